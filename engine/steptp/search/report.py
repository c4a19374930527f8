"""``report.md`` of a search run (a Table 3/4-style row per algorithm, paper §4.4, and a plot of
best speedup vs. samples) over the summaries under its directory."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

from ..io import write_text_atomic as _write_atomic


def load_summaries(outdir: str | Path) -> list[dict]:
    """Every ``summary.json`` at ``outdir`` and one level below."""
    out = Path(outdir)
    files = ([out / "summary.json"] if (out / "summary.json").exists() else []) + sorted(out.glob("*/summary.json"))
    res = []
    for f in files:
        try:
            res.append(json.loads(f.read_text(encoding="utf-8")))
        except (OSError, json.JSONDecodeError):
            continue
    return res


def table_rows(summaries: list[dict]) -> list[dict]:
    """One row per (algorithm, policy, rank, device): paper Table 3 and 4 columns."""
    groups: dict[tuple, list[dict]] = {}
    for sm in summaries:
        groups.setdefault((sm["algorithm"], sm["policy"], sm.get("rank"), _device(sm)), []).append(sm)
    rows = []
    for (alg, pol, rank, tgt), g in sorted(groups.items(), key=lambda kv: [str(x) for x in kv[0]]):
        sp = [x["speedup"] for x in g]
        smp = [x["samples"] for x in g]
        st = [x["strategies"] for x in g]
        eager = [x["speedup_vs_eager"] for x in g if x.get("speedup_vs_eager")]
        conf = [_confirmed(x) for x in g]
        avg_s, avg_n = statistics.mean(sp), statistics.mean(smp)
        rows.append({"algorithm": alg, "policy": pol + (f"/{rank}" if rank else ""), "device": tgt,
                     "target": tgt,  # the former name of "device"
                     "programs": len(g), "avg_samples": avg_n, "max_samples": max(smp), "avg_speedup": avg_s,
                     "median_speedup": statistics.median(sp), "max_speedup": max(sp),
                     "efficiency": avg_s / avg_n if avg_n else 0.0, "avg_strategies": statistics.mean(st),
                     "max_strategies": max(st),
                     "avg_speedup_vs_eager": statistics.mean(eager) if eager else None,
                     "avg_confirmed_speedup": statistics.mean(conf),
                     "wall_s": sum(x.get("seconds", {}).get("total", 0.0) for x in g)})
    return rows


def _us(x) -> str:
    return "n/a" if x is None else f"{x:.2f}"


def _device(sm: dict) -> str:
    """The device of a summary (``target`` in summaries written before ``device``)."""
    return sm.get("device") or sm.get("target") or "cpu"


def _confirmed(sm: dict) -> float:
    """The re-timed speedup of a summary (1 when the best is the root or it failed)."""
    c = sm.get("confirmed") or {}
    return c.get("speedup") or (sm["speedup"] if not c and sm["best"]["node"] != 0 else 1.0)


def _plot(summaries: list[dict], path: Path) -> bool:
    try:
        from matplotlib.figure import Figure
    except ImportError:
        return False
    groups: dict[str, list[dict]] = {}
    for sm in summaries:
        key = f"{sm['algorithm']} / {sm['policy']}" + (f"/{sm['rank']}" if sm.get("rank") else "")
        groups.setdefault(key, []).append(sm)
    fig = Figure(figsize=(6.4, 4.0))
    ax = fig.add_subplot(1, 1, 1)
    for key, g in sorted(groups.items()):
        top = max((x["samples"] for x in g), default=0)
        xs, ys = [0], [1.0]
        for n in range(1, top + 1):
            vals = []
            for sm in g:
                best = 1.0
                for a, b in sm.get("curve", []):
                    if a <= n:
                        best = max(best, b)
                vals.append(best)
            xs.append(n)
            ys.append(statistics.mean(vals))
        ax.plot(xs, ys, marker=".", label=f"{key} ({len(g)})")
    ax.set_xlabel("verified samples")
    ax.set_ylabel("best speedup (mean over programs)")
    ax.set_title("Best speedup vs. samples")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return True


def write_report(outdir: str | Path, run_info: dict | None = None) -> Path:
    """``OUTDIR/report.md`` (+ ``speedup_vs_samples.png``) over every summary under ``outdir``;
    ``run_info`` (:func:`run_summary`): also the programs of the run that failed."""
    out = Path(outdir)
    out.mkdir(parents=True, exist_ok=True)
    sms = load_summaries(out)
    lines = ["# stp search report", "",
             f"{len(sms)} search(es). Speedup = Runtime_root / Runtime_best; samples = candidates that verified "
             "Equal against the root (3 random + 2 ordered trials) and were timed; efficiency = average speedup / "
             "average samples (paper §4.4, Tables 3-4). Re-timed: root and best timed again with 10 measurements each "
             "(the best of many noisy 3-measurement samples overstates its speedup).", "",
             "| algorithm | policy | device | programs | avg # samples | max # samples | avg speedup | median speedup "
             "| max speedup | efficiency | avg # strategies | max # strategies | avg re-timed speedup | avg speedup vs eager "
             "| wall s |",
             "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    if run_info and run_info.get("stopped"):
        lines[4:4] = [f"The run was stopped ({run_info['stopped']}): the summaries are partial; rerun the same "
                      "command to resume.", ""]
    if run_info and run_info.get("failed"):
        lines[4:4] = [f"{len(run_info['failed'])} of {run_info['programs']} program(s) failed: "
                      f"{run_info['internal_errors']} with an internal error, {run_info['input_errors']} bad input "
                      "(see run_summary.json).", ""]
    for r in table_rows(sms):
        ve = "n/a" if r["avg_speedup_vs_eager"] is None else f"{r['avg_speedup_vs_eager']:.2f}"
        lines.append(f"| {r['algorithm']} | {r['policy']} | {r['device']} | {r['programs']} | {r['avg_samples']:.2f} | "
                     f"{r['max_samples']} | {r['avg_speedup']:.2f} | {r['median_speedup']:.2f} | {r['max_speedup']:.2f} | "
                     f"{r['efficiency']:.2f} | {r['avg_strategies']:.2f} | {r['max_strategies']} | "
                     f"{r['avg_confirmed_speedup']:.2f} | {ve} | "
                     f"{r['wall_s']:.0f} |")
    lines += ["", "## Programs", "",
              "| program | algorithm | samples | speedup | re-timed | strategies | root µs | best µs | vs eager "
              "| best trajectory |",
              "|---|---|---:|---:|---:|---:|---:|---:|---:|---|"]
    for sm in sorted(sms, key=lambda x: (x["program"], x["algorithm"])):
        traj = " → ".join(str(t["strategy"]) for t in sm["trajectory"][1:]) or "(root)"
        ve = sm.get("speedup_vs_eager")
        lines.append(f"| {sm['program']} | {sm['algorithm']} | {sm['samples']} | {sm['speedup']:.2f} | "
                     f"{_confirmed(sm):.2f} | "
                     f"{sm['strategies']} | {_us(sm['root_time_us'])} | {_us(sm['best']['time_us'])} | "
                     f"{'n/a' if ve is None else f'{ve:.2f}'} | {traj} |")
    if sms and _plot(sms, out / "speedup_vs_samples.png"):
        lines += ["", "![best speedup vs samples](speedup_vs_samples.png)"]
    path = out / "report.md"
    _write_atomic(path, "\n".join(lines) + "\n")
    return path


__all__ = ["load_summaries", "table_rows", "write_report"]
