"""Issue 20: timing (``stp time``, ``measure``), the performance build, the runtime-only module
path, ``--device cuda`` refusals on GPU-less machines, ``stp doctor``; GPU tests are marked
``gpu`` and skipped without a usable CUDA device."""

import json
import math
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from steptp.backend import cuda_runtime as cr
from steptp.runner.timing import Timing, cache_info, clear_cache, measure, speedup, summarize
from steptp.cli import app
from steptp.engine import apply_rule
from steptp.leir import load_leir, parse_leir, save_leir
from steptp.rules import load_rule

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
runner = CliRunner()
FAST = ["--repeat", "3", "--min-repeat-ms", "1", "--warmup", "1"]
NO_CUDA = cr.cuda_available()
gpu = pytest.mark.gpu

#: A program with V (vectorized) and P (parallel) loops, same signature as scale_bias.
VP_PROGRAM = textwrap.dedent("""\
    % program: scale_bias
    % input A: f32[8,32]
    % param C: f32[32]
    % output D: f32[8,32]
    B^{8}_{tx=0}V^{32}_{a=0}[E^{f32,g}_{tx,a}=A^{f32,g}_{tx,a}*0.5;];
    B^{8}_{tx=0}P^{32}_{a=0}[D^{f32,g}_{tx,a}=E^{f32,g}_{tx,a}+C^{f32,g}_{a};];
""")


def stp(*args):
    return runner.invoke(app, [str(a) for a in args])


@pytest.fixture(scope="module")
def parallel_matmul(tmp_path_factory):
    """examples/matmul.leir after loop_parallelization (same signature, a P loop)."""
    step = apply_rule(load_rule(ROOT / "rules" / "loop_parallelization.yaml"), load_leir(EXAMPLES / "matmul.leir"),
                      seed=0)
    path = tmp_path_factory.mktemp("par") / "matmul_par.leir"
    save_leir(step.after, path)
    return path


# ---------------------------------------------------------------------------
# statistics
# ---------------------------------------------------------------------------


def test_summarize_and_speedup_in_microseconds():
    t = summarize([1e-6, 2e-6, 3e-6, 4e-6], number=5, device="cpu")
    assert t.median_us == pytest.approx(2.5) and t.min_us == pytest.approx(1.0) and t.mean_us == pytest.approx(2.5)
    assert t.iqr_us == pytest.approx(1.5)  # 3.25 - 1.75
    assert t.cv == pytest.approx(np.std([1, 2, 3, 4], ddof=1) / 2.5)
    assert t.repeats == 4 and t.number == 5 and t.noisy
    d = t.as_dict()
    assert {"median_us", "min_us", "iqr_us", "cv", "mean_us", "repeats", "number", "device"} <= set(d)
    json.dumps(d)
    fast = summarize([0.5e-6], number=1, device="cpu")
    assert fast.cv == 0.0 and speedup(t, fast) == pytest.approx(5.0)
    assert speedup(t, summarize([0.0], 1, "cpu")) == math.inf


# ---------------------------------------------------------------------------
# measure(): performance build, cache
# ---------------------------------------------------------------------------


def test_measure_is_cached_by_program_text():
    clear_cache()
    m = load_leir(EXAMPLES / "matmul.leir")
    t1 = measure(m, repeat=3, min_repeat_ms=1, warmup=1)
    assert isinstance(t1, Timing) and t1.median_us > 0 and t1.min_us <= t1.median_us and t1.device == "cpu"
    assert t1.repeats == 3 and t1.number >= 1 and t1.threads >= 1
    again = parse_leir(m.text())  # another object, same text
    t2 = measure(again, repeat=3, min_repeat_ms=1, warmup=1)
    assert t2 is t1
    info = cache_info()
    assert info["runs"] == 1 and info["hits"] == 1 and info["misses"] == 1
    t3 = measure(m, repeat=4, min_repeat_ms=1, warmup=1)  # other settings: measured again
    assert t3 is not t1 and t3.repeats == 4 and cache_info()["runs"] == 2


def test_measure_times_a_scalar_output():
    """A loss reduces to a 0-d output (``D: f32[]``); its runtime tensor must stay 0-d."""
    m = parse_leir("% program: mse\n% input A: f32[3,64]\n% input C: f32[3,64]\n% output D: f32[]\n"
                   "B^{3}_{tx=0}L^{64}_{a=0}[E^{f32,g}_{tx,a}=(A^{f32,g}_{tx,a}-C^{f32,g}_{tx,a})*"
                   "(A^{f32,g}_{tx,a}-C^{f32,g}_{tx,a});];\n"
                   "B^{1}_{tx=0}L^{3}_{a=0}L^{64}_{c=0}[F^{f32,g}_{tx}=F^{f32,g}_{tx}+E^{f32,g}_{a,c};];\n"
                   "B^{1}_{tx=0}[D^{f32,g}=F^{f32,g}_{0}/192.0;];\n")
    assert measure(m, repeat=3, min_repeat_ms=1, warmup=1).median_us > 0
    assert tuple(cr.to_device(np.zeros((), np.float32), "cpu", "float32").shape) == ()


def test_measure_rejects_bad_settings():
    m = load_leir(EXAMPLES / "matmul.leir")
    with pytest.raises(ValueError):
        measure(m, device="tpu")
    with pytest.raises(ValueError):
        measure(m, repeat=0)


# exp in vector loops: plain, nested, large and -inf arguments; an equation with a guard
# (if_then_else) keeps T.exp (TVM's vectoriser loses let bindings around a select)
VEXP_PROGRAM = """% program: vexp
% input A: f32[4,64]
% output C: f32[4,64]
% output D: f32[4,64]
% output E: f32[4,64]
B^{4}_{tx=0}V^{64}_{a=0}[C^{f32,g}_{tx,a}=A^{f32,g}_{tx,a}/(1.0+exp(-A^{f32,g}_{tx,a}));];
B^{4}_{tx=0}V^{64}_{a=0}[D^{f32,g}_{tx,a}=exp(exp(A^{f32,g}_{tx,a}*0.1)-2.0)+exp(A^{f32,g}_{tx,a}*20.0-max(A^{f32,g}_{tx,a}*20.0,inf));];
B^{4}_{tx=0}L^{8}_{b=0}V^{8}_{a=0}[E^{f32,g}_{tx,b*8+a}=exp(if_then_else(b<1,-inf,A^{f32,g}_{tx,b*8+a}*20.0));];
"""


# V loops longer than the vector register file holds (512 float32 lanes with AVX-512), split to
# the vector width: with a vectorised tail (1000 = 62*16 + 8 with 16 lanes) and a one-lane
# tail with two equations (529 = 33*16 + 1)
VTAIL_PROGRAM = """% program: vtail
% input A: f32[3,1000]
% input B: f32[2,529]
% output C: f32[3,1000]
% output D: f32[2,529]
B^{3}_{tx=0}V^{1000}_{a=0}[C^{f32,g}_{tx,a}=A^{f32,g}_{tx,a}/(1.0+exp(-A^{f32,g}_{tx,a}));];
B^{2}_{tx=0}V^{529}_{a=0}[E^{f32,g}_{tx,a}=sqrt(B^{f32,g}_{tx,a}*B^{f32,g}_{tx,a}+1.0);D^{f32,g}_{tx,a}=E^{f32,g}_{tx,a}*2.0;];
"""


@pytest.mark.parametrize("source", ["matmul", "softmax", "gemm_relu", "parallel", "vp", "vexp", "vtail"])
def test_performance_build_computes_what_the_verification_form_computes(source, parallel_matmul):
    from steptp.backend.build import build_cpu
    from steptp.backend.perf import build_perf_cpu, host_cpu, perf_cpu_text
    from steptp.backend.tvmscript import POISON_MARK, THREAD_MARK, lower_module
    from steptp.verify import compare, poison_outputs, random_inputs

    if source == "parallel":
        m = load_leir(parallel_matmul)
    elif source in ("vp", "vexp", "vtail"):
        m = parse_leir({"vp": VP_PROGRAM, "vexp": VEXP_PROGRAM, "vtail": VTAIL_PROGRAM}[source])
    else:
        m = load_leir(EXAMPLES / f"{source}.leir")
    text = perf_cpu_text(m)
    assert POISON_MARK not in text and THREAD_MARK not in text and "thread_binding" not in text
    w = host_cpu()["vector_bits"] // 32
    if source == "parallel":
        assert "T.parallel(16)" in text
    if source == "vp":  # a V loop the register file holds stays one vector
        assert "T.vectorized(32)" in text and "_vo_" not in text and "T.parallel(32)" in text
    if source == "vexp":
        assert text.count("T.exp(") == 1  # only the equation with a guard keeps the libm call
        assert text.count(": T.let = T.min(T.max(") == 4
    if source == "vtail":
        for n in (1000, 529):  # the main loop, then the tail
            assert f"for _vo_a in range({n // w}):" in text and f"T.vectorized({w})" in text
            if n % w:
                assert f"for _vt_a in T.vectorized({n % w}):" in text if n % w > 1 else "for _vt_a in range(1):" in text
        # fast exp in the main loop and in the tail
        assert text.count(": T.let = T.min(T.max(") == 1 + (1000 % w != 0)
    perf = build_perf_cpu(m)
    check = build_cpu(lower_module(m, None, "cpu", poison=True).text, m.signature)
    for trial in range(3):
        x = random_inputs(m.signature, 0, trial, [m.program])
        want = check({**x, **poison_outputs(m.signature)})
        got = perf(x)
        for t in m.signature.outputs:
            ok, err, _ = compare(want[t.name], got[t.name], t.dtype)
            assert ok, (source, trial, t.name, err)


# ---------------------------------------------------------------------------
# stp time
# ---------------------------------------------------------------------------


def test_stp_time_two_programs_prints_speedup(parallel_matmul):
    res = stp("time", EXAMPLES / "matmul.leir", parallel_matmul, *FAST)
    assert res.exit_code == 0, res.output
    rows = [ln.split() for ln in res.stdout.splitlines()[1:] if ln.strip()]
    assert len(rows) == 2
    for row in rows:
        assert float(row[1]) > 0 and float(row[2]) > 0  # median_us, min_us
        assert row[5].endswith("x")  # speedup
    assert rows[0][5] == "1.00x" and len(rows[0]) == 6  # the baseline: no interval
    # the second: interleaved with the first, its 95 % interval and the verdict it supports
    lo, hi = float(rows[1][6].strip("[,")), float(rows[1][7].strip("]"))
    assert lo <= float(rows[1][5].rstrip("x")) + 0.005 and float(rows[1][5].rstrip("x")) <= hi + 0.005
    assert rows[1][8] in ("faster", "slower", "same")


def test_stp_time_json(parallel_matmul):
    res = stp("time", "--json", EXAMPLES / "matmul.leir", parallel_matmul, EXAMPLES / "softmax.leir", *FAST)
    assert res.exit_code == 0, res.output
    objs = [json.loads(ln) for ln in res.stdout.splitlines() if ln.strip()]
    assert len(objs) == 3
    for o in objs:
        assert {"median_us", "min_us", "iqr_us", "cv", "speedup"} <= set(o)
        assert o["median_us"] > 0 and o["device"] == "cpu"
    assert objs[0]["speedup"] == 1.0
    # interleaved with the first: the median of the paired ratios, inside its bootstrap interval
    lo, hi = objs[1]["speedup_ci"]
    assert lo <= objs[1]["speedup"] <= hi and objs[1]["speedup_verdict"] in ("faster", "slower", "same")
    assert objs[2]["speedup"] is None and "speedup_ci" not in objs[2]  # another signature: no speedup


def test_stp_time_bad_input_is_one_line_exit_2(tmp_path):
    res = stp("time", tmp_path / "missing.leir")
    assert res.exit_code == 2 and "missing.leir: no such file" in res.output and "Traceback" not in res.output
    bad = tmp_path / "bad.leir"
    bad.write_text("% program: x\n% input A: f32[4]\n% output C: f32[4]\nB^{4}_{tx=0}[C^{f32,g}_{tx}=A^{f32,g}_{tx}+;];\n")
    res = stp("time", bad)
    assert res.exit_code == 2
    first = res.output.splitlines()[0]  # then the offending line and a caret, as in every command
    assert first.startswith(f"error: {bad}:4:44: unexpected ';'") and "Traceback" not in res.output, res.output


def test_stp_time_help():
    res = stp("time", "--help")
    assert res.exit_code == 0
    for opt in ("--device", "--json", "--number", "--repeat", "--warmup", "--min-repeat-ms"):
        assert opt in res.output


# ---------------------------------------------------------------------------
# runtime-only module path (cuda_runtime), exercised on the CPU
# ---------------------------------------------------------------------------


def test_runtime_only_path_runs_and_times_an_exported_module_without_tvm(tmp_path):
    from steptp.backend.perf import export_cpu
    from steptp.verify import random_inputs

    m = load_leir(EXAMPLES / "gemm_relu.leir")
    export_cpu(m, tmp_path / "built")
    x = random_inputs(m.signature, 0, 0, [m.program])
    np.savez(tmp_path / "x.npz", **x)
    script = textwrap.dedent(f"""
        import sys, numpy as np
        from steptp.backend import cuda_runtime as cr
        from steptp.runner import cuda_timing as ct
        b = cr.read_built({str(tmp_path / 'built')!r})
        x = dict(np.load({str(tmp_path / 'x.npz')!r}))
        out = cr.run_module(b, [x])[0]["E"]
        mod = cr.load_built(b)
        secs = ct.time_function(mod, "cpu", cr.device_args(b.params, "cpu", x), number=10, repeat=2)
        assert len(secs) == 2 and all(s > 0 for s in secs), secs
        assert "tvm" not in sys.modules, "the runtime path imported tvm"
        np.save({str(tmp_path / 'out.npy')!r}, out)
    """)
    p = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-2000:]
    from steptp.backend.perf import build_perf_cpu

    want = build_perf_cpu(m, {"kind": "llvm"})(x)["E"]  # export_cpu's portable target
    np.testing.assert_array_equal(np.load(tmp_path / "out.npy"), want)


def test_runtime_reports_a_missing_input(tmp_path):
    from steptp.backend.errors import ExecError
    from steptp.backend.perf import export_cpu

    b = export_cpu(load_leir(EXAMPLES / "matmul.leir"), tmp_path)
    with pytest.raises(ExecError, match="missing input tensor"):
        cr.run_module(b, [{}])


def test_exported_cuda_module_holds_the_dataset_cuda_source(tmp_path):
    from steptp.backend import cuda_source
    from steptp.backend.perf import export_cuda
    from steptp.verify import verify_pair

    orig = load_leir(EXAMPLES / "softmax.leir")
    step = apply_rule(load_rule(ROOT / "rules" / "loop_parallelization.yaml"), orig, seed=0)
    art: dict = {}
    res = verify_pair(orig, step.after, artifacts=art)  # what a dataset entry stores
    assert res.equal and "device" not in res.to_dict()  # CPU records unchanged
    built, src = export_cuda(step.after, tmp_path, ptx=cr.nvcc_path() is not None)
    assert src == cuda_source(step.after) == art["cuda"]
    assert (tmp_path / "kernel.cu").read_text() == src and built.lib.is_file()
    again = cr.read_built(tmp_path)
    assert again.device == "cuda" and [p.name for p in again.params] == ["A", "C"]
    assert again.cuda_sha1 == cr.ptx_key(src)
    if cr.nvcc_path() is not None:
        assert (tmp_path / "ptx" / f"{cr.ptx_key(src)}.ptx").read_text().startswith("//")


# ---------------------------------------------------------------------------
# --device cuda without a GPU; doctor
# ---------------------------------------------------------------------------


@pytest.mark.skipif(NO_CUDA is None, reason="a usable CUDA device is present")
def test_cuda_available_names_what_is_missing():
    assert NO_CUDA.startswith("no ") and "\n" not in NO_CUDA


@pytest.mark.skipif(NO_CUDA is None, reason="a usable CUDA device is present")
def test_verify_device_cuda_without_gpu_exits_2_with_one_line():
    res = stp("verify", EXAMPLES / "matmul.leir", EXAMPLES / "matmul.leir", "--device", "cuda")
    assert res.exit_code == 2
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert lines == [f"error: --device cuda: {NO_CUDA}"]


@pytest.mark.skipif(NO_CUDA is None, reason="a usable CUDA device is present")
def test_dataset_device_cuda_without_gpu_exits_2_and_writes_nothing(tmp_path):
    out = tmp_path / "out"
    res = stp("dataset", EXAMPLES / "matmul.leir", "-o", out, "--device", "cuda", "-q")
    assert res.exit_code == 2 and f"error: --device cuda: {NO_CUDA}" in res.output
    assert not out.exists() and list(tmp_path.iterdir()) == []


@pytest.mark.skipif(NO_CUDA is None, reason="a usable CUDA device is present")
def test_time_device_cuda_without_gpu_exits_2():
    res = stp("time", EXAMPLES / "matmul.leir", "--device", "cuda")
    assert res.exit_code == 2 and res.output.strip() == f"error: --device cuda: {NO_CUDA}"


def test_doctor_reports_versions_and_exits_0():
    res = stp("doctor")
    assert res.exit_code == 0
    for key in ("tvm", "tvm-ffi", "torch", "nvcc", "cuda runtime", "cuda driver", "cuda device", "--device cuda"):
        assert key in res.output
    assert "0.27" in res.output


# ---------------------------------------------------------------------------
# GPU (skipped without a device)
# ---------------------------------------------------------------------------


@gpu
@pytest.mark.skipif(NO_CUDA is not None, reason=f"no usable CUDA: {NO_CUDA}")
def test_gpu_measure_and_verify(parallel_matmul):
    from steptp.verify import verify_pair

    m = load_leir(EXAMPLES / "matmul.leir")
    t = measure(m, "cuda", repeat=3, min_repeat_ms=1)
    assert t.device == "cuda" and t.median_us > 0
    res = verify_pair(m, load_leir(parallel_matmul), device="cuda")
    assert res.equal and res.device == "cuda" and res.to_dict()["device"] == "cuda", res.reason
    res = stp("verify", EXAMPLES / "matmul.leir", parallel_matmul, "--device", "cuda")
    assert res.exit_code == 0 and "device cuda" in res.output, res.output


@gpu
@pytest.mark.skipif(NO_CUDA is not None, reason=f"no usable CUDA: {NO_CUDA}")
def test_gpu_run_matches_cpu(tmp_path):
    from steptp.backend.perf import build_perf_cpu, export_cuda
    from steptp.verify import compare, random_inputs

    m = load_leir(EXAMPLES / "softmax.leir")
    built, _ = export_cuda(m, tmp_path)
    x = random_inputs(m.signature, 0, 1, [m.program])
    got = cr.run_module(built, [x])[0]["C"]
    assert compare(build_perf_cpu(m)(x)["C"], got, "f32")[0]


@pytest.mark.needs("cuda_compiler")
def test_ptx_cache_callback_returns_the_cached_ptx(tmp_path):
    import tvm_ffi

    from steptp.backend.perf import export_cuda

    built, src = export_cuda(load_leir(EXAMPLES / "matmul.leir"), tmp_path)
    cr.register_ptx_cache(built.ptx_dir, built.arch)
    ptx = tvm_ffi.get_global_func("tvm_callback_cuda_compile")(src)
    assert bytes(ptx) == (built.ptx_dir / f"{cr.ptx_key(src)}.ptx").read_bytes()
    assert bytes(ptx).startswith(b"/")  # loaded as PTX by TVM's CUDA module


# ---------------------------------------------------------------------------
# interleaved comparison (runner.stats.paired_speedup, runner.timing.compare)
# ---------------------------------------------------------------------------


def test_paired_speedup_calls_faster_only_when_the_interval_excludes_one():
    from steptp.runner.stats import paired_speedup

    rng = np.random.default_rng(0)
    base = 100 + rng.normal(0, 1, 12)
    st = paired_speedup(base, base / 1.5)
    assert st["speedup"] == pytest.approx(1.5) and st["verdict"] == "faster" and st["ci"][0] > 1
    noisy = paired_speedup(base, base * (1 + rng.normal(0, 0.2, 12)))
    assert noisy["ci"][0] < 1 < noisy["ci"][1] and noisy["verdict"] == "same"
    assert paired_speedup(base, base * 2)["verdict"] == "slower"
    assert paired_speedup(base, base / 1.5) == st  # deterministic for its seed
    with pytest.raises(ValueError):
        paired_speedup([1.0, 2.0], [1.0])


def test_compare_times_two_programs_interleaved(parallel_matmul):
    from steptp.runner.timing import compare

    a, b = load_leir(EXAMPLES / "matmul.leir"), load_leir(parallel_matmul)
    c = compare(a, b, rounds=4, min_repeat_ms=1)
    assert c.rounds == 4 and c.number >= 1 and c.baseline_us > 0 and c.candidate_us > 0 and c.device == "cpu"
    assert c.ci[0] <= c.speedup <= c.ci[1] and c.verdict in ("faster", "slower", "same")
    assert c.as_dict()["ci"] == list(c.ci)
    with pytest.raises(ValueError, match="signatures"):
        compare(a, load_leir(EXAMPLES / "softmax.leir"))
