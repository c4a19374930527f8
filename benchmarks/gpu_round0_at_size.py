"""Round 0 of the GPU search at KernelBench size, prepared on a machine without a GPU (issue 44).

    python benchmarks/gpu_round0_at_size.py OUT [--count 40] [--seed 5] [-j 2] [--breadth 8]
        [--lookahead 1] [--per-rule 4] [--iterations 3] [--limit-s 900]

1. ``stp corpus --count N --seed S --gpu -o OUT/corpus`` (the GPU benchmark set);
2. ``stp search OUT/corpus --device cuda --runner pack --no-sim -j J -a greedy --breadth B
   --rank cost --lookahead L --candidates-per-rule P -n I -o OUT/search``: every program's first batch verified here
   (programs too large to execute on this CPU only by the checks that execute nothing: GPU
   preflight and CUDA code generation; the node verifies them at full size) and written as
   round 0's pack; the command exits 3 with the node's command;
3. prints and writes ``OUT/round0.json``: wall seconds, programs, entries, the pack's size, the
   programs skipped with their reasons (``run_summary.json``), and each program's speed of light
   on an H200 (``stp roofline``: FLOPs, compulsory bytes, ``sol_us``).

Then, on the GPU node, ``benchmarks/gpu_at_size.sh`` runs the pack (with the baselines and the
sanitizer) and the same search command, run again here with the results in place, goes on.
Figures from this script are CPU-side figures: nothing here is a GPU measurement."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path


def _du(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) if path.exists() else 0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--count", type=int, default=40)
    ap.add_argument("--seed", type=int, default=5)
    ap.add_argument("-j", "--workers", type=int, default=2)
    ap.add_argument("--breadth", type=int, default=8)
    ap.add_argument("--lookahead", type=int, default=1)
    ap.add_argument("--per-rule", type=int, default=4, help="--candidates-per-rule")
    ap.add_argument("--iterations", type=int, default=3)
    ap.add_argument("--limit-s", type=float, default=900.0, help="wall-clock cap of the round (s)")
    a = ap.parse_args()
    stp = str(Path(sys.executable).parent / "stp")
    corpus, search = a.out / "corpus", a.out / "search"
    if not corpus.exists():
        subprocess.run([stp, "corpus", "--count", str(a.count), "--seed", str(a.seed), "--gpu", "-o", str(corpus),
                        "-q"], check=True)
    cmd = [stp, "search", str(corpus), "--device", "cuda", "--runner", "pack", "--no-sim", "-j", str(a.workers),
           "-a", "greedy", "--breadth", str(a.breadth), "--rank", "cost", "--lookahead", str(a.lookahead),
           "--candidates-per-rule", str(a.per_rule),
           "-n", str(a.iterations), "-o", str(search), "-q"]
    t0 = time.perf_counter()
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=a.limit_s)
        rc, tail = r.returncode, (r.stdout + r.stderr)[-2000:]
    except subprocess.TimeoutExpired:
        rc, tail = None, f"over the {a.limit_s:.0f} s cap"
    wall = time.perf_counter() - t0
    run = json.loads((search / "run_summary.json").read_text()) if (search / "run_summary.json").exists() else {}
    waiting = run.get("waiting") or {}
    pack = Path(waiting["pack"]) if waiting.get("pack") else None
    sol = {}
    for py in sorted(corpus.glob("*.py")):
        r2 = subprocess.run([stp, "roofline", str(py), "--gpu-model", "h200", "--json"], capture_output=True,
                            text=True)
        if r2.returncode == 0:
            d = json.loads(r2.stdout)
            sol[py.stem] = {k: d.get(k) for k in ("flops", "bytes", "sol_us")}
        else:
            sol[py.stem] = {"error": (r2.stderr or r2.stdout).strip()[:200]}
    res = {"command": " ".join(cmd), "exit": rc, "wall_s": round(wall, 1), "programs": run.get("programs"),
           "pending": len(run.get("pending") or []), "entries": waiting.get("entries"),
           "pack_bytes": _du(pack) if pack else 0, "failed": run.get("failed"), "sol_h200": sol,
           "note": "CPU-side preparation only; no GPU figure", "tail": tail if rc != 3 else ""}
    (a.out / "round0.json").write_text(json.dumps(res, indent=1))
    print(json.dumps({k: v for k, v in res.items() if k != "sol_h200"}, indent=1))


if __name__ == "__main__":
    main()
