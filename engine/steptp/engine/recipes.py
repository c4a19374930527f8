"""Multi-step recipes: the engine's multi-step proposals as data (``rules/recipes/*.yaml``, one
recipe per file, beside the rules; issue 53). A recipe names rules and says how to chain them;
this module loads, checks and expands recipes, and knows no rule or recipe by name (the
driver is :mod:`steptp.engine.macros`).

Kinds (field ``kind``):

* ``macro``: one rule (``rule``) at every site in turn, random sites and parameters (seeded).
* ``chain``: a step of ``first`` at each of its sites, then a step of a ``then`` rule in a nest
  the first step changed (the step it enables); the ``best`` pairs by the static GPU model.
* ``sequence``: each rule of ``steps`` at every site in turn, canonically (the first site and
  parameters; with ``accept:`` the first candidate the named site filter of
  :data:`steptp.engine.forms.SITE_FILTERS` accepts). A step with ``required: true`` that
  takes no step drops the whole sequence.
* ``tiling``: a schedule for one top-level nest of a form (``form``, :data:`steptp.engine.forms.FORMS`):
  conditions (``when``), parameter tries (``tries``) and a step list (``steps``), expanded
  into concrete steps per try. ``alongside: true`` proposes it besides the tiling that applies
  (``marks`` are copied into its report entry).
* ``tail``: a ``tiling`` for a nest that a tiling's ``loop_partition`` peeled off.

Within a kind, recipes run in ``order`` (then id). A tiling step addresses the nest's loops by
the names the form gives (``loop: m``); ``split: [m_o, m_i]`` names the two loops a split makes;
a parameter ``{to: [names]}`` is the loop order that puts the named loops innermost in that
order (the rest keep their places outside; ``"*name"`` splices a list binding of names);
``nest: [1, 2]`` is a sub-nest of the tiled nest (register tiling's accumulation, its third
item); ``loop:`` may also be a position (negative from the innermost) or a value expression.
Every string with ``?`` or ``(`` is a value expression of the rule language
(:mod:`steptp.engine.domains`), evaluated over the form's bindings, the try's parameters and
``let:`` values.

Sources: TVM MetaSchedule (a schedule rule as data applied to every block it matches;
MultiLevelTiling's tile tries), ast-grep (rules and their tests as files).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

import yaml

from ..positions import did_you_mean, inner_position, locate_field
from .domains import EvalContext, VALUE_FUNCTIONS, ValueExprError, eval_value, is_expression, parse_value
from .forms import FORMS, SITE_FILTERS

KINDS = ("macro", "chain", "sequence", "tiling", "tail")

_COMMON = {"id", "kind", "order", "description", "source", "tests"}
_TEST = {"name", "before", "nest", "seed", "rules", "after", "contains", "refused", "verify"}
_FIELDS = {
    "macro": _COMMON | {"rule"},
    "chain": _COMMON | {"first", "then", "best"},
    "sequence": _COMMON | {"steps"},
    "tiling": _COMMON | {"form", "when", "tries", "steps", "alongside", "marks", "unfit"},
    "tail": _COMMON | {"form", "when", "tries", "steps", "unfit"},
}
_REQUIRED = {"macro": {"rule"}, "chain": {"first", "then"}, "sequence": {"steps"},
             "tiling": {"form", "steps"}, "tail": {"form", "steps"}}
_SEQ_STEP = {"rule", "accept", "required"}
_TILING_STEP = {"rule", "nest", "loop", "bindings", "params", "split", "optional", "when"}
_TRIES = {"for", "let", "where", "unique", "order", "limit"}


class RecipeError(ValueError):
    """A recipe file that does not load: the message names the file, line, column and field."""


@dataclass
class Recipe:
    """One loaded recipe (module docstring for the fields); ``source_path``: its file."""

    id: str
    kind: str
    order: int
    spec: dict
    source_path: str = ""
    description: str = ""

    @property
    def rules(self) -> list[str]:
        """The rule ids the recipe uses, in order of first use."""
        s = self.spec
        if self.kind == "macro":
            return [s["rule"]]
        if self.kind == "chain":
            return [s["first"], *s["then"]]
        return list(dict.fromkeys(st["rule"] if isinstance(st, dict) else st for st in s["steps"]))


# ---------------------------------------------------------------------------
# loading
# ---------------------------------------------------------------------------


def _field(where: tuple) -> str:
    """A field path as rule errors write it: ``("steps", 0, "params", "f")`` ->
    ``steps[0].params.f``."""
    out = ""
    for part in where:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


class _Checker:
    """Checks of one recipe file, each failure a :class:`RecipeError` placed in the text by
    :mod:`steptp.positions` (as rule errors are)."""

    def __init__(self, path: str, text: str):
        self.path, self.text = path, text
        try:
            self.root = yaml.compose(text, Loader=yaml.SafeLoader)
        except yaml.YAMLError as e:
            mark = getattr(e, "problem_mark", None)
            where = f"{mark.line + 1}:{mark.column + 1}" if mark else "1:1"
            raise RecipeError(f"{path}:{where}: not valid YAML: {getattr(e, 'problem', e)}") from None

    def fail(self, where: tuple, msg: str, name: str | None = None, inner: str | None = None):
        """Raise :class:`RecipeError` for field ``where``: placed at ``name`` inside the field
        when given, else where a parse error ``inner`` (``at line 1, column N``) points inside
        a one-line scalar, else at the field's key or item."""
        field = _field(where)
        pos = None
        if self.root is not None:
            pos = (inner_position(self.text, field, inner, self.root) if inner else None) \
                or locate_field(self.text, field, name, self.root)
        line, col = pos or (1, 1)
        raise RecipeError(f"{self.path}:{line}:{col}: {field or 'recipe'}: {msg}")

    def keys(self, d, allowed: set, where: tuple):
        if not isinstance(d, dict):
            self.fail(where, f"expected a mapping, got {type(d).__name__}")
        for k in d:
            if k not in allowed:
                hint = did_you_mean(str(k), allowed, n=1) or f" (allowed: {', '.join(sorted(allowed))})"
                self.fail(where + (k,), f"unknown field {k!r}{hint}")

    def value(self, v, where: tuple):
        """A value expression parses and names only known value functions."""
        if isinstance(v, dict) and set(v) == {"to"}:
            if not isinstance(v["to"], list) or not all(isinstance(x, str) for x in v["to"]):
                self.fail(where + ("to",), "a loop order is a list of loop names")
            return
        if isinstance(v, list):
            for i, x in enumerate(v):
                self.value(x, where + (i,))
            return
        if not is_expression(v):
            return
        try:
            tree = parse_value(v)
        except Exception as e:  # noqa: BLE001 - a pattern error: its text names the column
            self.fail(where, f"bad value expression: {e}", inner=str(e))  # noqa: B904 - fail raises
        for fn in _calls(tree):
            if fn not in VALUE_FUNCTIONS:
                self.fail(where, f"unknown value function {fn!r}" + did_you_mean(fn, VALUE_FUNCTIONS, n=1), name=fn)

    def name(self, v, table: dict, what: str, where: tuple):
        if v not in table:
            self.fail(where, f"unknown {what} {v!r}" + (did_you_mean(str(v), table, n=1)
                                                       or f" (known: {', '.join(sorted(table))})"), name=str(v))


def _calls(tree) -> set[str]:
    if not isinstance(tree, tuple):
        return set()
    out = {tree[1]} if tree[0] == "call" else set()
    for x in tree[1:]:
        if isinstance(x, tuple):
            out |= _calls(x)
        elif isinstance(x, list):
            for y in x:
                out |= _calls(y)
    return out


def load_recipe_text(text: str, path: str = "<recipe>") -> Recipe:
    """A recipe from YAML ``text`` (``path`` names it in errors; its stem is the id). Raises
    :class:`RecipeError` (``FILE:LINE:COL: field: message``) for invalid YAML, an unknown kind
    or field, a missing field, an unknown form, site filter or value function, or a bad step."""
    c = _Checker(path, text)
    d = yaml.safe_load(text)
    if not isinstance(d, dict):
        c.fail((), "a recipe is a mapping")
    kind = d.get("kind")
    if kind not in KINDS:
        c.fail(("kind",), f"kind must be one of {', '.join(KINDS)}, got {kind!r}", name=str(kind))
    c.keys(d, _FIELDS[kind], ())
    for f in sorted(_REQUIRED[kind] - set(d)):
        c.fail((), f"a {kind} recipe needs {f!r}")
    rid = d.get("id", Path(path).stem)
    if path != "<recipe>" and rid != Path(path).stem:
        c.fail(("id",), f"the id {rid!r} must be the file name ({Path(path).stem!r})")
    order = d.get("order", 0)
    if not isinstance(order, int) or isinstance(order, bool):
        c.fail(("order",), "order is an integer")
    if kind == "macro" and not isinstance(d["rule"], str):
        c.fail(("rule",), "a rule id")
    if kind == "chain":
        if not isinstance(d["then"], list) or not all(isinstance(x, str) for x in d["then"]):
            c.fail(("then",), "a list of rule ids")
        if not isinstance(d.get("best", 4), int):
            c.fail(("best",), "an integer")
    if kind in ("sequence", "tiling", "tail"):
        if not isinstance(d["steps"], list) or not d["steps"]:
            c.fail(("steps",), "a non-empty list of steps")
    if kind == "sequence":
        steps = []
        for i, st in enumerate(d["steps"]):
            st = {"rule": st} if isinstance(st, str) else st
            c.keys(st, _SEQ_STEP, ("steps", i))
            if "rule" not in st:
                c.fail(("steps", i), "a step needs 'rule'")
            if "accept" in st:
                c.name(st["accept"], SITE_FILTERS, "site filter", ("steps", i, "accept"))
            steps.append(st)
        d["steps"] = steps
    if kind in ("tiling", "tail"):
        forms = d["form"] if isinstance(d["form"], list) else [d["form"]]
        for i, f in enumerate(forms):
            c.name(f, FORMS, "form", ("form",) if not isinstance(d["form"], list) else ("form", i))
        d["form"] = forms
        when = d.get("when", [])
        d["when"] = when = [when] if isinstance(when, (str, dict)) else when
        for i, w in enumerate(when):
            if isinstance(w, dict):
                c.keys(w, {"check", "reason"}, ("when", i))
                c.value(w.get("check"), ("when", i, "check"))
            else:
                c.value(w, ("when", i))
        tries = d.get("tries")
        if tries is not None:
            c.keys(tries, _TRIES, ("tries",))
            if "for" not in tries or not isinstance(tries["for"], dict):
                c.fail(("tries",), "tries need 'for': parameter -> values")
            for k, v in tries["for"].items():
                c.value(v, ("tries", "for", k))
            for k, v in (tries.get("let") or {}).items():
                c.value(v, ("tries", "let", k))
            for part in ("where", "unique", "order"):
                for i, v in enumerate(tries.get(part) or []):
                    c.value(v, ("tries", part, i))
        for i, st in enumerate(d["steps"]):
            c.keys(st, _TILING_STEP, ("steps", i))
            if "rule" not in st:
                c.fail(("steps", i), "a step needs 'rule'")
            for k in ("loop", "when"):
                if k in st:
                    c.value(st[k], ("steps", i, k))
            for k, v in (st.get("params") or {}).items():
                c.value(v, ("steps", i, "params", k))
            if "split" in st and (not isinstance(st["split"], list) or len(st["split"]) != 2 or "loop" not in st):
                c.fail(("steps", i, "split"), "split names the two loops a split of 'loop' makes: [outer, inner]")
    tests = d.get("tests", [])
    if not isinstance(tests, list):
        c.fail(("tests",), "a list of tests")
    for i, t in enumerate(tests):
        c.keys(t, _TEST, ("tests", i))
        if not isinstance(t.get("before"), str):
            c.fail(("tests", i), "a test needs 'before': a LEIR program")
        if "refused" in t and any(k in t for k in ("rules", "after", "contains")):
            c.fail(("tests", i, "refused"), "a refusal test expects no steps: no rules, after or contains")
        if not any(k in t for k in ("refused", "rules", "after", "contains")):
            c.fail(("tests", i), "a test expects something: rules, after, contains or refused")
        t.setdefault("name", f"test {i}")
        t["line"] = (locate_field(text, f"tests[{i}]", root=c.root) or (1, 1))[0]
    return Recipe(rid, kind, order, d, path, str(d.get("description", "")).strip())


def load_recipe(path: str | os.PathLike) -> Recipe:
    """The recipe in file ``path`` (:func:`load_recipe_text`)."""
    p = Path(path)
    return load_recipe_text(p.read_text(encoding="utf-8"), str(p))


def recipe_dirs() -> list[Path]:
    """The recipe folders in effect: the shipped ``rules/recipes/``, then the ``recipes/``
    folder of each user rule folder of ``$STP_RULES_PATH`` that has one."""
    from ..resources import rules_dir, user_rule_dirs  # noqa: PLC0415

    return [rules_dir() / "recipes"] + [d / "recipes" for d in user_rule_dirs() if (d / "recipes").is_dir()]


def load_recipes(dirs=None) -> list[Recipe]:
    """Every ``*.yaml`` recipe of ``dirs`` (default :func:`recipe_dirs`), a later folder's
    recipe replacing an earlier one of the same id, sorted by kind (:data:`KINDS`), order and
    id. Raises :class:`RecipeError` for a file that does not load."""
    found: dict[str, Recipe] = {}
    for d in (recipe_dirs() if dirs is None else [Path(x) for x in dirs]):
        for p in sorted(Path(d).glob("*.yaml")):
            r = load_recipe(p)
            found[r.id] = r
    return sorted(found.values(), key=lambda r: (KINDS.index(r.kind), r.order, r.id))


@lru_cache(maxsize=8)
def _cached(key: tuple) -> tuple:
    return tuple(load_recipes(list(key)))


def recipes_in_effect(kind: str | None = None) -> list[Recipe]:
    """The recipes of :func:`recipe_dirs` (loaded once per set of folders), only those of
    ``kind`` when given."""
    rs = _cached(tuple(str(d) for d in recipe_dirs()))
    return [r for r in rs if kind is None or r.kind == kind]


# ---------------------------------------------------------------------------
# expansion of tiling and tail recipes
# ---------------------------------------------------------------------------


def _ev(v, env: dict, module):
    if isinstance(v, dict) and set(v) == {"to"}:
        raise RecipeError("a loop order {to: ...} only as a step parameter")
    return eval_value(v, EvalContext(module, env))


def _truth(v, env, module) -> bool:
    return bool(_ev(v, env, module))


def bind(recipe: Recipe, nest) -> dict | str | None:
    """The bindings of the first of ``recipe``'s forms that ``nest`` has, a reason (the nest
    is of a form's family but not of it) or None (not of any form's family)."""
    reason = None
    for f in recipe.spec["form"]:
        b = FORMS[f](nest)
        if isinstance(b, dict):
            return b
        if b is not None and reason is None:
            reason = b
    return reason


def _tries(spec: dict, env: dict, module) -> list[dict]:
    """The parameter tries of a ``tries:`` block over ``env``: every combination of the ``for``
    values (in order; a key ``a,b`` takes pairs), with ``let`` values, that meets every
    ``where`` condition; the first per ``unique`` key; sorted by the ``order`` keys, ties by
    the parameters' values; at most ``limit``."""
    names, pools = [], []
    for key, vals in spec["for"].items():
        vals = _ev(vals, env, module)
        names.append([x.strip() for x in str(key).split(",")])
        pools.append(list(vals))
    out, seen = [], set()

    def rec(i: int, cur: dict, flat: tuple):
        if i == len(pools):
            e = {**env, **cur}
            for k, v in (spec.get("let") or {}).items():
                e[k] = _ev(v, e, module)
            if not all(_truth(w, e, module) for w in spec.get("where") or []):
                return
            if spec.get("unique"):
                u = tuple(_ev(x, e, module) for x in spec["unique"])
                if u in seen:
                    return
                seen.add(u)
            key = tuple(_ev(x, e, module) for x in spec.get("order") or [])
            out.append((key, flat, {k: e[k] for k in cur} | {k: e[k] for k in (spec.get("let") or {})}))
            return
        for v in pools[i]:
            vs = tuple(v) if len(names[i]) > 1 else (v,)
            if len(vs) != len(names[i]):
                raise RecipeError(f"tries: {','.join(names[i])} takes {len(names[i])} values per entry, got {v!r}")
            rec(i + 1, {**cur, **dict(zip(names[i], vs))}, flat + vs)

    rec(0, {}, ())
    if spec.get("order"):
        out.sort(key=lambda t: (t[0], t[1]))
    lim = spec.get("limit")
    return [t[2] for t in (out[:lim] if lim is not None else out)]


def _loop_order(target: list[str], names: list[str], env: dict) -> list[str]:
    want = []
    for x in target:
        if x.startswith("*"):
            want += list(env[x[1:]])
        else:
            want.append(x)
    fixed = len(names) - len(want)
    full = names[:fixed] + want
    if fixed < 0 or sorted(full) != sorted(names):
        raise RecipeError(f"loop order {want} is not a suffix order of the loops {names}")
    return full


def expand_steps(steps: list[dict], env: dict, k: int, module) -> list[tuple]:
    """Concrete steps ``(rule id, site filter, params)`` (:func:`steptp.engine.macros.site_for`)
    of a tiling recipe's ``steps`` for top-level nest ``k`` under ``env`` (a form's bindings and
    a try). Raises :class:`RecipeError` for a loop name the nest does not have."""
    names = list(env.get("loops", []))
    out = []
    for st in steps:
        if "when" in st and not _truth(st["when"], env, module):
            continue
        spec: dict = {"nest": [k, *st.get("nest", [])]}
        if "loop" in st:
            v = st["loop"]
            if isinstance(v, str) and not is_expression(v):
                if v not in names:
                    raise RecipeError(f"step {st['rule']}: no loop named {v!r} (loops {names})")
                v = names.index(v)
            else:
                v = _ev(v, env, module)
            spec["loop"] = v
        if "bindings" in st:
            spec["bindings"] = {b: _ev(x, env, module) for b, x in st["bindings"].items()}
        if st.get("optional"):
            spec["optional"] = True
        params = {}
        for p, x in (st.get("params") or {}).items():
            if isinstance(x, dict) and set(x) == {"to"}:
                full = _loop_order(x["to"], names, env)
                params[p] = [names.index(n) for n in full]
                names = full
            else:
                params[p] = _ev(x, env, module)
        if "split" in st:
            i = spec["loop"] % len(names) if names else 0
            names[i:i + 1] = list(st["split"])
        out.append((st["rule"], spec, params))
    return out


class _Keep(dict):
    def __missing__(self, key):
        return "{" + key + "}"


def _fill(text: str, env: dict) -> str:
    """``text`` with its ``{name}`` placeholders filled from ``env`` (others left as they are)."""
    return str(text).format_map(_Keep(env))


def sequences(recipe: Recipe, module, k: int) -> tuple[list[list[tuple]], str | None, bool]:
    """The step sequences a tiling or tail ``recipe`` proposes for top-level nest ``k`` of
    ``module``, one per try (best first): ``(sequences, reason, claimed)``. ``claimed``: the
    nest is of the family of one of the recipe's forms; ``reason``: why there are none (the
    form, a ``when`` condition, no try fits)."""
    nest = module.program.nests[k]
    b = bind(recipe, nest)
    if not isinstance(b, dict):
        return [], b, b is not None
    env = dict(b)
    for w in recipe.spec.get("when", []):
        cond = w["check"] if isinstance(w, dict) else w
        if not _truth(cond, env, module):
            why = w.get("reason", f"{recipe.id}: {cond} does not hold") if isinstance(w, dict) else \
                f"{recipe.id}: {cond} does not hold"
            return [], _fill(why, env), True
    tries = [{}]
    if recipe.spec.get("tries"):
        tries = _tries(recipe.spec["tries"], env, module)
        if not tries:
            why = recipe.spec.get("unfit", f"{recipe.id}: no parameters fit (extents {{ext}})")
            return [], _fill(why, env), True
    return [expand_steps(recipe.spec["steps"], {**env, **t}, k, module) for t in tries], None, True


def instantiate(recipe: Recipe, module, k: int, **params) -> list[tuple]:
    """``recipe``'s steps for top-level nest ``k`` of ``module`` with the try parameters given
    (no tries searched; the form's bindings and ``let:`` values filled in). Raises
    :class:`RecipeError` when the nest is not of the recipe's form."""
    b = bind(recipe, module.program.nests[k])
    if not isinstance(b, dict):
        raise RecipeError(f"{recipe.id}: nest {k} is not of form {recipe.spec['form']}: {b}")
    env = {**b, **params}
    for name, v in ((recipe.spec.get("tries") or {}).get("let") or {}).items():
        if name not in env:
            env[name] = _ev(v, env, module)
    return expand_steps(recipe.spec["steps"], env, k, module)


__all__ = ["KINDS", "Recipe", "RecipeError", "load_recipe", "load_recipe_text", "load_recipes", "recipe_dirs",
           "recipes_in_effect", "bind", "sequences", "expand_steps", "instantiate", "ValueExprError"]
