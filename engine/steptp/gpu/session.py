"""The node's session after the entries ran (:mod:`steptp.gpu.run`): ``compute-sanitizer`` on
each program's re-timed best (:mod:`steptp.gpu.sanitizer`), then the baselines of every
program against our best (:mod:`steptp.gpu.baselines`), each phase under the run's deadline.

Files (through :mod:`steptp.runner.record`): the sanitizer checks are written into the
records of ``RESULTS/retime.jsonl`` (and ``results.jsonl``) of the entries they checked
(a finding makes the record's status ``sanitizer``); the baselines go to
``RESULTS/baselines.jsonl``, one :class:`~steptp.runner.record.ProgramBaselines` per program.
"""

from __future__ import annotations

import time
from pathlib import Path

from ..runner.pool import shared
from ..runner.record import ProgramBaselines, read_baselines, read_entries, write_jsonl
from . import sanitizer as san
from .baselines import run_baselines, write_baselines


def _refdir(results: Path) -> str:
    return str(results / "references")


def check_best(pack: str, results: str | Path, manifest: dict, *, cap_s: float = 120.0,
               deadline: float | None = None, jobs: int = 4) -> dict:
    """Run the sanitizer checks (:func:`steptp.gpu.sanitizer.check_function`, each capped at
    ``cap_s`` seconds, ``jobs`` processes at once: nothing is timed meanwhile) over every
    Equal record of ``RESULTS/retime.jsonl`` (each program's re-timed best), write the checks
    into those records and into the same entries of ``results.jsonl``. Where no check can
    run (simulated device, no tool) the records get ``sanitizer`` None and that reason.
    ``deadline``: a ``time.perf_counter()`` value. Returns ``{"tool", "checked", "findings",
    "no_verdict", "reason", "seconds"}``."""
    from concurrent.futures import ThreadPoolExecutor  # noqa: PLC0415

    t0 = time.perf_counter()
    results = Path(results)
    rt = results / "retime.jsonl"
    recs = read_entries(rt)
    why = san.absent_reason()
    tool = None if why else san.find_tool()
    entries = {e["id"]: e for e in manifest["entries"]}
    todo = [r for r in recs.values() if r.status == "equal" and r.id in entries]
    for r in todo:
        r.sanitizer, r.sanitizer_reason = None, why or "deadline: the node's time ran out before this check"

    def one(r) -> None:
        left = None if deadline is None else deadline - time.perf_counter()
        if left is not None and left < 2.0:
            return
        r.sanitizer = san.check_function(pack, _refdir(results), r.program, entries[r.id]["transformed"], tool, cap_s,
                                         deadline)
        r.sanitizer_reason = "" if r.sanitizer_clean() is not None else \
            "; ".join(f"{c.tool}: {c.reason}" for c in r.sanitizer if c.reason) or "no verdict"

    if not why and todo:
        with ThreadPoolExecutor(max_workers=max(1, jobs)) as ex:
            list(ex.map(one, todo))
    checked = sum(r.sanitizer is not None for r in todo)
    findings = sum(r.sanitizer_clean() is False for r in todo)
    no_verdict = sum(r.sanitizer is not None and r.sanitizer_clean() is None for r in todo)
    if recs:
        write_jsonl(rt, recs.values())
        main = read_entries(results / "results.jsonl")
        for i, r in recs.items():
            if i in main:
                main[i].sanitizer, main[i].sanitizer_reason = r.sanitizer, r.sanitizer_reason
        write_jsonl(results / "results.jsonl", main.values())
    return {"tool": tool, "checked": checked, "findings": findings, "no_verdict": no_verdict, "reason": why or "",
            "seconds": round(time.perf_counter() - t0, 2)}


def choose_best(results: str | Path, manifest: dict, verdicts: dict | None = None) -> dict:
    """Per program of the manifest, our best to measure the baselines against: ``(manifest
    entry, True)`` for the re-timed record (``retime.jsonl``, else ``results.jsonl``) with
    the highest speedup whose interval lies above 1, Equal, not rejected by the sanitizer and
    with a clean sanitizer verdict where the tool can run (:func:`steptp.gpu.sanitizer.best_verdict`:
    a faster record the tool could have checked but did not is passed over for the next one);
    else ``(an entry, False)``: the original, when it ran Equal on the device; programs with
    neither are left out. ``verdicts``, when given, receives per program the chosen best's
    verdict (``"clean"``, or ``"unchecked: ..."`` where no tool can run) or, when the
    original stands because every faster record lacked a verdict, ``"no best: <why>"``."""
    results = Path(results)
    entries = {e["id"]: e for e in manifest["entries"]}
    timed = read_entries(results / "retime.jsonl") or read_entries(results / "results.jsonl")
    main = read_entries(results / "results.jsonl")
    unchecked = san.unchecked_label()
    out: dict = {}
    cands: dict[str, list] = {}
    for r in timed.values():
        t = r.timing
        if r.status != "equal" or r.id not in entries or t is None or not t.ci or t.ci[0] <= 1.0:
            continue
        cands.setdefault(r.program, []).append(r)
    for k, rs in cands.items():
        rs.sort(key=lambda r: -r.timing.speedup)  # stable: the first of equal speedups stays first
        passed = []
        for r in rs:
            v = san.best_verdict(r, unchecked)
            if v is not None:
                out[k] = (entries[r.id], True)
                if verdicts is not None:
                    verdicts[k] = v
                break
            passed.append(f"{r.id}: {san.no_verdict_reason(r)}")
        else:
            if verdicts is not None:
                verdicts[k] = f"no best: {passed[0]}"[:500]
    for r in main.values():
        if r.program not in out and r.original.equal and r.id in entries:
            out[r.program] = (entries[r.id], False)
    return out


def measure_baselines(pack: str, results: str | Path, manifest: dict, *, device_name: str, rounds: int = 8,
                      min_ms: float = 2.0, eager_cap_s: float = 120.0, compile_cap_s: float = 300.0,
                      compile_modes: tuple = (), torch_ok: bool = True, deadline: float | None = None,
                      programs: set | None = None) -> list[ProgramBaselines]:
    """The baselines of every program (``programs``: only these keys) against
    :func:`choose_best`'s best, in one GPU worker (pool kind ``gpu-baselines``), written to
    ``RESULTS/baselines.jsonl`` (what an earlier call measured there for the same best is
    kept). The best's sanitizer verdict (:func:`choose_best`) is recorded as ``best_sanitizer``.
    Options: :func:`steptp.gpu.baselines.run_baselines`."""
    results = Path(results)
    progs = {k: v for k, v in manifest["programs"].items() if programs is None or k in programs}
    runner = shared("gpu-baselines", eager_cap_s, preload="runtime")
    verdicts: dict = {}
    best = choose_best(results, manifest, verdicts)
    try:
        out = run_baselines(pack, _refdir(results), progs, best, device_name=device_name, verdicts=verdicts,
                            rounds=rounds, min_ms=min_ms, eager_cap_s=eager_cap_s, compile_cap_s=compile_cap_s,
                            compile_modes=compile_modes, torch_ok=torch_ok, deadline=deadline, runner=runner,
                            checkpoint=lambda recs: write_baselines(results / "baselines.jsonl", recs),
                            previous=read_baselines(results))
    finally:
        runner.close()
    write_baselines(results / "baselines.jsonl", out)
    return out


def baselines_table(records: list[ProgramBaselines]) -> str:
    """A markdown table of the baselines (µs; ratios: baseline / ours, > 1 ours faster)."""
    def us(x):
        return "-" if x is None else f"{x:.1f}"

    def ratio(b: ProgramBaselines, k: str) -> str:
        v = b.ratios.get(k)
        return "-" if v is None else f"{v.speedup:.2f} [{v.ci[0]:.2f}, {v.ci[1]:.2f}]"

    lines = ["## Baselines, like with like (µs per call; ratio = baseline / ours, 95 % interval)", "",
             "best: our best's kernels (`time_evaluator`); best py: called from Python; eager: PyTorch eager from "
             "Python; graph: eager in a CUDA graph (kernels); compile / autotune: `torch.compile` default / "
             "`max-autotune-no-cudagraphs` from Python. Sanitizer: the best's compute-sanitizer verdict; eager "
             "check: PyTorch ran with the program's own parameters and its output was compared with our "
             "original's (not equal: eager is not timed).", "",
             "| program | best | sanitizer | best py | original | eager | eager check | graph | compile | autotune "
             "| compile s | vs eager | vs graph | vs compile | vs autotune |", "|" + "---|" * 15]

    def cell(text) -> str:
        return "-" if not text else str(text).replace("|", "\\|").replace("\n", " ")[:80]

    for b in records:
        lines.append(f"| {b.name} | {us(b.best_us)} | {cell(b.best_sanitizer)} | {us(b.best_py_us)} | "
                     f"{us(b.original_us)} | {us(b.eager_us)} | {cell(b.eager_check)} | "
                     f"{us(b.eager_graph_us)} | {us(b.compile_us)} | {us(b.compile_autotune_us)} | "
                     f"{us(b.compile_s)} | {ratio(b, 'speedup_vs_eager')} | {ratio(b, 'speedup_vs_eager_graph')} | "
                     f"{ratio(b, 'speedup_vs_compile')} | {ratio(b, 'speedup_vs_compile_autotune')} |")
    return "\n".join(lines) + "\n"


__all__ = ["check_best", "choose_best", "measure_baselines", "baselines_table"]
