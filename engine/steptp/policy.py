"""Where candidate next programs come from: one protocol,
``Policy.propose(program, history, k) -> list[Proposal]``, and its three implementations,
shared by ``stp search`` (:mod:`steptp.search`) and ``stp eval`` (:mod:`steptp.eval`, which
renders a proposal as an answer text through a thin adapter, :mod:`steptp.eval.policies`).

``program`` is a :class:`~steptp.leir.LeirModule` or anything holding one in ``.module``: a
search node (:class:`steptp.search.core.Node`: ``text``, ``depth``, ``speedup``, ...) or an
eval case (:class:`steptp.eval.policies.Case`: ``id``, ``source``, ``prompt``, ...).
``history`` is the path root..parent of ``program`` (empty for the root, for the
chain-without-parent algorithm and in eval).

* :class:`EnginePolicy`: the rule engine, through :class:`steptp.engine.service.EngineService`
  (a worker process with time and memory limits). ``pick="candidate"`` (search): every rule
  x site x parameter that applies is a candidate, at most ``per_rule`` (a seeded sample) per
  rule; ``k`` of them are drawn with the seed (``rank="random"``) or the ``k`` with the
  lowest static cost (:mod:`steptp.cost_model.static`, ``rank="cost"``); a program never gets the
  same candidate twice. ``pick="rule"`` (eval baseline): a rule drawn at random among those
  that match, applied at its own seeded site (:func:`steptp.engine.apply_rule`).
* :class:`ReplayPolicy`: proposals read from a JSONL file: search records ``{"parent": LEIR
  or null, "leir": LEIR, "strategy": S, "site": ..., "params": {...}}`` and eval answer
  records ``{"case"|"source"|"program"|"prompt": ..., "answer": TEXT, "sample": N}``.
* :class:`LLMPolicy`: a chat model behind an OpenAI-compatible endpoint, prompted with the
  paper's multi-step prompt (App. B.2, ``templates/search_prompt.j2``; answers parsed
  tolerantly, at most ``k`` kept, garbage gives no proposal) or with the chat set's
  single-answer prompt (``prompt="single"``: ``k`` sampled answers, one proposal each,
  carrying the raw answer text).

Every seeded draw uses :func:`steptp.seeds.seeded_rng` (seed, program, rule, purpose). The claimed-strategy ->
rule-id lookup is :class:`StrategyNames`.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from .leir.fileformat import LeirModule


@dataclass
class Proposal:
    """One candidate next program.

    ``module``: the program (the input's signature), None when an answer could not be read;
    ``strategy``: a rule id, or the claimed strategy in rule-id spelling (``+`` between
    several); ``site``: text or None; ``params``: JSON-ready values; ``cot``: the chain of
    thought ('' if none); ``answer``: the raw answer text the proposal was read from (a
    model's or a file's), None for engine proposals; ``error``: why no answer could be
    obtained (``"request: ..."``), else None; ``info``: JSON-ready extras (rule id, tokens,
    finish reason)."""

    module: LeirModule | None
    strategy: str
    site: str | None = None
    params: dict = field(default_factory=dict)
    cot: str = ""
    answer: str | None = None
    error: str | None = None
    info: dict = field(default_factory=dict)


class Policy(Protocol):
    """Anything that proposes at most ``k`` next programs for ``program`` given ``history``."""

    def propose(self, program: Any, history: list, k: int) -> list[Proposal]: ...


def module_of(program: Any) -> LeirModule:
    """The :class:`~steptp.leir.LeirModule` of a policy's ``program`` argument (itself, or its
    ``.module``). Raises ``TypeError`` for anything else."""
    if isinstance(program, LeirModule):
        return program
    mod = getattr(program, "module", None)
    if not isinstance(mod, LeirModule):
        raise TypeError(f"expected a LeirModule or an object with one in .module, got {type(program).__name__}")
    return mod


def program_key(program: Any) -> str:
    """The canonical program text (printer output, no header) of ``program``: the key of
    every per-program cache and draw (a search node's ``text`` when it has one)."""
    text = getattr(program, "text", None)
    if isinstance(text, str):
        return text
    from .leir.printer import format_program

    return format_program(module_of(program).program)


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


# ---------------------------------------------------------------------------
# claimed strategy names
# ---------------------------------------------------------------------------


def normalise_name(name: str) -> str:
    """A strategy name in rule-id spelling: lower case, every run of other characters one
    ``_`` (``"Loop-Split "`` -> ``loop_split``)."""
    return re.sub(r"[^a-z0-9]+", "_", (name or "").lower()).strip("_")


class StrategyNames:
    """The claimed-strategy -> rule lookup: a rule's id or name, compared after
    :func:`normalise_name`. ``rules``: loaded rules or ``{"id", "name"}`` dicts (default:
    the shipped rules); the first rule of a name wins."""

    def __init__(self, rules=None):
        if rules is None:
            from .rules import load_rules

            rules = load_rules()
        self.rules = list(rules)
        self._by_name: dict[str, Any] = {}
        for r in self.rules:
            rid, name = (r["id"], r["name"]) if isinstance(r, dict) else (r.id, r.name)
            self._by_name.setdefault(normalise_name(rid), r)
            self._by_name.setdefault(normalise_name(name), r)

    def rule_for(self, name: str):
        """The rule (or dict) whose id or name matches ``name``, or None."""
        return self._by_name.get(normalise_name(name))

    def rule_id(self, name: str) -> str | None:
        """The rule id that ``name`` names, or None."""
        r = self.rule_for(name)
        return None if r is None else (r["id"] if isinstance(r, dict) else r.id)

    def strategy_id(self, claimed: str) -> str:
        """Rule ids of a claimed strategy (``"Loop Split, loop-reorder"`` ->
        ``loop_split+loop_reorder``; ``,`` or ``;`` between several); an unknown name is kept
        in id spelling; ``llm`` when nothing is named."""
        ids = []
        for part in (claimed or "").replace(";", ",").split(","):
            key = normalise_name(part)
            if key:
                ids.append(self.rule_id(key) or key)
        return "+".join(ids) or "llm"


def strategy_table(rules=None) -> list[dict]:
    """``[{"id", "name"}]`` of the rules (default: the shipped 43), in rule-file order."""
    if rules is None:
        from .rules import load_rules

        rules = load_rules()
    return [{"id": r.id, "name": r.name} for r in rules]


# ---------------------------------------------------------------------------
# engine
# ---------------------------------------------------------------------------


#: The pseudo rule id of a multi-step proposal among :meth:`EnginePolicy.candidates`.
MACRO = "@macro"


def _steps_of(p: Proposal) -> list[dict]:
    """A proposal's steps ``{"rule", "site", "params", "leir"}``: its multi-step record, or
    itself as one step."""
    if p.info.get("steps"):
        return list(p.info["steps"])
    from .leir.printer import format_program

    return [{"rule": p.strategy, "site": p.site, "params": p.params, "leir": format_program(p.module.program)}]


def _diverse(order: list[int], rules: list[list[str]], n: int) -> list[int]:
    """The first ``n`` of ``order`` (indices, best first; ``rules``: each one's rule ids, in
    ``order``'s order), the best of each distinct *set* of rules first, then the rest in order
    (candidates that differ only in a parameter are mostly the same program to a GPU)."""
    first, rest, kinds = [], [], set()
    for i, r in zip(order, rules):
        kind = frozenset(r)
        (rest if kind in kinds else first).append(i)
        kinds.add(kind)
    return (first + rest)[:n]


class EnginePolicy:
    """Proposals from the rule engine (see the module docstring).

    ``rules``: rule objects or ids (ids are looked up in ``rules_dir``; default: every
    shipped rule); ``pick``: ``candidate`` or ``rule``; ``rank``: ``random`` or ``cost``
    (``pick="candidate"``); ``seed``; ``per_rule``: at most this many candidates per rule
    and program (a seeded sample; default 8); ``tries``: rules tried per proposal with
    ``pick="rule"`` (8); ``target``: the cost model's target (``cpu``/``cuda``);
    ``skip_binding_only``: leave out the rules that only bind loops to
    GPU axes (:attr:`steptp.rules.loader.Rule.binding_only`: on the CPU the same code, never a
    timed sample; ``stp search --device cpu``); ``macros``: also propose the multi-step
    proposals of :mod:`steptp.engine.macros` (macros, chains, macro sequences; at most
    ``macro_steps`` steps per rule), each a candidate like a single step, its intermediate
    programs in ``Proposal.info["steps"]`` (``stp search --device cuda``); ``lookahead``
    (``rank="cost"``): levels of the tree ranked by the static model before proposing (1: the
    program's own candidates; L > 1: the ``expand`` best programs of a level, the best of each
    distinct set of rules first, are expanded again, and every program met is a multi-step
    proposal of the steps that reach it, ranked with the rest: issue 37's level expansion, a
    lookahead through the cost model that makes a round of a GPU search reach further).
    ``check`` (``rank="cost"``): optional ``fn(LeirModule) -> bool`` (the search's verification
    against its root, cached there): the ranked programs are proposed best first among those
    that pass it (as the GPU round search of issue 37 verified a level in ranked order until
    enough passed), and with ``lookahead`` > 1 a level's programs are checked before they are
    expanded, only the ``expand`` best that pass are (a step that does not verify or build
    would cut every proposal through it to one prefix).
    ``apply_timeout_s`` (seconds per application), ``list_timeout_s`` (to count a program's
    candidates), ``mem_bytes`` (the worker's address space) and ``isolated`` go to
    :class:`~steptp.engine.service.EngineService`; work over a limit is skipped and counted
    in :attr:`skipped`.

    :meth:`propose` takes an optional ``draw`` key: the draw's generator is
    ``seeded_rng(seed, *draw)`` (eval: ``(case id, sample)``), by default ``seeded_rng(seed,
    program key, "draw", n)`` for the n-th call on that program. Raises ``ValueError`` for
    an unknown ``rank`` or ``pick``."""

    def __init__(self, rules=None, *, rank: str = "random", pick: str = "candidate", seed: int = 0, per_rule: int = 8,
                 tries: int = 8, target: str = "cpu", rules_dir: str | None = None, apply_timeout_s: float = 30.0,
                 list_timeout_s: float = 120.0, mem_bytes: int = 3 << 30, cache_size: int = 256,
                 isolated: bool = True, skip_binding_only: bool = False, macros: bool = False,
                 macro_steps: int = 48, lookahead: int = 1, expand: int = 3, check=None):
        from .engine.service import EngineService

        if rank not in ("random", "cost"):
            raise ValueError(f"rank must be 'random' or 'cost', not {rank!r}")
        if pick not in ("candidate", "rule"):
            raise ValueError(f"pick must be 'candidate' or 'rule', not {pick!r}")
        self.service = EngineService(rules, rules_dir=rules_dir, isolated=isolated, apply_timeout_s=apply_timeout_s,
                                     list_timeout_s=list_timeout_s, mem_bytes=mem_bytes)
        self.rule_ids = list(self.service.rule_ids)
        if skip_binding_only:
            # GPU-binding-only rules build to the same CPU code (the search's "noop"): not proposed
            self.rule_ids = [rid for rid in self.rule_ids
                             if not getattr(self.service.rule(rid), "binding_only", False)]
        self.rank, self.pick, self.seed, self.per_rule, self.tries = rank, pick, seed, per_rule, tries
        self.target, self.rules_dir, self.cache_size = target, rules_dir, cache_size
        self._counts: dict[str, dict] = {}
        self._cands: dict[str, list] = {}
        self._used: dict[str, set] = {}
        self._calls: dict[str, int] = {}
        self._ranked: dict[str, list] = {}  # rank="cost": applied candidates not yet proposed, cheapest first
        self._proposed: dict[str, set] = {}  # rank="cost": program keys proposed (or replayed) at a program
        self.macros, self.macro_steps = macros, macro_steps
        self.lookahead, self.expand = max(1, lookahead), max(1, expand)
        self.check = check
        self._macros: dict[str, list] = {}

    @property
    def skipped(self) -> dict[str, int]:
        """Work skipped, by reason (time, memory, failed rewrite): the service's count."""
        return self.service.skipped

    def close(self) -> None:
        """Stop the engine worker."""
        self.service.close()

    def counts(self, module: LeirModule) -> dict[str, int]:
        """``{rule id: number of candidates}`` of ``module``, cached per canonical text."""
        key = program_key(module)
        hit = self._counts.get(key)
        if hit is None:
            if len(self._counts) >= self.cache_size:
                self._counts.pop(next(iter(self._counts)))
            hit = self._counts[key] = self.service.counts(module)
        return hit

    def candidates(self, module: LeirModule) -> list[tuple[str, int]]:
        """``(rule id, candidate index)`` pairs for ``module`` (at most ``per_rule`` per
        rule, a seeded sample), cached per canonical text."""
        from .seeds import seeded_rng

        key = program_key(module)
        hit = self._cands.get(key)
        if hit is not None:
            return hit
        counts = self.counts(module)
        out = []
        for rid in self.rule_ids:
            idx = list(range(int(counts.get(rid, 0))))
            if len(idx) > self.per_rule:
                idx = sorted(seeded_rng(self.seed, key, rid, "cap").sample(idx, self.per_rule))
            out.extend((rid, i) for i in idx)
        if self.macros:
            out.extend((MACRO, j) for j in range(len(self._macro_steps(module, key))))
        if len(self._cands) >= self.cache_size:
            self._cands.pop(next(iter(self._cands)))
        self._cands[key] = out
        return out

    def _macro_steps(self, module: LeirModule, key: str) -> list:
        hit = self._macros.get(key)
        if hit is None:
            if len(self._macros) >= self.cache_size:
                self._macros.pop(next(iter(self._macros)))
            hit = self._macros[key] = self.service.macros(module, self.seed, min(self.per_rule, 4), self.macro_steps)
        return hit

    def replayed(self, program: Any, proposals: list[Proposal]) -> None:
        """Bring the policy's state up to date with a call answered from a cache (a search
        replayed after waiting for a runner): the call counts, and its proposals are not
        proposed again at this program."""
        key = program_key(program)
        self._calls[key] = self._calls.get(key, 0) + 1
        if self.pick != "candidate":
            return
        if self.rank == "cost":
            done = self._proposed.setdefault(key, set())
            done.update(program_key(p.module) for p in proposals if p.module is not None)
            ranked = self._ranked.get(key)
            if ranked is not None:
                ranked[:] = [p for p in ranked if program_key(p.module) not in done]
            return
        used = self._used.setdefault(key, set())
        used.update(p.info["index"] for p in proposals if isinstance(p.info.get("index"), int))

    def rule_name(self, rule_id: str) -> str:
        """The display name of a rule id (the id itself when unknown)."""
        r = self.service.rule(rule_id)
        return r.name if r is not None else rule_id

    def _apply(self, module: LeirModule, rule_id: str, index: int | None, seed: int) -> Proposal | None:
        if rule_id == MACRO:
            steps = self._macro_steps(module, program_key(module))[index]
            from .leir import parse_program

            ids = list(dict.fromkeys(st["rule"] for st in steps))
            return Proposal(LeirModule(module.signature, parse_program(steps[-1]["leir"])), "+".join(ids),
                            info={"rule": MACRO, "steps": steps})
        a = self.service.apply(module, rule_id, index, seed)
        if not a.ok:
            return None
        return Proposal(a.module, rule_id, a.site, a.params, a.cot, info={"rule": rule_id})

    def _look_ahead(self, module: LeirModule, props: list[Proposal]) -> list[Proposal]:
        """``props`` (the candidates of ``module``) and the programs ``lookahead - 1`` levels
        further (class docstring), each a proposal with its steps from ``module``."""
        from .cost_model.static import static_scores

        seen = {program_key(p.module) for p in props}
        out, level = list(props), list(props)
        failed: set[str] = set()  # programs the check refused: not proposed either
        for _ in range(self.lookahead - 1):
            if not level:
                break
            scores = static_scores(module.program, [p.module.program for p in level], self.target)
            order = sorted(range(len(level)), key=lambda j: (-scores[j], j))
            order = _diverse(order, [[st["rule"] for st in _steps_of(level[j])] for j in order], len(order))
            picks = []
            for j in order:  # the expand best that pass the check (a step that does not build is no prefix)
                if len(picks) >= self.expand:
                    break
                if self.check is None or self._passes(level[j].module, failed):
                    picks.append(j)
            nxt: list[Proposal] = []
            for j in picks:
                base = level[j]
                cands = self.candidates(base.module)
                for i in range(len(cands)):
                    p = self._apply(base.module, *cands[i], self.seed)
                    if p is None:
                        continue
                    t = program_key(p.module)
                    if t in seen:
                        continue
                    seen.add(t)
                    steps = _steps_of(base) + _steps_of(p)
                    nxt.append(Proposal(p.module, "+".join(dict.fromkeys(st["rule"] for st in steps)),
                                        info={"rule": MACRO, "steps": steps}))
            out += nxt
            level = nxt
        return [p for p in out if program_key(p.module) not in failed]

    def _passes(self, module: LeirModule, failed: set) -> bool:
        ok = bool(self.check(module))
        if not ok:
            failed.add(program_key(module))
        return ok

    def _indexed(self, module: LeirModule, cands: list, i: int) -> Proposal | None:
        p = self._apply(module, *cands[i], self.seed)
        if p is not None:
            p.info["index"] = i
        return p

    def propose(self, program: Any, history: list, k: int, *, draw: tuple | None = None) -> list[Proposal]:
        """At most ``k`` engine proposals for ``program`` (see the class docstring)."""
        from .seeds import seeded_rng

        module, key = module_of(program), program_key(program)
        if draw is None:
            call = self._calls[key] = self._calls.get(key, 0) + 1
            rng = seeded_rng(self.seed, key, "draw", call)
        else:
            rng = seeded_rng(self.seed, *draw)
        if self.pick == "rule":
            counts = self.counts(module)
            pool = [rid for rid in self.rule_ids if counts.get(rid)]
            rng.shuffle(pool)
            out: list[Proposal] = []
            for rid in pool[:self.tries]:
                p = self._apply(module, rid, None, rng.randrange(2**31))
                if p is not None:
                    out.append(p)
                    if len(out) >= k:
                        break
            return out
        cands = self.candidates(module)
        used = self._used.setdefault(key, set())
        order = [i for i in range(len(cands)) if i not in used]
        rng.shuffle(order)
        if self.rank == "cost":
            ranked = self._ranked.get(key)
            if ranked is None:
                from .cost_model.static import static_scores

                # ties broken by a draw of the program alone: the ranking does not depend on the
                # call that computes it (a replayed search computes it later, issue 45)
                order = list(range(len(cands)))
                seeded_rng(self.seed, key, "rank").shuffle(order)
                props = [p for p in (self._indexed(module, cands, i) for i in order) if p is not None]
                if self.lookahead > 1:
                    props = self._look_ahead(module, props)
                scores = static_scores(module.program, [p.module.program for p in props], self.target)
                # highest predicted speedup (lowest estimate) first; the seeded order breaks ties
                best = sorted(range(len(props)), key=lambda j: (-scores[j], j))
                if self.macros:
                    # multi-step proposals: the best of each distinct set of rules first (variants of
                    # one sequence that differ in a parameter are mostly one program to a GPU, and
                    # share a prefix that may not build)
                    best = _diverse(best, [[st["rule"] for st in _steps_of(props[j])] for j in best], len(best))
                done = self._proposed.setdefault(key, set())
                ranked = self._ranked[key] = []
                for j in best:  # each program once; those proposed before this ranking (a replay) left out
                    t = program_key(props[j].module)
                    if t not in done:
                        done.add(t)
                        ranked.append(props[j])
            out = []
            while ranked and len(out) < k:
                p = ranked.pop(0)
                if self.check is None or self.check(p.module):
                    out.append(p)
            return out
        out = []
        for i in order:
            used.add(i)
            p = self._indexed(module, cands, i)
            if p is not None:
                out.append(p)
                if len(out) >= k:
                    break
        return out


class ScreeningPolicy:
    """Screen many, propose few: asks the wrapped policy for up to ``screen`` proposals at a
    node (e.g. every matching rule x site x parameter of the engine, up to the cap), scores
    them with ``scorer`` and proposes the ``k`` best not proposed yet (re-scored at each call:
    the model learns online). A node whose screened list runs out is screened again (the
    engine then yields its further candidates). Proposals whose program was already proposed
    anywhere, or is the node or one of its ancestors in ``history``, are dropped."""

    def __init__(self, inner, scorer, screen: int = 32):
        self.inner = inner
        self.scorer = scorer
        self.screen = screen
        self._pool: dict[str, list] = {}
        self._seen: set[str] = set()
        self._dry: set[str] = set()

    def propose(self, node, history, k: int):
        """The ``k`` best-scored proposals at ``node`` (see the class docstring)."""
        from .leir.printer import format_program

        def canonical(m):
            return format_program(m.program)

        pool = self._pool.setdefault(node.text, [])
        if len(pool) < k and node.text not in self._dry:
            fresh = list(self.inner.propose(node, history, self.screen))
            if not fresh:
                self._dry.add(node.text)
            back = {node.text} | {h.text for h in history}
            for p in fresh:
                t = canonical(p.module)
                if t not in self._seen and t not in back:
                    self._seen.add(t)
                    pool.append(p)
        if not pool:
            return []
        scores = self.scorer.score(node, pool)
        order = sorted(range(len(pool)), key=lambda i: (-scores[i], i))
        out = [pool[i] for i in order[:k]]
        keep = set(order[k:])
        pool[:] = [p for i, p in enumerate(pool) if i in keep]
        return out

    def close(self) -> None:
        close = getattr(self.inner, "close", None)
        if close is not None:
            close()

    def __getattr__(self, name):  # skipped / log of the wrapped policy
        if name in ("skipped", "log"):
            return getattr(self.inner, name)
        raise AttributeError(name)


# ---------------------------------------------------------------------------
# replay (search proposals and eval answers read from a file)
# ---------------------------------------------------------------------------


class ReplayError(ValueError):
    """A replay or answers file that cannot be read (path, line, what is wrong)."""


def _case_keys(program: Any) -> list[tuple[str, str]]:
    """The keys a record may name ``program`` by, most specific first."""
    keys = []
    if isinstance(getattr(program, "text", None), str):
        keys.append(("parent", program.text))
    for attr, kind in (("id", "case"), ("source", "source"), ("prompt", "prompt"), ("program", "program")):
        v = getattr(program, attr, None)
        if isinstance(v, str) and not isinstance(program, LeirModule):
            keys.append((kind, _sha(v) if kind == "prompt" else v))
    if not keys:
        keys.append(("parent", program_key(program)))
    return keys


class ReplayPolicy:
    """Proposals read from a JSONL file, one record per line (format in the module docstring).

    A record names the programs it is for by ``parent`` (canonical LEIR; null or absent:
    any program), ``case``, ``source``, ``program`` or ``prompt`` (eval cases), and holds
    either ``leir`` (a program, with or without ``%`` header; the program's signature is
    used: ``signature`` when given, else the proposing program's) or ``answer`` (a raw
    model output, parsed tolerantly, :func:`steptp.llm.parse_single`).

    :meth:`propose` without ``draw`` gives each record at most once, in file order (search);
    with ``draw=(sample,)`` it gives the record of that sample for the first key of the
    program that has records (eval: ``sample`` 0-based, else the record's position among
    those of its key). Raises :class:`ReplayError` for an unreadable file or line."""

    def __init__(self, path: str | Path, signature=None):
        self.path = Path(path)
        self.signature = signature
        self.records: list[dict] = []
        self.table: dict[tuple, dict[int, int]] = {}
        self._used: set[int] = set()
        try:
            lines = self.path.read_text(encoding="utf-8").splitlines()
        except OSError as e:
            raise ReplayError(f"{self.path}: cannot read: {e.strerror or e}") from None
        except UnicodeDecodeError:
            raise ReplayError(f"{self.path}: not UTF-8 text") from None
        for n, line in enumerate(lines, 1):
            if line.strip():
                self._add(n, line)

    def _add(self, n: int, line: str) -> None:
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as e:
            raise ReplayError(f"{self.path}:{n}: not JSON: {e.msg}") from None
        if not isinstance(rec, dict) or not (isinstance(rec.get("leir"), str) or isinstance(rec.get("answer"), str)):
            raise ReplayError(f"{self.path}:{n}: expected an object with a string 'leir' or 'answer'")
        keys = [(k, str(rec[k])) for k in ("case", "source", "program") if k in rec]
        if isinstance(rec.get("prompt"), str):
            keys.append(("prompt", _sha(rec["prompt"])))
        try:
            if isinstance(rec.get("leir"), str):
                self._parse(rec["leir"])  # a bad program is an error of the file, found now
            if isinstance(rec.get("parent"), str):
                keys.append(("parent", program_key(self._parse(rec["parent"]))))
        except Exception as e:  # noqa: BLE001 - LeirSyntaxError and friends, one line each
            raise ReplayError(f"{self.path}:{n}: {str(e).splitlines()[0]}") from None
        i = len(self.records)
        self.records.append({"leir": rec.get("leir"), "answer": rec.get("answer"), "keyed": bool(keys),
                             "strategy": str(rec.get("strategy") or "replay"), "site": rec.get("site"),
                             "params": rec.get("params") if isinstance(rec.get("params"), dict) else {}})
        sample = rec.get("sample")
        for key in keys or [("any", "")]:
            slot = self.table.setdefault(key, {})
            slot[sample if isinstance(sample, int) and sample >= 0 else len(slot)] = i

    def _parse(self, text: str, signature=None) -> LeirModule:
        from .leir import parse_leir

        m = parse_leir(text, str(self.path))
        sig = signature or self.signature
        return m if sig is None else LeirModule(sig, m.program)

    def _proposal(self, i: int, program: Any) -> Proposal:
        r = self.records[i]
        sig = self.signature or module_of(program).signature
        if r["leir"] is not None:
            site = None if r["site"] is None else str(r["site"])
            return Proposal(self._parse(r["leir"], sig), r["strategy"], site, dict(r["params"]), info={"record": i})
        from .llm import parse_single

        cand = parse_single(r["answer"], sig)
        return Proposal(cand.module if cand.ok else None, r["strategy"], answer=r["answer"], info={"record": i})

    def propose(self, program: Any, history: list, k: int, *, draw: tuple | None = None) -> list[Proposal]:
        """At most ``k`` recorded proposals for ``program`` (see the class docstring)."""
        keys = _case_keys(program)
        if draw is not None:
            for key in keys + [("any", "")]:
                slot = self.table.get(key)
                if slot:
                    i = slot.get(draw[0])
                    return [] if i is None else [self._proposal(i, program)]
            return []
        mine = {i for key in keys for i in self.table.get(key, {}).values()}
        out = []
        for i, r in enumerate(self.records):
            if len(out) >= k:
                break
            if i in self._used or (r["keyed"] and i not in mine):
                continue
            self._used.add(i)
            out.append(self._proposal(i, program))
        return out


# ---------------------------------------------------------------------------
# LLM
# ---------------------------------------------------------------------------

#: One sentence per algorithm, opening the prompt (paper App. B.2).
ALGORITHM_TEXT = {
    "greedy": "Greedy-based optimization",
    "beam": "Beam-search-based optimization",
    "bfs": "Breadth-first-based optimization",
    "dfs": "Depth-first-based optimization",
    "mcts": "Monte-Carlo-tree-search-based optimization",
    "chain": "Chain-based optimization",
    "chain-no-parent": "Chain-based optimization",
    "evolutionary": "Evolutionary optimization (a population of measured programs, mutated step by step)",
}


def render_prompt(algorithm: str, node, parent, strategies: list[dict], target: str = "cpu", count: int = 2) -> str:
    """The multi-step prompt of paper App. B.2 for a search node (``text``, ``module``,
    ``depth``, ``speedup``, ``strategy``; ``parent`` the same or None), from
    ``templates/search_prompt.j2``; ``strategies``: :func:`strategy_table` rows."""
    from .backend.hardware import DEFAULT_GPU
    from .leir.ast import DTYPES
    from .resources import render

    sig = node.module.signature
    tensors = [{"name": t.name, "role": t.role, "torch_dtype": "torch." + DTYPES[t.dtype], "shape": list(t.shape)}
               for t in sig.tensors]
    return render("search_prompt.j2", algorithm=ALGORITHM_TEXT.get(algorithm, "Search-based optimization"),
                  name=sig.name, leir=node.text, tensors=tensors,
                  parent=None if parent is None else {"leir": parent.text, "depth": parent.depth,
                                                       "speedup": parent.speedup or 1.0,
                                                       "is_root": parent.parent is None},
                  current={"depth": node.depth, "speedup": node.speedup or 1.0, "strategy": node.strategy},
                  target=target, gpu=DEFAULT_GPU, strategies=strategies, count=count)


def _wrap_json(text: str) -> str | None:
    """A bare JSON answer (the B.2 prompt asks for JSON only) wrapped in <answer> tags."""
    s = text
    if "</think>" in s:
        s = s.rsplit("</think>", 1)[1]
    starts = [i for i in (s.find("["), s.find("{")) if i >= 0]
    if not starts:
        return None
    i = min(starts)
    j = max(s.rfind("]"), s.rfind("}"))
    if j <= i:
        return None
    return "<answer>" + s[i:j + 1] + "</answer>"


def parse_proposals(text: str, signature, k: int, names: StrategyNames | None = None) -> tuple[list[Proposal], str]:
    """At most ``k`` proposals read from a model answer (``<answer>`` JSON, fenced JSON or
    bare JSON; keys ``transformed_IR`` and ``applied_strategies``/``applied_strategy``);
    strategies in rule-id spelling through ``names``. Returns ``(proposals, reason)``; never
    raises."""
    from .llm.answers import parse_candidates

    try:
        cands, why = parse_candidates(text, signature)
        if not cands and "<answer>" not in (text or ""):
            wrapped = _wrap_json(text or "")
            if wrapped is not None:
                cands, why = parse_candidates(wrapped, signature)
    except Exception as e:  # noqa: BLE001 - hostile text never crashes a search
        return [], f"unreadable answer: {type(e).__name__}"
    names = names or StrategyNames([])
    out = []
    reasons = [why] if why else []
    for c in cands:
        if c.ok:
            out.append(Proposal(c.module, names.strategy_id(c.strategy), None, {}))
        elif c.reason:
            reasons.append(c.reason)
        if len(out) >= k:
            break
    return out, "; ".join(reasons)[:500]


class LLMPolicy:
    """Proposals from a chat model (see the module docstring).

    ``client``: anything with ``complete(messages, n, temperature, max_tokens, seed)``
    returning objects with ``.text`` (:class:`steptp.llm.client.ChatClient`); ``prompt``:
    ``search`` (App. B.2, ``algorithm`` names the search in it, one request per call, at
    most ``k`` proposals, none from an unreadable answer) or ``single`` (the single-answer
    prompt, ``program.prompt`` when it has one: ``k`` sampled answers in one request, one
    proposal each with its raw ``answer`` and token counts in ``info``; a failed request
    gives ``k`` proposals with ``error``); ``temperature`` (paper: 0.3); ``max_tokens``;
    ``target``; ``rules`` (the strategies listed and looked up); ``seed``: sent with
    single-answer requests. ``log``: one dict per search request (prompt and answer sizes,
    proposals, reason, tokens)."""

    threaded = True

    def __init__(self, client, *, prompt: str = "search", algorithm: str = "greedy", temperature: float = 0.3,
                 max_tokens: int | None = None, target: str = "cpu", rules=None, seed: int | None = None):
        if prompt not in ("search", "single"):
            raise ValueError(f"prompt must be 'search' or 'single', not {prompt!r}")
        self.client, self.prompt, self.algorithm = client, prompt, algorithm
        self.temperature, self.max_tokens, self.target, self.seed = temperature, max_tokens, target, seed
        self.strategies = strategy_table(rules) if prompt == "search" else []
        self.names = StrategyNames(self.strategies) if prompt == "search" else None
        self.log: list[dict] = []

    def _single(self, program: Any, k: int) -> list[Proposal]:
        from .llm import RequestError, parse_single, single_prompt, user_messages

        module = module_of(program)
        prompt = getattr(program, "prompt", None) or single_prompt(module)
        try:
            comps = self.client.complete(user_messages(prompt), n=k, temperature=self.temperature,
                                         max_tokens=self.max_tokens, seed=self.seed)
        except RequestError as e:
            return [Proposal(None, "", answer="", error=f"request: {e}") for _ in range(k)]
        out = []
        for c in comps:
            cand = parse_single(c.text, module.signature)
            out.append(Proposal(cand.module if cand.ok else None, cand.strategy, answer=c.text,
                                info={"prompt_tokens": c.prompt_tokens, "completion_tokens": c.completion_tokens,
                                      "finish_reason": c.finish_reason}))
        return out

    def propose(self, program: Any, history: list, k: int) -> list[Proposal]:
        """At most ``k`` proposals for ``program`` (see the class docstring)."""
        if self.prompt == "single":
            return self._single(program, k)
        from .llm.client import RequestError

        parent = history[-1] if history else None
        prompt = render_prompt(self.algorithm, program, parent, self.strategies, self.target, count=max(2, k))
        rec = {"node": program.id, "prompt_chars": len(prompt)}
        try:
            comps = self.client.complete([{"role": "user", "content": prompt}], n=1, temperature=self.temperature,
                                         max_tokens=self.max_tokens)
        except RequestError as e:
            rec["reason"] = f"request failed: {e}"
            self.log.append(rec)
            return []
        text = comps[0].text if comps else ""
        props, why = parse_proposals(text, program.module.signature, k, self.names)
        rec.update({"answer_chars": len(text or ""), "proposals": len(props), "reason": why,
                    "prompt_tokens": getattr(comps[0], "prompt_tokens", None) if comps else None,
                    "completion_tokens": getattr(comps[0], "completion_tokens", None) if comps else None})
        self.log.append(rec)
        return props


__all__ = ["Proposal", "Policy", "module_of", "program_key", "normalise_name", "StrategyNames", "strategy_table",
           "EnginePolicy", "ReplayError", "ReplayPolicy", "ALGORITHM_TEXT", "render_prompt", "parse_proposals",
           "LLMPolicy"]
