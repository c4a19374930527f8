"""Throughput of ``stp dataset`` with the time split by stage, and the floor (figures, no assertions).

    python benchmarks/bench_pipeline.py [INPUT ...] [--rule R.yaml ...] [--per-rule N] [-j N] [--no-nvcc]

-j defaults to the CPU count (what a user of this machine would run).

INPUT: .leir/.py files or directories (default: examples/). Three measurements:

1. **profiled**: ``generate_dataset`` in process (``--in-process``: build and run in the
   generating process, so every stage can be timed) with timers wrapped around the
   pipeline's functions; exclusive wall time per stage (a stage's time excludes the stages
   it calls): match (site enumeration), apply, CoT, analyze, print/parse (LEIR text),
   lower (LEIR -> TVMScript), preflight, TIR parse, llvm build, CUDA codegen, nvcc, inputs,
   run, compare, chat, write, other.
2. **default**: the same run as ``stp dataset`` does it (isolated verification workers with
   a time limit, ``-j`` processes): candidates/s and verified entries/s.
3. **floor**: the kernels of the verified steps (originals and transformed), lowered
   beforehand, then only built (llvm), generated (CUDA), compiled (nvcc, one run per kernel
   and one batched run) and run (3 trials) with no engine: the cost of the kernels alone.

The machine is shared: absolute timings are noisy; the ratios matter more.
"""

from __future__ import annotations

import argparse
import collections
import functools
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


class StageTimer:
    """Exclusive wall time per stage of wrapped functions (nested calls are subtracted)."""

    def __init__(self):
        self.total = collections.Counter()
        self.calls = collections.Counter()
        self._stack: list[float] = []
        self._undo: list[tuple[object, str, object]] = []

    def wrap(self, stage: str, fn):
        @functools.wraps(fn)
        def timed(*a, **k):
            t0 = time.perf_counter()
            self._stack.append(0.0)
            try:
                return fn(*a, **k)
            finally:
                el = time.perf_counter() - t0
                child = self._stack.pop()
                self.total[stage] += el - child
                self.calls[stage] += 1
                if self._stack:
                    self._stack[-1] += el
        timed.__wrapped_stage__ = stage
        return timed

    def patch_everywhere(self, stage: str, owner, name: str) -> None:
        """Replace ``owner.name`` in its module and in every steptp module that imported it."""
        orig = getattr(owner, name)
        timed = self.wrap(stage, orig)
        for mod in list(sys.modules.values()):
            if mod is None or not getattr(mod, "__name__", "").startswith("steptp"):
                continue
            if getattr(mod, name, None) is orig:
                self._undo.append((mod, name, orig))
                setattr(mod, name, timed)
        if getattr(owner, name) is orig:  # a class attribute
            self._undo.append((owner, name, orig))
            setattr(owner, name, timed)

    def restore(self) -> None:
        for obj, name, orig in reversed(self._undo):
            setattr(obj, name, orig)
        self._undo.clear()


def install_timers(timer: StageTimer) -> None:
    import importlib

    import tvm

    def mod(name):  # importlib: some package attributes shadow their submodules (backend.preflight)
        return importlib.import_module(name)

    for name in ("steptp.dataset.generate", "steptp.dataset.pipeline", "steptp.frontend", "steptp.rules"):
        mod(name)  # imported first so that their names get patched too
    build, preflight, tvmscript = mod("steptp.backend.build"), mod("steptp.backend.preflight"), mod(
        "steptp.backend.tvmscript")
    cot, chat, writers = mod("steptp.engine.cot"), mod("steptp.dataset.chat"), mod("steptp.io")
    engine, apply_mod = mod("steptp.engine"), mod("steptp.engine.apply")
    analysis, parser, printer = mod("steptp.leir.analysis"), mod("steptp.leir.parser"), mod("steptp.leir.printer")
    verify = mod("steptp.verify")

    for stage, owner, name in [
        ("match", apply_mod, "list_candidates"), ("apply", apply_mod, "apply_rule"), ("CoT", cot, "render_cot"),
        ("analyze", analysis, "analyze"), ("print", printer, "format_program"), ("parse", parser, "parse_program"),
        ("lower", tvmscript, "lower_module"), ("preflight", preflight, "preflight"),
        ("TIR parse", build, "parse_tvmscript"), ("nvcc", build, "_run_nvcc"), ("run", build, "_call"),
        ("inputs", verify, "random_inputs"), ("compare", verify, "_compare_all"),
        ("chat", chat, "single_messages"), ("chat", chat, "multi_messages"),
        ("write", writers.JsonlAppender, "write_many"), ("write", writers, "write_jsonl_atomic"),
        ("write", writers, "write_json_atomic"),
    ]:
        timer.patch_everywhere(stage, owner, name)
    engine.list_candidates = apply_mod.list_candidates
    engine.apply_rule = apply_mod.apply_rule

    orig_compile = tvm.compile
    llvm = timer.wrap("llvm build", orig_compile)
    cuda = timer.wrap("CUDA codegen", orig_compile)

    def compile_(mod, target=None, *a, **k):
        kind = getattr(target, "kind", None)
        name = getattr(kind, "name", None) or str(target)
        return (cuda if "cuda" in str(name) else llvm)(mod, target, *a, **k)

    tvm.compile = compile_
    timer._undo.append((tvm, "compile", orig_compile))


STAGES = ["match", "apply", "CoT", "analyze", "print", "parse", "lower", "preflight", "TIR parse", "llvm build",
          "CUDA codegen", "nvcc", "inputs", "run", "compare", "chat", "write"]


def floor(entries: list[dict], with_nvcc: bool, trials: int = 3) -> dict:
    """Build/codegen/nvcc/run the verified kernels with no engine (lowered beforehand)."""
    from steptp.backend.build import _run_nvcc, build_cpu, compile_cuda_text, nvcc_path
    from steptp.backend.tvmscript import lower_module
    from steptp.leir.fileformat import LeirModule, Signature, TensorDecl
    from steptp.leir.parser import parse_program
    from steptp.verify import random_inputs

    progs = {}
    for e in entries:
        sig = Signature(e["signature"]["name"], tuple(TensorDecl(t["name"], t["role"], t["dtype"], tuple(t["shape"]))
                                                      for t in e["signature"]["tensors"]))
        for side in ("original", "transformed"):
            progs.setdefault(e[side]["leir"], LeirModule(sig, parse_program(e[side]["leir"])))
    work = []
    for m in progs.values():
        cpu = lower_module(m, None, "cpu").text
        gpu = lower_module(m, None, "cuda").text
        inputs = [random_inputs(m.signature, 0, k, [m.program]) for k in range(trials)]
        work.append((m, cpu, gpu, inputs))
    t = collections.Counter()
    sources = []
    for m, cpu, gpu, inputs in work:
        t0 = time.perf_counter()
        k = build_cpu(cpu, m.signature)
        t1 = time.perf_counter()
        src = compile_cuda_text(gpu)
        t2 = time.perf_counter()
        for x in inputs:
            k(x)
        t3 = time.perf_counter()
        t["llvm build"] += t1 - t0
        t["CUDA codegen"] += t2 - t1
        t["run"] += t3 - t2
        sources.append(src)
    have = with_nvcc and nvcc_path() is not None
    if have:
        with tempfile.TemporaryDirectory() as d:
            t0 = time.perf_counter()
            for i, src in enumerate(sources):
                _run_nvcc(src, "sm_90", d, f"k{i}", 600)
            t["nvcc (one run per kernel)"] = time.perf_counter() - t0
            # one batched .cu: TVM names every kernel main_kernel; rename to keep them apart
            big = "\n".join(s.replace("main_kernel", f"main_kernel_{i}") for i, s in enumerate(sources))
            t0 = time.perf_counter()
            err = _run_nvcc(big, "sm_90", d, "batch", 600)
            t["nvcc (batched, one .cu)"] = time.perf_counter() - t0
            if err:
                t["nvcc batch failed"] = 0.0
    return {"kernels": len(work), "seconds": dict(t), "nvcc": have}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("inputs", nargs="*", default=[str(ROOT / "examples")])
    ap.add_argument("--rule", action="append", default=None, help="rule file(s) (default: all shipped)")
    ap.add_argument("--per-rule", type=int, default=1)
    ap.add_argument("-j", "--workers", type=int, default=os.cpu_count() or 1,
                    help="processes for the default-mode run (default: the CPU count)")
    ap.add_argument("--no-nvcc", action="store_true")
    ap.add_argument("--skip-default", action="store_true", help="only the profiled run and the floor")
    args = ap.parse_args()

    from steptp.backend.build import nvcc_path
    from steptp.dataset.generate import Options
    from steptp.dataset.pipeline import generate_dataset
    from steptp.io import read_jsonl
    from steptp.resources import rules_dir

    rules = args.rule or [str(p) for p in sorted(rules_dir().glob("*.yaml"))]
    nvcc = not args.no_nvcc
    print(f"inputs {args.inputs}, {len(rules)} rule(s), per_rule {args.per_rule}, "
          f"nvcc {'on' if nvcc and nvcc_path() else 'off'} ({nvcc_path() or 'not found'})")
    tmp = Path(tempfile.mkdtemp(prefix="stp-bench-"))

    # 1. profiled, in process
    timer = StageTimer()
    install_timers(timer)
    opts = Options(seed=0, per_rule=args.per_rule, rule_paths=rules, isolated=False, nvcc=nvcc)
    t0 = time.perf_counter()
    rep = generate_dataset(args.inputs, tmp / "profiled", opts, progress=False)
    wall = time.perf_counter() - t0
    timer.restore()
    attempts = list(read_jsonl(tmp / "profiled" / "attempts.jsonl"))
    entries = list(read_jsonl(tmp / "profiled" / "dictionary.jsonl"))
    n_c, n_e = len(attempts), len(entries)
    print(f"\n[profiled, in process] {rep['programs']} programs, {n_c} candidates, {n_e} entries in {wall:.1f} s: "
          f"{n_c / wall:.2f} candidates/s, {n_e / wall:.2f} entries/s")
    print(f"{'stage':>14} {'seconds':>8} {'share':>6} {'calls':>7} {'ms/call':>8}")
    accounted = 0.0
    for st in STAGES:
        s = timer.total.get(st, 0.0)
        accounted += s
        c = timer.calls.get(st, 0)
        print(f"{st:>14} {s:8.2f} {100 * s / wall:5.1f}% {c:7d} {1000 * s / c if c else 0:8.2f}")
    print(f"{'other':>14} {wall - accounted:8.2f} {100 * (wall - accounted) / wall:5.1f}%")
    per_candidate = {st: 1000 * timer.total.get(st, 0.0) / max(n_c, 1) for st in STAGES}
    top = sorted(per_candidate.items(), key=lambda kv: -kv[1])[:5]
    print("per candidate (ms): " + ", ".join(f"{k} {v:.1f}" for k, v in top))

    # 2. default mode
    if not args.skip_default:
        opts_d = Options(seed=0, per_rule=args.per_rule, rule_paths=rules, isolated=True, nvcc=nvcc)
        t0 = time.perf_counter()
        generate_dataset(args.inputs, tmp / "default", opts_d, progress=False, workers=args.workers)
        wall_d = time.perf_counter() - t0
        n_cd = len(list(read_jsonl(tmp / "default" / "attempts.jsonl")))
        n_ed = len(list(read_jsonl(tmp / "default" / "dictionary.jsonl")))
        print(f"\n[default: isolated workers, -j {args.workers}] {n_cd} candidates, {n_ed} entries in {wall_d:.1f} s: "
              f"{n_cd / wall_d:.2f} candidates/s, {n_ed / wall_d:.2f} entries/s "
              f"(issue 11 target: 10 entries/s with nvcc on)")

    # 3. floor
    fl = floor(entries, nvcc)
    secs = fl["seconds"]
    base = sum(v for k, v in secs.items() if not k.startswith("nvcc"))
    per_kernel_nvcc = secs.get("nvcc (one run per kernel)", 0.0)
    batched_nvcc = secs.get("nvcc (batched, one .cu)", 0.0)
    print(f"\n[floor: {fl['kernels']} kernels (originals + verified steps) built and run with no engine]")
    for k, v in secs.items():
        print(f"{k:>28} {v:8.2f} s")
    for label, nv in (("per-kernel nvcc", per_kernel_nvcc), ("batched nvcc", batched_nvcc)):
        if nv or not fl["nvcc"]:
            tot = base + nv
            print(f"floor with {label}: {tot:.1f} s = {n_e / tot:.2f} entries/s; "
                  f"pipeline/floor ratio {wall / tot:.2f}x (profiled run)")
    print(f"\n(outputs in {tmp}; shared machine: absolute timings are noisy)")


if __name__ == "__main__":
    main()
