"""The paper's data set at the paper's scale, end to end (issue 51; figures, no assertions).

    python benchmarks/paper_scale.py [--count 6335] [--seed 0] [-j 2] [--work DIR] [--out FILE]
                                     [--stop-after SECONDS] [--allow-code-change]

Builds ``stp corpus --count N --seed S`` (the paper: 6,335 PyTorch programs from 189 program
types, §3.1) into ``WORK/corpus`` (kept when it is already complete), then runs
``stp dataset WORK/corpus -o WORK/data --profile paper -j J``, which resumes: stop it at any
time (Ctrl-C, SIGTERM, ``--stop-after``: ``stp dataset`` keeps what it recorded and summarises
it) and run this script again to continue; the wall time of every part is added up in
``WORK/parts.json``, with the commit of the code that ran it: a part at another commit is
refused (one run, one code), so run the parts from one checkout, e.g. a ``git worktree`` of
the commit with its own non-editable install, while the main checkout moves on. When the data set is complete it writes ``FILE`` (default
``benchmarks/results/paper-scale.json``) with ``programs``, ``types``, ``entries``, ``single``,
``multi`` (chat records), ``difficulty`` (shares of difficult / medium / easy items counted the
paper's way, from ``report.json``'s ``composition``), ``answers_per_single_prompt``,
``multi_slots_per_distinct_step``, ``wall_s`` (all parts), ``entries_per_s`` and the paper's
figures beside them. Exit 0 when complete, 3 when the run stopped before the end (a partial
summary is printed), 1 when a step failed.
"""

from __future__ import annotations

import argparse
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAPER = {"programs": 6335, "types": 189, "entries_before": 35878, "items": 24953, "single": 7537, "multi": 17416,
         "difficulty_pct": {"difficult": 87.32, "medium": 12.17, "easy": 0.51}}


def _stp(*args: str, stop_after: float | None = None) -> int:
    """Run ``stp ARGS``; after ``stop_after`` seconds (or on Ctrl-C / SIGTERM here) the run is
    sent SIGTERM, which it answers by keeping what it recorded (exit 130)."""
    exe = Path(sys.executable).with_name("stp")
    cmd = [str(exe) if exe.exists() else "stp", *args]
    print("$", " ".join(cmd), flush=True)
    proc = subprocess.Popen(cmd)
    try:
        return proc.wait(timeout=stop_after)
    except subprocess.TimeoutExpired:
        print(f"stopping after {stop_after:g} s (the run resumes where it stopped)", flush=True)
    except KeyboardInterrupt:
        pass
    proc.send_signal(signal.SIGTERM)
    while True:
        try:
            return proc.wait()
        except KeyboardInterrupt:
            continue


def _commit() -> str:
    """The checked-out commit of the code that runs (``+dirty`` with uncommitted changes)."""
    try:
        head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True,
                              check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True).stdout.strip()
        return head + ("+dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def _types(corpus: Path) -> int:
    types = set()
    for p in corpus.glob("*.py"):
        with p.open(encoding="utf-8") as f:
            for line in f:
                if line.startswith("# type:"):
                    types.add(line.split(":", 1)[1].strip())
                    break
                if not line.startswith("#"):
                    break
    return len(types)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--count", type=int, default=PAPER["programs"])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("-j", "--workers", type=int, default=2)
    ap.add_argument("--work", type=Path, default=ROOT / "out" / "paper-scale")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "paper-scale.json")
    ap.add_argument("--stop-after", type=float, default=None, metavar="SECONDS",
                    help="stop this part after SECONDS (the next run resumes)")
    ap.add_argument("--allow-code-change", action="store_true",
                    help="resume although the code's commit differs from the earlier parts'")
    args = ap.parse_args(argv)

    corpus, data, parts_file = args.work / "corpus", args.work / "data", args.work / "parts.json"
    args.work.mkdir(parents=True, exist_ok=True)
    parts = json.loads(parts_file.read_text()) if parts_file.exists() else []
    commit = _commit()
    before = {p.get("commit") for p in parts if p.get("commit")}
    if before and before != {commit} and not args.allow_code_change:
        print(f"error: {args.work} holds parts run at commit {', '.join(sorted(before))}, this is {commit}: "
              "one run is one code; check that commit out (or pass --allow-code-change)", file=sys.stderr)
        return 2
    started = time.time()
    if len(list(corpus.glob("*.py"))) < args.count:
        t0 = time.perf_counter()
        if _stp("corpus", "-o", str(corpus), "--count", str(args.count), "--seed", str(args.seed), "-q") != 0:
            return 1
        parts.append({"step": "corpus", "wall_s": round(time.perf_counter() - t0, 1), "commit": commit,
                      "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started))})
        parts_file.write_text(json.dumps(parts, indent=1))
    t0 = time.perf_counter()
    left = None if args.stop_after is None else max(1.0, args.stop_after - (time.time() - started))
    rc = _stp("dataset", str(corpus), "-o", str(data), "--profile", "paper", "--seed", str(args.seed),
              "-j", str(args.workers), "-q", stop_after=left)
    parts.append({"step": "dataset", "wall_s": round(time.perf_counter() - t0, 1), "exit": rc, "commit": commit,
                  "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started))})
    parts_file.write_text(json.dumps(parts, indent=1))
    states = data / "state.jsonl"
    done = sum(1 for _ in states.open()) if states.exists() else 0
    report = json.loads((data / "report.json").read_text()) if (data / "report.json").exists() else None
    wall = round(sum(p["wall_s"] for p in parts), 1)
    if rc not in (0, 130) or report is None or done < args.count:
        print(json.dumps({"programs_done": done, "programs": args.count, "wall_s": wall, "exit": rc}))
        return 3 if done < args.count else 1
    comp = report.get("composition", {})
    summary = {
        "programs": report["programs"], "types": _types(corpus), "entries": report["entries"],
        "single": report["chat_single"], "multi": report["chat_multi"],
        "difficulty": comp.get("level_pct"), "difficulty_gap_vs_paper": comp.get("level_pct_gap"),
        "answers_per_single_prompt": comp.get("single_answers_per_prompt"),
        "multi_slots_per_distinct_step": (round(comp["multi_slots"] / comp["multi_distinct_steps"], 3)
                                          if comp.get("multi_distinct_steps") else None),
        "labels": report.get("labels"), "wall_s": wall,
        "entries_per_s": round(report["entries"] / wall, 2) if wall else None,
        "workers": args.workers, "seed": args.seed, "commit": commit, "parts": parts, "paper": PAPER,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(summary, indent=1) + "\n")
    print(json.dumps({k: v for k, v in summary.items() if k not in ("parts", "paper")}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
