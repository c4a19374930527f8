"""The one result record (issue 45) and the node's compute-sanitizer parser (issue 44).

Records round-trip through JSON, a line of another schema version is refused in one line,
a baseline without a figure needs its reason; the sanitizer's output parser is run on the
output formats of NVIDIA's Compute Sanitizer User Manual
(https://docs.nvidia.com/compute-sanitizer/ComputeSanitizer/index.html: "Memcheck Tool",
"Racecheck Tool: Racecheck Report Modes"), and its runner on a stand-in executable that
prints those formats (this machine has no GPU and no compute-sanitizer).
"""

from __future__ import annotations

import json
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from steptp.gpu import sanitizer as san
from steptp.runner.record import (RATIOS, SCHEMA_VERSION, STATUSES, TIME_FIELDS, Check, EntryRecord, PairTiming,
                                  ProgramBaselines, Ratio, SanitizerCheck, SchemaError, baseline_summary, read_baselines,
                                  read_entries,
                                  read_results, write_jsonl)
from steptp.runner.stats import paired_speedup, spread

#: memcheck's report of a misaligned write and the launch failure it causes (the manual's
#: memcheck_demo, release build): the error line, indented detail lines, the summary.
MEMCHECK_OUT = """\
========= COMPUTE-SANITIZER
Mallocing memory
Running unaligned_kernel
========= Invalid __global__ write of size 4 bytes
=========     at unaligned_kernel()+0x70 in memcheck_demo.cu:6
=========     by thread (0,0,0) in block (0,0,0)
=========     Address 0x7f2a0c000001 is misaligned
=========     and is inside the nearest allocation at 0x7f2a0c000000 of size 4 bytes
=========     Saved host backtrace up to driver entry point at kernel launch time
=========         Host Frame: [0x2db39f]
=========                    in /lib/x86_64-linux-gnu/libcuda.so.1
=========
========= Program hit cudaErrorLaunchFailure (error 719) due to "unspecified launch failure" on CUDA API call to cudaDeviceSynchronize.
=========     Saved host backtrace up to driver entry point at error
=========
========= ERROR SUMMARY: 2 errors
"""
MEMCHECK_CLEAN = "========= COMPUTE-SANITIZER\nlaunched main of modules/lib0 once\n========= ERROR SUMMARY: 0 errors\n"
#: racecheck in analysis mode (the default report): one race between a write and a read of
#: shared memory, then its summary.
RACECHECK_OUT = """\
========= COMPUTE-SANITIZER
========= Error: Race reported between Write access at sumKernel(int *, int *)+0x90 in block_error.cu:41
=========     and Read access at sumKernel(int *, int *)+0x160 in block_error.cu:51 [4 hazards]
=========
========= RACECHECK SUMMARY: 1 hazard displayed (1 error, 0 warnings)
"""
RACECHECK_WARNING_ONLY = """\
========= COMPUTE-SANITIZER
========= Warning: Race reported between Read access at k()+0x10 in a.cu:3
=========     and Write access at k()+0x20 in a.cu:4 [1 hazard]
=========
========= RACECHECK SUMMARY: 1 hazard displayed (0 errors, 1 warning)
"""


def _entry(**kw) -> EntryRecord:
    timing = PairTiming(original_us=10.0, transformed_us=4.0, speedup=2.5, ci=[2.2, 2.7], verdict="faster", rounds=8,
                        number=100, original_number=40, device="cuda", original_iqr_us=[9.8, 10.3],
                        transformed_iqr_us=[3.9, 4.1])
    base = dict(id="p:1", program="abc", strategy="loop_split", device_name="NVIDIA H200", arch="sm_90",
                original=Check(True, True, "", 0.0, 0.0, 5, 3.0), transformed=Check(True, True, "", 1e-7, 1e-6, 5, 0.5),
                timing=timing, cpu_equal=True, agree=True)
    base.update(kw)
    return EntryRecord(**base)


def test_entry_record_round_trips_and_derives_its_status():
    r = _entry()
    d = json.loads(json.dumps(r.to_json()))
    assert d["schema"] == SCHEMA_VERSION and d["status"] == "equal" and d["reason"] == ""
    assert d["time_us"] == 4.0 and d["time_iqr_us"] == [3.9, 4.1] and d["repeats"] == 8
    assert d["max_abs_err"] == 1e-7 and d["max_rel_err"] == 1e-6 and d["trials"] == 5
    back = EntryRecord.from_json(d)
    assert back == r and back.to_json() == d
    # each rejection and its reason
    wrong = _entry(transformed=Check(True, False, "equal: C[3] 1.5 vs 1.0"))
    assert (wrong.status, wrong.reason, wrong.equal) == ("not_equal", "equal: C[3] 1.5 vs 1.0", False)
    fault = _entry(transformed=Check(False, False, "exec: CUDA error: an illegal memory access"), timing=None)
    assert fault.status == "fault" and "illegal memory access" in fault.reason
    orig = _entry(original=Check(False, False, "exec: original failed"))
    assert orig.status == "original_failed" and orig.reason == "exec: original failed"
    finding = _entry(sanitizer=[SanitizerCheck("memcheck", 1, None, "Invalid __global__ write of size 4 bytes", 86)])
    assert finding.status == "sanitizer" and not finding.equal and finding.sanitizer_clean() is False
    assert finding.reason == "compute-sanitizer memcheck: 1 error(s): Invalid __global__ write of size 4 bytes"
    assert EntryRecord.from_json(finding.to_json()).status == "sanitizer"
    capped = _entry(sanitizer=[SanitizerCheck("memcheck", None, reason="over the 90 s cap")])
    assert capped.status == "equal" and capped.sanitizer_clean() is None
    timing = _entry(timing=PairTiming(error="timing failed on cuda: launch timeout"))
    assert timing.status == "timing_failed" and timing.equal
    unchecked = _entry(unchecked=True, original=Check(None, None, "no references"))
    assert unchecked.status == "unchecked"
    assert {x.status for x in (r, wrong, fault, orig, finding, timing, unchecked)} <= set(STATUSES)


def _baselines() -> ProgramBaselines:
    b = ProgramBaselines(program="abc", name="Gemm", best_id="p:1", device="cuda", device_name="NVIDIA H200",
                         dtypes={"A": "f16", "B": "f16", "C": "f16"}, torch_dtype="float16", best_us=40.0,
                         best_py_us=48.0, original_us=400.0, eager_us=60.0, eager_graph_us=45.0)
    b.ratios["speedup_vs_eager"] = Ratio(**{k: v for k, v in paired_speedup([60, 61, 59], [48, 47, 49]).items()
                                            if k in ("speedup", "ci", "verdict", "rounds")})
    b.set_reason("compile_us", "over the 120 s cap")
    b.set_reason("compile_s", "over the 120 s cap")
    b.set_reason("compile_autotune_us", "not requested (python -m steptp.gpu.run --autotune)")
    b.set_reason("compile_autotune_s", "not requested (python -m steptp.gpu.run --autotune)")
    return b


def test_baselines_need_a_reason_for_every_missing_figure_and_round_trip(tmp_path):
    b = _baselines()
    d = json.loads(json.dumps(b.to_json()))
    back = ProgramBaselines.from_json(d)
    assert back.to_json() == d and back.ratios["speedup_vs_eager"].speedup == pytest.approx(60 / 48, rel=0.05)
    s = back.summary_fields()
    for f in list(TIME_FIELDS) + list(RATIOS):
        assert isinstance(s[f], float) or (s[f] is None and s[f"{f}_reason"]), f
    assert s["compile_us_reason"] == "over the 120 s cap" and s["speedup_vs_compile_reason"].startswith("compile_us:")
    assert s["speedup_vs_eager_ci"][0] <= s["speedup_vs_eager"] <= s["speedup_vs_eager_ci"][1]
    assert s["dtypes"] == {"A": "f16", "B": "f16", "C": "f16"} and s["baseline_device"] == "cuda"
    # a missing figure without its reason is a writer's defect, refused
    bad = ProgramBaselines(program="x", best_us=1.0)
    with pytest.raises(ValueError, match="without a value or a reason"):
        bad.to_json()
    # files: written atomically, read back by program / entry id
    write_jsonl(tmp_path / "baselines.jsonl", [b])
    write_jsonl(tmp_path / "results.jsonl", [_entry()])
    res = read_results(tmp_path)
    assert res.baselines_of("p:1").best_us == 40.0 and res.best("abc").id == "p:1"
    assert read_baselines(tmp_path)["abc"].to_json() == d
    assert baseline_summary(tmp_path, "p:1")["best_us"] == 40.0
    none = baseline_summary(tmp_path, "p:unknown")
    assert all(none[f] is None and "no baselines" in none[f"{f}_reason"] for f in TIME_FIELDS)


def test_results_of_another_schema_are_refused_in_one_line(tmp_path):
    d = _entry().to_json()
    p = tmp_path / "results.jsonl"
    p.write_text(json.dumps({**d, "schema": SCHEMA_VERSION + 1}) + "\n")
    with pytest.raises(SchemaError) as e:
        read_entries(p)
    msg = str(e.value)
    assert msg == f"{p}:1: results written by schema {SCHEMA_VERSION + 1}, this stp reads {SCHEMA_VERSION}"
    assert "\n" not in msg
    old = {k: v for k, v in d.items() if k != "schema"}  # written before the records were versioned
    p.write_text(json.dumps(old) + "\n")
    with pytest.raises(SchemaError, match=f"results written by schema 0, this stp reads {SCHEMA_VERSION}"):
        read_entries(p)
    b = _baselines().to_json()
    (tmp_path / "baselines.jsonl").write_text(json.dumps({**b, "schema": 0}) + "\n")
    with pytest.raises(SchemaError, match="results written by schema 0"):
        read_baselines(tmp_path)
    # stp gpu merge and python -m steptp.gpu.run turn it into one line and exit 2
    (tmp_path / "ds").mkdir()
    (tmp_path / "ds" / "dictionary.jsonl").write_text(json.dumps({"id": "p:1"}) + "\n")
    p.write_text(json.dumps({**d, "schema": 99}) + "\n")
    r = subprocess.run([str(Path(sys.executable).parent / "stp"), "gpu", "merge", str(tmp_path), str(tmp_path / "ds")],
                       capture_output=True, text=True)
    assert r.returncode == 2 and "results written by schema 99" in r.stderr and "Traceback" not in r.stderr


def test_spread_gives_the_median_and_quartiles():
    s = spread([4.0, 1.0, 3.0, 2.0, 100.0], scale=1e6)
    assert s["median"] == 3e6 and s["q1"] == 2e6 and s["q3"] == 4e6 and s["min"] == 1e6 and s["n"] == 5
    with pytest.raises(ValueError):
        spread([])


def test_sanitizer_output_parser_on_the_documented_formats():
    assert san.parse_output(MEMCHECK_OUT, "memcheck") == (2, None, "Invalid __global__ write of size 4 bytes")
    assert san.parse_output(MEMCHECK_CLEAN, "memcheck") == (0, None, "")
    errors, warnings, first = san.parse_output(RACECHECK_OUT, "racecheck")
    assert (errors, warnings) == (1, 0)
    assert first.startswith("Error: Race reported between Write access at sumKernel(int *, int *)+0x90")
    assert san.parse_output(RACECHECK_WARNING_ONLY, "racecheck")[:2] == (0, 1)  # a warning does not reject
    # no summary: the tool or the program did not finish, no verdict
    assert san.parse_output("========= COMPUTE-SANITIZER\nSegmentation fault\n", "memcheck")[0] is None


def test_sanitizer_command_and_where_it_is_looked_for(monkeypatch, tmp_path):
    argv = san.launcher_argv("/p", "/p/r", "abc", {"lib": "modules/lib0", "func": "f3"})
    assert argv == [sys.executable, "-m", "steptp.gpu.sanitizer", "/p", "/p/r", "abc", "modules/lib0", "f3"]
    cmd = san.command("/cs", "memcheck", argv)
    assert cmd[:7] == ["/cs", "--tool", "memcheck", "--error-exitcode", "86", "--print-limit", "20"] and cmd[7:] == argv
    assert san.command("/cs", "racecheck", ["x"])[7:] == ["--racecheck-report", "analysis", "x"]
    with pytest.raises(ValueError):
        san.command("/cs", "initcheckx", ["x"])
    src = ('extern "C" __global__ void f1_kernel(float* A) { A[0] = 1.f; }\n'
           'extern "C" __global__ void f2_kernel(float* A) { __shared__ float T[32]; T[threadIdx.x] = A[0]; }\n')
    assert san.uses_shared_memory(src, "f2") and not san.uses_shared_memory(src, "f1")
    # absent here: no GPU, no tool (PATH, /usr/local/cuda*/bin, the nvidia pip packages)
    monkeypatch.delenv("STP_CUDA_SIM", raising=False)
    monkeypatch.delenv("STP_COMPUTE_SANITIZER", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    if san.find_tool() is None:
        assert "compute-sanitizer not found" in san.absent_reason()
    fake = tmp_path / "compute-sanitizer"
    fake.write_text("#!/bin/sh\necho x\n")
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    assert san.find_tool() == str(fake) and san.absent_reason() is None
    monkeypatch.setenv("STP_CUDA_SIM", "1")
    assert "simulated" in san.absent_reason()  # CPU builds: nothing a sanitizer could check


def _stand_in(tmp_path: Path, body: str) -> str:
    """An executable printing a documented output in place of NVIDIA's tool."""
    p = tmp_path / "cs.sh"
    p.write_text("#!/bin/sh\n" + body)
    p.chmod(p.stat().st_mode | stat.S_IXUSR)
    return str(p)


def test_sanitizer_runner_verdicts_caps_and_failures(tmp_path):
    (tmp_path / "out.txt").write_text(MEMCHECK_OUT)
    found = san.run_tool(_stand_in(tmp_path, f"cat {tmp_path / 'out.txt'}\nexit 86\n"), "memcheck", ["true"], 10)
    assert found.finding and found.errors == 2 and found.returncode == 86
    assert found.first_error == "Invalid __global__ write of size 4 bytes"
    (tmp_path / "out.txt").write_text(MEMCHECK_CLEAN)
    clean = san.run_tool(_stand_in(tmp_path, f"cat {tmp_path / 'out.txt'}\nexit 0\n"), "memcheck", ["true"], 10)
    assert clean.errors == 0 and not clean.finding and clean.reason == ""
    # the launch failed under the tool: no verdict, never "clean"
    failed = san.run_tool(_stand_in(tmp_path, f"cat {tmp_path / 'out.txt'}\nexit 3\n"), "memcheck", ["true"], 10)
    assert failed.errors is None and "exit 3" in failed.reason
    capped = san.run_tool(_stand_in(tmp_path, "sleep 20\n"), "racecheck", ["true"], 1.0)
    assert capped.errors is None and capped.reason == "over the 1 s cap" and capped.seconds < 10
    missing = san.run_tool(str(tmp_path / "nowhere"), "memcheck", ["true"], 5)
    assert missing.errors is None and "did not start" in missing.reason
