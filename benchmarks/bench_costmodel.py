"""Ranking quality of the learned cost model (``stp costmodel``) on held-out measurements.

Measurements: the timed entries of ``stp dataset --time`` runs (each step timed
interleaved with its original). Default: the bundled examples, built once into
``out/bench_costmodel/data`` (resumable; ``--per-rule 3``, CPU, no CUDA). The programs are
split into ``--folds`` groups (seeded); for each fold the model is trained on the other
programs' measurements and ranks the held-out programs' transformations. Printed per
ranker (the learned model, the static roofline model of ``--rank cost``, seeded random):
Kendall's tau-b between predicted and measured speedups and top-k recall, means over the
held-out programs (TVM MetaSchedule reports the same kind of figures for its XGBoost model).

    python benchmarks/bench_costmodel.py [DATASET...] [--folds 5] [-k 3] [--seed 0] [--json]
"""

from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def build_default(out: Path, workers: int) -> Path:
    """A timed dataset of the bundled examples (resumes when it exists)."""
    stp = Path(sys.executable).with_name("stp")
    cmd = [str(stp) if stp.exists() else "stp", "dataset", str(ROOT / "examples"), "-o", str(out), "--time",
           "--per-rule", "3", "--no-cuda", "--no-nvcc", "--programs-per-task", "1", "-j", str(workers), "--seed", "0", "-q"]
    print("building the measurements:", " ".join(cmd[1:]), file=sys.stderr)
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("datasets", nargs="*", help="stp dataset --time outputs (default: the examples, built once)")
    ap.add_argument("--folds", type=int, default=5)
    ap.add_argument("-k", type=int, default=3, help="k of top-k recall")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("-j", "--workers", type=int, default=2, help="workers to build the default dataset")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)

    from steptp.cost_model import learned as C

    try:
        C.require_lightgbm()
    except C.CostModelUnavailable as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    paths = a.datasets or [build_default(ROOT / "out" / "bench_costmodel" / "data", a.workers)]
    groups = C.measured_groups(paths)
    keys = sorted(groups)
    random.Random(a.seed).shuffle(keys)
    folds = [keys[i::a.folds] for i in range(a.folds)]
    static = C.static_score()
    rand = random.Random(a.seed)
    results: dict[str, list[dict]] = {"model": [], "static": [], "random": []}
    for i, held in enumerate(folds):
        if not held:
            continue
        train = {g: groups[g] for f in folds[:i] + folds[i + 1:] for g in f}
        test = {g: groups[g] for g in held}
        m = C.LearnedModel("cpu", {"seed": a.seed})
        m.add_pairs(C.pairs_of(train, seed=a.seed))
        m.fit()
        results["model"].append(C.evaluate(test, m.predict, a.k))
        results["static"].append(C.evaluate(test, static, a.k))
        results["random"].append(C.evaluate(test, lambda b, cs: [rand.random() for _ in cs], a.k))

    def pooled(rs: list[dict], key: str):  # mean over held-out programs, weighted by programs per fold
        vals = [(r[key], r["groups"]) for r in rs if r[key] is not None and r["groups"]]
        n = sum(w for _, w in vals)
        return sum(v * w for v, w in vals) / n if n else None

    summary = {name: {"tau": pooled(rs, "tau"), "recall_at_k": pooled(rs, "recall_at_k"),
                      "programs": sum(r["groups"] for r in rs), "measurements": sum(r["measurements"] for r in rs)}
               for name, rs in results.items()}
    ls = [x for v in groups.values() for _, x in v]
    info = {"datasets": [str(p) for p in paths], "programs": len(groups), "measurements": len(ls),
            "folds": a.folds, "k": a.k, "median_speedup": statistics.median([math.exp(x) for x in ls]) if ls else None}
    if a.json:
        print(json.dumps({"info": info, "rankers": summary}, indent=1))
        return 0
    print(f"cost model, held-out ranking: {info['programs']} programs, {info['measurements']} timed steps, "
          f"{a.folds}-fold by program, k={a.k}")
    print(f"{'ranker':8} {'programs':>8} {'kendall tau':>12} {'top-%d recall' % a.k:>13}")
    for name, r in summary.items():
        tau = "n/a" if r["tau"] is None else f"{r['tau']:.3f}"
        rec = "n/a" if r["recall_at_k"] is None else f"{r['recall_at_k']:.3f}"
        print(f"{name:8} {r['programs']:8d} {tau:>12} {rec:>13}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
