"""Tensor cores (issue gpu-reach): ``rules/tensor_core_tiling.yaml``, the fragment storage
scope ``w`` and its lowering (``steptp.backend.tvmscript``: one ``wmma`` operation per fragment
nest, one warp per block), checked on the translator's output of real PyTorch programs.

Nothing here runs on a GPU: the tiled program is verified on the CPU (where a fragment is
plain memory), its CUDA C is read, and its sm_90 machine code is disassembled
(``cuobjdump``, installed with the test extra)."""

from __future__ import annotations

import pytest
import torch

from steptp.backend import cuda_source
from steptp.backend.errors import LoweringError, PreflightError
from steptp.backend.tvmscript import lower_module
from steptp.engine.macros import tiling_report
from steptp.engine.recipes import recipes_in_effect, sequences
from steptp.frontend.translate import translate_model
from steptp.leir import LeirModule, parse_leir
from steptp.rules import load_rules
from steptp.verify import verify_pair

RULES = {r.id: r for r in load_rules()}


class MatMul(torch.nn.Module):
    def forward(self, a, b):
        return torch.matmul(a, b)


def _matmul(n: int, dtype=torch.float16, batch: int = 0):
    torch.manual_seed(0)
    shape = (batch, n, n) if batch else (n, n)
    return translate_model(MatMul().to(dtype), [torch.randn(*shape, dtype=dtype), torch.randn(*shape, dtype=dtype)],
                           name="matmul").module


def _tensor_core_candidate(mod):
    tc = [r for r in tiling_report(RULES, mod) if r.get("tensor_core")]
    assert len(tc) == 1, tiling_report(RULES, mod)
    steps = tc[0]["steps"]
    assert steps[-1]["rule"] == "tensor_core_tiling"
    return LeirModule(mod.signature, parse_leir(steps[-1]["leir"], "<tc>").program)


@pytest.mark.parametrize("batch", [0, 3])
def test_f16_matmul_gets_a_tensor_core_candidate_that_verifies_and_emits_wmma(batch):
    orig = _matmul(64, batch=batch)
    after = _tensor_core_candidate(orig)
    assert ",w}" in after.text()                                              # fragments
    res = verify_pair(orig, after, trials=1)
    assert res.ok and res.equal, res.reason
    src = cuda_source(after)
    for op in ("fill_fragment", "load_matrix_sync", "mma_sync", "store_matrix_sync"):
        assert f"nvcuda::wmma::{op}" in src, op
    assert "__launch_bounds__(32)" in src                                     # one warp per block
    cpu = lower_module(after, None, "cpu").text
    assert "wmma" not in cpu and 'scope="local"' in cpu                      # plain memory on the CPU


def test_f16_matmul_1024_tensor_core_candidate_holds_hmma_in_sm90_machine_code(tmp_path):
    """The Done-when figure: the float16 1024x1024 matmul's tensor-core candidate, compiled for
    sm_90, holds HMMA instructions; its CUDA-core tiling holds none."""
    from steptp.backend.sass import measure

    after = _tensor_core_candidate(_matmul(1024))
    fig = measure(after, "sm_90", tmp_path, "tc")
    assert fig["hmma_total"] > 0 and fig["spill_stores"] == 0, fig


def test_f32_matmul_and_sizes_off_the_wmma_shape_have_no_tensor_core_candidate():
    mod = _matmul(64, dtype=torch.float32)
    assert not [r for r in tiling_report(RULES, mod) if r.get("tensor_core")]
    tc = next(r for r in recipes_in_effect("tiling") if r.id == "tensor_core_tiling")
    seqs, why, claimed = sequences(tc, mod, 0)
    assert not seqs and claimed and "f16 factors" in why
    seqs, why, claimed = sequences(tc, _matmul(72), 0)
    assert not seqs and claimed and "multiples of 16" in why


_KERNEL = ("B^{4}_{bx=0}B^{4}_{by=0}%s[L^{16}_{i=0}L^{16}_{j=0}[F^{f32,w}_{i,j}=0.0;];L^{4}_{ko=0}[L^{16}_{i=0}L^{16}_{k=0}"
           "[G^{f16,w}_{i,k}=A^{f16,g}_{bx*16+i,ko*16+k};];L^{16}_{k=0}L^{16}_{j=0}[H^{f16,w}_{k,j}=C^{f16,g}_{ko*16+k,"
           "by*16+j};];L^{16}_{i=0}L^{16}_{j=0}L^{16}_{k=0}[F^{f32,w}_{i,j}=F^{f32,w}_{i,j}+G^{f16,w}_{i,k}*H^{f16,w}_{k,j};"
           "];];L^{16}_{i=0}L^{16}_{j=0}[E^{f32,g}_{bx*16+i,by*16+j}=F^{f32,w}_{i,j};];];"
           "B^{64}_{tx=0}L^{64}_{a=0}[D^{f16,g}_{tx,a}=E^{f32,g}_{tx,a};];")
_HEADER = "% program: mm\n% input A: f16[64,64]\n% input C: f16[64,64]\n% output D: f16[64,64]\n"


def test_fragments_in_a_kernel_with_thread_loops_are_refused_by_the_gpu_preflight():
    from steptp.backend.preflight import preflight

    ok = parse_leir(_HEADER + _KERNEL % "", "ok")
    preflight(ok)
    bad = parse_leir(_HEADER + _KERNEL % "B^{2}_{tx=0}", "bad")
    with pytest.raises(PreflightError, match="fragment F is used in nest 0, a kernel with threadIdx loops"):
        preflight(bad)


def test_a_fragment_without_a_role_is_a_lowering_error():
    text = _HEADER.replace("% output D: f16[64,64]\n", "% output D: f32[64,64]\n") + \
        "B^{4}_{bx=0}[L^{16}_{i=0}L^{16}_{j=0}[F^{f32,w}_{i,j}=0.0;];L^{16}_{i=0}L^{16}_{j=0}[D^{f32,g}_{bx*16+i,j}=F^{f32,w}_{i,j};];];"
    with pytest.raises(LoweringError, match="fragment F .scope w. has no role"):
        lower_module(parse_leir(text, "norole"), None, "cuda")


def test_stp_rules_tiling_lists_the_tensor_core_candidate(tmp_path):
    import json

    from typer.testing import CliRunner

    from steptp.cli import app

    (tmp_path / "mm.leir").write_text(_matmul(64).text())
    res = CliRunner().invoke(app, ["rules", "tiling", str(tmp_path / "mm.leir")])
    assert res.exit_code == 0, res.output
    assert "matmul: 1 of 1 GEMM/convolution nest(s) tiled, 1 on tensor cores" in res.output
    assert "nest 0: on tensor cores in 7 steps: thread_block_rebinding, loop_split" in res.output
    res = CliRunner().invoke(app, ["rules", "tiling", "--json", str(tmp_path / "mm.leir")])
    nests = json.loads(res.output)["nests"]
    assert [n["tensor_cores"] for n in nests] == [False, True] and ",w}" in nests[1]["leir"]
