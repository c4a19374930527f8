"""The summary fields of a search measured through packs (:class:`steptp.runner.pack.PackRunner`,
issue 44): per program (:func:`remote_fields`) the node's device, the like-with-like baselines
the node measured against the re-timed best and the speed of light; per run
(:func:`gpu_aggregate`) ``gpu_summary.json``.

A search outcome's nodes (:class:`steptp.runner.base.SearchOutcome`) are the search's own:
``text``, ``status``, ``module``, ``time_us``, ``id``; nothing here imports the search.
"""

from __future__ import annotations

import math
import statistics
from pathlib import Path

from .base import SearchOutcome, text_key


#: Per-program summary fields of a GPU search (issue 44), each a number or null with
#: ``<field>_reason``: our best's kernels and call from Python, the original's kernels, PyTorch
#: eager from Python and in a CUDA graph, torch.compile (default, max-autotune-no-cudagraphs).
BASELINE_FIELDS = ("best_us", "best_py_us", "original_us", "eager_us", "eager_graph_us", "compile_us",
                   "compile_autotune_us", "compile_s")


def remote_fields(runner, outcome: SearchOutcome) -> dict:
    """A remote runner's extra summary fields: ``rounds`` (complete rounds of the run), the
    node's device, the like-with-like baselines the node measured against the re-timed best
    (:data:`BASELINE_FIELDS`, their ratios with 95 % intervals: ``python -m steptp.gpu.run
    ... --baselines``), and the speed of light (:func:`steptp.roofline.sol_fields` for the GPU
    the node reports, an H200 for the simulated device). Without the node's baselines,
    ``speedup_vs_eager`` is PyTorch eager from Python over the original's kernels (timed
    interleaved on the node) times the re-timed speedup, and ``speedup_vs_eager_how`` says
    that it is not like with like."""
    from ..roofline import gpu_model_for, roofline, sol_fields  # noqa: PLC0415

    s, retime, summary = outcome, outcome.retime, outcome.summary
    extra = dict((retime.extra if retime is not None else {}) or {})
    lookup = runner.result
    for n in s.nodes:  # the device and eager of any measured candidate
        if extra.get("eager") and extra.get("device_name"):
            break
        rec = lookup(f"{summary['program']}:{text_key(n.text)}") if n.status == "equal" else None
        if rec is not None:
            extra = {**{k: v for k, v in rec.extra.items() if k != "baselines"},
                     **{k: v for k, v in extra.items() if v is not None}}
    device = extra.get("device_name") or extra.get("device")
    out: dict = {"rounds": runner.rounds_done, "gpu_device": device}
    base = dict(extra.get("baselines") or {})
    if base:
        base = {k: v for k, v in base.items() if k not in ("speedup", "speedup_ci", "speedup_reason")}
        out.update(base)  # (speedup_vs_original: the baseline session's own figure; speedup: the re-time's)
    else:
        why = ("no re-timed best (nothing beat the original)" if retime is None else
               "the node measured no baselines (python -m steptp.gpu.run ... --baselines)")
        for f in BASELINE_FIELDS:
            out[f] = None
            out[f"{f}_reason"] = why
        if retime is not None and retime.status == "equal":
            out["best_us"], out["original_us"] = retime.time_us, retime.root_us
            out.pop("best_us_reason"), out.pop("original_us_reason")
        elif s.root.time_us:
            out["original_us"] = s.root.time_us
            out.pop("original_us_reason")
    eager = extra.get("eager") or {}
    if out.get("speedup_vs_eager") is None and eager.get("eager_us") and eager.get("original_us"):
        out["speedup_vs_eager"] = float(eager["eager_us"]) / float(eager["original_us"]) * float(summary["speedup"])
        out["speedup_vs_eager_how"] = ("PyTorch eager from Python over the original's kernels (timed interleaved on "
                                       "the node) times the re-timed speedup: not like with like")
        out.pop("speedup_vs_eager_reason", None)
    elif out.get("speedup_vs_eager") is None:
        out["speedup_vs_eager"] = None
        out.setdefault("speedup_vs_eager_reason", "the node did not time PyTorch eager (no torch there, or the "
                                                  "program is not from a .py file)")
    out["eager_reason"] = out.get("speedup_vs_eager_reason", "") if out.get("speedup_vs_eager") is None else ""
    gpu = gpu_model_for(device or "")
    try:
        if gpu is None:
            raise ValueError(f"no datasheet figures for the node's device {device!r} (stp roofline --help)")
        roof = roofline(s.root.module, gpu)
    except Exception as e:  # noqa: BLE001 - the speed of light is informative; say why it is missing
        out["sol_us"], out["sol_reason"] = None, f"{type(e).__name__}: {str(e)[:200]}"
    else:
        best_us = out.get("best_us") or (s.best.time_us if s.best.id else s.root.time_us)
        out.update(sol_fields(roof, best_us=best_us, original_us=out.get("original_us") or s.root.time_us,
                              eager_graph_us=out.get("eager_graph_us"), compile_us=out.get("compile_us")))
        for f in ("fraction_of_sol", "fraction_of_sol_original", "fraction_of_sol_eager_graph",
                  "fraction_of_sol_compile"):
            if out.get(f) is None:
                out[f"{f}_reason"] = "its time is not known (see the baseline fields' reasons)"
    return out


def _geo(xs) -> float | None:
    xs = [x for x in xs if isinstance(x, (int, float)) and x > 0]
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else None


def gpu_aggregate(summaries: list[dict], out: Path) -> dict:
    """``OUT/gpu_summary.json`` of a GPU search (issue 44's evidence): the programs' summaries, the
    median and geometric mean of the re-timed speedup over the original, the geometric mean of
    each like-with-like ratio over the programs that have it (``speedup_vs_eager``,
    ``speedup_vs_eager_graph``, ``speedup_vs_compile``, ``speedup_vs_compile_autotune``, with
    how many), the median ``fraction_of_sol`` (ours and the baselines'), and how well the cost
    models ranked what the node measured (:func:`steptp.cost_model.samples.ranking_quality`)."""
    from ..cost_model.samples import ranking_quality  # noqa: PLC0415

    agg: dict = {"programs": summaries}
    sp = [s.get("speedup") for s in summaries if s.get("speedup")]
    agg["median_speedup"] = statistics.median(sp) if sp else None
    agg["geomean_speedup"] = _geo(sp)
    for r in ("speedup_vs_eager", "speedup_vs_eager_graph", "speedup_vs_compile", "speedup_vs_compile_autotune"):
        xs = [s.get(r) for s in summaries if s.get(r)]
        agg[f"geomean_{r}"], agg[f"with_{r}"] = _geo(xs), len(xs)
    for f in ("fraction_of_sol", "fraction_of_sol_original", "fraction_of_sol_eager_graph",
              "fraction_of_sol_compile"):
        xs = [s.get(f) for s in summaries if s.get(f) is not None]
        agg[f"median_{f}"] = statistics.median(xs) if xs else None
    try:
        agg["ranking"] = ranking_quality(out)
    except Exception as e:  # noqa: BLE001 - informative; a missing LightGBM or a damaged tree is said
        agg["ranking"] = {"error": f"{type(e).__name__}: {str(e)[:200]}"}
    return agg


__all__ = ["BASELINE_FIELDS", "remote_fields", "gpu_aggregate"]
