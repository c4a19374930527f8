"""A search stopped by its time limit or a signal keeps what it has (issue 37): a summary with
its samples, ``stopped`` saying why, and (after a signal) a run that stops and resumes."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
STP = Path(sys.executable).parent / "stp"


def test_time_limit_writes_a_partial_summary(tmp_path):
    out = tmp_path / "s"
    r = subprocess.run([str(STP), "search", str(ROOT / "examples" / "softmax.leir"), "-o", str(out), "-n", "200",
                        "--time-limit", "8", "-q"], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    sm = json.loads((out / "summary.json").read_text())
    assert sm["stopped"] == "time limit" and sm["samples"] >= 1
    assert (out / "tree.jsonl").read_text().count("\n") >= sm["samples"] + 1  # the root and every sample


def test_sigterm_keeps_the_samples_and_the_rerun_resumes(tmp_path):
    out = tmp_path / "s"
    cmd = [str(STP), "search", str(ROOT / "examples" / "softmax.leir"), str(ROOT / "examples" / "gelu.leir"), "-o",
           str(out), "-n", "200", "-q"]
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    # the first program's search has started (its directory exists) and is past its start-up
    deadline = time.monotonic() + 240
    while not (out / "softmax").exists() and time.monotonic() < deadline and p.poll() is None:
        time.sleep(0.5)
    time.sleep(20)  # 200 iterations take minutes: it is searching now
    assert p.poll() is None
    p.send_signal(signal.SIGTERM)
    _, err = p.communicate(timeout=300)
    assert p.returncode == 1, err
    assert "stopped (SIGTERM)" in err and "Traceback" not in err
    sm = json.loads((out / "softmax" / "summary.json").read_text())
    assert sm["stopped"] == "SIGTERM" and sm["speedup"] == 1.0
    run = json.loads((out / "run_summary.json").read_text())
    assert run["stopped"] == "SIGTERM" and not (out / "gelu" / "summary.json").exists()
    assert "stopped (SIGTERM)" in (out / "report.md").read_text()
