"""Load rule YAML files into :class:`Rule` objects (validated: shape, then semantics).

``load_rule(path)`` validates the file against :data:`~steptp.rules.schema.RULE_SCHEMA`,
then compiles its patterns, ``where:`` clauses, parameter domains, fresh names, rewrite
steps, CoT template and tests, so a broken rule fails at load time with
``FILE: field.path: message`` rather than at application time.

``load_rules()`` loads every ``*.yaml`` of the shipped rule directory (the repo-root
``rules/`` directory, installed as the package ``steptp._rules``), then those of the user
rule folders named by ``$STP_RULES_PATH`` (``stp ... --rules DIR`` sets it); a user rule
with a shipped rule's id replaces it. Errors read ``FILE:LINE:COL: field: message``
(:mod:`steptp.rules.positions`).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import Any

import yaml

from ..resources import RULES_PATH_ENV, rules_dir, user_rule_dirs
from ..engine.primitives import MAX_DOMAIN_VALUES
from .checks import check_rule
from .positions import locate_error
from .schema import LEVELS, RuleError, validate_rule_data


def difficulty_score(K: int, P: int, S: int) -> float:
    """Paper eq. (1): ``0.1K + 0.5(P-1) + S`` (computed exactly, returned as float).

    K (preconditions) and S (synthesis depth) are >= 0, P (modified components) >= 1;
    raises ``ValueError`` otherwise."""
    if min(K, S) < 0 or P < 1:
        raise ValueError(f"difficulty components must satisfy K,S >= 0 and P >= 1 (got K={K}, P={P}, S={S})")
    return float(Fraction(K, 10) + Fraction(P - 1, 2) + S)


def difficulty_level(score: float) -> str:
    """``easy`` (< 1), ``medium`` (1 <= score < 2.5) or ``difficult`` (>= 2.5), paper §3.4."""
    if score < 1:
        return "easy"
    if score < 2.5:
        return "medium"
    return "difficult"


@dataclass(frozen=True)
class RuleTest:
    """One self-test of a rule: ``before`` (.leir text with signature), optional ``params``,
    ``site`` (index into the enumerated sites, or a partial site description) and
    ``seed``; ``after`` is the exact expected program (signature unchanged), or
    ``no_match`` says the rule must not apply."""

    index: int
    name: str
    before: str
    after: str | None = None
    no_match: bool = False
    params: dict | None = None
    site: Any = None
    seed: int = 0
    cot_contains: tuple[str, ...] = ()
    verify: bool = True


@dataclass(frozen=True, eq=False)
class Rule:
    """A strategy loaded from one YAML file (see ``rules/README.md``).

    ``difficulty`` is the dict ``{"K", "P", "S"}``; :attr:`score` and :attr:`level` are
    derived from it. ``rewrite`` is a tuple of ``(primitive, args)`` steps. ``key`` is a
    content hash used to cache compiled forms.
    """

    id: str
    name: str
    category: str
    description: str
    preconditions: tuple[str, ...]
    difficulty: dict
    scope: str
    match: Any
    where: tuple
    params: dict
    let: dict
    fresh: dict
    rewrite: tuple
    cot: str
    tests: tuple[RuleTest, ...]
    inverse: str | None = None
    #: an expansion (the inverse of a simplification, ``expansion: true``): §3.4's filter keeps
    #: fewer of its easy steps (:func:`steptp.dataset.difficulty.is_expansion`)
    expansion: bool = False
    #: strategies whose verified output this rule is tried on when the source program offers
    #: it no verified step (``stp dataset --follow-ups``, :mod:`steptp.dataset.generate`)
    follows: tuple[str, ...] = ()
    source: str | None = None
    path: str | None = None
    raw: dict = field(default_factory=dict, repr=False)
    key: str = ""

    @property
    def score(self) -> float:
        d = self.difficulty
        return difficulty_score(d["K"], d["P"], d["S"])

    @property
    def level(self) -> str:
        return difficulty_level(self.score)

    @property
    def binding_only(self) -> bool:
        """True when every rewrite step only binds a loop to a GPU axis (``set_loop`` to kind
        ``B``): on the CPU a ``B`` loop is a serial loop, so such a step builds to the same
        CPU code (``loop_binding``, ``reduction_thread_binding``, ``thread_block_rebinding``)."""
        return bool(self.rewrite) and all(p == "set_loop" and (a or {}).get("kind") == "B" for p, a in self.rewrite)

    @property
    def display_source(self) -> str:
        return display_path(self.path) if self.path else f"<rule {self.id}>"

    def __repr__(self) -> str:
        return f"Rule({self.id!r}, {self.category}, {self.level})"


def display_path(path: str | os.PathLike) -> str:
    """How error messages name a rule file: ``rules/<file>`` for the shipped rules,
    otherwise the path as given."""
    p = Path(path)
    try:
        if p.resolve().parent == rules_dir().resolve():
            return f"rules/{p.name}"
    except (OSError, ModuleNotFoundError):  # pragma: no cover
        pass
    return str(path)


_DECIMAL = re.compile(r"\s*-?(\d+\.\d*|\.\d+)([eE][+-]?\d+)?\s*")
_NUMERIC = re.compile(r"[\d.eE\s+\-*/%]*(\d+\.\d*|\.\d+)[\d.eE\s+\-*/%]*")


def _decimal(v):
    """A ``let:`` value that is a decimal number (YAML ``0.0625`` or the string ``"0.0625"``)
    as the exact rational it writes (:class:`fractions.Fraction`, as a decimal inside a value
    expression); arithmetic on decimal numbers without a metavariable or a parenthesis
    (``"0.25 * 0.25"``, which the value language would read as a string literal) as a value
    expression; any other value unchanged."""
    if isinstance(v, float) and math.isfinite(v):
        return Fraction(repr(v))
    if isinstance(v, str) and _DECIMAL.fullmatch(v):
        return Fraction(v.strip())
    if isinstance(v, str) and _NUMERIC.fullmatch(v):
        return f"({v})"
    return v


def _build(data: dict, source: str, path: str | None) -> Rule:
    m = data["match"]
    scopes = list(m)
    if len(scopes) != 1:
        raise RuleError(source, "match", f"exactly one scope key is required (expr, loop, nest, nests, tensor, "
                                         f"equation), got {scopes or 'none'}")
    scope = scopes[0]
    match = tuple(m[scope]) if scope == "nests" else m[scope]
    rw = data["rewrite"]
    if isinstance(rw, str):
        rewrite = (("replace", rw),)
    else:
        rewrite = tuple((next(iter(step)), step[next(iter(step))]) for step in rw)
    tests = []
    for i, t in enumerate(data["tests"]):
        tests.append(RuleTest(index=i, name=t.get("name", f"test {i}"), before=t["before"], after=t.get("after"),
                              no_match=bool(t.get("no_match", False)), params=t.get("params"), site=t.get("site"),
                              seed=int(t.get("seed", 0)), cot_contains=tuple(t.get("cot_contains", ())),
                              verify=bool(t.get("verify", True))))
    let = {k: _decimal(v) for k, v in data.get("let", {}).items()}
    key = hashlib.sha256(json.dumps(data, sort_keys=True, default=str).encode()).hexdigest()[:16]
    d = data["difficulty"]
    return Rule(id=data["id"], name=data["name"], category=data["category"], description=data["description"].strip(),
                preconditions=tuple(data["preconditions"]), difficulty={"K": d["K"], "P": d["P"], "S": d["S"]},
                scope=scope, match=match, where=tuple(data.get("where", ())), params=dict(data.get("params", {})),
                let=let, fresh=dict(data.get("fresh", {})), rewrite=rewrite, cot=data["cot"],
                tests=tuple(tests), inverse=data.get("inverse"), expansion=bool(data.get("expansion", False)), follows=tuple(data.get("follows", ())),
                source=data.get("source"), path=path, raw=data,
                key=key)


def _semantic_checks(rule: Rule, data: dict, source: str, stem: str | None) -> None:
    if stem is not None and rule.id != stem:
        raise RuleError(source, "id", f"the id {rule.id!r} must equal the file name {stem!r}")
    d = data["difficulty"]
    if d["K"] != len(rule.preconditions):
        raise RuleError(source, "difficulty.K", f"K counts the preconditions: expected {len(rule.preconditions)} "
                                                f"({', '.join(rule.preconditions) or 'none'}), got {d['K']}")
    if "level" in d and d["level"] != rule.level:
        raise RuleError(source, "difficulty.level", f"stated level {d['level']!r} but the score "
                                                    f"{rule.score:g} gives {rule.level!r}")
    if rule.inverse == rule.id:
        raise RuleError(source, "inverse", "a rule cannot be its own inverse")
    if rule.id in rule.follows:
        raise RuleError(source, "follows", "a rule cannot follow itself")
    for pname, spec in rule.params.items():
        r = spec.get("range") if isinstance(spec, dict) else None
        lo, hi = (r[0], r[1]) if isinstance(r, list) and len(r) == 2 else \
            (r.get("from"), r.get("to")) if isinstance(r, dict) else (None, None)
        if isinstance(lo, int) and isinstance(hi, int) and hi - lo + 1 > MAX_DOMAIN_VALUES:
            raise RuleError(source, f"params.{pname}.range", f"[{lo}, {hi}] has {hi - lo + 1} values, above the "
                                                            f"limit {MAX_DOMAIN_VALUES}")
    marker = _check_marker(rule)
    if marker is not None and marker.exists():
        return  # this text passed these checks before, with this code
    check_rule(rule, source)
    if marker is not None:
        try:  # an empty marker file, written atomically; a cache that cannot be written is no error
            marker.parent.mkdir(parents=True, exist_ok=True)
            tmp = marker.with_name(f"{marker.name}.{os.getpid()}.tmp")
            tmp.write_bytes(b"")
            os.replace(tmp, marker)
        except OSError:
            pass


def rule_check_cache() -> Path | None:
    """Where rules that passed :func:`~steptp.rules.checks.check_rule` are remembered:
    ``$STP_RULE_CHECK_CACHE`` (``off``: nowhere) or ``~/.cache/steptp/rule-checks``. The
    checks (patterns compiled in egglog, every test's LEIR parsed: about 3 s for the shipped
    rules) are a function of the rule's text, its CoT template file and the code of
    :mod:`steptp.rules`, :mod:`steptp.engine` and :mod:`steptp.leir`; a marker named by the
    hash of all of them skips them in the next process. Only passes are remembered: a broken
    rule is checked, and refused, every time."""
    env = os.environ.get("STP_RULE_CHECK_CACHE")
    if env is not None:
        return None if env.strip().lower() in ("", "0", "off", "no") else Path(env)
    return Path.home() / ".cache" / "steptp" / "rule-checks"


_CODE_KEY: str | None = None


def _code_key() -> str:
    """A hash of the checking code: the sources of the rule, engine and LEIR packages and the
    versions of the libraries they call (egglog, lark, jinja2, PyYAML)."""
    global _CODE_KEY
    if _CODE_KEY is None:
        from importlib import metadata

        h = hashlib.sha256()
        pkg = Path(__file__).resolve().parents[1]
        for sub in ("rules", "engine", "leir"):
            for f in sorted((pkg / sub).glob("*")):
                if f.suffix in (".py", ".lark"):
                    h.update(f.name.encode() + b"\0" + f.read_bytes() + b"\0")
        for dist in ("egglog", "lark", "jinja2", "pyyaml"):
            try:
                h.update(f"{dist}={metadata.version(dist)};".encode())
            except metadata.PackageNotFoundError:
                h.update(f"{dist}=?;".encode())
        _CODE_KEY = h.hexdigest()
    return _CODE_KEY


def _check_marker(rule: Rule) -> Path | None:
    cache = rule_check_cache()
    if cache is None:
        return None
    try:
        h = hashlib.sha256(_code_key().encode())
        h.update(json.dumps(rule.raw, sort_keys=True, default=str).encode())
        if rule.cot.endswith(".j2"):  # the template file the rule names, as the loader finds it
            from ..engine.cot import _loader_for

            for d in _loader_for(rule).searchpath:
                f = Path(d) / rule.cot
                if f.is_file():
                    h.update(str(f).encode() + f.read_bytes())
                    break
            else:
                return None  # missing: check_rule reports it
        return cache / h.hexdigest()
    except OSError:
        return None


#: Largest rule file accepted (characters).
MAX_RULE_CHARS = 1_000_000


class _StrictLoader(getattr(yaml, "CSafeLoader", yaml.SafeLoader)):
    """``yaml.SafeLoader`` (libyaml's parser when PyYAML has it: the shipped rules parse in a
    fifth of the time) that refuses duplicate mapping keys (YAML 1.2 requires unique keys;
    PyYAML silently keeps the last one)."""

    def construct_mapping(self, node, deep=False):
        seen = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            try:
                hash(key)
            except TypeError:
                continue
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {key!r} (first at line {seen[key] + 1})", key_node.start_mark)
            seen[key] = key_node.start_mark.line
        return super().construct_mapping(node, deep)


def load_rule_text(text: str, source: str = "<string>", path: str | None = None) -> Rule:
    """Parse and validate rule YAML text (``source`` names it in errors)."""
    if len(text) > MAX_RULE_CHARS:
        raise RuleError(source, "", f"rule file of {len(text)} characters exceeds the limit {MAX_RULE_CHARS}")
    if "\x00" in text:
        raise RuleError(source, "", "not a text file (contains NUL bytes)")
    try:
        data = yaml.load(text, Loader=_StrictLoader)  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        raise RuleError(source, "", f"invalid YAML: {getattr(e, 'problem', None) or e}",
                        positions=[(mark.line + 1, mark.column + 1)] if mark else None) from None
    except RecursionError:
        raise RuleError(source, "", "YAML nested too deeply") from None
    try:
        validate_rule_data(data, source)
        rule = _build(data, source, path)
        _semantic_checks(rule, data, source, Path(path).stem if path else None)
    except RuleError as e:
        raise locate_error(e, text) from None
    return rule


_CACHE: dict[tuple, Rule] = {}


def load_rule(path: str | os.PathLike) -> Rule:
    """Load and validate one rule file. Raises :class:`RuleError` (``FILE: field: msg``)
    or :class:`FileNotFoundError`. Results are cached per (path, mtime, size)."""
    p = Path(path)
    st = p.stat()
    key = (str(p.resolve()), st.st_mtime_ns, st.st_size)
    hit = _CACHE.get(key)
    if hit is not None:
        return hit
    try:
        text = p.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise RuleError(display_path(p), "", f"not a UTF-8 text file (byte {e.start})") from None
    rule = load_rule_text(text, display_path(p), str(p))
    if len(_CACHE) > 256:
        _CACHE.clear()
    _CACHE[key] = rule
    return rule


def default_rules_dir() -> Path:
    """The shipped rule directory (package ``steptp._rules`` = repo-root ``rules/``)."""
    return rules_dir()


def rule_paths(report=None) -> list[Path]:
    """The rule files in effect: every ``*.yaml`` of the shipped directory (sorted by file
    name), then those of each user folder (:func:`user_rule_dirs`, in order, each sorted).
    A user file named like a shipped one (a rule's id is its file name) takes the shipped
    one's place, and ``report`` (when given) is called with one line saying so. Raises
    :class:`RuleError` for a user folder that is not a directory and for two user files of
    the same name."""
    shipped = default_rules_dir()
    paths = sorted(shipped.glob("*.yaml"))
    pos = {p.stem: i for i, p in enumerate(paths)}
    user: dict[str, Path] = {}
    for d in user_rule_dirs():
        if not d.is_dir():
            raise RuleError(str(d), "", f"not a rule directory (from --rules or ${RULES_PATH_ENV})")
        for p in sorted(d.glob("*.yaml")):
            if p.stem in user:
                raise RuleError(str(p), "id", f"duplicate rule id {p.stem!r} (also in {user[p.stem]})")
            user[p.stem] = p
            if p.stem in pos:
                if report is not None:
                    report(f"note: rule {p.stem!r} from {p} replaces the shipped rules/{p.name}")
                paths[pos[p.stem]] = p
            else:
                pos[p.stem] = len(paths)
                paths.append(p)
    return paths


def find_rule(ref: str | os.PathLike) -> Path:
    """The file of a rule given as a path (an existing file) or as an id, looked up among
    the rules in effect (:func:`rule_paths`: shipped, then user folders). Raises
    :class:`FileNotFoundError` naming the folders searched."""
    p = Path(ref)
    if p.is_file() or p.suffix in (".yaml", ".yml") or os.sep in str(ref):
        if not p.is_file():
            raise FileNotFoundError(f"{ref}: no such rule file")
        return p
    for q in rule_paths():
        if q.stem == str(ref):
            return q
    dirs = ", ".join(["the shipped rules"] + [str(d) for d in user_rule_dirs()])
    raise FileNotFoundError(f"{ref}: no such rule file, and no rule with that id in {dirs}")


def load_rules(directory: str | os.PathLike | None = None, *, report=None) -> list[Rule]:
    """Load every ``*.yaml`` rule of ``directory``, sorted by file name; without one, the
    rules in effect (:func:`rule_paths`: the shipped rules, then the user folders of
    ``$STP_RULES_PATH``, a user rule replacing a shipped rule of the same id, ``report``
    called with the line that says so). Raises :class:`RuleError` for an invalid file or
    duplicate ids."""
    if directory is not None:
        files = sorted(Path(directory).glob("*.yaml"))
    else:
        files = rule_paths(report)
    rules = [load_rule(p) for p in files]
    seen: dict[str, Rule] = {}
    for r in rules:
        if r.id in seen:
            raise RuleError(r.display_source, "id", f"duplicate rule id {r.id!r} (also in {seen[r.id].display_source})")
        seen[r.id] = r
    return rules


__all__ = ["LEVELS", "difficulty_score", "difficulty_level", "RuleTest", "Rule", "display_path", "load_rule_text",
           "load_rule", "load_rules", "default_rules_dir", "RULES_PATH_ENV", "user_rule_dirs", "rule_paths",
           "find_rule"]
