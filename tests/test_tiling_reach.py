"""Issue gpu-reach: the tiling proposals reach the forms the translator writes at size.

Each case is a real PyTorch module translated by the frontend (not a hand-written form) with
the features that kept tiling away before: a bias added in place by a later kernel, rows
and columns that no tile divides (peeled by ``loop_partition``), rows bound to blockIdx
(M > 1024), a transposed operand (``nn.Linear``'s weight), a batch loop, a 1-D convolution
(a GEMM with a window loop) and a 2-D convolution with odd output sizes. The tiled program
must hold a shared-memory tile and a register tile and verify Equal against the original;
a nest that is not tiled names its reason."""

from __future__ import annotations

import itertools
import re

import pytest
import torch

from steptp.backend import cuda_source
from steptp.engine.macros import tiling_report
from steptp.frontend.translate import translate_model
from steptp.leir import LeirModule, parse_leir
from steptp.leir import ast as A
from steptp.rules import load_rules
from steptp.verify import verify_pair

RULES = {r.id: r for r in load_rules()}


class MatMul(torch.nn.Module):
    def forward(self, a, b):
        return torch.matmul(a, b)


CASES = {
    # rows 72 = 64 + 8 and columns 40 = 32 + 8: both peeled; the bias is a later in-place kernel
    "linear_bias_odd": (lambda: torch.nn.Linear(24, 40), [(72, 24)], ["loop_partition", "loop_partition"]),
    # 1100 rows: the translator binds them to blockIdx.x, so no thread-to-block rebinding
    "linear_rows_on_blocks": (lambda: torch.nn.Linear(16, 40), [(1100, 16)], ["loop_partition"]),
    "batched_matmul": (MatMul, [(3, 40, 24), (3, 24, 48)], ["loop_partition"]),
    "conv1d": (lambda: torch.nn.Conv1d(16, 40, 3), [(2, 16, 70)], ["loop_partition"]),
    "conv2d_odd_sizes": (lambda: torch.nn.Conv2d(8, 4, 3), [(2, 8, 21, 35)], ["loop_partition", "loop_partition"]),
}


def _translate(name):
    make, shapes, _ = CASES[name]
    torch.manual_seed(0)
    return translate_model(make(), [torch.randn(*s) for s in shapes], name=name).module


@pytest.mark.parametrize("name", sorted(CASES))
def test_translated_program_gets_a_tiled_nest_that_verifies_equal(name):
    orig = _translate(name)
    rep = tiling_report(RULES, orig)
    tiled = [r for r in rep if "steps" in r]
    assert len(tiled) == 1, rep
    steps = tiled[0]["steps"]
    rules = [s["rule"] for s in steps]
    want_partitions = CASES[name][2]
    assert rules[:len(want_partitions)] == want_partitions, rules
    if name == "linear_rows_on_blocks":
        assert "thread_block_rebinding" not in rules                     # rows were on blockIdx already
    staged = rules.count("shared_memory_tiling") + rules.count("shared_memory_window_tiling")
    assert "register_tiling" in rules and staged >= 1
    if name.startswith("conv2d"):
        assert "shared_memory_window_tiling" in rules                    # the input window, not a 9x tile
    text = steps[-1]["leir"]
    assert ",s}" in text and ",l}" in text                                 # a shared tile and a register tile
    after = LeirModule(orig.signature, parse_leir(text, "<tiled>").program)
    res = verify_pair(orig, after, trials=1)
    assert res.ok and res.equal, res.reason
    body = cuda_source(after)
    assert "__shared__" in body and "blockIdx.x" in body and "threadIdx.y" in body


def test_a_nest_too_small_to_tile_names_its_reason():
    torch.manual_seed(0)
    mod = translate_model(torch.nn.Linear(8, 8), [torch.randn(8, 8)], name="small").module
    rep = tiling_report(RULES, mod)
    assert [r["nest"] for r in rep] == [0] and "steps" not in rep[0]     # the bias kernel is no candidate
    assert "no tile fits extents [8, 8, 8]" in rep[0]["reason"]


def test_stp_rules_tiling_lists_tiled_nests_and_reasons(tmp_path):
    from typer.testing import CliRunner

    from steptp.cli import app

    torch.manual_seed(0)
    (tmp_path / "big.leir").write_text(_translate("linear_bias_odd").text())
    (tmp_path / "small.leir").write_text(
        translate_model(torch.nn.Linear(8, 8), [torch.randn(8, 8)], name="small").module.text())
    res = CliRunner().invoke(app, ["rules", "tiling", str(tmp_path / "big.leir"), str(tmp_path / "small.leir")])
    assert res.exit_code == 0, res.output
    assert "linear_bias_odd: 1 of 1 GEMM/convolution nest(s) tiled" in res.output
    assert re.search(r"nest 0: tiled in \d+ steps: loop_partition, loop_partition, .*register_tiling", res.output)
    assert "small: 0 of 1" in res.output and "not tiled: no tile fits extents [8, 8, 8]" in res.output
    bad = CliRunner().invoke(app, ["rules", "tiling", str(tmp_path / "none.leir")])
    assert bad.exit_code == 2 and "no such file" in bad.output


def test_partitioned_gemm_keeps_its_register_tile_with_a_bias_kernel_after_it():
    """The head of a partitioned GEMM is register-tiled although the tail and the bias kernel
    write the same output later (register_tiling refuses only an earlier writer)."""
    orig = _translate("linear_bias_odd")
    steps = next(r for r in tiling_report(RULES, orig) if "steps" in r)["steps"]
    final = parse_leir(steps[-1]["leir"], "<tiled>").program
    assert len(final.nests) == len(orig.program.nests) + 4                 # two peeled tails, each with its init
    first = steps[0]["leir"]
    assert "=0.0;];" in first                                              # the tail starts from the identity
    # each peeled tail runs a thread per output (rows on blockIdx.x, columns on threadIdx.x),
    # not one thread per row over all columns
    assert [s["rule"] for s in steps][-2:] == ["thread_block_rebinding", "loop_binding"] or \
        [s["rule"] for s in steps][-1] == "loop_binding"
    for nest in final.nests[1:]:
        if any(lp.kind == "L" for lp in nest.loops) and len(nest.loops) == 3:   # a tail GEMM
            assert nest.loops[0].var.startswith("bx") and nest.loops[1].var.startswith("tx"), nest


def test_tiled_matmul_hot_loop_in_sm90_machine_code(tmp_path):
    """The tiled candidate of a 1024x1024x1024 float32 matmul (the translator's form), compiled
    for sm_90 and read from its SASS (cuobjdump, installed with the test extra): the k loop
    holds no select (the register tile is initialised before it), at least 80 % FFMA, 16 FFMA
    per shared load, only 128-bit shared loads, and no spills."""
    from steptp.backend.sass import measure

    torch.manual_seed(0)
    mod = translate_model(MatMul(), [torch.randn(1024, 1024), torch.randn(1024, 1024)], name="matmul").module
    steps = next(r for r in tiling_report(RULES, mod) if "steps" in r)["steps"]
    after = LeirModule(mod.signature, parse_leir(steps[-1]["leir"], "<tiled>").program)
    fig = measure(after, "sm_90", tmp_path, "matmul")
    h = fig["hot_loop"]
    assert h["sel"] == 0 and h["fma_share"] >= 0.8 and h["fma_per_shared_load"] >= 16, fig
    assert set(h["lds_by_width"]) == {"128"} and fig["spill_stores"] == 0 and fig["spill_loads"] == 0, fig


def test_static_gpu_model_ranks_the_tiled_gemm_first_and_not_memory_bound():
    """The cost model counts shared-memory traffic with the register tile's reuse: the tiled
    1024^3 GEMM is predicted faster than the original and than every partial form on the
    way (each step's program), and bound by instruction issue rather than memory."""
    from steptp.cost_model.gpu import estimate_gpu_ns, kernel_estimate

    torch.manual_seed(0)
    mod = translate_model(MatMul(), [torch.randn(1024, 1024), torch.randn(1024, 1024)], name="matmul").module
    steps = next(r for r in tiling_report(RULES, mod) if "steps" in r)["steps"]
    progs = [parse_leir(s["leir"], "<step>").program for s in steps]
    final = estimate_gpu_ns(progs[-1])
    partial = [estimate_gpu_ns(p) for p, s in zip(progs[:-1], steps) if s["rule"] != "loop_unrolling"]
    assert final < estimate_gpu_ns(mod.program) and final < min(partial), (final, partial)
    k = kernel_estimate(progs[-1].nests[0])
    assert k.issue_ns > k.memory_ns, k


def _eval(e, env):
    """An integer index expression or condition of LEIR, evaluated with loop indices ``env``."""
    if isinstance(e, A.Int):
        return e.value
    if isinstance(e, A.Index):
        return env[e.name]
    if isinstance(e, A.BinOp):
        a, b = _eval(e.lhs, env), _eval(e.rhs, env)
        return {"+": a + b, "-": a - b, "*": a * b, "//": a // b if b else 0, "%": a % b if b else 0}[e.op]
    if isinstance(e, A.Compare):
        a, b = _eval(e.lhs, env), _eval(e.rhs, env)
        return {"<": a < b, "<=": a <= b, ">": a > b, ">=": a >= b, "==": a == b, "!=": a != b}[e.op]
    raise TypeError(e)


def _copies(nest, loops=()):
    """(loops around it, equation) of every copy into a shared tensor inside ``nest``."""
    loops = loops + tuple(nest.loops)
    for item in nest.body:
        if isinstance(item, A.Nest):
            yield from _copies(item, loops)
        elif item.target.scope == "s":
            yield loops, item


def test_convolution_window_reads_each_input_element_into_shared_memory_once_per_block():
    """Issue gpu-reach: the convolution's candidate copies no input element into shared
    memory twice in one block. Every copy step of block (0, 0, 0) and every reduction step
    is enumerated on the translated Conv2d's tiled LEIR; the elements of the input it
    stages (guarded padding left out) are distinct, and they are exactly the window a
    3x3 filter reads for the block's outputs."""
    torch.manual_seed(0)
    orig = translate_model(torch.nn.Conv2d(8, 16, 3), [torch.randn(2, 8, 34, 260)], name="conv").module
    steps = next(r["steps"] for r in tiling_report(RULES, orig) if "steps" in r)
    prog = parse_leir(steps[-1]["leir"], "<tiled>").program
    (loops, eq), = list(_copies(prog.nests[0]))
    assert isinstance(eq.value, A.Call) and eq.value.func == "if_then_else"
    cond, src = eq.value.args[0], eq.value.args[1]
    outer = [l for l in loops if l.kind == "B" and l.var.startswith("b")]
    inner = [l for l in loops if l not in outer]
    serial = [l for l in inner if not (l.kind == "B")]
    copy_loop = serial[-1]                                  # the copy's own loop (innermost serial)
    steps_loops = [l for l in serial if l is not copy_loop]  # serial column tiles, reduction step
    threads = [l for l in inner if l.kind == "B"]
    for outer_vals in itertools.product(*[range(l.extent) for l in steps_loops]):
        seen = []
        for vals in itertools.product(*[range(l.extent) for l in threads + [copy_loop]]):
            env = {l.var: 0 for l in outer}
            env.update({l.var: v for l, v in zip(steps_loops, outer_vals)})
            env.update({l.var: v for l, v in zip(threads + [copy_loop], vals)})
            if _eval(cond, env):
                seen.append(tuple(_eval(x, env) for x in src.indices))
        assert len(seen) == len(set(seen)), "an input element is staged twice in one block"
        rows = {s[2] for s in seen}
        cols = {s[3] for s in seen}
        chans = {s[1] for s in seen}
        # the window: the block's rows and columns plus the 3x3 halo, each (ci, row, col) once
        assert len(seen) == len(chans) * len(rows) * len(cols)
        assert max(rows) - min(rows) + 1 == len(rows) and max(cols) - min(cols) + 1 == len(cols)
