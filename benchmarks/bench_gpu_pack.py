"""Pack size, pack build time and simulated-device run throughput of ``stp gpu pack`` / ``run``.

Usage::

    stp dataset examples -o /tmp/d --seed 0 -j 2
    python benchmarks/bench_gpu_pack.py /tmp/d [--no-sim] [--time] [-j 1] [--limit N] [--keep DIR]

Builds a pack of the dataset directory with the installed ``stp`` (beside this interpreter),
prints its size (total and by top-level folder) and build time, then runs it on the
simulated CUDA device (``STP_CUDA_SIM=1``, which needs the simulated device's CPU builds, so
the run is skipped with ``--no-sim``) and prints entries/s as the runner's ``summary.json``
reports them. Entries/s on the simulated device show the runner's own overhead (processes,
loads, copies, references), not GPU speed. The same command works against an older
install (options it lacks are left out), so before/after figures come from one script.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

STP = Path(sys.executable).parent / "stp"


def _size(p: Path) -> int:
    return sum(f.stat().st_size for f in p.rglob("*") if f.is_file())


def _timed(cmd: list[str], env: dict) -> float | None:
    """Run ``cmd``; its wall seconds, or None (stderr's tail printed) when it failed."""
    t0 = time.perf_counter()
    r = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if r.returncode != 0:
        print(r.stderr[-2000:], file=sys.stderr)
        return None
    return time.perf_counter() - t0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("dataset", type=Path, help="a stp dataset directory (dictionary.jsonl)")
    ap.add_argument("--no-sim", action="store_true", help="pack without the simulated device's builds (no run)")
    ap.add_argument("--time", action="store_true", help="run with --time")
    ap.add_argument("-j", "--jobs", type=int, default=None, help="runner workers (newer runners only)")
    ap.add_argument("--no-eager", action="store_true", help="run without PyTorch eager timings (newer runners only)")
    ap.add_argument("--run-only", action="store_true", help="reuse the pack already in --keep DIR (no build)")
    ap.add_argument("--limit", type=int, default=None, help="pack only the first N entries")
    ap.add_argument("--keep", type=Path, default=None, help="write the pack and results here (default: a temp dir)")
    a = ap.parse_args(argv)
    if not (a.dataset / "dictionary.jsonl").is_file():
        print(f"error: {a.dataset}: not a dataset directory (no dictionary.jsonl)", file=sys.stderr)
        return 2
    work = a.keep or Path(tempfile.mkdtemp(prefix="bench-gpu-pack-"))
    work.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "STP_CUDA_SIM": "1", "STP_PTX_CACHE": str(work / "ptx-cache")}
    pack, res = work / "pack", work / "results"
    cmd = [str(STP), "gpu", "pack", str(a.dataset), "-o", str(pack), "-q"]
    cmd += ["--no-sim"] if a.no_sim else []
    cmd += ["--limit", str(a.limit)] if a.limit else []
    if a.run_only:
        build_s = float("nan")
    else:
        build_s = _timed(cmd, env)
        if build_s is None:
            return 1
    m = json.loads((pack / "manifest.json").read_text())
    total = _size(pack)
    print(f"pack: {len(m['entries'])} entries, {total / 2**20:.2f} MB, built in {build_s:.1f} s "
          f"(manifest build_seconds {m.get('build_seconds')})")
    for d in sorted(p for p in pack.iterdir()):
        print(f"  {d.name:<14} {(_size(d) if d.is_dir() else d.stat().st_size) / 2**20:8.2f} MB")
    if a.no_sim:
        return 0
    cmd = [str(STP), "gpu", "run", str(pack), "-o", str(res), "-q"] + (["--time"] if a.time else [])
    help_text = subprocess.run([str(STP), "gpu", "run", "--help"], capture_output=True, text=True, env=env).stdout
    if a.jobs and "--jobs" in help_text:
        cmd += ["-j", str(a.jobs)]
    if a.no_eager and "--no-eager" in help_text:
        cmd += ["--no-eager"]
    if res.exists():
        import shutil  # noqa: PLC0415

        shutil.rmtree(res)
    run_s = _timed(cmd, env)
    if run_s is None:
        return 1
    s = json.loads((res / "summary.json").read_text())
    print(f"sim run{' --time' if a.time else ''}: {s['done']} entries, {s['equal']} Equal, "
          f"{run_s:.1f} s wall (process included), {s['entries_per_second']} entries/s (runner wall)")
    for k in ("verification_entries_per_second", "timing_entries_per_second", "first_call_ms_median",
              "worker_restarts", "eager_programs"):
        if k in s:
            print(f"  {k}: {s[k]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
