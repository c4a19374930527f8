"""Throughput of ``stp search``: samples/s and the time split (propose, verify, time).

Runs one search per program (default: greedy + engine policy, 10 iterations, on
examples/softmax.leir and examples/matmul.leir) and prints, per program and in total, the
samples, the wall time, samples per second and the seconds spent proposing (rule matching
and application in the engine worker), verifying (verify_pair against the root, 3 trials,
worker process) and timing (steptp.runner.timing.measure). The rest of the wall time is
start-up (rules, worker processes, root timing) and bookkeeping.

    python benchmarks/bench_search.py [PROGRAM...] [--algorithm greedy] [--iterations 10]
        [--rank random|cost] [--seed 0] [--out DIR]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("programs", nargs="*", default=[str(ROOT / "examples" / "softmax.leir"),
                                                     str(ROOT / "examples" / "matmul.leir")])
    ap.add_argument("--algorithm", default="greedy")
    ap.add_argument("--iterations", type=int, default=10)
    ap.add_argument("--rank", default="random", choices=("random", "cost"))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=None, help="Output directory (default: a temporary one).")
    a = ap.parse_args(argv)

    from steptp.search import SearchConfig, search_program

    out = Path(a.out or tempfile.mkdtemp(prefix="bench_search_"))
    cfg = SearchConfig(algorithm=a.algorithm, iterations=a.iterations, rank=a.rank, seed=a.seed, progress=False)
    tot = {"samples": 0, "wall": 0.0, "propose": 0.0, "verify": 0.0, "time": 0.0}
    print(f"{'program':24} {'samples':>7} {'wall s':>7} {'samples/s':>9} {'propose':>8} {'verify':>8} {'time':>8} "
          f"{'speedup':>8}")
    for i, p in enumerate(a.programs):
        t0 = time.perf_counter()
        sm = search_program(p, out / f"{i}_{Path(p).stem}", cfg)
        wall = time.perf_counter() - t0
        sec = sm["seconds"]
        print(f"{Path(p).name:24} {sm['samples']:7d} {wall:7.1f} {sm['samples'] / wall:9.2f} {sec['propose']:8.1f} "
              f"{sec['verify']:8.1f} {sec['time']:8.1f} {sm['speedup']:7.2f}x")
        tot["samples"] += sm["samples"]
        tot["wall"] += wall
        for k in ("propose", "verify", "time"):
            tot[k] += sec[k]
    w = tot["wall"] or 1.0
    print(f"{'total':24} {tot['samples']:7d} {tot['wall']:7.1f} {tot['samples'] / w:9.2f} {tot['propose']:8.1f} "
          f"{tot['verify']:8.1f} {tot['time']:8.1f}")
    print(f"split of wall time: propose {100 * tot['propose'] / w:.0f}%, verify {100 * tot['verify'] / w:.0f}%, "
          f"time {100 * tot['time'] / w:.0f}%, other {100 * (1 - (tot['propose'] + tot['verify'] + tot['time']) / w):.0f}%")
    print(f"outputs in {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
