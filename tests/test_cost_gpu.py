"""The static GPU cost model (issue 37): it must rank what a GPU rewards: binding loops to
threads and blocks, coalesced accesses, fewer launches, parallel rather than serial reductions.
No GPU timings exist in CI, so these are orderings the CUDA programming model implies, on
programs like the translator's output."""

from __future__ import annotations

from pathlib import Path

import pytest

from steptp.leir import load_leir, parse_leir
from steptp.cost_model.static import estimate_ns
from steptp.cost_model.gpu import estimate_gpu_ns, kernel_estimate

HEAD = "% program: s\n% input A: f32[512,1024]\n% output C: f32[512,1024]\n"


def est(body: str) -> float:
    return estimate_gpu_ns(parse_leir(HEAD + body).program)


def test_binding_loops_to_blocks_and_threads_is_faster():
    serial = est("L^{512}_{a=0}L^{1024}_{c=0}[C^{f32,g}_{a,c}=A^{f32,g}_{a,c}*2.0;];")
    rows = est("B^{512}_{bx=0}L^{1024}_{c=0}[C^{f32,g}_{bx,c}=A^{f32,g}_{bx,c}*2.0;];")
    both = est("B^{512}_{bx=0}B^{1024}_{tx=0}[C^{f32,g}_{bx,tx}=A^{f32,g}_{bx,tx}*2.0;];")
    # a row per thread re-reads each 32-byte sector from L1 (1 DRAM miss per 8 floats): the
    # thread's chain of 1024 loads still waits several times longer than one wide launch
    assert serial > 100 * rows and rows > 4 * both


def test_coalesced_access_beats_strided():
    coalesced = est("B^{512}_{bx=0}B^{1024}_{tx=0}[C^{f32,g}_{bx,tx}=A^{f32,g}_{bx,tx}*2.0;];")
    strided = est("B^{1024}_{bx=0}B^{512}_{tx=0}[C^{f32,g}_{tx,bx}=A^{f32,g}_{tx,bx}*2.0;];")
    assert strided > 1.5 * coalesced


def test_one_fused_launch_beats_two():
    two = est("B^{512}_{bx=0}B^{1024}_{tx=0}[D^{f32,g}_{bx,tx}=A^{f32,g}_{bx,tx}*2.0;];\n"
              "B^{512}_{bx=0}B^{1024}_{tx=0}[C^{f32,g}_{bx,tx}=D^{f32,g}_{bx,tx}+1.0;];")
    one = est("B^{512}_{bx=0}B^{1024}_{tx=0}[C^{f32,g}_{bx,tx}=A^{f32,g}_{bx,tx}*2.0+1.0;];")
    assert two > 1.5 * one


def test_serial_loops_around_the_binding_are_host_loops_one_launch_each():
    """On the H200 (issue 37) a loop_reorder that put a 35-iteration reduction loop outside
    the bound loop ran 26x slower: the backend launches the kernel once per host iteration."""
    hdr = "% program: g\n% input I: f32[35]\n% input E: f32[1009,35]\n% output G: f32[1009]\n"
    inside = parse_leir(hdr + "B^{1009}_{tx=0}L^{35}_{a=0}[G^{f32,g}_{tx}=G^{f32,g}_{tx}+I^{f32,g}_{a}*E^{f32,g}_{tx,a};];")
    outside = parse_leir(hdr + "L^{35}_{a=0}B^{1009}_{tx=0}[G^{f32,g}_{tx}=G^{f32,g}_{tx}+I^{f32,g}_{a}*E^{f32,g}_{tx,a};];")
    assert kernel_estimate(inside.program.nests[0]).launches == 1
    assert kernel_estimate(outside.program.nests[0]).launches == 35
    assert estimate_gpu_ns(outside.program) > 10 * estimate_gpu_ns(inside.program)
    # a nest with no binding at all is one kernel of one thread, whatever its loops
    serial = parse_leir(hdr + "L^{1009}_{c=0}L^{35}_{a=0}[G^{f32,g}_{c}=G^{f32,g}_{c}+I^{f32,g}_{a}*E^{f32,g}_{c,a};];")
    assert kernel_estimate(serial.program.nests[0]).launches == 1


def test_a_serial_reduction_per_thread_in_one_block_is_bound_by_one_sm():
    """A row sum serial in one thread per row in ONE block (the translator's form of a
    reduction) runs on one of the 132 SMs: bound by that SM's issue rate and its threads'
    chains of 1024 dependent adds and loads (each a mostly-L1 re-read of its row's sector),
    not by the device's memory bandwidth."""
    head = "% program: r\n% input A: f32[512,1024]\n% output C: f32[512]\n"
    serial = parse_leir(head + "B^{512}_{tx=0}L^{1024}_{a=0}[C^{f32,g}_{tx}=C^{f32,g}_{tx}+A^{f32,g}_{tx,a};];")
    k = kernel_estimate(serial.program.nests[0])
    assert min(k.latency_ns, k.issue_ns) > 2 * k.memory_ns
    assert k.occupancy < 0.5  # 16 warps in one block on one SM


def test_cuda_target_of_the_static_model_is_the_gpu_model():
    m = load_leir(Path(__file__).resolve().parents[1] / "examples" / "softmax.leir")
    assert estimate_ns(m.program, "cuda") == pytest.approx(estimate_gpu_ns(m.program))
    assert estimate_ns(m.program, "cpu") != pytest.approx(estimate_ns(m.program, "cuda"))
