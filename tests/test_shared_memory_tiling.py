"""Shared-memory tiling (rule shared_memory_tiling) and register tiling (rule register_tiling)
on a real GEMM: a torch matmul translated to LEIR, split and bound by the existing rules step by
step through the engine, then its inputs staged in shared memory by the block's threads
together (TVM cache_read "shared" + the cooperative fetch) and its accumulator kept in a
thread's registers (cache_write "local").

Checked: the CUDA source (TVM target cuda, sm_90; nvcc builds it) has ``__shared__`` tiles of
both inputs, filled by stores indexed by ``threadIdx`` (every thread copies its share, not
only what it reads) between ``__syncthreads()`` barriers; a local accumulator array; the
result runs Equal on the simulated device; the GPU preflight accepts the cooperative form and
refuses racy variants (a tile read in the phase that writes it, a tile in global memory, a
copy whose threads write the same element).
"""

from __future__ import annotations

import re

import pytest
import torch

from steptp.backend import cuda_source
from steptp.backend.build import nvcc_check, nvcc_path
from steptp.backend.cuda_runtime import cuda_compiler
from steptp.backend.preflight import gpu_problems, loop_hazards
from steptp.engine import apply_rule, find_sites, list_candidates
from steptp.frontend.translate import translate_model
from steptp.leir import parse_leir
from steptp.runner.pool import close_all
from steptp.verify import verify_pair
from tiling_steps import GEMM_TILING, RULES, pick, run_steps

#: the splits, the reorder and the bindings of GEMM_TILING (register tiling comes after)
SPLIT_AND_BOUND = GEMM_TILING[:10]
SHARED_A = ("shared_memory_tiling", {"nest": [0], "bindings": {"Z": "A"}}, {"w": 4})
SHARED_C = ("shared_memory_tiling", {"nest": [0], "bindings": {"Z": "C"}}, {"w": 4})


class MatMul(torch.nn.Module):
    def forward(self, a, b):
        return torch.matmul(a, b)


@pytest.fixture(scope="module")
def gemm():
    """``D = A @ C`` (64x64x64 f32) translated from PyTorch, then split and bound:
    ``B^{4}_{bx}B^{4}_{by}L^{8}_{ko}B^{4}_{tx}B^{4}_{ty}L^{8}_{ki}L^{4}L^{4}[...]``."""
    torch.manual_seed(0)
    tr = translate_model(MatMul(), [torch.randn(64, 64), torch.randn(64, 64)], name="matmul")
    mods = run_steps(tr.module, SPLIT_AND_BOUND)
    return mods[0], mods[-1]


def _shared_tiled(bound):
    return run_steps(bound, [SHARED_A, SHARED_C])[-1]


def _kernel(src: str) -> str:
    return src[src.index("__global__ void __launch_bounds__"):]


def test_the_translated_gemm_is_split_and_bound_with_the_reduction_step_below_the_blocks(gemm):
    orig, bound = gemm
    loops = bound.program.nests[0].loops
    assert [(l.kind, l.extent) for l in loops] == [("B", 4), ("B", 4), ("L", 8), ("B", 4), ("B", 4), ("L", 8),
                                                    ("L", 4), ("L", 4)]
    assert [l.thread_tag for l in loops if l.kind == "B"] == ["blockIdx.x", "blockIdx.y", "threadIdx.y", "threadIdx.x"]
    sites = [s.describe()["bindings"]["Z"] for s in find_sites(RULES["shared_memory_tiling"], bound)]
    assert sorted(sites) == ["A", "C"]            # one tile per input, none of the output


def test_cuda_has_cooperatively_filled_shared_tiles_between_barriers(gemm):
    _, bound = gemm
    tiled = _shared_tiled(bound)
    src = cuda_source(tiled)
    body = _kernel(src)
    shared = re.findall(r"__shared__ (?:alignas\(\d+\) )?float (\w+)\[(\d+)\];", body)
    assert len(shared) == 2 and all(int(n) == 128 for _, n in shared), shared   # 16x8 and 8x16 tiles
    loop = body[body.index("for (int", body.index(shared[-1][0])):]
    for name, _ in shared:
        # the fill: a store into the tile at an index of the thread's own ids, from the input
        fill = re.search(r"\b" + name + r"\[([^\]]*)\] = (\w+)_ptr\[", loop)
        assert fill and "threadIdx.x" in fill.group(1) and "threadIdx.y" in fill.group(1), loop[:1500]
        assert fill.group(2) in ("A", "C")
    syncs = [m.start() for m in re.finditer(r"__syncthreads\(\);", loop)]
    names = "|".join(n for n, _ in shared)
    fills = [m.start() for m in re.finditer(r"\b(" + names + r")\[[^\]]*\] = ", loop)]
    reads = [m.start() for m in re.finditer(r"[*+] (" + names + r")\[", loop)]
    assert len(syncs) == 2, loop[:2000]
    # one barrier before the fill (the previous step's readers are done: write after read),
    # one between the fill and the reads (read after write)
    assert syncs[0] < min(fills) and max(fills) < syncs[1] < min(reads)
    if nvcc_path():
        res = nvcc_check([src])[0]
        assert res.ok, res.reason


def test_register_tiling_gives_a_local_micro_tile_written_back_once(gemm):
    _, bound = gemm
    step = GEMM_TILING[10]
    assert step[0] == "register_tiling"
    reg = run_steps(bound, [step])[-1]
    body = _kernel(cuda_source(reg))
    local = re.findall(r"^\s*(?:alignas\(\d+\) )?float (\w+)\[(\d+)\];", body, re.M)
    assert len(local) == 1 and local[0][1] == "16", body[:800]      # 4x4 outputs per thread
    name = local[0][0]
    # the global output is stored from the local array only, after the reduction loop
    stores = re.findall(r"D_ptr\[[^\]]*\] = ([^;]*);", body)
    assert stores and all(s.startswith(name + "[") for s in stores), stores
    last_update = max(m.start() for m in re.finditer(name + r"\[[^\]]*\] = \(" + name, body))
    assert body.index("D_ptr[") > last_update      # one write-back, after the accumulation
    assert "D_ptr[" not in body[:last_update]       # no read-modify-write of global memory


def test_tiled_gemm_runs_equal_on_the_simulated_device(gemm, monkeypatch, tmp_path):
    if cuda_compiler() is None:
        pytest.fail("the simulated CUDA device needs a CUDA compiler (nvcc or NVRTC)")
    monkeypatch.setenv("STP_CUDA_SIM", "1")
    monkeypatch.setenv("STP_PTX_CACHE", str(tmp_path / "ptx"))
    close_all()  # workers started by earlier tests in this process lack the simulated device's env
    orig, bound = gemm
    tiled = run_steps(bound, GEMM_TILING[10:])[-1]      # registers, both shared tiles, float4, unrolled
    res = verify_pair(orig, tiled, device="cuda")
    assert res.ok and res.equal and res.device == "cuda", res.reason


def test_each_rewrite_verifies_on_the_cpu(gemm):
    orig, bound = gemm
    for mod in run_steps(bound, [SHARED_A, SHARED_C])[1:]:
        res = verify_pair(orig, mod, trials=1)
        assert res.ok and res.equal, res.reason


HEAD = "% program: gemm\n% input A: f32[64,64]\n% param W: f32[64,64]\n% output C: f32[64,64]\n"
COMPUTE = ("B^{16}_{txa=0}B^{16}_{tya=0}L^{16}_{f=0}[C^{f32,g}_{bxa*16+txa,bya*16+tya}=C^{f32,g}_{bxa*16+txa,bya*16+tya}"
           "+D^{f32,SC}_{txa*16+f}*W^{f32,g}_{d*16+f,bya*16+tya};];")


def _prog(copy: str, scope: str = "s") -> str:
    return HEAD + "B^{4}_{bxa=0}B^{4}_{bya=0}L^{4}_{d=0}[" + copy + COMPUTE.replace("SC", scope) + "];\n"


def test_preflight_accepts_the_cooperative_fill_and_refuses_racy_variants():
    coop = parse_leir(_prog("B^{16}_{txa=0}B^{16}_{tya=0}[D^{f32,s}_{txa*16+tya}=A^{f32,g}_{bxa*16+txa,d*16+tya};];"))
    assert gpu_problems(coop) == [] and loop_hazards(coop) == []
    # each thread copies two elements of a 256-element tile (a serial copy loop inside the threads)
    two = parse_leir(HEAD + "B^{4}_{bxa=0}B^{8}_{bya=0}L^{4}_{d=0}[B^{16}_{txa=0}B^{8}_{tya=0}L^{2}_{c=0}"
                     "[D^{f32,s}_{c*128+txa*8+tya}=A^{f32,g}_{bxa*16+(c*128+txa*8+tya)//16,d*16+(c*128+txa*8+tya)%16};];"
                     "B^{16}_{txa=0}B^{8}_{tya=0}L^{16}_{f=0}[C^{f32,g}_{bxa*16+txa,bya*8+tya}=C^{f32,g}_{bxa*16+txa,"
                     "bya*8+tya}+D^{f32,s}_{txa*16+f}*W^{f32,g}_{d*16+f,bya*8+tya};];];\n")
    assert gpu_problems(two) == [] and loop_hazards(two) == []
    # the tile written and read in one phase: no barrier between another thread's write and this read
    same = parse_leir(HEAD + "B^{4}_{bxa=0}B^{4}_{bya=0}L^{4}_{d=0}B^{16}_{txa=0}B^{16}_{tya=0}[D^{f32,s}_{txa*16+tya}="
                      "A^{f32,g}_{bxa*16+txa,d*16+tya};L^{16}_{f=0}[C^{f32,g}_{bxa*16+txa,bya*16+tya}=C^{f32,g}_{bxa*16+txa,"
                      "bya*16+tya}+D^{f32,s}_{txa*16+f}*W^{f32,g}_{d*16+f,bya*16+tya};];];\n")
    assert any("threadIdx.x loop txa" in p and "writes tensor D" in p for p in gpu_problems(same))
    # the tile in global memory: TVM puts no barrier between phases for it (and all blocks share it)
    glob = parse_leir(_prog("B^{16}_{txa=0}B^{16}_{tya=0}[D^{f32,g}_{txa*16+tya}=A^{f32,g}_{bxa*16+txa,d*16+tya};];", "g"))
    probs = gpu_problems(glob)
    assert any("global tensor D is handed between phases" in p for p in probs)
    assert any("blockIdx.x loop bxa" in p and "writes tensor D" in p for p in probs)
    # two threads of the copy write one element (txa*15+tya: (1,0) and (0,15)), whatever the reads
    clash = parse_leir(HEAD + "B^{4}_{bxa=0}B^{4}_{bya=0}L^{4}_{d=0}[B^{16}_{txa=0}B^{16}_{tya=0}[D^{f32,s}_{txa*15+tya}="
                       "A^{f32,g}_{bxa*16+txa,d*16+tya};];B^{16}_{txa=0}B^{16}_{tya=0}L^{15}_{f=0}[C^{f32,g}_{bxa*16+txa,"
                       "bya*16+tya}=C^{f32,g}_{bxa*16+txa,bya*16+tya}+D^{f32,s}_{txa*15+f}*W^{f32,g}_{d*16+f,bya*16+tya};];];\n")
    assert any("threadIdx.x loop txa" in p and "writes tensor D" in p for p in gpu_problems(clash))


def test_copy_widths_are_those_the_block_shares_out_evenly(gemm):
    """A 128-element tile over 16 threads: 8, 4 or 2 elements per thread, in runs of 1, 2 or 4
    (a width outside the domain is refused)."""
    _, bound = gemm
    widths = {(s.env["Z"], p["w"]) for s, p in list_candidates(RULES["shared_memory_tiling"], bound)}
    assert widths == {(z, w) for z in ("A", "C") for w in (1, 2, 4)}
    site = pick("shared_memory_tiling", bound, {"nest": [0], "bindings": {"Z": "A"}})
    with pytest.raises(ValueError, match="w"):
        apply_rule(RULES["shared_memory_tiling"], bound, site=site, params={"w": 8})
