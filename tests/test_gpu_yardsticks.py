"""Level yardsticks (issue 52): PyTorch eager runs on the program's own parameters and its
output is cross-checked against our original's before anything is timed; a program's best is
reported only with a clean compute-sanitizer verdict where the tool can run (memcheck,
initcheck, and racecheck/synccheck where the kernel uses shared memory or barriers).

No GPU needed: eager runs on the CPU (the simulated device's path), the pack is built and run
on the simulated CUDA device by the real commands, and where a GPU node would start NVIDIA's
``compute-sanitizer`` a stand-in executable prints the tool's documented output (the parsing,
the verdicts and the choice of the best are ours and run unchanged).
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from steptp.backend import cuda_runtime as cr
from steptp.gpu import sanitizer as san
from steptp.resources import rules_dir
from steptp.runner.record import EntryRecord, read_baselines, read_entries, write_jsonl

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
STP = Path(sys.executable).parent / "stp"

# Output formats of NVIDIA's Compute Sanitizer User Manual ("Initcheck Tool", "Synccheck
# Tool", "Memcheck Tool"): every line prefixed, details indented, one ERROR SUMMARY line.
INITCHECK_OUT = """\
========= COMPUTE-SANITIZER
========= Uninitialized __global__ memory read of size 4 bytes
=========     at vectorAdd(int *)+0x70 in /home/cuda/initcheck_error.cu:8
=========     by thread (0,0,0) in block (0,0,0)
=========     Address 0x7f7d8cc00000
=========     Saved host backtrace up to driver entry point at kernel launch time
=========     Host Frame: [0x2db3e4]
=========                in /lib64/libcuda.so.1
=========
========= ERROR SUMMARY: 48 errors
"""
SYNCCHECK_OUT = """\
========= COMPUTE-SANITIZER
========= Barrier error detected. Divergent thread(s) in warp
=========     at myKernel(int *, int)+0x110 in /tmp/divergence.cu:14
=========     by thread (37,0,0) in block (0,0,0)
=========
========= ERROR SUMMARY: 1 error
"""
CLEAN_OUT = "========= COMPUTE-SANITIZER\n========= ERROR SUMMARY: 0 errors\n"


# ---------------------------------------------------------------------------
# eager on the program's own parameters, cross-checked
# ---------------------------------------------------------------------------


def _pack_program(path: Path, *, eval_mode: bool = False):
    """A program as a pack manifest holds it (specs, roles, the ``.py`` with its parameter
    map) and trial 0 of its verification (inputs, our original's CPU outputs, allowances)."""
    from steptp.frontend import translate_file
    from steptp.gpu.pack import torch_param_map
    from steptp.runner.program_inputs import tensor_specs
    from steptp.verify import default_runner, reference_data

    tr = translate_file(path, eval_mode=eval_mode)
    m = tr.module
    prog = {"name": m.signature.name, "specs": [list(s) for s in tensor_specs(m.signature)],
            "roles": [t.role for t in m.signature.tensors],
            "torch": {"file": str(path), **torch_param_map(path, m)}}
    ref = reference_data(m, 3, 0, runner=default_runner(), timeout_s=120.0)
    return prog, ref.inputs[0], ref.refs[0], (ref.slacks or [{}])[0]


def test_eager_gets_the_programs_parameters_and_its_output_is_checked():
    from steptp.gpu.eager import comparable, program_model

    src = EXAMPLES / "gemm_relu.py"  # relu(x @ W^T + b): nn.Linear's weight and bias are LEIR params
    prog, inputs, ref, slack = _pack_program(src)
    assert prog["torch"]["params"] == {"C": "gemm.weight", "D": "gemm.bias"}
    model, args, info = program_model(src, prog, inputs, "cpu", ref, slack)
    assert info == {"eager_params": "program", "eager_check": "equal", "eager_mode": "train"} and comparable(info)
    # the module holds the verifier's trial-0 arrays, not its own seeded initialisation
    assert np.array_equal(model.gemm.weight.detach().numpy(), inputs["C"])
    assert np.array_equal(model.gemm.bias.detach().numpy(), inputs["D"])
    assert np.array_equal(args[0].numpy(), inputs["A"])

    # without the map the model keeps its own seeded weights: the check catches it
    bare = {**prog, "torch": {"file": str(src)}}
    _, _, info = program_model(src, bare, inputs, "cpu", ref, slack)
    assert info["eager_params"].startswith("own seeded: no map") and not comparable(info)
    assert info["eager_check"].startswith("mismatch: output E differs in trial 0")
    # one element of our original's output off by 1 %: not comparable either
    bad = {"E": ref["E"].copy()}
    i = np.unravel_index(int(np.argmax(np.abs(bad["E"]))), bad["E"].shape)
    bad["E"][i] *= 1.01
    _, _, info = program_model(src, prog, inputs, "cpu", bad, slack)
    assert info["eager_params"] == "program" and info["eager_check"].startswith("mismatch: output E differs")
    assert f"worst at {tuple(int(x) for x in i)}" in info["eager_check"]
    # no reference: not checked, hence not comparable
    _, _, info = program_model(src, prog, inputs, "cpu", None)
    assert info["eager_check"].startswith("not checked") and not comparable(info)


def test_buffers_are_loaded_and_a_program_translated_in_eval_mode_is_checked_in_eval_mode(tmp_path):
    """Batch norm translated with ``--eval``: its running statistics are LEIR params (module
    buffers); the model is built in training mode (batch statistics), which mismatches, so eval
    mode is tried and matches."""
    from steptp.gpu.eager import program_model

    src = tmp_path / "bn.py"
    src.write_text("import torch\n\n\nclass Model(torch.nn.Module):\n    def __init__(self):\n        super().__init__()\n"
                   "        self.bn = torch.nn.BatchNorm1d(6)\n\n    def forward(self, x):\n        return self.bn(x)\n\n\n"
                   "def get_inputs():\n    return [torch.randn(8, 6)]\n\n\ndef get_init_inputs():\n    return []\n")
    prog, inputs, ref, slack = _pack_program(src, eval_mode=True)
    params = prog["torch"]["params"]
    assert {"bn.running_mean", "bn.running_var"} <= set(params.values())
    model, _, info = program_model(src, prog, inputs, "cpu", ref, slack)
    assert info == {"eager_params": "program", "eager_check": "equal", "eager_mode": "eval"} and not model.training
    name = next(k for k, v in params.items() if v == "bn.running_mean")
    assert np.array_equal(model.bn.running_mean.numpy(), inputs[name])


def test_the_parameter_map_refuses_what_it_cannot_match():
    from steptp.frontend import translate_file
    from steptp.gpu.eager import load_program_params
    from steptp.gpu.pack import torch_param_map

    conv = translate_file(EXAMPLES / "conv_pool.py").module
    got = torch_param_map(EXAMPLES / "gemm_relu.py", conv)  # another program's file
    assert "params_error" in got and "gemm_relu.py's translation" in got["params_error"]
    assert torch_param_map(EXAMPLES / "softmax.py", translate_file(EXAMPLES / "softmax.py").module) == {"params": {}}
    missing = torch_param_map(EXAMPLES / "nowhere.py", conv)
    assert "does not translate again" in missing["params_error"]
    # a key that names no tensor of the module, a shape that differs: ValueError, nothing set
    tr = translate_file(EXAMPLES / "gemm_relu.py")
    from steptp.runner.program_inputs import tensor_specs

    prog = {"specs": [list(s) for s in tensor_specs(tr.module.signature)],
            "roles": [t.role for t in tr.module.signature.tensors],
            "torch": {"params": {"C": "gemm.weight", "D": "lifted_tensor_0"}}}
    arrays = {k: np.ones(tuple(s[1]), np.float32) for k, s in zip((s[0] for s in prog["specs"]), prog["specs"])}
    before = tr.model.gemm.weight.detach().clone()
    with pytest.raises(ValueError, match="not a parameter or buffer"):
        load_program_params(tr.model, prog, arrays)
    with pytest.raises(ValueError, match=r"module shape \[16, 12\], program \[12, 16\]"):
        load_program_params(tr.model, {**prog, "torch": {"params": {"C": "gemm.weight", "D": "gemm.bias"}}},
                            {**arrays, "C": np.ones((12, 16), np.float32)})
    assert np.array_equal(tr.model.gemm.weight.detach(), before)


# ---------------------------------------------------------------------------
# the node on the simulated device
# ---------------------------------------------------------------------------


def _sim_env(tmp: Path) -> dict:
    return {**os.environ, "STP_CUDA_SIM": "1", "STP_PTX_CACHE": str(tmp / "ptx")}


def _run(*args, env):
    return subprocess.run([str(a) for a in args], capture_output=True, text=True, env=env, timeout=900)


@pytest.fixture(scope="module")
def node_run(tmp_path_factory):
    """gemm_relu.py's dataset (two loop_split entries), its pack and a node run on the
    simulated device with the re-time of both, the sanitizer phase and the baselines."""
    if cr.cuda_compiler() is None:
        pytest.fail("the simulated CUDA device needs a CUDA compiler (nvcc or NVRTC)", pytrace=False)
    tmp = tmp_path_factory.mktemp("yardsticks")
    env = _sim_env(tmp)
    ds, pack, res = tmp / "ds", tmp / "pack", tmp / "res"
    r = _run(STP, "dataset", EXAMPLES / "gemm_relu.py", "-o", ds, "--rule", rules_dir() / "loop_split.yaml",
             "--per-rule", "2", "-q", env=env)
    assert r.returncode == 0, r.stderr
    r = _run(STP, "gpu", "pack", ds, "-o", pack, "-q", env=env)
    assert r.returncode == 0, r.stderr
    r = _run(sys.executable, "-m", "steptp.gpu.run", pack, "-o", res, "--time", "--repeat", "3", "--min-ms", "0.2",
             "--retime-best", "2", "--sanitizer", "--baselines", "-q", env=env)
    assert r.returncode == 0, r.stderr
    return {"tmp": tmp, "env": env, "pack": pack, "res": res,
            "manifest": json.loads((pack / "manifest.json").read_text())}


def test_the_node_runs_eager_on_the_programs_parameters_and_records_the_check(node_run):
    m, res = node_run["manifest"], node_run["res"]
    (prog,) = m["programs"].values()
    assert prog["torch"]["params"] == {"C": "gemm.weight", "D": "gemm.bias"}  # carried by the pack
    recs = read_entries(res / "results.jsonl")
    assert len(recs) == len(m["entries"]) == 2
    for r in recs.values():
        assert r.eager["eager_params"] == "program" and r.eager["eager_check"] == "equal"
        assert r.eager["eager_us"] > 0 and r.eager["allow_tf32"] == {"matmul": False, "cudnn": False, "fp16_reduced_reduction": False}
    s = json.loads((res / "summary.json").read_text())
    (p,) = s["programs"]
    assert (p["eager_params"], p["eager_check"]) == ("program", "equal") and p["eager_us"] > 0
    assert p["best_sanitizer"] == san.UNCHECKED_SIMULATED and p["best_id"] in recs  # no tool can check CPU builds
    (b,) = read_baselines(res).values()
    fields = b.summary_fields()
    assert (fields["eager_params"], fields["eager_check"], b.eager_mode) == ("program", "equal", "train")
    assert b.eager_us > 0 and fields["speedup_vs_eager"] is not None
    assert b.best_sanitizer == (san.UNCHECKED_SIMULATED if b.best_id else None)
    report = (res / "report.md").read_text()
    assert "eager check" in report and san.UNCHECKED_SIMULATED[:40] in report


def test_an_eager_that_computes_something_else_is_not_comparable_and_not_timed(node_run, tmp_path):
    """The same pack without its parameter map (a pack made before issue 52): eager runs with
    its own seeded weights, its output is not the original's, so no eager time, no ratio and
    no torch.compile against it; the reason is recorded; nothing crashes."""
    pack = tmp_path / "pack"
    shutil.copytree(node_run["pack"], pack)
    man = json.loads((pack / "manifest.json").read_text())
    for p in man["programs"].values():
        del p["torch"]["params"]
    (pack / "manifest.json").write_text(json.dumps(man))
    res = tmp_path / "res"
    r = _run(sys.executable, "-m", "steptp.gpu.run", pack, "-o", res, "--time", "--repeat", "3", "--min-ms", "0.2",
             "--baselines", "--compile", "--compile-cap-s", "30", "-q", env=node_run["env"])
    assert r.returncode == 0, r.stderr
    assert "Traceback" not in r.stderr
    for x in read_entries(res / "results.jsonl").values():
        assert "eager_us" not in x.eager and x.eager["error"].startswith("not comparable")
        assert x.eager["eager_check"].startswith("mismatch: output E differs in trial 0")
        assert x.eager["eager_params"].startswith("own seeded")
    s = json.loads((res / "summary.json").read_text())
    (p,) = s["programs"]
    assert p["eager_us"] is None and p["eager_reason"].startswith("not comparable") and s["eager_programs"] == 0
    (b,) = read_baselines(res).values()
    f = b.summary_fields()
    assert b.eager_us is None and f["speedup_vs_eager"] is None and b.eager_check.startswith("mismatch")
    assert f["eager_us_reason"].startswith("not comparable") and "not comparable" in f["speedup_vs_eager_reason"]
    assert f["compile_us"] is None and not b.cpu_figures and f["compile_us_reason"].startswith("not comparable")
    assert b.best_py_us > 0  # ours still timed


# ---------------------------------------------------------------------------
# the sanitizer: tools, formats, and no best without a verdict
# ---------------------------------------------------------------------------


def test_initcheck_and_synccheck_outputs_and_which_tools_run():
    assert san.parse_output(INITCHECK_OUT, "initcheck") == (48, None, "Uninitialized __global__ memory read of size 4 "
                                                                      "bytes")
    assert san.parse_output(SYNCCHECK_OUT, "synccheck") == (1, None, "Barrier error detected. Divergent thread(s) "
                                                                     "in warp")
    assert san.parse_output(CLEAN_OUT, "initcheck") == (0, None, "")
    assert san.parse_output("========= COMPUTE-SANITIZER\n", "synccheck")[0] is None  # no summary: no verdict
    for tool in ("initcheck", "synccheck"):
        assert san.command("/cs", tool, ["x"]) == ["/cs", "--tool", tool, "--error-exitcode", "86", "--print-limit",
                                                   "20", "x"]
    src = ('extern "C" __global__ void f1_kernel(float* A) { A[0] = 1.f; }\n'
           'extern "C" __global__ void f2_kernel(float* A) { __shared__ float T[32]; T[threadIdx.x] = A[0];\n'
           '  __syncthreads(); A[1] = T[0]; }\n'
           'extern "C" __global__ void f3_kernel(float* A) { if (threadIdx.x < 4) { __syncthreads(); } A[0] = 0.f; }\n')
    assert san.tools_for(src, "f1") == ["memcheck", "initcheck"]
    assert san.tools_for(src, "f2") == ["memcheck", "initcheck", "racecheck", "synccheck"]
    assert san.tools_for(src, "f3") == ["memcheck", "initcheck", "synccheck"]  # a barrier, no shared memory


def _stand_in(tmp: Path, bad_func: str | None = None, mode: str = "clean") -> str:
    """An executable in place of NVIDIA's compute-sanitizer: for the function ``bad_func``
    (the launcher's last argument) it prints initcheck's error (``mode`` "initcheck") or
    hangs past any cap (``mode`` "hang"); every other run prints a clean summary."""
    (tmp / "init.txt").write_text(INITCHECK_OUT)
    (tmp / "clean.txt").write_text(CLEAN_OUT)
    p = tmp / "compute-sanitizer"
    bad = {"initcheck": f'[ "$2" = initcheck ] && {{ cat {tmp / "init.txt"}; exit 86; }}', "hang": "exec sleep 30"}
    body = bad.get(mode, "") if bad_func else ""
    p.write_text(f'#!/bin/sh\nfor last; do :; done\nif [ "$last" = "{bad_func}" ]; then\n  {body or ":"}\nfi\n'
                 f"cat {tmp / 'clean.txt'}\nexit 0\n")
    p.chmod(p.stat().st_mode | stat.S_IXUSR)
    return str(p)


def _node_results(node_run, tmp: Path) -> tuple[Path, str, str]:
    """A copy of the node's results where both entries were re-timed, their timings set so
    that entry ``fast`` is the fastest (speedup 2.0, interval above 1) and ``slow`` next (1.5):
    returns ``(results, fast id, slow id)``."""
    res = tmp / "res"
    shutil.copytree(node_run["res"], res)
    recs, again = read_entries(res / "results.jsonl"), read_entries(res / "retime.jsonl")
    assert set(again) == set(recs) and len(recs) == 2
    funcs = {e["id"]: e["transformed"]["func"] for e in node_run["manifest"]["entries"]}
    fast, slow = sorted(recs)
    assert funcs[fast] != funcs[slow]
    for rs in (recs, again):
        for i, (sp, us) in ((fast, (2.0, 1.0)), (slow, (1.5, 2.0))):
            t = rs[i].timing
            t.speedup, t.ci, t.transformed_us, t.original_us = sp, [sp - 0.3, sp + 0.3], us, 3.0
            rs[i].sanitizer, rs[i].sanitizer_reason = None, EntryRecord("x", "p").sanitizer_reason
    write_jsonl(res / "results.jsonl", recs.values())
    write_jsonl(res / "retime.jsonl", again.values())
    return res, fast, slow


def _real_node(monkeypatch, tool: str | None, tmp: Path) -> None:
    """This process as a GPU node (not the simulated device) with ``tool`` as its
    compute-sanitizer, or with none anywhere it is looked for."""
    monkeypatch.delenv("STP_CUDA_SIM", raising=False)
    if tool is None:
        monkeypatch.delenv("STP_COMPUTE_SANITIZER", raising=False)
        empty = tmp / "empty-path"
        empty.mkdir(exist_ok=True)
        monkeypatch.setenv("PATH", str(empty))
    else:
        monkeypatch.setenv("STP_COMPUTE_SANITIZER", tool)


@pytest.mark.parametrize("mode", ["hang", "initcheck"])
def test_a_best_without_a_clean_verdict_gives_way_to_the_next(node_run, tmp_path, monkeypatch, mode):
    """The tool exists: the fastest entry's check is capped (no verdict) or finds an
    uninitialised read (rejected); the next entry, checked clean, is the best in the summary
    and for the baselines."""
    from steptp.gpu.run import summarize
    from steptp.gpu.session import check_best, choose_best

    res, fast, slow = _node_results(node_run, tmp_path)
    m = node_run["manifest"]
    funcs = {e["id"]: e["transformed"]["func"] for e in m["entries"]}
    tool = _stand_in(tmp_path, funcs[fast], mode)
    _real_node(monkeypatch, tool, tmp_path)
    assert san.unchecked_label() is None
    got = check_best(str(node_run["pack"]), res, m, cap_s=2.0, jobs=2)
    assert got["tool"] == tool and got["checked"] == 2
    again = read_entries(res / "retime.jsonl")
    assert [c.tool for c in again[slow].sanitizer] == ["memcheck", "initcheck"]  # no shared memory, no barrier
    assert again[slow].sanitizer_clean() is True
    if mode == "hang":
        assert again[fast].sanitizer_clean() is None and "over the 2 s cap" in again[fast].sanitizer[0].reason
        assert got["no_verdict"] == 1
    else:
        assert again[fast].status == "sanitizer" and got["findings"] == 1
        assert "Uninitialized __global__ memory read" in again[fast].reason
    verdicts: dict = {}
    best = choose_best(res, m, verdicts)
    (okey,) = best
    assert best[okey][0]["id"] == slow and best[okey][1] is True and verdicts[okey] == "clean"
    (p,) = summarize(res / "results.jsonl", m)["programs"]
    assert (p["best_id"], p["best_sanitizer"], p["best_us"]) == (slow, "clean", 2.0)


def test_no_verdict_anywhere_means_no_best_and_no_tool_means_unchecked(node_run, tmp_path, monkeypatch):
    from steptp.gpu.run import summarize
    from steptp.gpu.session import check_best, choose_best

    m = node_run["manifest"]
    (okey,) = m["programs"]
    # the tool exists and was not run (no --sanitizer): nothing is reported as the best
    res, fast, slow = _node_results(node_run, tmp_path)
    _real_node(monkeypatch, _stand_in(tmp_path), tmp_path)
    (p,) = summarize(res / "results.jsonl", m)["programs"]
    assert p["best_us"] is None and p["best_id"] is None and "no compute-sanitizer verdict" in p["best_reason"]
    verdicts: dict = {}
    best = choose_best(res, m, verdicts)
    assert best[okey][1] is False and verdicts[okey].startswith(f"no best: {fast}: no compute-sanitizer verdict")
    # the tool exists and every check is capped: still none
    tool = tmp_path / "slow-sanitizer"
    tool.write_text("#!/bin/sh\nexec sleep 30\n")
    tool.chmod(tool.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("STP_COMPUTE_SANITIZER", str(tool))
    got = check_best(str(node_run["pack"]), res, m, cap_s=1.0, jobs=2)
    assert got["no_verdict"] == 2 and got["findings"] == 0
    (p,) = summarize(res / "results.jsonl", m)["programs"]
    assert p["best_us"] is None and "over the 1 s cap" in p["best_reason"]
    assert choose_best(res, m)[okey][1] is False
    # a node without the tool: the fastest is the best, labelled unchecked (said explicitly)
    res2 = tmp_path / "nodetool"
    res2.mkdir()
    res2, fast, _ = _node_results(node_run, res2)
    _real_node(monkeypatch, None, tmp_path)
    if san.find_tool() is not None:
        pytest.fail(f"a compute-sanitizer is installed where none should be found: {san.find_tool()}")
    got = check_best(str(node_run["pack"]), res2, m)
    assert got["tool"] is None and "compute-sanitizer not found" in got["reason"]
    verdicts = {}
    best = choose_best(res2, m, verdicts)
    assert best[okey][0]["id"] == fast and verdicts[okey] == san.UNCHECKED_NO_TOOL == "unchecked: no compute-sanitizer"
    (p,) = summarize(res2 / "results.jsonl", m)["programs"]
    assert (p["best_id"], p["best_sanitizer"]) == (fast, san.UNCHECKED_NO_TOOL)


def test_the_search_reads_the_nodes_sanitizer_gate(node_run, tmp_path, monkeypatch):
    """The node writes each re-timed record's sanitizer gate (``gate_retimed``), and the search
    side (``runner.pack._measure_result``, what ``stp search`` reads back) takes no best the
    gate refuses: on the simulated device the best stands, labelled unchecked; on a GPU node
    whose compute-sanitizer gave no verdict it is no best; on one without the tool it stands,
    labelled so."""
    from steptp.gpu.run import gate_retimed
    from steptp.runner.pack import _measure_result

    sim = [r for r in read_entries(node_run["res"] / "retime.jsonl").values() if r.status == "equal"]
    assert sim and all(r.sanitizer_gate == san.UNCHECKED_SIMULATED for r in sim)
    assert all(_measure_result(r).status == "equal" for r in sim)
    res, fast, slow = _node_results(node_run, tmp_path)
    _real_node(monkeypatch, _stand_in(tmp_path), tmp_path)          # the tool exists, was not run
    assert gate_retimed(res) == 2
    again = read_entries(res / "retime.jsonl")
    got = _measure_result(again[fast])
    assert again[fast].sanitizer_gate == "none" and got.status == "sanitizer"
    assert "no compute-sanitizer verdict where the tool exists" in got.reason
    _real_node(monkeypatch, None, tmp_path)                           # no tool on this node
    gate_retimed(res)
    again = read_entries(res / "retime.jsonl")
    assert again[fast].sanitizer_gate == san.UNCHECKED_NO_TOOL
    assert _measure_result(again[fast]).status == "equal"
