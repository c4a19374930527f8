"""``report.md`` and PNG plots of an ``stp eval`` run: the Table 2 row (Diff / Build / Exec /
Equal pass rates of the first sample, paper §4.3), pass@k, and Fig. 5-style counts of the
strategies behind correct answers by category and difficulty level (matplotlib, Agg, no
pyplot; house style of :mod:`steptp.dataset.report`)."""

from __future__ import annotations

from pathlib import Path

from ..dataset.report import grouped_bars
from .metrics import STAGES

CATEGORIES = ("graph", "operator", "memory", "math")
LEVELS = ("easy", "medium", "difficult")
_COLORS = {"recognised": "#3182bd", "claimed": "#fdae6b", "easy": "#a1d99b", "medium": "#fdae6b",
           "difficult": "#e6550d"}


def _table(head, rows) -> str:
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    lines += ["| " + " | ".join(str(c).replace("|", "\\|") for c in r) + " |" for r in rows]
    return "\n".join(lines)


def _pct(x) -> str:
    return "-" if x is None else f"{100 * x:.1f} %"


def _figure(w: float = 7.0, h: float = 4.0):
    from matplotlib.figure import Figure  # no pyplot: no global state, Agg canvas on savefig

    return Figure(figsize=(w, h), dpi=100, layout="constrained")


def make_plots(outdir: Path, s: dict) -> dict[str, str]:
    """Write ``stages.png`` (Table 2 as bars), ``strategies.png`` (Fig. 5: (a) category, (b)
    level) and ``by_strategy.png``; returns ``{name: file name}``."""
    files = {}
    fig = _figure(6, 3.5)
    ax = fig.add_subplot()
    vals = [100 * s[k] for k in STAGES]
    bars = ax.bar([k.capitalize() for k in STAGES], vals, color="#31a354")
    ax.bar_label(bars, labels=[f"{v:.1f} %" for v in vals], fontsize=8)
    ax.set_ylim(0, 110)
    ax.set_ylabel("% of cases (first sample)")
    ax.set_title(f"Single-step pass rates ({s['cases']} cases)")
    fig.savefig(outdir / "stages.png", format="png")
    files["stages"] = "stages.png"

    fig = _figure(9, 3.5)
    ax1, ax2 = fig.subplots(1, 2)
    grouped_bars(ax1, list(CATEGORIES), {k: [s["by_category"][k].get(c, 0) for c in CATEGORIES]
                                         for k in ("recognised", "claimed")}, colors=_COLORS)
    ax1.set_title("(a) strategies of correct answers per category", fontsize=9)
    grouped_bars(ax2, list(LEVELS), {k: [s["by_level"][k].get(lv, 0) for lv in LEVELS]
                                     for k in ("recognised", "claimed")}, colors=_COLORS)
    ax2.set_title("(b) per difficulty level", fontsize=9)
    ax1.margins(y=0.2)
    ax2.margins(y=0.2)
    fig.savefig(outdir / "strategies.png", format="png")
    files["strategies"] = "strategies.png"

    names = sorted(set(s["by_strategy"]["recognised"]) | set(s["by_strategy"]["claimed"]))
    if names:
        fig = _figure(7, max(2.5, 0.35 * len(names) + 1.2))
        ax = fig.add_subplot()
        grouped_bars(ax, names, {k: [s["by_strategy"][k].get(n, 0) for n in names] for k in ("recognised", "claimed")},
                     horizontal=True, colors=_COLORS)
        ax.set_xlabel("samples passing Equal")
        ax.set_title("Strategies of correct answers")
        fig.savefig(outdir / "by_strategy.png", format="png")
        files["by_strategy"] = "by_strategy.png"
    return files


def format_report(s: dict, files: dict[str, str] | None = None) -> str:
    """The markdown text of a summary (:func:`steptp.eval.runner.summarise`)."""
    run = s.get("run", {})
    who = run.get("model") or run.get("answers") or run.get("policy", "?")
    L = [f"# stp eval: {who}", ""]
    L.append(f"{s['cases']} cases, {s['samples']} sample(s) each, {run.get('trials', 3)} seeded trials per check"
             f" (paper §4.3). Rates are the fraction of cases whose first sample passes.")
    L.append("")
    L.append("## Table 2 row (single attempt)")
    L.append("")
    L.append(_table(["policy / model", "Diff", "Build", "Exec", "Equal"],
                    [[who] + [f"{100 * s[k]:.1f} %" for k in STAGES]]))
    L.append("")
    L.append(f"Parsed answers: {_pct(s.get('parse'))}; request errors: {s.get('request_errors', 0)}; "
             f"internal errors: {s.get('internal_error_samples', 0)} sample(s), {s.get('internal_errors', 0)} case(s) "
             f"with no other result; skipped inputs: {len(s.get('skipped', []))}.")
    if s["samples"] > 1:
        L += ["", "## pass@k (Chen et al. 2021, unbiased estimator)", ""]
        ks = sorted(s["pass_at_k"]["equal"], key=int)
        L.append(_table(["stage"] + [f"k={k}" for k in ks],
                        [[st] + [_pct(s["pass_at_k"][st][k]) for k in ks] for st in STAGES]))
    L += ["", "## Strategies of correct answers (Fig. 5)", ""]
    L.append(_table(["category", "recognised", "claimed"],
                    [[c, s["by_category"]["recognised"].get(c, 0), s["by_category"]["claimed"].get(c, 0)]
                     for c in CATEGORIES]))
    L.append("")
    L.append(_table(["level", "recognised", "claimed"],
                    [[lv, s["by_level"]["recognised"].get(lv, 0), s["by_level"]["claimed"].get(lv, 0)]
                     for lv in LEVELS]))
    L.append("")
    L.append(f"Distinct strategies: {s['distinct_strategies']['recognised']} recognised, "
             f"{s['distinct_strategies']['claimed']} claimed.")
    L += ["", "## Claimed vs recognised strategy (answers passing Diff)", ""]
    L.append(f"Agreement (claimed rule among the recognised): {_pct(s.get('agreement'))}; "
             f"unrecognised answers: {s.get('unrecognised', 0)}.")
    L.append("")
    rows = [[r["claimed"], r["recognised"], r["count"]] for r in s["claimed_vs_recognised"][:30]]
    L.append(_table(["claimed", "recognised", "samples"], rows) if rows else "(none)")
    if s.get("reasons"):
        L += ["", "## First-failure reasons (first samples)", ""]
        L.append(_table(["reason", "cases"], [[r["reason"], r["count"]] for r in s["reasons"]]))
    if files:
        L += ["", "## Plots", ""]
        L += [f"![{k}]({v})" for k, v in files.items()]
    return "\n".join(L) + "\n"


def write_report(outdir: str | Path, summary: dict, plots: bool = True) -> str:
    """Write ``outdir/report.md`` (and the plots unless ``plots`` is False); returns the text."""
    out = Path(outdir)
    files = make_plots(out, summary) if plots else None
    text = format_report(summary, files)
    tmp = out / "report.md.tmp"
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(out / "report.md")
    return text


__all__ = ["format_report", "make_plots", "write_report"]
