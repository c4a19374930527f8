"""What a round of the GPU round search built, by the static GPU model (no GPU needed).

    python benchmarks/round_static_report.py OUT/rounds/<k> [--measured SUMMARY.json]

For a round's candidates (``OUT/rounds/<k>/dictionary.jsonl`` of ``stp search --runner pack``)
prints per program
the fewest kernel launches (top-level nests) of a candidate, the static model's best estimate
(``steptp.cost_model.gpu.estimate_gpu_ns``, microseconds) and, with ``--measured`` (a GPU
search's combined ``summary.json``, e.g. benchmarks/results/gpu-search-h200/summary.json, or a
search directory holding ``<program>/summary.json``),
the measured original over that estimate: the speedup the candidate would have if the GPU
agreed with the model. Then the totals: candidates, those with each rule in their steps, the
kernel sum, how many programs reach 30x by that estimate and the median of it. Model figures,
not measurements.
"""

from __future__ import annotations

import argparse
import collections
import json
import statistics
import sys

from steptp.leir import parse_program
from steptp.cost_model.gpu import estimate_gpu_ns


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("round", help="OUT/rounds/<k> of `stp search --runner pack` (its dictionary.jsonl)")
    ap.add_argument("--measured", help="a GPU search's summary.json (root_us per program) or its directory")
    ap.add_argument("--mark", type=float, default=30.0, help="speedup mark to count (default 30)")
    a = ap.parse_args(argv)
    from pathlib import Path

    try:
        pending: dict = collections.defaultdict(list)
        for line in (Path(a.round) / "dictionary.jsonl").read_text(encoding="utf-8").splitlines():
            e = json.loads(line)
            pending[e["program"]].append({"text": e["transformed"]["leir"], "steps": [{"rule": e["strategy"]["id"]}]})
        measured = {}
        if a.measured and Path(a.measured).is_dir():
            for f in Path(a.measured).glob("*/summary.json"):
                sm = json.loads(f.read_text())
                measured[sm["program"]] = {"root_us": sm.get("root_time_us")}
        elif a.measured:
            measured = {p["program"]: p for p in json.load(open(a.measured))["programs"]}
    except (OSError, ValueError, KeyError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    rules: collections.Counter = collections.Counter()
    rows = []
    for name, cands in sorted(pending.items()):
        if not cands:
            continue
        progs = [parse_program(c["text"]) for c in cands]
        for c in cands:
            rules.update({s["rule"] for s in c.get("steps", [])})
        kernels = min(len(p.nests) for p in progs)
        best_us = min(estimate_gpu_ns(p) for p in progs) / 1e3
        root_us = (measured.get(name) or {}).get("root_us")
        rows.append((name, kernels, best_us, root_us / best_us if root_us else None))
    print(f"{'program':48s} {'kernels':>7s} {'model us':>9s} {'x (measured root / model)':>26s}")
    for name, k, us, x in rows:
        print(f"{name[:48]:48s} {k:7d} {us:9.1f} {'' if x is None else f'{x:26.1f}'}")
    ncand = sum(len(c) for c in pending.values())
    print(f"\ncandidates: {ncand}; with each rule: "
          + ", ".join(f"{r} {n}" for r, n in sorted(rules.items(), key=lambda kv: -kv[1])))
    print(f"fewest kernels per program, summed: {sum(r[1] for r in rows)} over {len(rows)} programs")
    xs = [r[3] for r in rows if r[3] is not None]
    if xs:
        print(f"programs at {a.mark:g}x or more by the model: {sum(1 for x in xs if x >= a.mark)} of {len(xs)}; "
              f"median {statistics.median(xs):.1f}x (model figures, not measurements)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
