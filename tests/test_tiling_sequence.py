"""One proposal from a plain GEMM and a plain 2-D convolution (both translated from PyTorch) to
the tiled GPU form: thread blocks and threads bound, a register micro-tile per thread
(register_tiling), shared tiles of both inputs fetched cooperatively (shared_memory_tiling),
vectorized copies / write-back (loop_vectorization: ``float4``) and an unrolled inner loop
(loop_unrolling). The steps are data (``tests/tiling_steps.py``: rule id, site filter,
params), applied one at a time through the engine's public API; every step is verified Equal
on the CPU against the original, and the last one on the simulated device (its real CUDA,
nvcc/NVRTC PTX, the CPU build run as the device)."""

from __future__ import annotations

import re

import pytest
import torch

from steptp.backend import cuda_source
from steptp.backend.cuda_runtime import cuda_compiler
from steptp.frontend.translate import translate_model
from steptp.runner.pool import close_all
from steptp.verify import verify_pair
from tiling_steps import CONV_TILING, GEMM_TILING, run_steps


class MatMul(torch.nn.Module):
    def forward(self, a, b):
        return torch.matmul(a, b)


def _gemm():
    torch.manual_seed(0)
    return translate_model(MatMul(), [torch.randn(64, 64), torch.randn(64, 64)], name="matmul").module


def _conv():
    torch.manual_seed(0)
    conv = torch.nn.Conv2d(16, 16, 3, bias=False)
    return translate_model(conv, [torch.randn(1, 16, 18, 10)], name="conv2d").module


def _every_step_equal(orig):
    def check(before, after, step):
        res = verify_pair(orig, after, trials=1)
        assert res.ok and res.equal, f"{step}: {res.reason}"
    return check


@pytest.fixture(params=["gemm", "conv"])
def case(request):
    orig = _gemm() if request.param == "gemm" else _conv()
    steps = GEMM_TILING if request.param == "gemm" else CONV_TILING
    return request.param, orig, steps


def test_the_sequence_reaches_the_tiled_form_every_step_equal(case, monkeypatch, tmp_path):
    name, orig, steps = case
    mods = run_steps(orig, steps, _every_step_equal(orig))
    assert len(mods) == len(steps) + 1
    src = cuda_source(mods[-1])
    body = src[src.index("__global__ void __launch_bounds__"):]
    assert "blockIdx.x" in body and "blockIdx.y" in body and "threadIdx.x" in body and "threadIdx.y" in body
    shared = re.findall(r"__shared__ (?:alignas\(\d+\) )?float (\w+)\[\d+\];", body)
    assert len(shared) == 2, body[:600]                                  # a tile of each input
    local = re.findall(r"^\s*alignas\(\d+\) float (\w+)\[(\d+)\];", body, re.M)
    assert len(local) == 1 and int(local[0][1]) >= 4                     # the register micro-tile
    assert body.count("__syncthreads();") == 2
    assert "float4" in body                                              # vectorized copy / write-back
    if name == "gemm":   # both tiles filled with float4 stores at thread-indexed addresses
        for t in shared:
            assert re.search(r"\*\(float4\*\)\(" + t + r" \+ [^;]*threadIdx[^;]*\) = \*\(float4\*\)\(\w+_ptr", body)
    # last step on the simulated device
    if cuda_compiler() is None:
        pytest.fail("the simulated CUDA device needs a CUDA compiler (nvcc or NVRTC)")
    monkeypatch.setenv("STP_CUDA_SIM", "1")
    monkeypatch.setenv("STP_PTX_CACHE", str(tmp_path / "ptx"))
    close_all()  # workers started by earlier tests in this process lack the simulated device's env
    res = verify_pair(orig, mods[-1], device="cuda")
    assert res.ok and res.equal and res.device == "cuda", res.reason
