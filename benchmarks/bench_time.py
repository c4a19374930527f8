"""CPU run time of original vs transformed programs for a fixed set of (program, rule) pairs,
so that speedups can be compared across commits.

Each pair: the program (a bundled example, or the larger built-in ``matmul_big``), the rule
applied once with ``steptp.engine.apply_rule(rule, module, seed=0)``, both timed with
``steptp.runner.timing.measure`` (performance build: LLVM opt-level 3, P loops parallel, V
loops vectorized, bound loops serial; seeded inputs; 3 warm-up calls; TVM time_evaluator
with --repeat measurements of at least --min-repeat-ms each). Prints median and IQR in
microseconds per call and the speedup (original median / transformed median, paper App.
C.2). TVM_NUM_THREADS defaults to 1 (set it to time parallel loops on several threads).
The bundled examples are small (microsecond kernels): their speedups mostly show what a
rewrite does to loop overhead and code generation, ``matmul_big`` shows real work.

    python benchmarks/bench_time.py [--repeat 10] [--min-repeat-ms 20] [--json]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

MATMUL_BIG = """\
% program: matmul_big
% input A: f32[64,128]
% input C: f32[128,96]
% output D: f32[64,96]
B^{64}_{tx=0}L^{96}_{a=0}L^{128}_{c=0}[D^{f32,g}_{tx,a}=D^{f32,g}_{tx,a}+A^{f32,g}_{tx,c}*C^{f32,g}_{c,a};];
"""

#: (program, rule) pairs, in print order. A program is ``examples/<name>.leir`` or a key of
#: the built-in programs.
CASES = [
    ("matmul", "loop_parallelization"),
    ("matmul", "loop_unrolling"),
    ("softmax", "loop_parallelization"),
    ("gemm_relu", "loop_parallelization"),
    ("mlp", "loop_parallelization"),
    ("scale_bias", "operator_fusion"),
    ("matmul_big", "loop_parallelization"),
    ("matmul_big", "loop_reorder"),
    ("matmul_big", "loop_split"),
]
BUILTIN = {"matmul_big": MATMUL_BIG}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeat", type=int, default=10, help="measurements per program")
    ap.add_argument("--min-repeat-ms", type=float, default=20.0, help="minimum length of one measurement (ms)")
    ap.add_argument("--json", action="store_true", help="one JSON object per pair")
    args = ap.parse_args(argv)

    from steptp.backend.errors import BackendError
    from steptp.runner.timing import measure, speedup
    from steptp.engine import NoMatch, apply_rule
    from steptp.leir import load_leir, parse_leir
    from steptp.rules import load_rule

    if not args.json:
        print(f"{'program':<11} {'rule':<21} {'orig_us':>10} {'±iqr':>8} {'new_us':>10} {'±iqr':>8} {'speedup':>8}"
              f"  cv(orig/new)")
    for prog, rule in CASES:
        m = parse_leir(BUILTIN[prog]) if prog in BUILTIN else load_leir(ROOT / "examples" / f"{prog}.leir")
        try:
            step = apply_rule(load_rule(ROOT / "rules" / f"{rule}.yaml"), m, seed=0)
            a = measure(m, repeat=args.repeat, min_repeat_ms=args.min_repeat_ms)
            b = measure(step.after, repeat=args.repeat, min_repeat_ms=args.min_repeat_ms)
        except NoMatch:
            print(f"{prog:<11} {rule:<21} (no match)", file=sys.stderr)
            continue
        except BackendError as e:
            print(f"{prog:<11} {rule:<21} {e.stage}: {e.reason}", file=sys.stderr)
            continue
        except Exception as e:  # noqa: BLE001 - a broken rule costs its row, not the benchmark
            print(f"{prog:<11} {rule:<21} {type(e).__name__}: {e}", file=sys.stderr)
            continue
        s = speedup(a, b)
        if args.json:
            print(json.dumps({"program": prog, "rule": rule, "original": a.as_dict(), "transformed": b.as_dict(),
                              "speedup": s}))
        else:
            print(f"{prog:<11} {rule:<21} {a.median_us:>10.3f} {a.iqr_us:>8.3f} {b.median_us:>10.3f} "
                  f"{b.iqr_us:>8.3f} {s:>7.2f}x  {a.cv:.1%}/{b.cv:.1%}")
    if not args.json:
        print(f"(cpu, {a.threads} TVM thread(s), {args.repeat} measurements, >= {args.min_repeat_ms:g} ms each)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
