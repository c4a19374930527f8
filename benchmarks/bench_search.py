"""``stp search`` over algorithms x ranks: re-timed speedups, speedup vs PyTorch eager,
samples/s and the time split (propose, verify, time, model).

Runs one search per (program, algorithm, rank) with the engine policy on the CPU (default:
``greedy``, ``mcts``, ``chain-no-parent`` and ``evolutionary``, each with ``--rank random``,
``cost`` and ``model``, 20 iterations, on ``benchmarks/search_programs``) and prints

* per search: samples, wall time, samples/s, seconds proposing (rule matching and
  application in the engine worker), verifying (verify_pair against the root, worker
  process), timing and in the cost model (scoring and online refits), the **re-timed**
  speedup of ``summary.json`` (root and best timed again interleaved; 1 unless the 95 %
  interval lies above 1), the best-sample speedup and ``speedup_vs_eager`` (PyTorch eager
  on one thread over the best program; ``.py`` programs only);
* per (algorithm, rank): median and geometric mean of the re-timed speedup and of
  ``speedup_vs_eager``, mean samples and total wall time. With ``--seeds N`` (N > 1) each
  program is searched with seeds ``--seed`` .. ``--seed``+N-1, a program's figure is the
  median over its seeds, and ``spread`` is the median over programs of the largest over the
  smallest re-timed speedup of its seeds (how much one search's result is luck).

``--retime`` checks that the figures reproduce: every reported speedup other than 1 is timed
again by ``stp time ROOT BEST --json`` in a fresh process (``retime.json`` beside the
search's outputs, so a resumed run keeps it), and the summary counts those within 10 %.

``--rank model`` uses ``--model PATH`` (``stp costmodel train``) when given, else the model
learns online from each search's own samples (the static model ranks until it has some).

    python benchmarks/bench_search.py [PROGRAM...] [--algorithms greedy,mcts,chain-no-parent,evolutionary]
        [--ranks random,cost,model] [--model MODEL.json] [--iterations 20] [--seed 0] [--seeds 1]
        [--retime] [--out DIR] [--json F]
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ALGORITHMS = ("greedy", "mcts", "chain-no-parent", "evolutionary")
RANKS = ("random", "cost", "model")


def geomean(xs: list[float]) -> float | None:
    xs = [x for x in xs if x and x > 0 and math.isfinite(x)]
    return math.exp(sum(map(math.log, xs)) / len(xs)) if xs else None


def _f(x, fmt: str = "{:.2f}") -> str:
    return "n/a" if x is None else fmt.format(x)


#: a re-timed speedup reproduces the reported one within this relative difference (issue 26)
REPRODUCE_TOL = 0.10


def retime(d: Path, reported: float) -> dict:
    """``stp time ROOT BEST --json`` on a search's ``root.leir`` and ``best.leir`` in a fresh
    process (cached in ``d/retime.json``): ``{"speedup": x or None, "reproduced": bool,
    "error": text}``; a reported speedup of 1 (nothing better found) is not re-timed."""
    f = d / "retime.json"
    if f.exists():
        return json.loads(f.read_text())
    if abs(reported - 1.0) < 1e-9:
        return {"speedup": None, "reproduced": None}
    stp = Path(sys.executable).parent / "stp"
    p = subprocess.run([str(stp), "time", str(d / "root.leir"), str(d / "best.leir"), "--json"],
                       capture_output=True, text=True, timeout=900)
    rows = [json.loads(x) for x in p.stdout.splitlines() if x.startswith("{")]
    if p.returncode != 0 or len(rows) != 2:
        out = {"speedup": None, "reproduced": False, "error": (p.stderr.strip().splitlines() or ["?"])[-1][:300]}
    else:
        sp = float(rows[1]["speedup"])
        out = {"speedup": sp, "reproduced": abs(sp - reported) <= REPRODUCE_TOL * reported}
    f.write_text(json.dumps(out) + "\n")
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("programs", nargs="*", default=[str(ROOT / "benchmarks" / "search_programs")])
    ap.add_argument("--algorithms", "--algorithm", default=",".join(ALGORITHMS),
                    help="comma-separated (default: %(default)s)")
    ap.add_argument("--ranks", "--rank", default=",".join(RANKS), help="comma-separated (default: %(default)s)")
    ap.add_argument("--model", default=None, help="cost model file for --rank model (default: online only)")
    ap.add_argument("--iterations", type=int, default=20)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--seeds", type=int, default=1, help="searches per program, seeds --seed.. (default: 1)")
    ap.add_argument("--retime", action="store_true",
                    help="re-time every reported speedup with stp time in a fresh process (within 10 %%?)")
    ap.add_argument("--out", default=None, help="Output directory (default: a temporary one; resumable).")
    ap.add_argument("--json", default=None, help="Also write every search's figures to this JSON file.")
    a = ap.parse_args(argv)

    from steptp.search import ALGORITHMS as KNOWN
    from steptp.search import SearchConfig, search_program
    from steptp.search.run import collect_programs

    algs = [x for x in a.algorithms.split(",") if x]
    ranks = [x for x in a.ranks.split(",") if x]
    bad = [x for x in algs if x not in KNOWN] + [x for x in ranks if x not in RANKS]
    if bad:
        print(f"error: unknown algorithm or rank: {', '.join(bad)}", file=sys.stderr)
        return 2
    if a.seeds < 1:
        print("error: --seeds must be at least 1", file=sys.stderr)
        return 2
    progs = collect_programs(a.programs)
    seeds = list(range(a.seed, a.seed + a.seeds))
    out = Path(a.out or tempfile.mkdtemp(prefix="bench_search_"))
    rows = []
    print(f"{'program':22} {'algorithm':15} {'rank':6} {'samples':>7} {'wall s':>7} {'samp/s':>6} {'propose':>7} "
          f"{'verify':>6} {'time':>6} {'model':>6} {'speedup':>8} {'best-smp':>8} {'vs eager':>8}", flush=True)
    for alg, rank, (i, p), seed in itertools.product(algs, ranks, enumerate(progs), seeds):
        r = f"model:{a.model}" if rank == "model" and a.model else rank
        cfg = SearchConfig(algorithm=alg, iterations=a.iterations, rank=r, seed=seed, progress=False)
        d = out / alg / rank / (f"{i}_{p.stem}" if len(seeds) == 1 else f"{i}_{p.stem}_s{seed}")
        t0 = time.perf_counter()
        resumed = (d / "summary.json").exists()
        sm = json.loads((d / "summary.json").read_text()) if resumed else search_program(p, d, cfg)
        wall = sm["seconds"]["total"] if resumed else time.perf_counter() - t0
        sec = sm["seconds"]
        row = {"program": p.stem, "algorithm": alg, "rank": rank, "seed": seed, "samples": sm["samples"],
               "wall_s": wall, "speedup": sm["speedup"], "speedup_best_sample": sm.get("speedup_best_sample"),
               "speedup_vs_eager": sm.get("speedup_vs_eager"),
               "seconds": {k: sec.get(k, 0.0) for k in ("propose", "verify", "time", "model")}}
        if a.retime:
            row["retime"] = retime(d, sm["speedup"])
        rows.append(row)
        s = row["seconds"]
        print(f"{p.stem[:22]:22} {alg:15} {rank:6} {sm['samples']:7d} {wall:7.1f} "
              f"{sm['samples'] / wall if wall else 0:6.2f} {s['propose']:7.1f} {s['verify']:6.1f} "
              f"{s['time']:6.1f} {s['model']:6.1f} {sm['speedup']:7.2f}x "
              f"{_f(row['speedup_best_sample'], '{:7.2f}x'):>8} {_f(row['speedup_vs_eager'], '{:7.3f}x'):>8}"
              + (f"  seed {seed}" if len(seeds) > 1 else "")
              + (f"  re-timed {_f(row['retime']['speedup'], '{:.2f}x')}"
                 f"{'' if row['retime']['reproduced'] is not False else ' NOT reproduced'}"
                 if a.retime and row["retime"]["reproduced"] is not None else ""), flush=True)
    print()
    print(f"{'algorithm':15} {'rank':6} {'programs':>8} {'median':>7} {'geomean':>7} {'eager med':>9} "
          f"{'eager geo':>9} {'samples':>7} {'wall s':>7}" + (f" {'spread':>7}" if len(seeds) > 1 else ""))
    summary = []
    for alg, rank in itertools.product(algs, ranks):
        g = [x for x in rows if x["algorithm"] == alg and x["rank"] == rank]
        if not g:
            continue
        by_prog: dict[str, list[dict]] = {}
        for x in g:
            by_prog.setdefault(x["program"], []).append(x)
        # a program's figure: the median over its seeds
        sp = [statistics.median(x["speedup"] for x in v) for v in by_prog.values()]
        ea = [statistics.median(e) for v in by_prog.values()
              if (e := [x["speedup_vs_eager"] for x in v if x["speedup_vs_eager"]])]
        spread = statistics.median(max(x["speedup"] for x in v) / min(x["speedup"] for x in v)
                                   for v in by_prog.values())
        agg = {"algorithm": alg, "rank": rank, "programs": len(by_prog), "seeds": len(seeds),
               "median_speedup": statistics.median(sp), "geomean_speedup": geomean(sp),
               "median_vs_eager": statistics.median(ea) if ea else None, "geomean_vs_eager": geomean(ea),
               "mean_samples": statistics.mean(x["samples"] for x in g), "wall_s": sum(x["wall_s"] for x in g),
               "seed_spread": spread}
        checked = [x["retime"]["reproduced"] for x in g if x.get("retime", {}).get("reproduced") is not None]
        if a.retime:
            agg["reproduced"], agg["retimed"] = sum(checked), len(checked)
        summary.append(agg)
        print(f"{alg:15} {rank:6} {len(by_prog):8d} {agg['median_speedup']:6.2f}x {_f(agg['geomean_speedup']):>6}x "
              f"{_f(agg['median_vs_eager'], '{:.3f}'):>8}x {_f(agg['geomean_vs_eager'], '{:.3f}'):>8}x "
              f"{agg['mean_samples']:7.1f} {agg['wall_s']:7.0f}" + (f" {spread:6.2f}x" if len(seeds) > 1 else "")
              + (f"  re-timed by stp time within 10 %: {sum(checked)}/{len(checked)}" if a.retime else ""))
    if a.json:
        Path(a.json).write_text(json.dumps({"searches": rows, "summary": summary}, indent=1) + "\n")
    print(f"outputs in {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
