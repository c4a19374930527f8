"""Audit a data set against what its labels promise, and time verification with and without
the edge-case trials (issue 50; figures, no assertions).

    python benchmarks/edge_audit.py OUTDIR [--limit N] [--every N] [--json FILE]

OUTDIR: an ``stp dataset`` output directory (``dictionary.jsonl``). For every entry it
re-verifies ``transformed`` against ``original`` (:func:`steptp.verify.verify_pair`, in
process, the CPU verification form, no CUDA checks) twice, interleaved: without the
edge-case trials (3 random + 2 ordered, the verifier before issue 50) and with them (+ exact
zeros, scattered zeros, all negative, large magnitudes). It prints

* per strategy: entries, entries the edge-case trials reject, the first reason of each kind
  (which trial, which output, inf/nan or tolerance);
* the verification time per entry, median and interquartile range, both ways, and their
  ratio: "cold" (the original's references computed for the entry, as for the first
  candidate of a program) and "warm" (references cached, as for every further candidate).

Timings are wall clock on a shared 2-core machine: read the ratio, not the absolute figures.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path


def _quartiles(xs: list[float]) -> tuple[float, float, float]:
    xs = sorted(xs)
    if len(xs) < 4:
        m = statistics.median(xs)
        return m, xs[0], xs[-1]
    q = statistics.quantiles(xs, n=4)
    return q[1], q[0], q[2]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("outdir", type=Path)
    ap.add_argument("--limit", type=int, default=0, help="audit the first N entries only")
    ap.add_argument("--every", type=int, default=1, help="audit every N-th entry (a systematic sample)")
    ap.add_argument("--json", type=Path, help="write the figures as JSON too")
    args = ap.parse_args(argv)

    from steptp.leir.fileformat import parse_leir
    from steptp.verify import clear_reference_cache, verify_pair

    lines = (args.outdir / "dictionary.jsonl").read_text(encoding="utf-8").splitlines()
    entries = [json.loads(x) for x in lines if x.strip()]
    entries = entries[:: max(1, args.every)]
    if args.limit:
        entries = entries[: args.limit]
    if not entries:
        print(f"{args.outdir}: no entries", file=sys.stderr)
        return 1

    def module(e: dict, side: str):
        text = e["original"]["leir"] if side == "original" else e["transformed"]["leir"]
        hdr = ["% program: " + e["signature"]["name"]]
        for t in e["signature"]["tensors"]:
            hdr.append(f"% {t['role']} {t['name']}: {t['dtype']}[{','.join(map(str, t['shape']))}]")
        return parse_leir("\n".join(hdr) + "\n" + text + "\n")

    rejected: dict[str, list[str]] = defaultdict(list)
    per_rule = Counter()
    times = {("cold", False): [], ("cold", True): [], ("warm", False): [], ("warm", True): []}
    baseline_fail = 0
    for n, e in enumerate(entries):
        rule = e["strategy"]["id"]
        per_rule[rule] += 1
        orig, new = module(e, "original"), module(e, "transformed")
        results = {}
        for edge in ((False, True) if n % 2 == 0 else (True, False)):   # interleaved order
            clear_reference_cache()
            t0 = time.perf_counter()
            r = verify_pair(orig, new, gpu_check=False, edge=edge)
            times[("cold", edge)].append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            verify_pair(orig, new, gpu_check=False, edge=edge)
            times[("warm", edge)].append(time.perf_counter() - t0)
            results[edge] = r
        if not results[False].ok:
            baseline_fail += 1
        elif not results[True].ok:
            rejected[rule].append(results[True].reason)
        if (n + 1) % 50 == 0:
            print(f"  {n + 1}/{len(entries)} entries", file=sys.stderr)

    print(f"# Edge-case audit of {args.outdir} ({len(entries)} entries)\n")
    print(f"entries not Equal even without edge-case trials (other causes): {baseline_fail}")
    total = sum(len(v) for v in rejected.values())
    print(f"entries the edge-case trials reject: {total}\n")
    print("| strategy | entries | rejected by edge-case trials | first reason |")
    print("|---|---|---|---|")
    for rule in sorted(per_rule):
        rs = rejected.get(rule, [])
        print(f"| {rule} | {per_rule[rule]} | {len(rs)} | {rs[0][:160] if rs else ''} |")
    trial_kinds = Counter()
    for rs in rejected.values():
        for r in rs:
            kind = r.split("(", 1)[1].split(" inputs)", 1)[0] if " inputs)" in r else "other"
            trial_kinds[kind] += 1
    print(f"\nrejections by first failing trial: {dict(trial_kinds)}\n")
    summary = {}
    for mode in ("cold", "warm"):
        a, b = times[(mode, False)], times[(mode, True)]
        ma, la, ha = _quartiles(a)
        mb, lb, hb = _quartiles(b)
        ratio = statistics.median([y / x for x, y in zip(a, b) if x > 0])
        summary[mode] = {"without_ms": ma * 1e3, "with_ms": mb * 1e3, "median_ratio": ratio}
        print(f"verification per entry, {mode}: without edge trials {ma * 1e3:.1f} ms (IQR {la * 1e3:.1f}-{ha * 1e3:.1f}), "
              f"with {mb * 1e3:.1f} ms (IQR {lb * 1e3:.1f}-{hb * 1e3:.1f}); median per-entry ratio {ratio:.2f}")
    if args.json:
        args.json.write_text(json.dumps({"entries": len(entries), "baseline_not_equal": baseline_fail,
                                         "rejected": {k: len(v) for k, v in rejected.items()},
                                         "reasons": rejected, "by_trial": dict(trial_kinds), "timing": summary},
                                        indent=1), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
