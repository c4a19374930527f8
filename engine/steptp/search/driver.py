"""The driver of one program's search (:func:`search_program`): build the evaluator, the policy
and the scorer from the configuration, run the algorithm (resumed from its caches when its
runner answers in rounds), re-time the best, and write ``summary.json``, ``best.leir``,
``root.leir`` and ``tree.jsonl`` (the fields: :mod:`steptp.search.run`). Whatever depends on
the runner's kind is the runner's (:class:`steptp.runner.base.Runner`)."""

from __future__ import annotations

import json
import time
from pathlib import Path

from ..io import write_text_atomic as _write_atomic
from ..leir import LeirModule, save_leir
from .algorithms import ALGORITHMS, run_algorithm
from .config import SIGNALLED, SearchConfig, SearchInputError
from .core import Search
from .factories import make_policy, make_scorer
from .inputs import load_program


def _strategy_names(strategy: str | None) -> list[str]:
    return [s for s in (strategy or "").split("+") if s]


def summarize(s: Search, cfg: SearchConfig, name: str, source: str, seconds: float) -> dict:
    """The ``summary.json`` dict of a finished search."""
    from ..engine.jsonify import plain

    traj = s.trajectory()
    strategies = sorted({x for n in traj[1:] for x in _strategy_names(n.strategy)})
    samples = s.samples
    best = s.best
    speedup = best.speedup if samples and best.speedup else 1.0
    counts: dict[str, int] = {}
    for n in s.nodes[1:]:
        counts[n.status] = counts.get(n.status, 0) + 1
    return {
        "program": name, "source": source, "algorithm": cfg.algorithm, "policy": cfg.policy,
        "rank": cfg.rank_kind if cfg.policy == "engine" else None, "device": cfg.device,
        "target": cfg.device,  # the former name of "device", kept for readers of older summaries
        "seed": cfg.seed,
        "params": cfg.algorithm_params(),
        "samples": samples, "speedup": speedup, "strategies": len(strategies), "strategy_list": strategies,
        "efficiency": speedup / samples if samples else 0.0,
        "root_time_us": s.root.time_us,
        "best": {"node": best.id, "depth": best.depth, "time_us": best.time_us, "speedup": speedup,
                 "leir": best.text},
        "trajectory": [{"step": i, "node": n.id, "strategy": n.strategy, "site": n.site, "params": plain(n.params),
                        "leir": n.text, "time_us": n.time_us, "speedup": n.speedup, "cot": n.cot}
                       for i, n in enumerate(traj)],
        "curve": [[a, b] for a, b in s.curve],
        "nodes": len(s.nodes), "counts": counts, "noop": counts.get("noop", 0),
        "seconds": {**{k: round(v, 3) for k, v in s.timer.seconds.items()}, "total": round(seconds, 3)},
    }


def search_program(program, outdir: str | Path, cfg: SearchConfig, *, client=None, rules=None,
                   name: str | None = None, timer=None, runner=None) -> dict:
    """Search one program (a path to ``.leir``/``.py``, or a LeirModule) and write
    ``summary.json``, ``best.leir`` and ``tree.jsonl`` into ``outdir``; returns the summary.
    ``timer``: optional ``fn(module) -> µs`` replacing the default timing. ``runner``: a
    :class:`steptp.runner.base.Runner` (default: the ``local`` runner on ``cfg.device``).

    With a runner that answers later (``pack``) the search may stop at a batch whose
    measurements are pending: it then saves its caches (:class:`steptp.search.replay.SearchCache`)
    and returns ``{"program", "status": "pending"}`` without a summary; run again once the
    runner has the results, it replays from the start (:mod:`steptp.search.replay`) and goes on."""
    from tqdm import tqdm

    from ..runner.base import Pending, SearchOutcome
    from ..runner import kinds
    from .evaluate import Measure, RootFailed
    from .replay import CachedPolicy, SearchCache

    if cfg.algorithm not in ALGORITHMS:
        raise SearchInputError(f"unknown algorithm {cfg.algorithm!r}; one of {', '.join(ALGORITHMS)}")
    t_start = time.perf_counter()
    tr = None
    if isinstance(program, LeirModule):
        root, source = program, "<module>"
    else:
        path = Path(program)
        # measured elsewhere (a GPU node at KernelBench size): the translation needs shapes only
        root, tr = load_program(path, meta=runner is not None and not runner.measures_here)
        source = str(path)
    from ..faults import inject

    inject(source)  # STP_FAULT_INJECT (tests): an unexpected crash in this program's search
    name = name or root.signature.name
    out = Path(outdir)
    out.mkdir(parents=True, exist_ok=True)
    if runner is None:
        runner = kinds.create("local", device=cfg.device, timer=timer, retime_rounds=max(1, cfg.confirm_repeat))
    cache = SearchCache(out, {"root": root.text(), "algorithm": cfg.algorithm, "params": cfg.algorithm_params(),
                              "policy": cfg.policy, "rank": cfg.rank, "seed": cfg.seed, "per_rule": cfg.per_rule,
                              "lookahead": cfg.lookahead, "expand": cfg.expand,
                              "device": cfg.device, **runner.identity()})
    entry = runner.entry(name, root, source if tr is not None else None, cfg.seed)
    try:
        measure = Measure(root, device=cfg.device, trials=cfg.trials, seed=cfg.seed, timeout_s=cfg.timeout_s,
                          timer=timer, runner=runner, name=name, verified=cache.verified, entry=entry)
    except RootFailed as e:
        raise SearchInputError(f"{source}: {e}") from None
    scorer = make_scorer(cfg, [root.text()])
    # on cuda the engine proposes the ranked programs that verify (its multi-step proposals reach
    # further than one step, and a step that does not build would cut them all to one prefix)
    check = (lambda m: measure.verify(m)["equal"]) if cfg.device == "cuda" else None
    policy = CachedPolicy(lambda: make_policy(cfg, root, client, rules, scorer, check=check),
                          cache.proposals, root.signature)
    bar = tqdm(desc=f"{name} {cfg.algorithm}", unit="sample", disable=not cfg.progress, leave=False)
    deadline = time.monotonic() + cfg.time_limit_s if cfg.time_limit_s else None
    s = Search(root, policy, measure, max_samples=cfg.max_samples, progress=bar, scorer=scorer, deadline=deadline)
    restore = _stop_on_sigterm(s)
    try:
        params = cfg.algorithm_params()
        run_algorithm(cfg.algorithm, s, **params)
    except Pending:
        cache.save()
        return {"program": name, "status": "pending"}
    except KeyboardInterrupt:
        s.request_stop("interrupted (SIGINT)")  # keep what the search has: the summary below
    finally:
        restore()
        bar.close()
        policy.close()
    s.root.time_us = s.root.time_us or measure.runner.root_time_us(name, root)
    summary = summarize(s, cfg, name, source, time.perf_counter() - t_start)
    summary.update(runner.identity())
    summary["speedup_best_sample"] = summary["speedup"]
    if s.stop_reason:
        summary["stopped"] = s.stop_reason
    signalled = s.stop_reason.startswith(SIGNALLED)
    retime = None
    if signalled and s.best.id != 0:
        # no time to re-time after a signal: the best sample is kept, never reported as a speedup
        summary["speedup"] = 1.0
        summary["best"]["speedup"] = 1.0
        summary["unconfirmed_best"] = summary["speedup_best_sample"]
    elif s.best.id != 0 and runner.retimes and cfg.confirm_repeat:
        try:
            retime = measure.retime(s.best.module, s.best.steps)
        except Pending:
            cache.save()
            return {"program": name, "status": "pending"}
        summary["confirmed"] = c = confirmed_record(retime, cfg.confirm_repeat)
        # the headline is the re-time, and only an improvement that the interval supports
        summary["speedup"] = c["speedup"] if c.get("verdict") == "faster" else 1.0
        summary["best"]["speedup"] = summary["speedup"]
        summary["efficiency"] = summary["speedup"] / summary["samples"] if summary["samples"] else 0.0
        if c.get("verdict") != "faster":
            summary["reason"] = (f"the re-time did not reproduce a speedup (interval {c.get('ci')})"
                                 if retime.status == "equal" else f"the re-time failed: {retime.reason}")
    summary.update(runner.summary_fields(SearchOutcome(name, s.root, s.best, s.nodes, retime, summary, tr,
                                                       cfg.device)))
    if scorer is not None:
        summary["scorer"] = {"kind": type(scorer).__name__, **({"model": cfg.rank_model}
                                                                if cfg.rank_kind == "model" else {}),
                             **{k: (round(v, 3) if isinstance(v, float) else v)
                                for k, v in (getattr(scorer, "stats", None) or {}).items()}}
    inner = policy.inner
    if hasattr(inner, "log"):
        summary["llm_requests"] = inner.log
    if getattr(inner, "skipped", None):
        summary["skipped_candidates"] = dict(inner.skipped)
    best = s.best
    save_leir(LeirModule(root.signature, best.module.program), out / "best.leir")
    save_leir(root, out / "root.leir")
    _write_atomic(out / "tree.jsonl", "".join(json.dumps(n.record()) + "\n" for n in s.nodes))
    _write_atomic(out / "summary.json", json.dumps(summary, indent=1) + "\n")
    return summary


def confirmed_record(r, repeat: int) -> dict:
    """The summary's ``confirmed`` record of a runner's re-time (:class:`steptp.runner.base.MeasureResult`):
    ``{repeat, root_time_us, best_time_us, speedup, ci, verdict}`` or ``{error}``."""
    if r.status != "equal" or r.speedup is None:
        return {"error": r.reason or r.status}
    return {"repeat": r.extra.get("rounds", repeat), "root_time_us": r.root_us, "best_time_us": r.time_us,
            "speedup": r.speedup, "ci": list(r.ci) if r.ci else None, "verdict": r.verdict}


def _stop_on_sigterm(s: Search):
    """While the search runs, SIGTERM (a job queue's time limit, ``timeout``) asks it to stop
    at its next check instead of killing the process, so its summary is written; returns the
    function that restores the previous handler. A no-op outside the main thread."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        return lambda: None
    previous = signal.getsignal(signal.SIGTERM)
    signal.signal(signal.SIGTERM, lambda signum, frame: s.request_stop("SIGTERM"))
    return lambda: signal.signal(signal.SIGTERM, previous)


