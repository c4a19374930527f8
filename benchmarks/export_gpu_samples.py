"""Write a round search's GPU samples as the package's shipped GPU timings (issue 37).

    python benchmarks/export_gpu_samples.py OUT \
        engine/steptp/cost_model/data/gpu_samples_h200.json.gz --device "NVIDIA H200"

Every candidate that ran Equal on the GPU and was timed against its original becomes one row
(root .leir, candidate .leir, ln speedup); ``stp search --runner pack --rank model`` starts
from these rows (:func:`steptp.cost_model.samples.shipped_rows`), less those of the programs it
searches. Prints the counts and the file size."""

from __future__ import annotations

import argparse
import json
import os

from steptp.cost_model.samples import export_samples


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("state", help="OUT of a stp search --runner pack run (OUT/<program>/tree.jsonl, root.leir)")
    ap.add_argument("out", help="the gzipped samples file to write")
    ap.add_argument("--device", required=True, help="the GPU the samples were measured on")
    a = ap.parse_args()
    counts = export_samples(a.state, a.out, a.device)
    print(json.dumps({**counts, "bytes": os.path.getsize(a.out)}))


if __name__ == "__main__":
    main()
