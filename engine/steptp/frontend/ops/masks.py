"""Comparisons, masks and selection: gt/lt/eq..., logical ops, where, masked_fill, tril/triu,
constant fills, sign."""

from __future__ import annotations

from ...leir import ast as A
from ..ir import Fill, Lazy, Value, bread, call, iadd
from .context import lowering


# ---------------------------------------------------------------------------
# Comparisons, masks, selection
# ---------------------------------------------------------------------------

_CMP = {"gt": ">", "lt": "<", "ge": ">=", "le": "<=", "eq": "==", "ne": "!=", "greater": ">", "less": "<",
        "greater_equal": ">=", "less_equal": "<=", "not_equal": "!="}


def _cmp_lowering(name: str):
    def lower(ctx):
        a = ctx.args.get("self")
        if not isinstance(a, Value):
            ctx.fail("expected a tensor", "self")
        b = ctx.operand("other", a.dtype)
        shape = ctx.out_shape
        return Lazy(shape, "bool", lambda idx: A.Compare(_CMP[name], bread(a, idx, shape), bread(b, idx, shape)))

    lower.__name__ = f"lower_{name}"
    lower.__doc__ = f"``self {_CMP[name]} other``: a boolean mask evaluated where it is read (no nest)."
    lowering(name)(lower)


for _n in _CMP:
    _cmp_lowering(_n)


def _bool_operand(ctx, name: str) -> Value:
    v = ctx.args.get(name)
    if not isinstance(v, Value) or v.dtype != "bool":
        ctx.fail("expected a boolean tensor", name)
    return v


@lowering("logical_and", "logical_or", "bitwise_and", "bitwise_or", "__and__", "__or__")
def lower_logical_binary(ctx):
    """``a & b`` / ``a | b`` of boolean masks (evaluated where read)."""
    a, b = _bool_operand(ctx, "self"), _bool_operand(ctx, "other")
    op = "and" if "and" in ctx.op else "or"
    shape = ctx.out_shape
    return Lazy(shape, "bool", lambda idx: A.BoolOp(op, bread(a, idx, shape), bread(b, idx, shape)))


@lowering("logical_not", "bitwise_not", "__invert__")
def lower_logical_not(ctx):
    """``~mask`` (evaluated where read)."""
    a = _bool_operand(ctx, "self")
    return Lazy(a.shape, "bool", lambda idx: A.Not(a.read(idx)))


@lowering("where")
def lower_where(ctx):
    """``where(condition, self, other)``: ``if_then_else(cond, x, y)`` (broadcasting)."""
    if ctx.overload not in ("self", "ScalarOther", "ScalarSelf", "Scalar"):
        ctx.fail("where(condition) with one argument is not supported", "condition")
    c = _bool_operand(ctx, "condition")
    return ctx.map(lambda cv, x, y: call("if_then_else", cv, x, y), c, ctx.operand("self"), ctx.operand("other"))


@lowering("masked_fill")
def lower_masked_fill(ctx):
    """``masked_fill(self, mask, value)``: ``if_then_else(mask, value, x)``."""
    m = _bool_operand(ctx, "mask")
    return ctx.map(lambda x, mv, v: call("if_then_else", mv, v, x), ctx.operand("self"), m, ctx.operand("value"))


@lowering("tril", "triu")
def lower_tril(ctx):
    """``tril``/``triu(self, diagonal)``: keep ``j-i <= k`` (tril) / ``j-i >= k`` (triu), else 0."""
    x = ctx.operand("self")
    k = ctx.args.get("diagonal", 0)
    out = ctx.result()
    sp = ctx.em.space(out.shape)
    i, j = sp.out[-2], sp.out[-1]
    cond = A.Compare("<=" if ctx.op == "tril" else ">=", j, iadd(i, A.Int(k)))
    ctx.em.emit(sp.loops, A.Assign(out.ref(sp.out), call("if_then_else", cond, x.read(sp.out), ctx.lit(0))))
    return out


@lowering("full", "zeros", "ones", "scalar_tensor", "zeros_like", "ones_like", "full_like", "new_zeros",
          "new_ones", "new_full")
def lower_full(ctx):
    """Constant tensors (``zeros``, ``ones``, ``full``, ``*_like``): a fill value read in place."""
    if ctx.op in ("zeros", "zeros_like", "new_zeros"):
        v = 0
    elif ctx.op in ("ones", "ones_like", "new_ones"):
        v = 1
    elif ctx.op == "scalar_tensor":
        v = ctx.number("s")
    else:
        v = ctx.number("fill_value")
    return Fill(v, ctx.out_dtype, ctx.out_shape)


@lowering("sign")
def lower_sign(ctx):
    """``sign(x)``: ``if_then_else(x>0, 1, if_then_else(x<0, -1, 0))``."""
    x = ctx.operand("self")
    return ctx.map(lambda v: call("if_then_else", A.Compare(">", v, ctx.lit(0)), ctx.lit(1),
                                  call("if_then_else", A.Compare("<", v, ctx.lit(0)), ctx.lit(-1), ctx.lit(0))), x)
