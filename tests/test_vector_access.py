"""Vectorized global loads and stores (rule loop_vectorization, and the vector width of a shared
tile's copy in shared_memory_tiling): a ``V`` loop of 4 (2) lanes over contiguous float32
elements becomes one ``float4`` (``float2``) access in TVM's CUDA code when the address is
provably aligned, and a gather (``make_float4`` of four loads) otherwise, so a vectorized
loop never makes a misaligned vector access (CUDA C Programming Guide §5.3.2: a vector access
must be aligned to its size). shared_memory_tiling only offers a copy width w when every run
of w elements starts aligned (value function ``aligned_run``)."""

from __future__ import annotations

import re

from steptp.backend import cuda_source
from steptp.engine import apply_rule, list_candidates
from steptp.leir import parse_leir
from steptp.rules import load_rules
from steptp.verify import verify_pair

RULES = {r.id: r for r in load_rules()}


def _store_line(src: str, name: str) -> str:
    return next(line.strip() for line in src.splitlines() if f"{name}_ptr" in line and " = " in line)


def _vectorized(text: str, loop: int):
    m = parse_leir(text)
    st = apply_rule(RULES["loop_vectorization"], m, site={"loop": loop})
    assert verify_pair(m, st.after, trials=1).equal
    return cuda_source(st.after)


def test_an_aligned_contiguous_elementwise_loop_loads_and_stores_float4_and_float2():
    for lanes, vec in ((4, "float4"), (2, "float2")):
        src = _vectorized("% program: scale\n% input A: f32[64,8]\n% output C: f32[64,8]\n"
                          f"B^{{64}}_{{tx=0}}L^{{8//lanes}}_{{a=0}}L^{{{lanes}}}_{{c=0}}".replace("8//lanes", str(8 // lanes))
                          + f"[C^{{f32,g}}_{{tx,a*{lanes}+c}}=A^{{f32,g}}_{{tx,a*{lanes}+c}}*2.0;];\n", 2)
        assert re.search(rf"\*\({vec}\*\)\(C_ptr \+ [^;]*\) = ", _store_line(src, "C")), src
        assert f"*({vec}*)(A_ptr + " in src and "A_ptr[" not in src, src


def test_a_misaligned_run_is_gathered_not_loaded_as_a_vector():
    src = _vectorized("% program: shift\n% input A: f32[260]\n% output C: f32[64,4]\n"
                      "B^{64}_{tx=0}L^{4}_{c=0}[C^{f32,g}_{tx,c}=A^{f32,g}_{tx*4+c+1};];\n", 1)
    line = _store_line(src, "C")
    assert "make_float4(A_ptr[" in line and "*(float4*)(A_ptr" not in line, line


def test_shared_tile_copy_widths_follow_alignment():
    head = "% program: gemm\n% input A: f32[16,17]\n% param W: f32[17,16]\n% output C: f32[16,16]\n"
    aligned = parse_leir(head.replace("17", "16") + "B^{4}_{bxa=0}B^{4}_{bya=0}L^{2}_{d=0}B^{4}_{txa=0}B^{4}_{tya=0}"
                         "L^{8}_{f=0}[C^{f32,g}_{bxa*4+txa,bya*4+tya}=C^{f32,g}_{bxa*4+txa,bya*4+tya}+A^{f32,g}_{bxa*4+txa,"
                         "d*8+f}*W^{f32,g}_{d*8+f,bya*4+tya};];\n")
    widths = {(s.env["Z"], p["w"]) for s, p in list_candidates(RULES["shared_memory_tiling"], aligned)}
    assert widths == {("A", 1), ("A", 2), ("W", 1), ("W", 2)}   # 32-element tiles, 16 threads
    # A's rows of 17 elements: a run of 2 starting at d*8+f is not aligned in every row
    skew = parse_leir(head + "B^{4}_{bxa=0}B^{4}_{bya=0}L^{2}_{d=0}B^{4}_{txa=0}B^{4}_{tya=0}"
                      "L^{8}_{f=0}[C^{f32,g}_{bxa*4+txa,bya*4+tya}=C^{f32,g}_{bxa*4+txa,bya*4+tya}+A^{f32,g}_{bxa*4+txa,"
                      "d*8+f}*W^{f32,g}_{d*8+f,bya*4+tya};];\n")
    widths = {(s.env["Z"], p["w"]) for s, p in list_candidates(RULES["shared_memory_tiling"], skew)}
    assert ("A", 2) not in widths and ("A", 1) in widths and ("W", 2) in widths
