"""Proposals from the rule engine (:class:`EnginePolicy`): every rule x site x parameter that
applies is a candidate, drawn with the seed or ranked by the static cost model, with the
engine's multi-step proposals (:mod:`steptp.engine.macros`) and a lookahead through the cost
model; the bookkeeping that lets a replayed search (:mod:`steptp.search.replay`) continue
where it stopped."""

from __future__ import annotations

from typing import Any

from ..leir.fileformat import LeirModule
from .base import Proposal, module_of, program_key
from .steps import Step, rule_ids, steps_of_records

#: The pseudo rule id of a multi-step proposal among :meth:`EnginePolicy.candidates`.
MACRO = "@macro"


def _steps_of(p: Proposal) -> list[Step]:
    """A proposal's steps (:class:`~steptp.policy.steps.Step`): its own, or itself as one
    step."""
    if p.steps:
        return list(p.steps)
    return [Step.of(p.strategy, p.module, p.site, p.params)]


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
    programs in ``Proposal.steps`` (``stp search --device cuda``); ``lookahead``
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
    :class:`~steptp.rules.service.EngineService`; work over a limit is skipped and counted
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
        from ..rules.service import EngineService

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
        self._ranker = None  # rank="cost": the static cost model (cost_model.create("cost", target))

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
        from ..seeds import seeded_rng

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
            steps = steps_of_records(self._macro_steps(module, program_key(module))[index], module.signature)
            ids = list(dict.fromkeys(rule_ids(steps)))
            return Proposal(steps[-1].program, "+".join(ids), info={"rule": MACRO}, steps=steps)
        a = self.service.apply(module, rule_id, index, seed)
        if not a.ok:
            return None
        return Proposal(a.module, rule_id, a.site, a.params, a.cot, info={"rule": rule_id})

    def _look_ahead(self, module: LeirModule, props: list[Proposal]) -> list[Proposal]:
        """``props`` (the candidates of ``module``) and the programs ``lookahead - 1`` levels
        further (class docstring), each a proposal with its steps from ``module``."""
        seen = {program_key(p.module) for p in props}
        out, level = list(props), list(props)
        failed: set[str] = set()  # programs the check refused: not proposed either
        for _ in range(self.lookahead - 1):
            if not level:
                break
            scores = self._rank(module.program, [p.module.program for p in level])
            order = sorted(range(len(level)), key=lambda j: (-scores[j], j))
            order = _diverse(order, [rule_ids(_steps_of(level[j])) for j in order], len(order))
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
                    steps = tuple(_steps_of(base) + _steps_of(p))
                    nxt.append(Proposal(p.module, "+".join(dict.fromkeys(rule_ids(steps))),
                                        info={"rule": MACRO}, steps=steps))
            out += nxt
            level = nxt
        return [p for p in out if program_key(p.module) not in failed]

    def _rank(self, base, programs: list) -> list[float]:
        """Predicted ln speedup of each of ``programs`` over ``base`` by the static cost model
        (``rank="cost"``), made by :func:`steptp.cost_model.create` as every ranking of the
        search is."""
        if self._ranker is None:
            from ..cost_model import create  # noqa: PLC0415

            self._ranker = create("cost", self.target)
        return self._ranker.predict(base, programs)

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
        from ..seeds import seeded_rng

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
                # ties broken by a draw of the program alone: the ranking does not depend on the
                # call that computes it (a replayed search computes it later, issue 45)
                order = list(range(len(cands)))
                seeded_rng(self.seed, key, "rank").shuffle(order)
                props = [p for p in (self._indexed(module, cands, i) for i in order) if p is not None]
                if self.lookahead > 1:
                    props = self._look_ahead(module, props)
                scores = self._rank(module.program, [p.module.program for p in props])
                # highest predicted speedup (lowest estimate) first; the seeded order breaks ties
                best = sorted(range(len(props)), key=lambda j: (-scores[j], j))
                if self.macros:
                    # multi-step proposals: the best of each distinct set of rules first (variants of
                    # one sequence that differ in a parameter are mostly one program to a GPU, and
                    # share a prefix that may not build)
                    best = _diverse(best, [rule_ids(_steps_of(props[j])) for j in best], len(best))
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


__all__ = ["MACRO", "EnginePolicy"]
