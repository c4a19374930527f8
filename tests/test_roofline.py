"""The speed of light (steptp.roofline, ``stp roofline``): exact FLOPs and compulsory bytes of
programs produced by the real translator from PyTorch modules, checked against the textbook
formulas computed independently (shapes from PyTorch itself), the peak each dtype gets, guards,
the device-name mapping and the command's JSON and error exits."""

from __future__ import annotations

import json
import math
import textwrap

import pytest
import torch
from typer.testing import CliRunner

from steptp.cli import app
from steptp.leir import parse_leir
from steptp.programs import load
from steptp.roofline import (GPUS, RooflineError, count_flops, gpu_model_for, peak_flops, roofline,
                             sol_fields)

runner = CliRunner()

_HEADER = "import torch\nimport torch.nn as nn\n\n"


def _write(tmp_path, name: str, body: str):
    p = tmp_path / f"{name}.py"
    p.write_text(_HEADER + textwrap.dedent(body))
    return p


def _gemm(tmp_path, m: int, k: int, n: int, dtype: str = "float32"):
    return _write(tmp_path, f"gemm_{dtype}", f"""
        class Model(nn.Module):
            def forward(self, A, B):
                return torch.matmul(A, B)

        def get_inputs():
            return [torch.randn({m}, {k}, dtype=torch.{dtype}), torch.randn({k}, {n}, dtype=torch.{dtype})]

        def get_init_inputs():
            return []
        """)


def test_gemm_flops_and_bytes_are_exact(tmp_path):
    m, k, n = 8, 12, 16
    mod, tr = load(_gemm(tmp_path, m, k, n))
    assert tr is not None  # translated from PyTorch, not hand-written
    r = roofline(mod, "h200")
    assert r.flops == 2 * m * n * k
    assert r.flops_by_dtype == {"f32": 2 * m * n * k}
    assert r.tensor_core_flops == {}  # f32: SIMT peak, never TF32
    assert r.bytes == (m * k + k * n + m * n) * 4
    assert (r.bytes_read, r.bytes_written) == ((m * k + k * n) * 4, m * n * 4)
    spec = GPUS["h200"]
    assert r.compute_us == pytest.approx(2 * m * n * k / spec.fp32 * 1e6)
    assert r.memory_us == pytest.approx(r.bytes / spec.dram_bytes_per_s * 1e6)
    assert r.sol_us == max(r.compute_us, r.memory_us)
    assert r.bound == ("compute" if r.compute_us >= r.memory_us else "memory")


def test_f16_gemm_counts_at_the_tensor_core_peak(tmp_path):
    m, k, n = 8, 12, 16
    mod, _ = load(_gemm(tmp_path, m, k, n, "float16"))
    r = roofline(mod, "h100")
    # the translator accumulates f16 products in f32: still an f16 GEMM (HMMA, f32 accumulate)
    assert r.flops_by_dtype == {"f16": 2 * m * n * k}
    assert r.tensor_core_flops == {"f16": 2 * m * n * k}
    assert r.bytes == (m * k + k * n + m * n) * 2
    assert r.compute_us == pytest.approx(2 * m * n * k / GPUS["h100"].fp16_tensor * 1e6)


@pytest.mark.parametrize("stride,padding,groups,bias", [(1, 0, 1, False), (2, 1, 1, True), (1, 2, 2, True)])
def test_conv2d_flops_and_bytes_are_exact(tmp_path, stride, padding, groups, bias):
    n, cin, cout, h, w, kh, kw = 2, 4, 6, 9, 7, 3, 2
    src = _write(tmp_path, "conv", f"""
        class Model(nn.Module):
            def __init__(self):
                super().__init__()
                self.conv = nn.Conv2d({cin}, {cout}, ({kh}, {kw}), stride={stride}, padding={padding},
                                      groups={groups}, bias={bias})

            def forward(self, x):
                return self.conv(x)

        def get_inputs():
            return [torch.randn({n}, {cin}, {h}, {w})]

        def get_init_inputs():
            return []
        """)
    mod, _ = load(src)
    conv = torch.nn.Conv2d(cin, cout, (kh, kw), stride=stride, padding=padding, groups=groups, bias=bias)
    out = conv(torch.randn(n, cin, h, w))  # the output shape, from PyTorch itself
    macs = out.numel() * (cin // groups) * kh * kw
    want_flops = 2 * macs + (out.numel() if bias else 0)
    want_bytes = 4 * (n * cin * h * w + conv.weight.numel() + (cout if bias else 0) + out.numel())
    r = roofline(mod)
    assert r.flops == want_flops
    assert r.bytes == want_bytes
    assert r.exact


def test_guarded_branches_count_only_where_selected():
    # index-only guard: the multiply runs on 3 of 8 iterations; a data-dependent select counts both sides
    m = parse_leir("% program: g\n% input X: f32[8]\n% output Y: f32[8]\n% output Z: f32[8]\n"
                   "L^{8}_{a=0}[Y^{f32,g}_{a}=if_then_else(a<3,X^{f32,g}_{a}*2.0,0.0);];\n"
                   "L^{8}_{a=0}[Z^{f32,g}_{a}=if_then_else(X^{f32,g}_{a}>0.0,X^{f32,g}_{a},X^{f32,g}_{a}*0.01);];\n")
    fc = count_flops(m.program)
    assert fc.by_dtype == {"f32": 3 + 8 * 2}
    assert fc.exact


def test_transcendentals_index_arithmetic_and_nested_nests():
    # exp/max/compare one FLOP each; subscripts (a*2+c) and negation none; an inner nest runs
    # once per outer iteration
    m = parse_leir("% program: t\n% input X: f32[4,8]\n% output Y: f32[4,8]\n"
                   "B^{4}_{tx=0}[L^{8}_{a=0}[Y^{f32,g}_{tx,a}=max(exp(-X^{f32,g}_{tx,a}),0.5);];];\n")
    assert count_flops(m.program).by_dtype == {"f32": 4 * 8 * 2}


def test_mixed_dtypes_add_their_compute_times(tmp_path):
    m = parse_leir("% program: mix\n% input X: f64[16]\n% input H: f16[16]\n% output Y: f64[16]\n"
                   "% output Z: f16[16]\n"
                   "L^{16}_{a=0}[Y^{f64,g}_{a}=X^{f64,g}_{a}*X^{f64,g}_{a};];\n"
                   "L^{16}_{a=0}[Z^{f16,g}_{a}=H^{f16,g}_{a}+H^{f16,g}_{a};];\n")
    r = roofline(m, "a100")
    a = GPUS["a100"]
    assert r.flops_by_dtype == {"f16": 16, "f64": 16}
    assert r.compute_us == pytest.approx((16 / a.fp64 + 16 / a.fp16) * 1e6)


def test_peaks_follow_the_documented_units():
    h = GPUS["h200"]
    assert peak_flops(h, "f32", True) == peak_flops(h, "f32", False) == h.fp32  # no TF32
    assert peak_flops(h, "f16", True) > peak_flops(h, "f16", False)
    assert h.dram_bytes_per_s == 4.8e12 and GPUS["h100"].dram_bytes_per_s == 3.35e12
    assert all(spec.sources for spec in GPUS.values())
    with pytest.raises(RooflineError):
        roofline(parse_leir("% program: x\n% input X: f32[2]\n% output Y: f32[2]\n"
                            "L^{2}_{a=0}[Y^{f32,g}_{a}=X^{f32,g}_{a};];\n"), "v100")


@pytest.mark.parametrize("name,key", [("NVIDIA H200", "h200"), ("NVIDIA H100 80GB HBM3", "h100"),
                                      ("NVIDIA A100-SXM4-80GB", "a100"), ("simulated (CPU builds)", "h200"),
                                      ("NVIDIA H100 PCIe", None), ("NVIDIA A100-SXM4-40GB", None),
                                      ("NVIDIA GH200 480GB", None), ("", None), ("Tesla V100-SXM2-16GB", None)])
def test_gpu_model_for_device_names(name, key):
    assert gpu_model_for(name) == key


def test_sol_fields_divide_by_each_time(tmp_path):
    mod, _ = load(_gemm(tmp_path, 4, 4, 4))
    r = roofline(mod)
    f = sol_fields(r, best_us=2.0, original_us=None, eager_graph_us=0.0, compile_us=4.0)
    assert f["sol_us"] == r.sol_us and f["flops"] == r.flops and f["bytes"] == r.bytes
    assert f["fraction_of_sol"] == pytest.approx(r.sol_us / 2.0)
    assert f["fraction_of_sol_compile"] == pytest.approx(r.sol_us / 4.0)
    assert f["fraction_of_sol_original"] is None and f["fraction_of_sol_eager_graph"] is None


def test_cli_json_matches_the_library(tmp_path):
    m, k, n = 6, 10, 14
    src = _gemm(tmp_path, m, k, n)
    res = runner.invoke(app, ["roofline", str(src), "--json", "--gpu-model", "a100"])
    assert res.exit_code == 0, res.output
    got = json.loads(res.stdout)
    assert got["flops"] == 2 * m * n * k
    assert got["bytes"] == (m * k + k * n + m * n) * 4
    assert got["gpu_model"] == "a100"
    assert math.isclose(got["sol_us"], max(2 * m * n * k / GPUS["a100"].fp32, got["bytes"] / 2.039e12) * 1e6)
    human = runner.invoke(app, ["roofline", str(src)])
    assert human.exit_code == 0 and "sol us" in human.stdout and "nvidia.com" in human.stdout


def test_cli_bad_input_exits_2_with_one_line(tmp_path):
    bad = tmp_path / "bad.leir"
    head = "% input A: f32[4]\n% output C: f32[4]\n"
    bad.write_text("% program: bad\n" + head + "B^{4}_{tx=0}[C^{f32,g}_{tx}=A^{f32,g}_{tx}+;];\n")
    oob = tmp_path / "oob.leir"
    oob.write_text("% program: oob\n" + head + "B^{4}_{tx=0}[C^{f32,g}_{tx}=A^{f32,g}_{tx+1};];\n")
    nomodel = tmp_path / "nomodel.py"
    nomodel.write_text("x = 1\n")
    good = tmp_path / "ok.leir"
    good.write_text("% program: ok\n" + head + "B^{4}_{tx=0}[C^{f32,g}_{tx}=A^{f32,g}_{tx};];\n")
    cases = [([str(tmp_path / "missing.leir")], "no such file"), ([str(bad)], f"{bad}:4:"),
             ([str(oob)], "out-of-bounds"), ([str(nomodel)], "Model"),
             ([str(good), "--gpu-model", "v100"], "unknown GPU model")]
    for args, needle in cases:
        res = runner.invoke(app, ["roofline", *args])
        assert res.exit_code == 2, (args, res.output)
        assert needle in res.stderr, (args, res.stderr)
        assert len(res.stderr.strip().splitlines()) == 1, res.stderr
        assert "Traceback" not in res.output
