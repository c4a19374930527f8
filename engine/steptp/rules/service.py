"""The engine service: candidates of (program, rules, seed, limits), listed and applied under
time and memory limits. Its seeded samples use :func:`steptp.seeds.seeded_rng`.

* :func:`bounded` - one engine call in the current process under a wall-clock limit
  (:func:`steptp.timelimit.time_limit`): what ``stp dataset`` pays per candidate, with no
  process hop.
* :class:`EngineService` - count, list and apply the candidates of a rule set on programs,
  in a worker process (:class:`steptp.runner.worker.IsolatedRunner`) with a time limit per
  call and an address-space limit (``isolated=True``), or in this process under
  :func:`bounded` (``isolated=False``). One rule that explodes on one program (seen: a
  ``cache_read_write`` candidate growing past 9 GB in a minute) costs that rule or that
  candidate, not the run. Used by the engine policy (:mod:`steptp.policy`), the strategy
  recogniser of ``stp eval`` and ``stp rules coverage``.

The worker-side functions (:func:`count_candidates`, :func:`apply_candidate`,
:func:`rule_results`) are module-level (pickled by reference) and take and return plain
data: LEIR texts with their ``%`` header, a rule-set spec, rule ids, candidate indices.
The worker keeps the loaded rules and the candidate lists per (program, rule).

It lives in ``rules/``, above the engine (issue 53): it loads rule files for its worker,
so in ``engine/`` it made the engine and the rules import each other.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable

from ..engine.jsonify import plain  # noqa: F401  (re-exported: callers import it from here)
from ..seeds import seeded_rng


def bounded(fn: Callable, *args, time_s: float = 0.0, what: str = "engine work", **kwargs):
    """``fn(*args, **kwargs)`` in this process under a wall-clock limit of ``time_s``
    seconds (``<= 0``: none). Raises :class:`steptp.timelimit.WorkTimeout` past the limit
    (main thread only; elsewhere no limit, see :func:`steptp.timelimit.time_limit`) and
    whatever ``fn`` raises."""
    from ..timelimit import time_limit

    with time_limit(time_s, what):
        return fn(*args, **kwargs)


# ---------------------------------------------------------------------------
# worker side (also run in this process when the service is not isolated)
# ---------------------------------------------------------------------------

_STATE: dict = {"rules": {}, "limited": False, "cands": {}}


def _limit(mem_bytes: int | None) -> None:
    """Cap this (worker) process's address space at ``mem_bytes`` once."""
    if _STATE["limited"] or not mem_bytes:
        return
    import resource

    _soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    cap = mem_bytes if hard == resource.RLIM_INFINITY else min(mem_bytes, hard)
    resource.setrlimit(resource.RLIMIT_AS, (cap, hard))
    _STATE["limited"] = True


def _rules(spec: tuple) -> dict:
    """``{id: rule}`` of a rule-set spec: ``("dir", path or None)`` or ``("files", paths)``."""
    hit = _STATE["rules"].get(spec)
    if hit is None:
        from . import load_rule, load_rules

        rules = load_rules(spec[1]) if spec[0] == "dir" else [load_rule(p) for p in spec[1]]
        hit = _STATE["rules"][spec] = {r.id: r for r in rules}
    return hit


def _module(program):
    if not isinstance(program, str):
        return program
    from ..leir import parse_leir

    return parse_leir(program, "<engine>")


def _candidates(spec: tuple, program, rule_id: str, check: bool = False, module=None) -> list:
    """The ``(site, params)`` candidates of one rule on ``program`` (text or module; ``module``:
    the text already parsed), cached."""
    text = program if isinstance(program, str) else program.text()
    key = (spec, text, rule_id, check)
    hit = _STATE["cands"].get(key)
    if hit is None:
        from ..engine import NoMatch, list_candidates

        try:
            hit = list_candidates(_rules(spec)[rule_id], module or _module(program), check=check)
        except NoMatch:
            hit = []
        if len(_STATE["cands"]) > 4096:
            _STATE["cands"].clear()
        _STATE["cands"][key] = hit
    return hit


def _step(spec: tuple, program, rule_id: str, index: int | None, seed: int, check: bool):
    """The :class:`~steptp.engine.Step` of candidate ``index`` of ``rule_id`` (``None``: the
    rule's own seeded site and parameter draw, :func:`~steptp.engine.apply_rule`)."""
    from ..engine import apply_rule

    rule, module = _rules(spec)[rule_id], _module(program)
    if index is None:
        return apply_rule(rule, module, seed=seed)
    site, params = _candidates(spec, program, rule_id, check)[index]
    return apply_rule(rule, module, seed=seed, site=site, params=params)


#: generation-0 threshold (allocations between young collections) and the two older
#: generations' thresholds of :func:`settle_heap`
GC_THRESHOLDS = (20_000, 50, 100)


def settle_heap() -> None:
    """Tune this process's garbage collector for candidate listing, once per process: move
    what is alive now (modules, grammars, loaded rules, caches) to the permanent generation
    (``gc.freeze``) and raise the collection thresholds to :data:`GC_THRESHOLDS` (CPython's
    defaults are 700, 10, 10). Listing the candidates of all rules keeps tens of thousands
    of sites and candidates alive at once; with the defaults each listing on a 124-nest
    program ran one or more full collections over the whole heap, 50-100 ms each, about a
    fifth of the listing (``benchmarks/bench_matching.py``). Results never depend on it.
    Called by the engine service's worker (:func:`ready`) and by ``stp dataset``'s workers.
    Source: Python ``gc.freeze`` / ``gc.set_threshold`` documentation."""
    if _STATE.get("heap_settled"):
        return
    import gc

    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)
    _STATE["heap_settled"] = True


def ready() -> bool:
    """Worker: import the engine (a fresh worker's first call; about 1-2 s), then
    :func:`settle_heap`."""
    from .. import engine  # noqa: F401

    settle_heap()
    return True


def count_candidates(spec: tuple, text: str, rule_ids: list[str], check: bool = False,
                     mem_bytes: int | None = None) -> dict:
    """Worker: ``{rule id: number of (site, params) candidates}`` of the program ``text``; a
    rule that fails counts 0 and is named in ``"failed"`` (``{id: reason}``); ``"memory"``
    marks an exhausted address space."""
    _limit(mem_bytes)
    out: dict = {}
    module = None
    todo = [rid for rid in rule_ids if (spec, text, rid, check) not in _STATE["cands"]]
    if todo:
        from ..engine.match import prefetch_sites

        try:  # every rule's query in one batch; on failure each rule is listed (and fails) alone
            module = _module(text)
            rules = _rules(spec)
            prefetch_sites([rules[rid] for rid in todo if rid in rules], module)
        except Exception:  # noqa: BLE001 - MemoryError included: the loop below reports it
            pass
    for rid in rule_ids:
        try:
            out[rid] = len(_candidates(spec, text, rid, check, module))
        except MemoryError:
            _STATE["cands"].clear()
            out[rid] = 0
            out["memory"] = True
        except Exception as e:  # noqa: BLE001 - a rule that fails on this program offers nothing
            out[rid] = 0
            out.setdefault("failed", {})[rid] = f"{type(e).__name__}: {e}"[:300]
    return out


def apply_candidate(spec: tuple, text: str, rule_id: str, index: int | None, seed: int = 0, check: bool = False,
                    mem_bytes: int | None = None) -> tuple:
    """Worker: apply candidate ``index`` of ``rule_id`` (None: the rule's seeded draw) to
    ``text``: ``("ok", after_text, cot, site, params)`` or ``("fail", reason)`` /
    ``("memory", reason)``."""
    _limit(mem_bytes)
    try:
        st = _step(spec, text, rule_id, index, seed, check)
        return ("ok", st.after.text(), st.cot, str(st.site), plain(dict(st.params)))
    except MemoryError:
        _STATE["cands"].clear()
        return ("memory", "address-space limit reached")
    except Exception as e:  # noqa: BLE001 - one broken candidate is skipped
        return ("fail", f"{type(e).__name__}: {str(e)[:200]}")


def macro_candidates(spec: tuple, text: str, seed: int, per_rule: int, max_steps: int,
                     mem_bytes: int | None = None) -> tuple:
    """Worker: the multi-step proposals of the program ``text``
    (:func:`steptp.engine.macros.macro_proposals`): ``("ok", [[step, ...], ...])`` (each step
    ``{"rule", "site", "params", "leir"}``) or ``("memory", reason)``."""
    _limit(mem_bytes)
    from ..engine.macros import macro_proposals

    try:
        return ("ok", macro_proposals(list(_rules(spec).values()), _module(text), seed, per_rule, max_steps))
    except MemoryError:
        _STATE["cands"].clear()
        return ("memory", "address-space limit reached")


def rule_results(spec: tuple, text: str, rule_id: str, max_candidates: int, seed: int, time_s: float,
                 mem_bytes: int | None = None) -> tuple[list[str], bool]:
    """Worker: the canonical LEIR texts (no header) of the results of ``rule_id``'s
    candidates on ``text`` (at most ``max_candidates``, a sample drawn with
    ``seeded_rng(seed, rule_id)`` when there are more; candidates that do not apply are left
    out), and whether the list is complete (no sample, ``time_s`` seconds not exceeded,
    checked between candidates). A rule whose matching raises gives ``([], True)``; a
    ``MemoryError`` propagates."""
    _limit(mem_bytes)
    from ..leir.printer import format_program

    deadline = time.monotonic() + time_s
    try:
        cands = list(range(len(_candidates(spec, text, rule_id))))
    except MemoryError:
        _STATE["cands"].clear()
        raise
    except Exception:  # noqa: BLE001 - a rule that crashes on this program costs that rule only
        return [], True
    complete = True
    if len(cands) > max_candidates:
        complete = False
        cands = seeded_rng(seed, rule_id).sample(cands, max_candidates)
    out: list[str] = []
    for i in cands:
        if time.monotonic() > deadline:
            return out, False
        try:
            step = _step(spec, text, rule_id, i, 0, False)
        except MemoryError:
            raise
        except Exception:  # noqa: BLE001 - an inapplicable candidate
            continue
        out.append(format_program(step.after.program))
    return out, complete


# ---------------------------------------------------------------------------
# the service
# ---------------------------------------------------------------------------


@dataclass
class Applied:
    """One applied candidate: ``module`` the transformed program (the input's signature),
    ``site`` its text, ``params`` JSON-ready values, ``cot`` the rendered chain of thought;
    ``step`` the engine's :class:`~steptp.engine.Step` (in-process services only, else None).
    A failed application has ``module`` None, ``error`` one of ``"time"`` (time limit or
    crashed worker), ``"memory"`` (address-space limit), ``"fail"`` (the rewrite raised) and
    ``reason`` (``"ExcType: message"``)."""

    module: Any = None
    site: str = ""
    params: dict = field(default_factory=dict)
    cot: str = ""
    step: Any = None
    error: str | None = None
    reason: str = ""

    @property
    def ok(self) -> bool:
        return self.module is not None


class EngineService:
    """Candidates of a rule set on programs, under limits (see the module docstring).

    ``rules``: loaded rules or rule ids (default: every rule of ``rules_dir``, the shipped
    ones when None); ``isolated``: work in a worker process (time and memory limits) or in
    this process (time limit only, under :func:`bounded`; rules without a file must run
    here, so ``isolated`` is turned off for them); ``apply_timeout_s``: seconds per
    application (and per rule when a listing is retried rule by rule); ``list_timeout_s``:
    seconds to count every rule's candidates on one program; ``mem_bytes``: the worker's
    address space; ``check``: list only candidates that pass the GPU preflight
    (:func:`steptp.engine.list_candidates` ``check=True``).

    ``skipped`` counts work lost to a limit or a failure, by reason. Use as a context
    manager, or call :meth:`close` (stops the worker)."""

    def __init__(self, rules=None, *, rules_dir: str | None = None, isolated: bool = True,
                 apply_timeout_s: float = 30.0, list_timeout_s: float = 120.0, mem_bytes: int = 3 << 30,
                 check: bool = False):
        objs = [r for r in (rules or []) if not isinstance(r, str)]
        if rules is None or len(objs) < len(rules):  # ids (or nothing): looked up in the directory
            self.spec: tuple = ("dir", None if rules_dir is None else str(rules_dir))
            self.rule_ids = list(_rules(self.spec)) if rules is None else [r if isinstance(r, str) else r.id
                                                                          for r in rules]
        else:
            paths = tuple(getattr(r, "path", None) for r in objs)
            self.spec = ("files", paths) if all(paths) else ("objects", id(self))
            self.rule_ids = [r.id for r in objs]
            _STATE["rules"][self.spec] = {r.id: r for r in objs}  # this process need not reload them
            isolated = isolated and self.spec[0] == "files"
        self.isolated = isolated
        self.apply_timeout_s, self.list_timeout_s = apply_timeout_s, list_timeout_s
        self.mem_bytes, self.check = mem_bytes, check
        self.skipped: dict[str, int] = {}
        self.failures: dict[str, str] = {}
        self._runner = None

    # -- plumbing ----------------------------------------------------------

    def _call(self, fn: Callable, *args, timeout_s: float):
        """``fn(spec, *args, ...)`` in the worker (an ``ExecError`` when it exceeds
        ``timeout_s`` or dies: it is restarted on the next call) or here under :func:`bounded`
        (its exception, e.g. a ``WorkTimeout``, is returned, not raised)."""
        if not self.isolated:
            try:
                return bounded(fn, self.spec, *args, time_s=timeout_s, what=f"engine: {fn.__name__}")
            except Exception as e:  # noqa: BLE001 - as the worker reports it: the call failed
                return e
        from ..backend.errors import BackendError
        from ..runner.pool import shared

        if self._runner is None:
            self._runner = shared("engine", preload=None)  # egglog only: spawned, without TVM
        if self._runner.pid is None:  # a fresh worker imports the engine first, outside the call's limit
            try:
                self._runner.call(ready, timeout_s=120.0)
            except BackendError as e:
                return e
        try:
            return self._runner.call(fn, self.spec, *args, mem_bytes=self.mem_bytes, timeout_s=timeout_s)
        except BackendError as e:  # time limit (worker killed) or crash: restarted on the next call
            return e

    def _skip(self, why: str) -> None:
        self.skipped[why] = self.skipped.get(why, 0) + 1

    def restart(self) -> None:
        """Stop the worker (after an exhausted address space); the next call starts a fresh one."""
        if self._runner is not None:
            self._runner.close()

    def close(self) -> None:
        """Stop the worker process, if any."""
        if self._runner is not None:
            self._runner.close()
            self._runner = None

    def __enter__(self) -> "EngineService":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- the API -----------------------------------------------------------

    def counts(self, module, rule_ids: list[str] | None = None) -> dict[str, int]:
        """``{rule id: number of candidates}`` on ``module`` (a LeirModule) for ``rule_ids``
        (default: all). All rules are counted in one call of ``list_timeout_s``; when that
        fails (time, memory, crash) they are counted again one at a time with
        ``apply_timeout_s`` each, and a rule over a limit counts 0 (``skipped["list: time or
        memory limit"]``). A rule whose matching raises counts 0; :attr:`failures` keeps the
        last program's reasons by rule id."""
        ids = list(self.rule_ids if rule_ids is None else rule_ids)
        text = module.text()
        got = self._call(count_candidates, text, ids, self.check, timeout_s=self.list_timeout_s)
        if isinstance(got, Exception) or got.get("memory"):
            self.restart()
            got = {}
            for rid in ids:  # one rule at a time, to lose only the one that explodes
                c = self._call(count_candidates, text, [rid], self.check, timeout_s=self.apply_timeout_s)
                if isinstance(c, Exception) or c.get("memory"):
                    self._skip("list: time or memory limit")
                    self.restart()
                    continue
                got.setdefault("failed", {}).update(c.pop("failed", {}))
                got.update(c)
        self.failures = dict(got.get("failed") or {})
        return {rid: int(got.get(rid, 0)) for rid in ids}

    def apply(self, module, rule_id: str, index: int | None = None, seed: int = 0) -> Applied:
        """Apply candidate ``index`` of ``rule_id`` (the order of
        :func:`steptp.engine.list_candidates`; ``None``: the rule's own seeded site and
        parameter draw, :func:`steptp.engine.apply_rule` with ``seed``) to ``module`` within
        ``apply_timeout_s``. Never raises: a failure is an :class:`Applied` with ``error``."""
        if not self.isolated:
            from ..timelimit import WorkTimeout

            try:
                st = bounded(_step, self.spec, module, rule_id, index, seed, self.check,
                             time_s=self.apply_timeout_s, what=f"rule {rule_id}: application")
            except WorkTimeout as e:
                self._skip("apply: time limit or crash")
                return Applied(error="time", reason=str(e))
            except Exception as e:  # noqa: BLE001 - one broken candidate costs that candidate
                self._skip("apply: rewrite failed")
                return Applied(error="fail", reason=f"{type(e).__name__}: {e}")
            return Applied(st.after, str(st.site), plain(dict(st.params)), st.cot, st)
        r = self._call(apply_candidate, module.text(), rule_id, index, seed, self.check,
                       timeout_s=self.apply_timeout_s)
        if isinstance(r, Exception):
            self._skip("apply: time limit or crash")
            return Applied(error="time", reason=str(r))
        if r[0] == "memory":
            self._skip("apply: memory limit")
            self.restart()
            return Applied(error="memory", reason=r[1])
        if r[0] != "ok":
            self._skip("apply: rewrite failed")
            return Applied(error="fail", reason=r[1])
        from ..leir import LeirModule, parse_leir

        _, text, cot, site, params = r
        return Applied(LeirModule(module.signature, parse_leir(text, "<engine>").program), site, params, cot)

    def macros(self, module, seed: int, per_rule: int = 4, max_steps: int = 48) -> list[list[dict]]:
        """The multi-step proposals of ``module`` (:func:`macro_candidates`) within
        ``list_timeout_s``: lists of steps ``{"rule", "site", "params", "leir"}`` (``leir``:
        canonical text, no header). ``[]`` past a limit (counted in :attr:`skipped`)."""
        r = self._call(macro_candidates, module.text(), seed, per_rule, max_steps, timeout_s=self.list_timeout_s)
        if isinstance(r, Exception) or r[0] != "ok":
            self._skip("macros: time or memory limit")
            self.restart()
            return []
        return r[1]

    def rule(self, rule_id: str):
        """The loaded rule of ``rule_id`` (in this process), or None."""
        return _rules(self.spec).get(rule_id)

    def candidates(self, module, rule_id: str) -> list:
        """The ``(site, params)`` candidates of one rule on ``module``, as
        :func:`steptp.engine.list_candidates` gives them (in this process, no limit: for
        callers that print or re-use the engine's own objects). Raises what the matching
        raises (``NoMatch`` is an empty list)."""
        return _candidates(self.spec, module, rule_id, self.check)

    def results(self, module, rule_id: str, max_candidates: int, seed: int, time_s: float) -> tuple[list[str], bool]:
        """:func:`rule_results` of one rule on ``module`` within ``time_s`` seconds (the
        worker is killed 2 s later if the matching itself does not return):
        ``(canonical result texts, complete)``; ``([], False)`` when the limit passed, the
        memory ran out or the worker died (counted in :attr:`skipped`)."""
        r = self._call(rule_results, module.text(), rule_id, max_candidates, seed, time_s,
                       timeout_s=time_s + (2.0 if self.isolated else 0.0))
        if isinstance(r, Exception):
            self._skip("results: time or memory limit")
            self.restart()
            return [], False
        return r


__all__ = ["bounded", "plain", "EngineService", "Applied", "ready", "settle_heap", "GC_THRESHOLDS", "count_candidates",
           "apply_candidate", "rule_results", "macro_candidates"]
