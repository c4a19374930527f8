"""One program -> its verified one-step dictionary entries (paper §3.2-§3.4).

For a source program: translate it (PyTorch) or parse it (``.leir``); verify the original
(against PyTorch eager for ``.py`` sources, three seeded trials); then for every rule that
matches, try candidates (site x parameters, in an order drawn from the run's seed) until
one transformed program passes Diff/Build/Exec/Equal against the original. Each
success becomes one dictionary entry; each failed attempt is reported, never written as
data. Everything random derives from ``(seed, program key, rule id)``, so a run is
reproducible whatever the worker count or order.
"""

from __future__ import annotations

import hashlib
import json
import random
import time
import traceback
from dataclasses import dataclass, field

from ..leir.fileformat import LeirModule, load_leir
from ..leir.printer import format_program
from .sources import Source


@dataclass
class Options:
    """Generation knobs (all serialisable: they travel to worker processes)."""

    seed: int = 0
    trials: int = 3
    per_rule: int = 1           # verified steps kept per (program, rule)
    max_tries: int = 4          # candidates tried per (program, rule) before giving up
    with_cuda: bool = True      # store TIR for the GPU path and CUDA source
    nvcc: bool = True           # Build pass includes nvcc --ptx of the CUDA source (when nvcc exists)
    isolated: bool = True       # build+run every check in a worker process with a time limit
    timeout_s: float = 60.0     # per check (isolated mode)
    rule_paths: list[str] = field(default_factory=list)


@dataclass
class ProgramResult:
    source: str
    key: str
    program: str | None
    entries: list[dict]
    attempts: list[dict]        # one per tried candidate: rule, outcome, reason
    error: str | None = None    # the program itself could not be used
    seconds: float = 0.0


def _signature_dict(module: LeirModule) -> dict:
    return {"name": module.signature.name,
            "tensors": [{"name": t.name, "role": t.role, "dtype": t.dtype, "shape": list(t.shape)}
                        for t in module.signature.tensors]}


def entry_id(original_leir: str, transformed_leir: str, strategy: str) -> str:
    """Content hash of a step (sha256 of the canonical texts and strategy, 16 hex digits)."""
    h = hashlib.sha256("\x00".join([original_leir, transformed_leir, strategy]).encode()).hexdigest()
    return h[:16]


def _lowered(module: LeirModule, with_cuda: bool) -> dict:
    from ..backend import cuda_source, lower

    out = {"leir": format_program(module.program)}
    if with_cuda:
        out["tir"] = lower(module, target="cuda")
        try:
            out["cuda"] = cuda_source(module)
        except Exception as e:  # noqa: BLE001 - kept as data: the GPU path is reported, not fatal
            out["cuda"] = None
            out["cuda_error"] = f"{type(e).__name__}: {e}"
    else:
        out["tir"] = lower(module, target="cpu")
    return out


_RUNNER = None


def _runner(opts: Options):
    """One isolated verification worker per generating process (started lazily, reused:
    a worker costs ~2 s to start; a crash or time-out restarts it and fails one check)."""
    global _RUNNER
    if not opts.isolated:
        return None
    if _RUNNER is None:
        from ..backend import IsolatedRunner

        _RUNNER = IsolatedRunner(timeout_s=opts.timeout_s)
    return _RUNNER


def load_source(src: Source, opts: Options) -> tuple[LeirModule, dict]:
    """Parse or translate one source; returns the module and the original's verification.

    Raises whatever the parser/translator raises; the caller records it as the program error."""
    if src.kind == "leir":
        return load_leir(src.path), {"against": "none"}
    from ..frontend import translate_file

    tr = translate_file(src.path)
    res = tr.verify(trials=opts.trials, seed=opts.seed, runner=_runner(opts), timeout_s=opts.timeout_s)
    ver = res.to_dict()
    ver["against"] = "pytorch"
    if not res.equal:
        raise RuntimeError(f"translation of {src.path} does not match PyTorch: {res.reason}")
    return tr.module, ver


def _entry(src: Source, module: LeirModule, original: dict, original_check: dict, rule, step, res,
           opts: Options, nvcc_ran: bool) -> dict:
    """One dictionary entry (design.md §6) for a verified step."""
    after_text = format_program(step.after.program)
    d = rule.difficulty
    return {
        "id": entry_id(original["leir"], after_text, rule.id),
        "program": module.signature.name,
        "source": str(src.path),
        "signature": _signature_dict(module),
        "strategy": {"id": rule.id, "name": rule.name, "category": rule.category},
        "difficulty": {"K": d["K"], "P": d["P"], "S": d["S"], "score": rule.score, "level": rule.level},
        "params": _jsonable(step.params),
        "site": _jsonable(step.site_description),
        "original": original,
        "transformed": _lowered(step.after, opts.with_cuda),
        "cot": step.cot,
        "verification": {**res.to_dict(), "nvcc": nvcc_ran},
        "original_verification": original_check,
        "seed": opts.seed,
    }


def _verified_steps(rule, module: LeirModule, src: Source, opts: Options, attempts: list[dict]):
    """Yield ``(step, VerifyResult)`` for up to ``opts.per_rule`` verified steps of ``rule``.

    Candidates (site x parameters) are tried in an order drawn from ``(seed, program key,
    rule id)``, at most ``opts.max_tries`` of them; every try is appended to ``attempts``."""
    from ..engine import NoMatch, apply_rule, list_candidates
    from ..verify import verify_pair

    from ..timelimit import time_limit

    rng = random.Random(f"{opts.seed}:{src.key}:{rule.id}")
    try:
        with time_limit(opts.timeout_s if opts.isolated else 0, f"rule {rule.id}: site enumeration"):
            cands = list_candidates(rule, module)
    except NoMatch:
        return
    except Exception as e:  # noqa: BLE001 - a rule that crashes on one program costs that rule only
        attempts.append({"rule": rule.id, "outcome": "match_error", "reason": f"{type(e).__name__}: {e}"})
        return
    order = list(range(len(cands)))
    rng.shuffle(order)
    kept = 0
    seen_after: set[str] = set()
    for ci in order[: opts.max_tries]:
        site, params = cands[ci]
        try:
            with time_limit(opts.timeout_s if opts.isolated else 0, f"rule {rule.id}: application"):
                step = apply_rule(rule, module, seed=rng.randrange(2**31), site=site, params=params)
        except Exception as e:  # noqa: BLE001
            attempts.append({"rule": rule.id, "outcome": "apply_error", "reason": f"{type(e).__name__}: {e}"})
            continue
        after_text = format_program(step.after.program)
        if after_text in seen_after:
            continue
        seen_after.add(after_text)
        res = verify_pair(module, step.after, trials=opts.trials, seed=opts.seed,
                          runner=_runner(opts), timeout_s=opts.timeout_s, nvcc=opts.nvcc)
        attempts.append({"rule": rule.id, "outcome": "equal" if res.equal else "failed", "reason": res.reason})
        if res.equal:
            yield step, res
            kept += 1
            if kept >= opts.per_rule:
                return


def process(src: Source, opts: Options) -> ProgramResult:
    """Generate the verified steps of one program (runs in a worker process)."""
    from ..backend import nvcc_path
    from ..rules import load_rule

    t0 = time.perf_counter()
    try:
        module, original_check = load_source(src, opts)
    except Exception as e:  # noqa: BLE001 - one bad program must not stop the run
        return ProgramResult(str(src.path), src.key, None, [], [],
                             error=f"{type(e).__name__}: {e}", seconds=time.perf_counter() - t0)
    nvcc_ran = bool(opts.nvcc and nvcc_path() is not None)
    entries: list[dict] = []
    attempts: list[dict] = []
    original = None  # lowered lazily: only programs with a verified step need it
    for rule_path in opts.rule_paths:
        rule = load_rule(rule_path)
        for step, res in _verified_steps(rule, module, src, opts, attempts):
            original = original or _lowered(module, opts.with_cuda)
            entries.append(_entry(src, module, original, original_check, rule, step, res, opts, nvcc_ran))
    return ProgramResult(str(src.path), src.key, module.signature.name, entries, attempts,
                         seconds=time.perf_counter() - t0)


def process_safe(src: Source, opts: Options) -> ProgramResult:
    """:func:`process` that turns any unexpected crash into a ProgramResult error."""
    try:
        return process(src, opts)
    except Exception as e:  # noqa: BLE001
        return ProgramResult(str(src.path), src.key, None, [], [],
                             error=f"internal error: {type(e).__name__}: {e}\n{traceback.format_exc(limit=3)}")


def _jsonable(x):
    return json.loads(json.dumps(x, default=str))


__all__ = ["Options", "ProgramResult", "entry_id", "load_source", "process", "process_safe"]
