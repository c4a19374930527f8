"""The --device cuda matrix on the simulated CUDA device (STP_CUDA_SIM=1), no GPU needed.

Everything above the driver is the real code: GPU-form lowering, TVM's CUDA codegen, nvcc PTX
and its cache, export, worker processes and pickling, timing records and every command's
writing; only module load + launch runs the program's CPU build. Faults injected in the
simulator (a sticky CUDA error, a hang) show that one fault costs one candidate. The pack
runner is run in an interpreter that can import numpy and tvm_ffi only.
"""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
from pathlib import Path

import pytest

from steptp.backend import cuda_runtime as cr
from steptp.runner import cuda_timing as ct
from steptp.backend.hardware import H100
from steptp.leir import load_leir, parse_leir
from steptp.resources import rules_dir
from steptp.runner.record import STATUSES
from steptp.runner.worker import IsolatedRunner, WorkerCallError

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
STP = Path(sys.executable).parent / "stp"

#: the simulated device compiles real PTX: with nvcc, else NVRTC (the `nvrtc` extra, in the
#: test extra); never a silent skip (issue 34)
_COMPILER = cr.cuda_compiler()


@pytest.fixture(autouse=True)
def _cuda_compiler():
    if _COMPILER is None:
        pytest.fail("the simulated CUDA device needs a CUDA compiler: no nvcc on PATH and no NVRTC "
                    "(pip install '.[nvrtc]': cuda-bindings + nvidia-cuda-nvrtc)", pytrace=False)


@pytest.fixture
def sim(monkeypatch, tmp_path):
    """Simulated device on, a private PTX cache; the env reaches subprocesses and workers."""
    monkeypatch.setenv("STP_CUDA_SIM", "1")
    monkeypatch.setenv("STP_PTX_CACHE", str(tmp_path / "ptx"))
    monkeypatch.delenv("STP_CUDA_SIM_FAULT", raising=False)
    monkeypatch.delenv("STP_CUDA_SIM_ARCH", raising=False)
    return os.environ.copy()


def run(*args, env, cwd=None, timeout=600):
    return subprocess.run([str(a) for a in args], capture_output=True, text=True, env=env, cwd=cwd, timeout=timeout)


def _softmax_and_candidates(tmp_path, env, n=3):
    """softmax.leir and n loop_split candidates of it (distinct CUDA sources)."""
    orig = tmp_path / "softmax.leir"
    r = run(STP, "translate", EXAMPLES / "softmax.py", "-o", orig, env=env)
    assert r.returncode == 0, r.stderr
    out = []
    for site in range(n):
        p = tmp_path / f"cand{site}.leir"
        r = run(STP, "apply", rules_dir() / "loop_split.yaml", orig, "--site", site, "-o", p, env=env)
        assert r.returncode == 0, r.stderr
        out.append(p)
    return orig, out


def test_gpu_limits_pickle_and_unpicklable_calls_are_caller_errors():
    # the mappingproxy of GpuLimits crashed every --device cuda verification before
    assert pickle.loads(pickle.dumps(H100)) == H100
    with IsolatedRunner(timeout_s=30) as r:
        with pytest.raises(WorkerCallError, match="cannot send"):
            r.call(len, lambda: 0)  # a lambda does not pickle: never an Exec failure of a program
        assert r.call(len, [1, 2, 3]) == 3  # the worker is still usable


def test_ptx_key_depends_on_arch_and_compiler():
    src = "extern \"C\" __global__ void k() {}"
    keys = {cr.ptx_key(src, "sm_90", "nvcc-13.0 -O3"), cr.ptx_key(src, "sm_80", "nvcc-13.0 -O3"),
            cr.ptx_key(src, "sm_90", "nvcc-13.1 -O3"), cr.ptx_key(src, "sm_90", "nvrtc-13.0 -O3")}
    assert len(keys) == 4


def test_device_facts_from_the_simulated_device(sim, tmp_path):
    r = run(STP, "doctor", env=sim)
    assert "simulated device  on" in r.stdout and "--device cuda     available" in r.stdout, r.stdout
    env = {**sim, "STP_CUDA_SIM_ARCH": "sm_80"}
    code = "from steptp.runner.device import device_limits; print(device_limits('cuda').arch)"
    assert run(sys.executable, "-c", code, env=env).stdout.strip() == "sm_80"
    # a device CUDA 13 cannot compile for: exit 2, one line, nothing written
    env = {**sim, "STP_CUDA_SIM_ARCH": "sm_61"}
    out = tmp_path / "never"
    r = run(STP, "dataset", EXAMPLES / "softmax.leir", "-o", out, "--device", "cuda", env=env)
    assert r.returncode == 2 and "compute capability 6.1" in r.stderr and "Traceback" not in r.stderr
    assert not out.exists()


def test_verify_and_time_on_the_simulated_device(sim, tmp_path):
    orig, (cand, *_) = _softmax_and_candidates(tmp_path, sim, 1)
    r = run(STP, "verify", orig, cand, "--device", "cuda", env=sim)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "Equal  pass" in r.stdout and "device cuda" in r.stdout
    assert any(Path(sim["STP_PTX_CACHE"]).glob("*.ptx"))  # real nvcc PTX in the keyed cache
    r = run(STP, "time", orig, cand, "--device", "cuda", "--json", "--repeat", "3", "--min-repeat-ms", "1", env=sim)
    assert r.returncode == 0, r.stderr
    rows = [json.loads(x) for x in r.stdout.splitlines() if x.startswith("{")]
    assert len(rows) == 2 and all(x["device"] == "cuda" and x["median_us"] > 0 for x in rows)


def test_cuda_measurements_start_from_a_flushed_l2(sim, monkeypatch):
    # the flush size comes from the (simulated) device's L2; TVM's time_evaluator writes it
    # before each measurement: a kernel streaming 16 MiB (beyond this CPU's L2, within its
    # L3) is measurably slower with the flush than with warm caches
    import statistics

    import numpy as np

    from steptp.backend.perf import _params, build_perf_cpu

    monkeypatch.setenv("STP_CUDA_SIM_L2_BYTES", str(32 << 20))
    assert cr.l2_cache_bytes() == 32 << 20 and ct.l2_flush_bytes("cuda") == 64 << 20 and ct.l2_flush_bytes("cpu") == 0
    monkeypatch.delenv("STP_CUDA_SIM_L2_BYTES")
    assert ct.l2_flush_bytes("cuda") == 2 * cr.SIM_L2_BYTES
    monkeypatch.setenv("STP_CUDA_SIM_L2_BYTES", str(32 << 20))
    m = parse_leir("% program: stream\n% input A: f32[1024,2048]\n% output C: f32[1024,2048]\n"
                   "L^{1024}_{a=0}V^{2048}_{b=0}[C^{f32,g}_{a,b}=A^{f32,g}_{a,b}*2.0;];\n")
    mod = build_perf_cpu(m).executable.mod
    args = cr.device_args(_params(m), "cpu", {"A": np.ones((1024, 2048), "float32")})
    # the fastest of each (noise from the other test worker only adds time; a median under
    # load once gave 1.12x), interleaved in three rounds
    warm, cold = [], []
    for _ in range(3):
        warm += ct.time_function(mod, "cuda", args, number=1, repeat=8, flush_bytes=0)
        cold += ct.time_function(mod, "cuda", args, number=1, repeat=8)  # the default: L2 flushed
    assert min(cold) > 1.3 * min(warm), (min(cold), min(warm), statistics.median(cold), statistics.median(warm))


def test_sticky_fault_costs_one_candidate(sim, monkeypatch, tmp_path):
    from steptp.backend import cuda_source
    from steptp.verify import verify_pair

    orig, cands = _softmax_and_candidates(tmp_path, sim, 3)
    mods = [load_leir(p) for p in cands]
    lines = [set(cuda_source(m).splitlines()) for m in mods]
    unique = sorted(x.strip() for x in lines[1] - lines[0] - lines[2] if len(x.strip()) > 8)
    assert unique, "candidate 1 should have a CUDA line of its own"
    monkeypatch.setenv("STP_CUDA_SIM_FAULT", f"sticky:{unique[0]}")
    base = load_leir(orig)
    with IsolatedRunner(timeout_s=120) as r:
        res = [verify_pair(base, m, runner=r, device="cuda") for m in mods]
        assert res[0].equal and res[2].equal, [x.reason for x in res]
        assert not res[1].exec and "illegal memory access" in res[1].reason
        assert r.restarts == 1  # the faulty worker was discarded; the next candidate ran in a fresh one


def test_hang_costs_one_candidate(sim, monkeypatch, tmp_path):
    from steptp.backend import cuda_source
    from steptp.verify import verify_pair

    orig, cands = _softmax_and_candidates(tmp_path, sim, 2)
    mods = [load_leir(p) for p in cands]
    extra = sorted(x.strip() for x in set(cuda_source(mods[0]).splitlines()) - set(cuda_source(mods[1]).splitlines())
                   if len(x.strip()) > 8)
    monkeypatch.setenv("STP_CUDA_SIM_FAULT", f"hang:{extra[0]}")
    base = load_leir(orig)
    with IsolatedRunner(timeout_s=120) as r:
        verify_pair(base, mods[1], runner=r, device="cuda", timeout_s=120)  # warm the reference and the worker
        hung = verify_pair(base, mods[0], runner=r, device="cuda", timeout_s=15)
        after = verify_pair(base, mods[1], runner=r, device="cuda", timeout_s=120)
    assert not hung.exec and "time limit" in hung.reason
    assert after.equal, after.reason


def test_dataset_time_search_eval_on_the_simulated_device(sim, tmp_path):
    ds = tmp_path / "ds"
    r = run(STP, "dataset", EXAMPLES / "softmax.leir", "-o", ds, "--device", "cuda", "--time", "--rule",
            rules_dir() / "loop_split.yaml", "--per-rule", "2", "-q", env=sim)
    assert r.returncode == 0, r.stderr
    entries = [json.loads(x) for x in (ds / "dictionary.jsonl").read_text().splitlines()]
    assert entries, "the GPU path must produce entries, not an empty dataset"
    for e in entries:
        assert e["verification"]["device"] == "cuda" and e["verification"]["equal"]
        assert e["timing"]["device"] == "cuda" and e["timing"]["speedup"] > 0, e["timing"]
    r = run(STP, "search", EXAMPLES / "softmax.leir", "-o", tmp_path / "srch", "--device", "cuda", "-n", "2", env=sim)
    assert r.returncode == 0, r.stderr
    summary = json.loads(next((tmp_path / "srch").rglob("summary.json")).read_text())
    assert summary.get("device", summary.get("target")) == "cuda"
    r = run(STP, "eval", EXAMPLES / "softmax.leir", "-o", tmp_path / "ev", "--policy", "engine", "--device", "cuda",
            "--no-recognise", "-q", env=sim)
    assert r.returncode == 0, r.stderr
    rec = json.loads((tmp_path / "ev" / "results.jsonl").read_text().splitlines()[0])
    assert rec.get("error") != "internal", rec


def _runtime_only_env(tmp_path: Path, pack: Path, env: dict) -> dict:
    """An interpreter environment that can import numpy, ml_dtypes, tvm_ffi (and what the
    pack carries), nothing else: ``python -S -s`` with a PYTHONPATH of symlinks."""
    import ml_dtypes
    import numpy
    import tvm_ffi
    import typing_extensions  # apache-tvm-ffi's one dependency

    site = tmp_path / "site"
    site.mkdir()
    (site / "typing_extensions.py").symlink_to(typing_extensions.__file__)
    for mod in (numpy, ml_dtypes, tvm_ffi):
        d = Path(mod.__file__).parent
        (site / d.name).symlink_to(d)
        libs = d.parent / f"{d.name}.libs"
        if libs.is_dir():
            (site / libs.name).symlink_to(libs)
    keep = {k: v for k, v in env.items() if k.startswith("STP_") or k in ("PATH", "HOME", "TMPDIR")}
    return {**keep, "PYTHONPATH": f"{pack / 'python'}{os.pathsep}{site}", "PYTHONNOUSERSITE": "1"}


def _wrong(leir: str) -> str:
    """``leir`` with its last equation's value scaled by 1.5: a wrong program that still builds."""
    i = leir.rindex(";]")
    return leir[:i] + "*1.5" + leir[i:]


def test_pack_run_runtime_only_then_merge(sim, tmp_path):
    ds = tmp_path / "ds"
    r = run(STP, "dataset", EXAMPLES / "softmax.py", "-o", ds, "--per-rule", "1", "-q", env=sim)
    assert r.returncode == 0, r.stderr
    lines = (ds / "dictionary.jsonl").read_text().splitlines()
    n = len(lines)
    # one entry made wrong (its CPU verdict still says Equal): the node must find it not Equal
    wrong = json.loads(lines[-1])
    wrong["transformed"]["leir"] = _wrong(wrong["transformed"]["leir"])
    (ds / "dictionary.jsonl").write_text("\n".join(lines[:-1] + [json.dumps(wrong)]) + "\n")
    pack = tmp_path / "pack"
    r = run(STP, "gpu", "pack", ds, "-o", pack, "--batch", "8", "-q", env=sim)
    assert r.returncode == 0, r.stderr
    assert "MB in" in r.stderr and "references computed on the node" in r.stderr  # the pack size, printed
    m = json.loads((pack / "manifest.json").read_text())
    assert len(m["entries"]) == n and m["libraries"] >= 2  # batched: several programs per library
    size = sum(f.stat().st_size for f in pack.rglob("*") if f.is_file())
    assert size < 20 * 2**20
    assert not list(pack.rglob("libtvm_compiler.so"))
    # no stored outputs: the original's reference build, digests, and the .py it came from
    assert not (pack / "data").exists() and not list(pack.rglob("*.npz"))
    (prog,) = m["programs"].values()
    assert prog["reference"]["func"].startswith("r") and (pack / prog["reference"]["lib"] / "kernel.so").is_file()
    assert len(prog["outputs_sha1"]) == len(prog["inputs_sha1"]) == 9  # 3 random + 2 ordered + 4 edge-case
    assert (pack / prog["torch"]["file"]).read_text() == (EXAMPLES / "softmax.py").read_text()

    base = getattr(sys, "_base_executable", sys.executable)
    ro = _runtime_only_env(tmp_path, pack, sim)
    probe = ("import sys, importlib.util as u, steptp.gpu.run, steptp.gpu.node; "
             "print([m for m in ('tvm', 'lark', 'egglog', 'sympy', 'torch') if m in sys.modules]); "
             "print([m for m in ('tvm', 'lark', 'egglog', 'sympy', 'torch') if u.find_spec(m) is not None])")
    r = run(base, "-S", "-s", "-c", probe, env=ro)  # -S: not even the interpreter's own site-packages
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == ["[]", "[]"], r.stdout  # nothing of the compiler side is even importable

    # one transformed program faults (sticky): it alone fails, after one retry in a fresh worker
    e0 = m["entries"][0]
    src = (pack / e0["transformed"]["lib"] / "kernel.cu").read_text()
    fn = e0["transformed"]["func"]
    marker = f"{fn}_kernel("
    assert marker in src
    res = tmp_path / "res"
    r = run(base, "-S", "-s", "-m", "steptp.gpu.run", pack, "-o", res, "--time", "--repeat", "3", "--min-ms", "0.2", "-q",
            env={**ro, "STP_CUDA_SIM_FAULT": f"sticky:{marker}"})
    assert r.returncode == 0, r.stderr
    assert "Traceback" not in r.stderr
    # no torch on this node: said once, in one line, not an error
    assert r.stderr.count("torch does not import") == 1, r.stderr
    recs = {x["id"]: x for x in map(json.loads, (res / "results.jsonl").read_text().splitlines())}
    assert len(recs) == n
    assert all(x["eager"] is None and x["schema"] == 1 and x["status"] in STATUSES for x in recs.values())
    bad = [i for i, x in recs.items() if not x["transformed"]["equal"]]
    same_fn = {e["id"] for e in m["entries"] if e["transformed"] == e0["transformed"]}
    assert e0["id"] in bad and set(bad) <= same_fn | {wrong["id"]}, bad  # the faulty function, the wrong entry
    assert "illegal memory access" in recs[e0["id"]]["transformed"]["reason"]
    assert recs[e0["id"]]["retried"] and not recs[e0["id"]]["transformed"]["exec"]
    w = recs[wrong["id"]]
    assert w["transformed"]["exec"] and not w["transformed"]["equal"] and w["transformed"]["reason"].startswith("equal:")
    assert w["cpu_equal"] is True and w["agree"] is False  # a CPU/GPU disagreement, reported
    good = [x for x in recs.values() if x["transformed"]["equal"]]
    assert len(good) == n - len(bad) and len(good) >= n - 3
    assert all(x["original"]["equal"] for x in recs.values())  # the node's references: the original matches
    assert all(x["timing"]["rounds"] == 3 and x["timing"]["verdict"] in ("faster", "slower", "same") for x in good
               if "timing" in x)
    s = json.loads((res / "summary.json").read_text())
    assert s["done"] == n and s["equal"] == len(good) and (res / "report.md").is_file()
    assert s["references"] == "computed on the node" and s["reference_digest_mismatches"] == []
    assert s["worker_restarts"] >= 1 and s["retried_entries"] == len(same_fn)
    assert s["verification_entries_per_second"] > 0 and s["timing_entries_per_second"] > 0
    assert [d["id"] for d in s["cpu_gpu_disagreements"]] == [wrong["id"]] or e0["id"] in {
        d["id"] for d in s["cpu_gpu_disagreements"]}

    # a second run resumes: nothing left to do
    r = run(base, "-S", "-s", "-m", "steptp.gpu.run", pack, "-o", res, "-q", env=ro)
    assert r.returncode == 0 and json.loads((res / "summary.json").read_text())["ran_now"] == 0
    # an interruption that cut the last line: that entry alone runs again, the file stays clean
    lines = (res / "results.jsonl").read_text().splitlines(keepends=True)
    (res / "results.jsonl").write_text("".join(lines[:-1]) + lines[-1][: len(lines[-1]) // 2])
    r = run(base, "-S", "-s", "-m", "steptp.gpu.run", pack, "-o", res, "-q", env=ro)
    assert r.returncode == 0 and json.loads((res / "summary.json").read_text())["ran_now"] == 1
    assert len([json.loads(x) for x in (res / "results.jsonl").read_text().splitlines()]) == n

    # where torch imports (this interpreter), PyTorch eager is timed beside every entry of the
    # .py program, on the simulated device's CPU; two workers (the like-with-like baselines
    # and torch.compile: tests/test_gpu_node_baselines.py)
    res2 = tmp_path / "res2"
    r = run(STP, "gpu", "run", pack, "-o", res2, "-j", "2", "-q", env=sim)
    assert r.returncode == 0, r.stderr
    assert "torch does not import" not in r.stderr
    recs2 = [json.loads(x) for x in (res2 / "results.jsonl").read_text().splitlines()]
    assert len(recs2) == n and all(x["eager"]["eager_us"] > 0 for x in recs2), [x.get("eager") for x in recs2]
    assert all(x["eager"]["allow_tf32"] == {"matmul": False, "cudnn": False, "fp16_reduced_reduction": False} for x in recs2)
    assert all(x["eager"]["original_us"] > 0 for x in recs2)
    assert {x["id"] for x in recs2 if not x["transformed"]["equal"]} == {wrong["id"]}
    s2 = json.loads((res2 / "summary.json").read_text())
    assert s2["eager_programs"] == 1 and s2["jobs"] == 2
    assert "PyTorch eager" in (res2 / "report.md").read_text()

    before = (ds / "dictionary.jsonl").read_text().splitlines()
    r = run(STP, "gpu", "merge", res2, ds, env=sim)
    assert r.returncode == 0, r.stderr
    after = [json.loads(x) for x in (ds / "dictionary.jsonl").read_text().splitlines()]
    assert len(after) == len(before)
    assert all(e["verification_gpu"]["device"] == "cuda" for e in after)
    assert all(e["eager_gpu"]["eager_us"] > 0 for e in after)
    assert all(e["verification"] == json.loads(b)["verification"] for e, b in zip(after, before))  # CPU kept
    r = run(STP, "report", ds, "--no-plots", "--no-tokens", env=sim)
    assert r.returncode == 0 and "GPU" in r.stdout, r.stdout[-2000:]


def test_pack_with_stored_references_and_without_sim_builds(sim, tmp_path):
    orig, (cand, *_) = _softmax_and_candidates(tmp_path, sim, 1)
    stored = tmp_path / "stored"
    r = run(STP, "gpu", "pack", orig, cand, "-o", stored, "--store-references", "-q", env=sim)
    assert r.returncode == 0, r.stderr
    m = json.loads((stored / "manifest.json").read_text())
    (prog,) = m["programs"].values()
    assert (stored / prog["data"]).is_file() and m["references"] == "stored"
    res = tmp_path / "res"
    r = run(STP, "gpu", "run", stored, "-o", res, "-q", env=sim)
    assert r.returncode == 0, r.stderr
    (rec,) = [json.loads(x) for x in (res / "results.jsonl").read_text().splitlines()]
    assert rec["transformed"]["equal"] and rec["original"]["equal"]
    assert json.loads((res / "summary.json").read_text())["references"] == "stored"
    assert not (res / "references").exists()  # nothing computed on the node
    # --no-sim drops the simulated device's CPU builds, never the originals' reference builds
    nosim = tmp_path / "nosim"
    r = run(STP, "gpu", "pack", orig, cand, "-o", nosim, "--no-sim", "-q", env=sim)
    assert r.returncode == 0, r.stderr
    m = json.loads((nosim / "manifest.json").read_text())
    (prog,) = m["programs"].values()
    assert (nosim / prog["reference"]["lib"] / "kernel.so").is_file() and not list(nosim.rglob("sim"))
    assert not list(nosim.rglob("*.npz"))


def test_bad_runner_options_are_exit_2(sim, tmp_path):
    r = run(sys.executable, "-m", "steptp.gpu.run", tmp_path, "-o", tmp_path / "r", "-j", "0", env=sim)
    assert r.returncode == 2 and "--jobs" in r.stderr and "Traceback" not in r.stderr
    r = run(sys.executable, "-m", "steptp.gpu.run", tmp_path, env=sim)  # no -o
    assert r.returncode == 2 and "Traceback" not in r.stderr


def test_pack_of_nothing_and_run_of_a_non_pack_are_clear_errors(sim, tmp_path):
    (tmp_path / "empty").mkdir()
    r = run(STP, "gpu", "pack", tmp_path / "empty", "-o", tmp_path / "p", env=sim)
    assert r.returncode == 2 and "dictionary.jsonl" in r.stderr and "Traceback" not in r.stderr
    r = run(STP, "gpu", "run", tmp_path / "empty", "-o", tmp_path / "r", env=sim)
    assert r.returncode == 2 and "manifest" in r.stderr and "Traceback" not in r.stderr


def test_a_pack_for_a_newer_gpu_is_refused(sim, tmp_path):
    pack = tmp_path / "pack"
    r = run(STP, "gpu", "pack", EXAMPLES / "softmax.leir", EXAMPLES / "softmax.leir", "-o", pack, "--arch", "sm_90",
            "-q", env=sim)
    assert r.returncode == 0, r.stderr
    r = run(STP, "gpu", "run", pack, "-o", tmp_path / "res", env={**sim, "STP_CUDA_SIM_ARCH": "sm_80"})
    assert r.returncode == 2 and "--arch sm_80" in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "res").exists()


def test_no_gpu_is_one_line_and_nothing_written(monkeypatch, tmp_path):
    monkeypatch.delenv("STP_CUDA_SIM", raising=False)
    if cr.cuda_available() is None:
        pytest.skip("this machine has a usable GPU")
    out = tmp_path / "ds"
    r = run(STP, "dataset", EXAMPLES / "softmax.leir", "-o", out, "--device", "cuda", env=os.environ.copy())
    assert r.returncode == 2 and r.stderr.strip().count("\n") == 0 and "--device cuda" in r.stderr
    assert not out.exists()


def test_import_tvm_after_registering_the_ptx_callback(tmp_path):
    # tvm.support.nvcc registers the same global function without override: registering ours
    # first used to make every later `import tvm` fail ("already registered")
    code = ("from steptp.backend.cuda_runtime import register_ptx_cache; "
            f"register_ptx_cache({str(tmp_path)!r}); import tvm, tvm.support.nvcc, tvm_ffi; "
            "f = tvm_ffi.get_global_func('tvm_callback_cuda_compile'); print('ok', f is not None)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and r.stdout.strip() == "ok True", r.stderr[-1500:]


def _path_without_nvcc() -> str:
    return os.pathsep.join(d for d in os.environ["PATH"].split(os.pathsep) if not (Path(d) / "nvcc").exists())


def test_nvrtc_when_nvcc_is_missing(sim, tmp_path):
    """No nvcc on PATH: the PTX comes from NVRTC (cuda-bindings + libnvrtc, the `nvrtc`
    extra, which the test extra installs) with the toolkit's include/cccl, keyed apart from
    nvcc's. NVRTC missing is a failure, not a skip."""
    env = {**sim, "PATH": _path_without_nvcc()}
    probe = "from steptp.backend import cuda_runtime as cr; print(cr.cuda_compiler(), '|', cr.compiler_tag())"
    out = run(sys.executable, "-c", probe, env=env).stdout.strip()
    assert out.startswith("nvrtc"), f"NVRTC unavailable without nvcc ({out}): install the nvrtc extra"
    orig, (cand, *_) = _softmax_and_candidates(tmp_path, env, 1)
    r = run(STP, "verify", orig, cand, "--device", "cuda", env=env)
    assert r.returncode == 0 and "Equal  pass" in r.stdout, r.stdout + r.stderr
    ptx = list(Path(sim["STP_PTX_CACHE"]).glob("*.ptx"))
    assert ptx and ".target sm_90" in ptx[0].read_text()


def test_no_compiler_at_all_is_one_failing_line(tmp_path):
    """Neither nvcc nor NVRTC: the simulated-device tests fail with one line saying so."""
    code = ("import sys, pytest; sys.modules['cuda'] = None; sys.modules['cuda.bindings'] = None; "  # no NVRTC
            f"sys.exit(pytest.main(['-q', '-p', 'no:cacheprovider', {str(Path(__file__))!r} + '::test_ptx_key_depends_on_arch_and_compiler']))")
    r = run(sys.executable, "-c", code, env={**os.environ, "PATH": _path_without_nvcc()}, cwd=tmp_path)
    assert r.returncode == 1, r.stdout[-2000:]
    assert "needs a CUDA compiler: no nvcc on PATH and no NVRTC" in r.stdout, r.stdout[-2000:]


def test_gpu_workers_are_pinned_to_one_gpu_each(monkeypatch):
    """Worker i of a run sees GPU i mod n only (CUDA_VISIBLE_DEVICES while it starts), its
    replacement after a discard too, and the driver's own environment is left as it was."""
    from steptp.gpu.run import gpu_slots
    from steptp.runner.pool import shared

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,5")
    monkeypatch.delenv("STP_CUDA_SIM", raising=False)
    assert gpu_slots() == ["2", "5"]
    monkeypatch.setenv("STP_CUDA_SIM", "1")
    assert gpu_slots() == ["0"]  # the simulated device: one slot
    r = shared("test-pinned-gpu-5", 60, env={"CUDA_VISIBLE_DEVICES": "5"})  # what gpu.run asks the pool for
    try:
        assert r.call(os.getenv, "CUDA_VISIBLE_DEVICES") == "5"
        r.discard()
        assert r.call(os.getenv, "CUDA_VISIBLE_DEVICES") == "5"
    finally:
        r.close()
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "2,5"


def test_an_epilogue_fused_bound_gemm_runs_equal_on_the_simulated_device(sim, tmp_path):
    """epilogue_fusion's form (issue 37: a GEMM and its bias add in one kernel, the reduction an
    inner serial nest under the bound spatial loops) through CUDA code generation (nvcc PTX)
    and the simulated device, against the translator's two-kernel form."""
    head = ("% program: linear\n% input A: f32[8,16]\n% param C: f32[96,16]\n% param D: f32[96]\n"
            "% output E: f32[8,96]\n")
    orig = tmp_path / "linear.leir"
    orig.write_text(head + "B^{8}_{tx=0}L^{96}_{a=0}L^{16}_{c=0}[E^{f32,g}_{tx,a}=E^{f32,g}_{tx,a}"
                    "+A^{f32,g}_{tx,c}*C^{f32,g}_{a,c};];\n"
                    "B^{8}_{tx=0}L^{96}_{a=0}[E^{f32,g}_{tx,a}=E^{f32,g}_{tx,a}+D^{f32,g}_{a};];\n")
    cand = tmp_path / "fused.leir"
    cand.write_text(head + "B^{8}_{tx=0}B^{96}_{bxa=0}[L^{16}_{c=0}[E^{f32,g}_{tx,bxa}=E^{f32,g}_{tx,bxa}"
                    "+A^{f32,g}_{tx,c}*C^{f32,g}_{bxa,c};];E^{f32,g}_{tx,bxa}=E^{f32,g}_{tx,bxa}+D^{f32,g}_{bxa};];\n")
    r = run(STP, "verify", orig, cand, "--device", "cuda", env=sim)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "Equal  pass" in r.stdout and "device cuda" in r.stdout
    # the bias read before the sum is finished would be wrong: the verifier must catch it
    wrong = tmp_path / "wrong.leir"
    wrong.write_text(head + "B^{8}_{tx=0}B^{96}_{bxa=0}[E^{f32,g}_{tx,bxa}=E^{f32,g}_{tx,bxa}+D^{f32,g}_{bxa};"
                     "L^{16}_{c=0}[E^{f32,g}_{tx,bxa}=E^{f32,g}_{tx,bxa}*2.0+A^{f32,g}_{tx,c}*C^{f32,g}_{bxa,c};];];\n")
    r = run(STP, "verify", orig, wrong, "--device", "cuda", env=sim)
    assert r.returncode != 0 and "Equal  pass" not in r.stdout, r.stdout + r.stderr


def test_node_baselines_sanitizer_and_records_on_the_simulated_device(sim, tmp_path):
    """A real pack run by ``python -m steptp.gpu.run`` with the re-time, the sanitizer and the
    like-with-like baselines (issue 44) writes records that round-trip (issue 45); every
    baseline figure is a number or None with its reason; GPU-only baselines name the
    simulated device; torch.compile's path runs on the CPU under its cap and never lands in a
    GPU field; the sanitizer's launcher runs the function once on the reference inputs."""
    from steptp.gpu.sanitizer import launcher_argv
    from steptp.runner.record import (RATIOS, TIME_FIELDS, EntryRecord, ProgramBaselines, read_baselines,
                                      read_entries)

    ds = tmp_path / "ds"  # two entries of a program from a .py file (PyTorch eager exists for it)
    r = run(STP, "dataset", EXAMPLES / "softmax.py", "-o", ds, "--rule", rules_dir() / "loop_split.yaml",
            "--rule", rules_dir() / "loop_reorder.yaml", "--per-rule", "1", "-q", env=sim)
    assert r.returncode == 0, r.stderr
    pack = tmp_path / "pack"
    r = run(STP, "gpu", "pack", ds, "-o", pack, "-q", env=sim)
    assert r.returncode == 0, r.stderr
    m = json.loads((pack / "manifest.json").read_text())
    assert all(p.get("torch") for p in m["programs"].values())
    res = tmp_path / "res"
    args = ["--time", "--repeat", "3", "--min-ms", "0.2", "--retime-best", "1", "--sanitizer", "--baselines",
            "--compile", "--autotune", "--compile-cap-s", "2", "-q"]
    r = run(sys.executable, "-m", "steptp.gpu.run", pack, "-o", res, *args, env=sim)
    assert r.returncode == 0, r.stderr
    assert "Traceback" not in r.stderr
    for name in ("results.jsonl", "retime.jsonl"):
        for line in (res / name).read_text().splitlines():
            d = json.loads(line)
            assert EntryRecord.from_json(d).to_json() == d  # the one record, round-trip
    recs, again = read_entries(res / "results.jsonl"), read_entries(res / "retime.jsonl")
    assert len(recs) == len(m["entries"]) and set(again) <= set(recs) and again
    for x in again.values():  # the simulated device runs no CUDA kernel: no sanitizer verdict, said why
        assert x.sanitizer is None and "simulated" in x.sanitizer_reason
    s = json.loads((res / "summary.json").read_text())
    assert s["sanitizer"]["reason"].startswith("the simulated CUDA device") and s["baselines"]["programs"] == 1
    (b,) = read_baselines(res).values()
    line = json.loads((res / "baselines.jsonl").read_text())
    assert ProgramBaselines.from_json(line).to_json() == line and line["schema"] == 1
    fields = b.summary_fields()
    for f in list(TIME_FIELDS) + list(RATIOS):
        assert isinstance(fields[f], float) or (fields[f] is None and fields[f"{f}_reason"]), (f, fields)
    assert b.device == "cuda-sim" and b.dtypes == {s[0]: s[2] for s in m["programs"][b.program]["specs"]}
    assert b.best_us > 0 and b.best_py_us > 0 and b.eager_us > 0 and b.original_us > 0  # CPU figures, labelled
    assert b.allow_tf32 == {"matmul": False, "cudnn": False, "fp16_reduced_reduction": False} == fields["allow_tf32"]  # IEEE f32 yardsticks
    assert b.best_id is None or (b.best_id in again and again[b.best_id].timing.ci[0] > 1.0)
    assert "simulated" in fields["eager_graph_us_reason"]
    for f in ("compile_us", "compile_s", "compile_autotune_us", "compile_autotune_s"):
        assert fields[f] is None and "over the 2 s cap" in fields[f"{f}_reason"] and "simulated" in fields[f"{f}_reason"]
    lo, hi = fields["speedup_vs_eager_ci"]
    assert lo <= fields["speedup_vs_eager"] <= hi
    assert "Baselines, like with like" in (res / "report.md").read_text()

    # a second call keeps what the first measured for the same best and retries what is
    # missing: torch.compile's path to the end on the CPU (gcc), compiled, timed interleaved
    # with ours from Python, kept in cpu_figures only, the GPU fields None with the reason
    first = b
    r = run(sys.executable, "-m", "steptp.gpu.run", pack, "-o", res, "--compile", "--compile-cap-s", "400",
            "--repeat", "3", "--min-ms", "0.2", "-q", env=sim)
    assert r.returncode == 0, r.stderr
    (b,) = read_baselines(res).values()
    assert (b.eager_us, b.best_py_us, b.best_id) == (first.eager_us, first.best_py_us, first.best_id)
    assert b.compile_us is None and b.compile_s is None and "not a GPU figure" in b.reasons["compile_us"]
    assert b.cpu_figures["compile_s"] > 0 and b.cpu_figures["compile_us"] > 0
    assert b.cpu_figures["speedup_vs_compile"]["rounds"] == 3

    # the node without torch (numpy and tvm_ffi only): the baselines say so, ours are timed
    (res / "baselines.jsonl").unlink()
    ro = _runtime_only_env(tmp_path, pack, sim)
    base = getattr(sys, "_base_executable", sys.executable)
    r = run(base, "-S", "-s", "-m", "steptp.gpu.run", pack, "-o", res, "--baselines", "--repeat", "3", "--min-ms",
            "0.2", "-q", env=ro)
    assert r.returncode == 0, r.stderr
    (b,) = read_baselines(res).values()
    assert b.eager_us is None and b.reasons["eager_us"] == "torch does not import on this node" and b.best_py_us > 0

    # the sanitizer's launcher: one launch of the function on trial 0's reference inputs
    e = m["entries"][0]
    argv = launcher_argv(str(pack), str(res / "references"), e["program"], e["transformed"])
    r = run(*argv, env=sim)
    assert r.returncode == 0 and "launched" in r.stdout, r.stderr
    r = run(*argv[:3], env=sim)
    assert r.returncode == 2 and "usage" in r.stderr

    # results of another schema version: refused with one line, exit 2
    lines = (res / "results.jsonl").read_text().splitlines()
    (res / "results.jsonl").write_text("\n".join(lines[:-1] + [json.dumps({**json.loads(lines[-1]), "schema": 7})])
                                       + "\n")
    r = run(sys.executable, "-m", "steptp.gpu.run", pack, "-o", res, "-q", env=sim)
    assert r.returncode == 2 and "results written by schema 7, this stp reads 1" in r.stderr
    assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1
