"""The GPU tiling value functions (engine/steptp/engine/tiling.py) on a real program: the loops
around an equation and a nest, reduction axes, thread loops, flat indices and their inverse
(checked by enumeration), alignment of vector runs; and the preflight's proofs they rely on
(a mixed-radix copy index separates threads, a dense fill makes a shared tile private to its
block)."""

from __future__ import annotations

import operator

import pytest

from steptp.backend.preflight import _dense_span, _separates
from steptp.engine.primitives import EqRef, EvalContext, NestRef, ValueExprError, eval_value
from steptp.leir import ast as A
from steptp.leir import parse_leir
from steptp.leir.parser import parse_expr

PROG = parse_leir("% program: gemm\n% input A: f32[16,16]\n% param W: f32[16,16]\n% output C: f32[16,16]\n"
                  "B^{4}_{bxa=0}B^{4}_{bya=0}[L^{2}_{d=0}B^{4}_{txa=0}B^{4}_{tya=0}L^{8}_{f=0}[C^{f32,g}_{bxa*4+txa,"
                  "bya*4+tya}=C^{f32,g}_{bxa*4+txa,bya*4+tya}+A^{f32,g}_{bxa*4+txa,d*8+f}*W^{f32,g}_{d*8+f,bya*4+tya};];];\n")
E = EqRef((0, 0, 0))
INNER = NestRef((0, 0))


def ev(text, **env):
    return eval_value(text, EvalContext(PROG, {"e": E, "M": INNER, **env}))


def names(loops):
    return [l.var for l in loops]


def test_loops_around_an_equation_and_a_nest():
    assert names(ev("eq_loops(?e)")) == ["bxa", "bya", "d", "txa", "tya", "f"]
    assert names(ev("outer_loops(?M)")) == ["bxa", "bya"]
    assert ev("outer_loops(?N)", N=NestRef((0,))) == ()
    assert ev("reduction_axes(?e)") == ("d", "f")
    assert names(ev("thread_loops(eq_loops(?e))")) == ["txa", "tya"]
    assert ev("extent_product(thread_loops(eq_loops(?e)))") == 16
    with pytest.raises(ValueExprError):
        ev("eq_loops(?M)")


def test_linear_index_and_delinearized_are_inverse():
    tile = ev('loops_in_order(eq_loops(?e), free_indices(subscripts_of(?t)))', t=parse_expr("A^{f32,g}_{txa,f}"))
    assert names(tile) == ["txa", "f"]
    flat = ev("linear_index(?L)", L=tile)
    assert flat == parse_expr("txa*8+f")
    # every flat index 0..31 maps back to the (txa, f) whose linear index it is
    coords = ev("delinearized(?l, ?L, ?x)", l=(A.Index("txa"), A.Index("f")), L=tile, x=A.Index("x"))
    for x in range(32):
        env = {"x": x}
        got = tuple(_eval_int(c, env) for c in coords)
        assert got[0] * 8 + got[1] == x and 0 <= got[0] < 4 and 0 <= got[1] < 8
    assert ev("serial_loop(c, 1)") == () and names(ev("serial_loop(c, 3)")) == ["c"]


def test_aligned_run():
    sub = (parse_expr("bxa*4+txa"), parse_expr("d*8+f"))
    assert ev("aligned_run(?l, A, f, 4)", l=sub) and ev("aligned_run(?l, A, f, 2)", l=sub)
    assert not ev("aligned_run(?l, A, f, 4)", l=(parse_expr("bxa*4+txa"), parse_expr("d*8+f+1")))
    assert not ev("aligned_run(?l, A, txa, 2)", l=sub)         # txa is not in the last entry
    assert ev("dtype_bytes(f16)") == 2


def test_preflight_proofs_of_the_cooperative_copy():
    # c*64 + tx*16 + ty*4 + v over c<2, tx<4, ty<4, v<4: tx's coefficient is below c's span,
    # yet no two threads (tx) write one element: the whole form is mixed radix
    e = parse_expr("c*64+tx*16+ty*4+v")
    inner = {"ty": 4, "c": 2, "v": 4}
    assert _separates(e, "tx", inner, 4)
    assert not _separates(e, "tx", inner)                        # without tx's extent: no proof
    assert not _separates(parse_expr("c*8+tx*16+ty*4+v"), "tx", inner, 4)   # c overlaps tx
    assert _dense_span(e, {"c": 2, "tx": 4, "ty": 4, "v": 4}) == (0, 127)
    assert _dense_span(parse_expr("tx*32+ty"), {"tx": 4, "ty": 4}) is None  # holes
    assert _dense_span(e, {"tx": 4, "ty": 4, "v": 4}) is None    # c is not the writer's own loop


def _eval_int(e, env):
    if isinstance(e, A.Int):
        return e.value
    if isinstance(e, A.Index):
        return env[e.name]
    a, b = _eval_int(e.lhs, env), _eval_int(e.rhs, env)
    return {"+": operator.add, "-": operator.sub, "*": operator.mul, "//": operator.floordiv,
            "%": operator.mod}[e.op](a, b)

