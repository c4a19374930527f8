"""Do the speedups `stp search` reports reproduce? (figures, no assertions)

For each program: `stp search` (engine policy, greedy, `--rank cost`, `-n N`, CPU, one TVM
thread), then, in a fresh process, `stp time root.leir best.leir --json` (interleaved, 10
rounds) on the search's own output files. Prints per program the search's headline speedup
(the re-timed one, `summary.json: speedup`), the best-of-samples figure it replaced
(`speedup_best_sample`), the independent re-time and whether the headline is within 10 % of
it; then the median and geometric mean of each column.

    python benchmarks/bench_reproduce.py [PROGRAM...] [-n 10] [--out DIR]

Default programs: benchmarks/search_programs/*.py and the first 6 programs of
`stp corpus --count 40 --seed 5` (generated into the output directory).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
STP = [sys.executable, "-c", "from steptp.cli import app; app()"]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("programs", nargs="*")
    ap.add_argument("-n", "--iterations", type=int, default=10)
    ap.add_argument("--corpus", type=int, default=6, help="corpus programs added when no PROGRAM is given")
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)
    out = Path(a.out or tempfile.mkdtemp(prefix="bench_reproduce_"))
    progs = [Path(p) for p in a.programs]
    if not progs:
        progs = sorted((ROOT / "benchmarks" / "search_programs").glob("*.py"))
        if a.corpus:
            subprocess.run(STP + ["corpus", "-o", str(out / "corpus"), "--count", "40", "--seed", "5"], check=True,
                           capture_output=True)
            progs += sorted((out / "corpus").glob("*.py"))[: a.corpus]
    rows = []
    for p in progs:
        d = out / "search" / p.stem
        r = subprocess.run(STP + ["search", str(p), "-o", str(d), "--rank", "cost", "-n", str(a.iterations), "-q"],
                           capture_output=True, text=True)
        sm_files = list(d.rglob("summary.json"))
        if r.returncode != 0 or not sm_files:
            print(f"{p.name}: search failed: {r.stderr.strip()[-200:]}")
            continue
        sm = json.loads(sm_files[0].read_text())
        sdir = sm_files[0].parent
        t = subprocess.run(STP + ["time", str(sdir / "root.leir"), str(sdir / "best.leir"), "--json", "--repeat", "10"],
                           capture_output=True, text=True)
        objs = [json.loads(x) for x in t.stdout.splitlines() if x.startswith("{")]
        if len(objs) != 2:
            print(f"{p.name}: stp time failed: {t.stderr.strip()[-200:]}")
            continue
        again, verdict = objs[1]["speedup"], objs[1].get("speedup_verdict", "same")
        retimed = again if verdict == "faster" else 1.0
        head = sm["speedup"]
        rows.append((p.stem, sm["samples"], sm.get("noop", 0), sm.get("speedup_best_sample", head), head, again,
                     verdict, abs(head - retimed) <= 0.10 * retimed, sm.get("speedup_vs_eager")))
        print(f"{p.stem:<40} samples {sm['samples']:>3}  noop {sm.get('noop', 0):>2}  best-sample "
              f"{rows[-1][3]:6.2f}x  headline {head:6.2f}x  stp time {again:6.2f}x ({verdict})  "
              f"reproduced {'yes' if rows[-1][7] else 'NO'}", flush=True)
    if not rows:
        return 1

    def gm(xs):
        return math.exp(statistics.mean(math.log(x) for x in xs))

    for i, name in ((3, "best-sample"), (4, "headline"), (5, "stp time")):
        xs = [r[i] for r in rows]
        print(f"{name:>12}: median {statistics.median(xs):.2f}x  geomean {gm(xs):.2f}x")
    print(f"reproduced within 10 %: {sum(r[7] for r in rows)}/{len(rows)}")
    eager = [r[8] for r in rows if r[8]]
    if eager:
        print(f"speedup_vs_eager: median {statistics.median(eager):.2f}  geomean {gm(eager):.2f} ({len(eager)} programs)")
    print(f"(outputs in {out})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
