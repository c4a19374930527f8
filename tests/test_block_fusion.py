"""Block-level fusion (rule block_fusion), the round search's row-wise macro sequences that
reach it (with compute_inline_indexed and the matched loop split) and the GPU preflight's
phase-handoff check.

A kernel whose blocks run two phases (sibling threadIdx loops, or code outside them, under the
same blockIdx loops) needs a barrier where one phase reads what other threads wrote in the
previous one. TVM 0.27 inserts ``__syncthreads()`` there only for shared-scope buffers; the
preflight rejects global ones and block_fusion moves what it hands over to shared memory.
"""

from __future__ import annotations

import random
import re
import subprocess
import sys
from pathlib import Path

from steptp.backend import cuda_source
from steptp.backend.build import compile_cuda_text, lower_module
from steptp.backend.preflight import gpu_problems
from steptp.engine import apply_rule, list_candidates
from steptp.engine.apply import PreflightRejected, gpu_preflight_problems
from steptp.leir import parse_leir
from steptp.rules import load_rules
from steptp.engine import macros as P
from steptp.engine.recipes import load_recipe_text, recipes_in_effect
from steptp.verify import verify_pair

STP = Path(sys.executable).parent / "stp"
RULES = {r.id: r for r in load_rules()}
RECIPES = {r.id: r for r in recipes_in_effect()}
HEAD = "% program: centre\n% input A: f32[4,32]\n% output F: f32[4,32]\n"
TWO_KERNELS = HEAD + ("B^{4}_{bxa=0}B^{32}_{tya=0}[J^{f32,g}_{bxa}=J^{f32,g}_{bxa}+A^{f32,g}_{bxa,tya};];\n"
                      "B^{4}_{bxa=0}B^{32}_{tya=0}[F^{f32,g}_{bxa,tya}=A^{f32,g}_{bxa,tya}-J^{f32,g}_{bxa}/32.0;];\n")


def _kernels(src: str) -> int:
    """Kernel definitions in a CUDA source (TVM also declares each one first)."""
    return len(re.findall(r"__global__ void[^;{]*\{", src))


def _phased(scope: str) -> str:
    return HEAD + (f"B^{{4}}_{{bxa=0}}[B^{{32}}_{{tya=0}}[J^{{f32,{scope}}}_{{bxa}}=J^{{f32,{scope}}}_{{bxa}}"
                   f"+A^{{f32,g}}_{{bxa,tya}};];B^{{32}}_{{tya=0}}[F^{{f32,g}}_{{bxa,tya}}=A^{{f32,g}}_{{bxa,tya}}"
                   f"-J^{{f32,{scope}}}_{{bxa}}/32.0;];];\n")


def test_a_global_row_sum_read_by_the_next_phase_is_a_race_the_shared_one_has_a_barrier():
    glob, shared = parse_leir(_phased("g")), parse_leir(_phased("s"))
    probs = gpu_problems(glob)
    assert len(probs) == 1 and "global tensor J is handed between phases" in probs[0], probs
    assert gpu_problems(shared) == []
    src = cuda_source(shared)
    body = src[src.index("main_kernel(float"):]
    # the all-reduce's result is stored by one thread, then the barrier, then the read
    store, sync, read = body.index("J_ptr[0] = "), body.index("__syncthreads()"), body.index("- (J_ptr[0]")
    assert store < sync < read
    assert "__shared__" in body and "J_ptr[1]" in body


def test_same_thread_handoff_between_phases_passes_and_a_broadcast_read_does_not():
    head = "% program: p\n% input A: f32[4,32]\n% output C: f32[4,32]\n"
    same = parse_leir(head + "B^{4}_{bxa=0}[B^{32}_{tya=0}[D^{f32,g}_{bxa,tya}=A^{f32,g}_{bxa,tya}*2.0;];"
                             "B^{32}_{tyb=0}[C^{f32,g}_{bxa,tyb}=D^{f32,g}_{bxa,tyb}+1.0;];];\n")
    assert gpu_problems(same) == []          # thread t reads what thread t wrote
    other = parse_leir(head + "B^{4}_{bxa=0}[B^{32}_{tya=0}[D^{f32,g}_{bxa,tya}=A^{f32,g}_{bxa,tya}*2.0;];"
                              "B^{32}_{tyb=0}[C^{f32,g}_{bxa,tyb}=D^{f32,g}_{bxa,31-tyb};];];\n")
    assert any("global tensor D is handed between phases" in p for p in gpu_problems(other))


def test_a_thread_reduction_inside_a_fused_nest_read_by_all_threads_is_rejected():
    """The shape round 0 of the 40-program search produced 26 times (epilogue_fusion, then
    reduction_thread_binding of the inner reduction loop): the sum is stored by one thread and
    read right after by every thread of the block, with no barrier."""
    m = parse_leir("% program: bmm\n% input A: f32[2,4,8]\n% input C: f32[2,8,5]\n% output D: f32[2,4,5]\n"
                   "B^{2}_{bya=0}B^{4}_{tya=0}B^{5}_{bxa=0}[B^{8}_{txa=0}[E^{f32,g}_{bya,tya,bxa}="
                   "E^{f32,g}_{bya,tya,bxa}+A^{f32,g}_{bya,tya,txa}*C^{f32,g}_{bya,txa,bxa};];"
                   "D^{f32,g}_{bya,tya,bxa}=E^{f32,g}_{bya,tya,bxa};];\n")
    assert any("global tensor E is handed between phases" in p for p in gpu_problems(m))
    before = parse_leir("% program: bmm\n% input A: f32[2,4,8]\n% input C: f32[2,8,5]\n% output D: f32[2,4,5]\n"
                        "B^{2}_{bya=0}B^{4}_{tya=0}B^{5}_{bxa=0}[L^{8}_{c=0}[E^{f32,g}_{bya,tya,bxa}="
                        "E^{f32,g}_{bya,tya,bxa}+A^{f32,g}_{bya,tya,c}*C^{f32,g}_{bya,c,bxa};];"
                        "D^{f32,g}_{bya,tya,bxa}=E^{f32,g}_{bya,tya,bxa};];\n")
    assert gpu_preflight_problems(before) == []
    cands = list_candidates(RULES["reduction_thread_binding"], before)
    assert cands                   # the rule matches (tx and ty are free) ...
    for site, params in cands:     # ... and the preflight refuses every site's rewrite
        try:
            step = apply_rule(RULES["reduction_thread_binding"], before, site=site, params=params)
        except PreflightRejected as e:
            assert "handed between phases" in str(e), e
        else:
            raise AssertionError(f"accepted: {step.after.text()}")


def test_block_fusion_step_verifies_and_lowers_to_one_kernel_with_a_barrier():
    m = parse_leir(TWO_KERNELS)
    step = apply_rule(RULES["block_fusion"], m, seed=0)
    assert len(step.after.program.nests) == 1
    assert "J^{f32,s}" in step.after.text()
    assert verify_pair(m, step.after, seed=0).ok
    src = cuda_source(step.after)
    assert _kernels(src) == 1 and "__syncthreads()" in src
    assert _kernels(cuda_source(m)) == 2


def test_the_row_sequence_fuses_a_layernorm_into_one_kernel():
    """The row_kernels recipe (rows to blocks, columns to threads, reductions to
    cross-thread all-reduces, then fusion) on the translator's 4-kernel LayerNorm: one kernel,
    every step verified, the GPU preflight passes."""
    text = ("% program: layernorm\n% input A: f32[6,40]\n% param D: f32[40]\n% param E: f32[40]\n"
            "% output F: f32[6,40]\n"
            "B^{6}_{tx=0}L^{40}_{a=0}[J^{f64,g}_{tx}=J^{f64,g}_{tx}+A^{f32,g}_{tx,a};];\n"
            "B^{6}_{tx=0}L^{40}_{a=0}[K^{f64,g}_{tx}=K^{f64,g}_{tx}+(A^{f32,g}_{tx,a}-J^{f64,g}_{tx}/40.0)"
            "*(A^{f32,g}_{tx,a}-J^{f64,g}_{tx}/40.0);];\n"
            "B^{6}_{tx=0}L^{40}_{a=0}[F^{f32,g}_{tx,a}=(A^{f32,g}_{tx,a}-J^{f64,g}_{tx}/40.0)"
            "/sqrt(K^{f64,g}_{tx}/40.0+1e-05)*D^{f32,g}_{a}+E^{f32,g}_{a};];\n")
    root = parse_leir(text)
    mod, steps = _run_sequence(RECIPES["row_kernels"], root)
    assert len(mod.program.nests) == 1, mod.text()
    assert [s["rule"] for s in steps].count("block_fusion") == 2
    assert gpu_preflight_problems(mod) == []
    assert verify_pair(root, mod, seed=1).ok


def test_block_fused_softmax_runs_equal_on_the_simulated_device(tmp_path):
    """The fused form through CUDA code generation (nvcc PTX) and the simulated device."""
    orig, cand = tmp_path / "a.leir", tmp_path / "b.leir"
    orig.write_text(TWO_KERNELS)
    cand.write_text(_phased("s"))
    env = {**__import__("os").environ, "STP_CUDA_SIM": "1"}
    r = subprocess.run([str(STP), "verify", str(orig), str(cand), "--device", "cuda"], capture_output=True,
                       text=True, env=env, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "Equal  pass" in r.stdout and "device cuda" in r.stdout
    bad = tmp_path / "c.leir"
    bad.write_text(_phased("g"))
    r = subprocess.run([str(STP), "verify", str(orig), str(bad), "--device", "cuda"], capture_output=True,
                       text=True, env=env, timeout=600)
    assert r.returncode != 0 and "handed between phases" in r.stdout + r.stderr, r.stdout + r.stderr


def _run_sequence(seq, root):
    """The sequence recipe ``seq`` from ``root``, every step verified against it (as the search does)."""
    from steptp.leir import LeirModule, parse_program

    mod, steps = P.run_sequence(seq, RULES, root, random.Random(0))
    for st in steps:
        assert verify_pair(root, LeirModule(root.signature, parse_program(st["leir"])), seed=0).ok, st["rule"]
    return mod, steps


def test_a_split_to_the_previous_nests_extents_lets_a_group_norm_fuse():
    """A GroupNorm's element-wise nest runs over all 8 channels, its group sums over 2 x 4: the
    row sequence alone leaves two kernels (8 threads and 2 x 4 threads: one block shape per
    kernel); the variant that first splits the channel loop to the previous nest's extents
    (2 x 4) gives one."""
    root = parse_leir("% program: groupnorm\n% input A: f32[3,8]\n% output H: f32[3,8]\n"
                      "B^{3}_{tx=0}L^{2}_{a=0}L^{4}_{c=0}[N^{f32,g}_{tx,a}=N^{f32,g}_{tx,a}+A^{f32,g}_{tx,a*4+c};];\n"
                      "B^{3}_{tx=0}L^{8}_{a=0}[H^{f32,g}_{tx,a}=A^{f32,g}_{tx,a}-N^{f32,g}_{tx,a//4}/4.0;];\n")
    plain, split = RECIPES["row_kernels"], RECIPES["row_kernels_split_like_previous"]
    mod, _ = _run_sequence(plain, root)
    assert len(mod.program.nests) == 2, mod.text()
    mod, steps = _run_sequence(split, root)
    assert len(mod.program.nests) == 1, mod.text()
    assert steps[0]["rule"] == "loop_split" and steps[0]["params"] == {"f": 4} and "nest(1)" in steps[0]["site"]
    assert gpu_preflight_problems(mod) == [] and verify_pair(root, mod, seed=2).ok


def test_the_row_sequence_inlines_a_padding_nest_and_the_result_runs_on_the_simulated_device(tmp_path):
    """compute_inline_indexed at the head of the row sequence: a padded convolution (the
    translator's pad kernel, then the sum read at a+d) becomes one kernel; the inlined guard
    keeps the reads of the padding in bounds (CUDA code generation, nvcc PTX, simulated device)."""
    text = ("% program: conv1d\n% input A: f32[1,3,12]\n% param W: f32[5,3,3]\n% output C: f32[1,5,12]\n"
            "B^{3}_{tx=0}L^{14}_{a=0}[D^{f32,g}_{0,tx,a}=if_then_else(1<=a&a<13,A^{f32,g}_{0,tx,a-1},0.0);];\n"
            "B^{5}_{tx=0}L^{12}_{a=0}L^{3}_{c=0}L^{3}_{d=0}[C^{f32,g}_{0,tx,a}=C^{f32,g}_{0,tx,a}"
            "+D^{f32,g}_{0,c,a+d}*W^{f32,g}_{tx,c,d};];\n")
    root = parse_leir(text)
    mod, steps = _run_sequence(RECIPES["row_kernels"], root)
    assert steps[0]["rule"] == "compute_inline_indexed" and len(mod.program.nests) == 1, mod.text()
    assert "if_then_else(" in mod.text() and "D^{" not in mod.text()   # the pad is computed where read
    assert gpu_preflight_problems(mod) == []
    orig, cand = tmp_path / "a.leir", tmp_path / "b.leir"
    orig.write_text(text)
    cand.write_text(mod.text())
    env = {**__import__("os").environ, "STP_CUDA_SIM": "1"}
    r = subprocess.run([str(STP), "verify", str(orig), str(cand), "--device", "cuda"], capture_output=True,
                       text=True, env=env, timeout=600)
    assert r.returncode == 0 and "Equal  pass" in r.stdout, r.stdout + r.stderr


# --- redundant execution: a phase outside an axis bound elsewhere in its kernel -------------

def _redundant(first_loops: str, target: str, second_loops: str) -> str:
    return ("% program: r\n% input A: f32[2,8,4]\n% output F: f32[2,8,4]\n% output X: f32[2]\n"
            f"B^{{2}}_{{bxa=0}}[{first_loops}[{target}_{{bxa}}={target}_{{bxa}}+A^{{f32,g}}_{{bxa,c,d}};];"
            f"{second_loops}[F^{{f32,g}}_{{bxa,c,d}}=A^{{f32,g}}_{{bxa,c,d}}*2.0;];];\n")


def test_an_in_place_update_outside_a_thread_axis_of_its_kernel_is_a_race():
    """TVM emits a phase outside a thread axis bound elsewhere in the kernel with no thread
    test, so every thread runs its X = X + .. at once: the preflight refuses it (the CPU runs
    it once). A block axis bound in one phase makes every block of it run the other phases:
    a race for a global update, not for a shared one (one copy per block). TVM's cross-thread
    all-reduce (the reduction itself bound to a thread) groups the other threads: allowed."""
    serial = _redundant("L^{8}_{c=0}L^{4}_{d=0}", "X^{f32,g}", "B^{8}_{txa=0}L^{4}_{e=0}").replace(
        "F^{f32,g}_{bxa,c,d}=A^{f32,g}_{bxa,c,d}", "F^{f32,g}_{bxa,txa,e}=A^{f32,g}_{bxa,txa,e}")
    probs = gpu_problems(parse_leir(serial))
    assert len(probs) == 1 and "updates X in place" in probs[0] and "threadIdx.x (8)" in probs[0], probs
    # the code TVM would build (lowered without the preflight that now refuses it)
    src = compile_cuda_text(lower_module(parse_leir(serial), None, "cuda").text, "sm_90")
    body = src[src.index("main_kernel(float"):]
    update = body.index("X_ptr[((int)blockIdx.x)] = (X_ptr")
    assert "threadIdx" not in body[:update]   # no guard: every thread runs the update
    by_block = ("% program: r\n% input A: f32[2,8,4]\n% output F: f32[2,8,4]\n% output X: f32[2]\n"
                "B^{2}_{bxa=0}[B^{8}_{txa=0}L^{4}_{d=0}[X^{f32,g}_{bxa}=X^{f32,g}_{bxa}+A^{f32,g}_{bxa,txa,d};];"
                "B^{8}_{txa=0}B^{4}_{bya=0}[F^{f32,g}_{bxa,txa,bya}=A^{f32,g}_{bxa,txa,bya}*2.0;];];\n")
    assert gpu_problems(parse_leir(by_block)) == []   # an all-reduce stores the same value per block
    by_block_serial = by_block.replace("B^{8}_{txa=0}L^{4}_{d=0}[X^{f32,g}_{bxa}=X^{f32,g}_{bxa}+A^{f32,g}_{bxa,txa,d}",
                                       "L^{8}_{c=0}L^{4}_{d=0}[X^{f32,g}_{bxa}=X^{f32,g}_{bxa}+A^{f32,g}_{bxa,c,d}")
    probs = gpu_problems(parse_leir(by_block_serial))
    assert len(probs) == 1 and "threadIdx.x (8), blockIdx.y (4)" in probs[0], probs
    shared = ("% program: r\n% input A: f32[2,8,4]\n% output F: f32[2,8,4]\n"
              "B^{2}_{bxa=0}[B^{8}_{txa=0}L^{4}_{d=0}[I^{f32,s}_{bxa}=I^{f32,s}_{bxa}+A^{f32,g}_{bxa,txa,d};];"
              "B^{8}_{txa=0}B^{4}_{tya=0}[F^{f32,g}_{bxa,txa,tya}=A^{f32,g}_{bxa,txa,tya}-I^{f32,s}_{bxa};];];\n")
    assert gpu_problems(parse_leir(shared)) == []   # all-reduce over tx, ty threads grouped
    src = cuda_source(parse_leir(shared))
    assert "__shfl_sync(mask_ptr[0], red_buf0_ptr[0], (((int)threadIdx.y) * 8), 32)" in src


def test_a_split_of_a_bound_loop_simplifies_the_group_reads_and_the_grid_filter_fuses_a_group_norm():
    """A GroupNorm shaped like the translator's (the normalisation over all channels reads the
    group statistics at c//4): the split variant of the row sequence splits its channel loop as
    the group nests' 2 x 4 (the split simplifies (g*4+c)//4 to g), the row sequence's binding
    keeps blocks outermost (row_kernels_split_like_previous's binding step with the block_axes_outermost filter: the fourth loop stays serial, not blockIdx.y),
    and block_fusion joins the three nests into one kernel. With the plain canonical binding
    the normalisation's last loop goes to blockIdx.y and block_fusion finds no site."""
    root = parse_leir(
        "% program: gn\n% input A: f32[8,3,5,2]\n% output K: f32[8,3,5,2]\n"
        "B^{2}_{tx=0}L^{4}_{a=0}L^{3}_{c=0}L^{5}_{d=0}L^{2}_{f=0}[I^{f64,g}_{tx}=I^{f64,g}_{tx}"
        "+A^{f32,g}_{tx*4+a,c,d,f};];\n"
        "B^{2}_{tx=0}L^{4}_{a=0}L^{3}_{c=0}L^{5}_{d=0}L^{2}_{f=0}[J^{f64,g}_{tx}=J^{f64,g}_{tx}"
        "+(A^{f32,g}_{tx*4+a,c,d,f}-I^{f64,g}_{tx}/120.0)*(A^{f32,g}_{tx*4+a,c,d,f}-I^{f64,g}_{tx}/120.0);];\n"
        "B^{8}_{tx=0}L^{3}_{a=0}L^{5}_{c=0}L^{2}_{d=0}[K^{f32,g}_{tx,a,c,d}=(A^{f32,g}_{tx,a,c,d}"
        "-I^{f64,g}_{tx//4}/120.0)/sqrt(J^{f64,g}_{tx//4}/120.0+1e-05);];\n")
    split = RECIPES["row_kernels_split_like_previous"]
    assert {"rule": "loop_binding", "accept": "block_axes_outermost"} in split.spec["steps"]
    mod, steps = _run_sequence(split, root)
    assert steps[0]["rule"] == "loop_split" and steps[0]["params"] == {"f": 4}
    assert len(mod.program.nests) == 1, mod.text()
    assert "//" not in mod.text() and "B^{" in mod.text() and "_{bya" not in mod.text()
    assert gpu_preflight_problems(mod) == [] and verify_pair(root, mod, seed=3).ok
    # the same recipe with its binding step unfiltered (a recipe is data: a changed copy)
    plain = load_recipe_text(Path(split.source_path).read_text().replace(
        "{rule: loop_binding, accept: block_axes_outermost}", "loop_binding"))
    assert "accept" not in plain.spec["steps"][2]
    mod, _ = _run_sequence(plain, root)
    assert len(mod.program.nests) > 1 and "_{bya=0}" in mod.text(), mod.text()


def test_a_softmax_over_channels_becomes_one_kernel_with_the_spatial_positions_as_the_grid():
    """The translator's softmax over the channel axis of (batch, channel, h, w): the max and sum
    nests run batch, h, w, then the channel reduction; the normalisation batch, channel, h, w.
    The last rows variant moves that nest's channel loop inward (the order_matches_neighbour filter: one move,
    to the reductions' order), binds batch, h, w to blocks and the channels to threads
    (the blocks_while_free filter, reduction_thread_binding: cross-thread all-reduces) and joins the three
    nests: one kernel, grid 2 x 3 x 4, 5 threads, verified, preflight clean. The row sequence
    without the reorder keeps more than one kernel."""
    root = parse_leir(
        "% program: softmax_c\n% input A: f32[2,5,3,4]\n% output K: f32[2,5,3,4]\n"
        "B^{2}_{tx=0}L^{3}_{a=0}L^{4}_{c=0}L^{5}_{d=0}[I^{f32,g}_{tx,a,c}=max(I^{f32,g}_{tx,a,c},"
        "A^{f32,g}_{tx,d,a,c});];\n"
        "B^{2}_{tx=0}L^{3}_{a=0}L^{4}_{c=0}L^{5}_{d=0}[J^{f32,g}_{tx,a,c}=J^{f32,g}_{tx,a,c}"
        "+exp(A^{f32,g}_{tx,d,a,c}-I^{f32,g}_{tx,a,c});];\n"
        "B^{2}_{tx=0}L^{5}_{a=0}L^{3}_{c=0}L^{4}_{d=0}[K^{f32,g}_{tx,a,c,d}=exp(A^{f32,g}_{tx,a,c,d}"
        "-I^{f32,g}_{tx,c,d})/J^{f32,g}_{tx,c,d};];\n")
    seq = RECIPES["row_kernels_matched_order"]
    assert seq.spec["steps"][0] == {"rule": "loop_reorder", "accept": "order_matches_neighbour", "required": True}
    mod, steps = _run_sequence(seq, root)
    assert steps[0]["rule"] == "loop_reorder" and steps[0]["params"] == {"order": [0, 2, 3, 1]}, steps[0]
    assert len(mod.program.nests) == 1, mod.text()
    loops = mod.program.nests[0].loops
    assert [(lp.var[:2], lp.extent) for lp in loops] == [("bx", 2), ("by", 3), ("bz", 4)], mod.text()
    assert "B^{5}_{txa=0}" in mod.text() and "^{f32,s}" in mod.text()
    assert gpu_preflight_problems(mod) == [] and verify_pair(root, mod, seed=4).ok
    mod, _ = _run_sequence(RECIPES["row_kernels"], root)
    assert len(mod.program.nests) > 1, mod.text()
