"""Elementwise arithmetic and activations: add/sub/mul/div/pow, unary math, relu/gelu/silu and
the other activations, clamps, lerp and addcmul."""

from __future__ import annotations

import math
from typing import Callable

from ...leir import ast as A
from ..ir import Value, add, call, div, mul, reshape_view, slice_view, sub
from .context import lowering, OpContext


# ---------------------------------------------------------------------------
# Elementwise arithmetic
# ---------------------------------------------------------------------------


def _alpha(ctx: OpContext, e: A.Expr) -> A.Expr:
    alpha = ctx.args.get("alpha", 1)
    return e if alpha == 1 else mul(ctx.lit(alpha), e)


@lowering("add")
def lower_add(ctx):
    """``self + alpha*other`` (tensors or numbers, broadcasting)."""
    return ctx.map(lambda x, y: add(x, _alpha(ctx, y)), ctx.operand("self"), ctx.operand("other"))


@lowering("sub", "subtract")
def lower_sub(ctx):
    """``self - alpha*other``."""
    return ctx.map(lambda x, y: sub(x, _alpha(ctx, y)), ctx.operand("self"), ctx.operand("other"))


@lowering("rsub")
def lower_rsub(ctx):
    """``other - alpha*self`` (``1 - x``)."""
    return ctx.map(lambda x, y: sub(y, _alpha(ctx, x)), ctx.operand("self"), ctx.operand("other"))


@lowering("mul", "multiply")
def lower_mul(ctx):
    """``self * other``."""
    return ctx.map(mul, ctx.operand("self"), ctx.operand("other"))


@lowering("div", "divide", "true_divide")
def lower_div(ctx):
    """``self / other`` (true division only; ``rounding_mode`` is rejected)."""
    if ctx.args.get("rounding_mode") is not None:
        ctx.unsupported("rounding_mode")
    ctx.require_float(ctx.tensor("self") if isinstance(ctx.args.get("self"), Value) else None)
    return ctx.map(div, ctx.operand("self"), ctx.operand("other"))


@lowering("neg", "negative")
def lower_neg(ctx):
    """``-self``."""
    return ctx.map(lambda x: A.Neg(x), ctx.operand("self"))


@lowering("pow")
def lower_pow(ctx):
    """``self ** exponent`` for a number exponent (2 -> ``x*x``, 0.5 -> ``sqrt``, else ``**``)."""
    if ctx.overload != "Tensor_Scalar":
        ctx.fail("only a tensor base with a number exponent is supported", "exponent")
    x = ctx.operand("self")
    ctx.require_float(x)
    p = ctx.number("exponent")
    if p == 1:
        return ctx.map(lambda v: v, x)
    if p == 2:
        return ctx.map(lambda v: mul(v, v), x)
    if p == 3:
        return ctx.map(lambda v: mul(mul(v, v), v), x)
    if p == 0.5:
        return ctx.map(lambda v: call("sqrt", v), x)
    if p == -1:
        return ctx.map(lambda v: div(ctx.lit(1), v), x)
    return ctx.map(lambda v: A.BinOp("**", v, ctx.lit(p)), x)


def _unary(fn: Callable[[OpContext, A.Expr], A.Expr], *names: str, floats: bool = True, composite: bool = False):
    """Register an elementwise lowering ``fn(ctx, x)``; ``composite``: several operations,
    computed in float32 for 16-bit float inputs and rounded once (:meth:`OpContext.opmath`)."""
    def lower(ctx):
        x = ctx.operand("self")
        if floats:
            ctx.require_float(x)
        return ctx.map(lambda v: fn(ctx, v), ctx.opmath(x) if composite else x)

    lower.__name__ = f"lower_{names[0]}"
    lower.__doc__ = f"Elementwise {names[0]}."
    lowering(*names)(lower)
    return lower


def _sigmoid(ctx, v):
    return div(ctx.lit(1), add(ctx.lit(1), call("exp", A.Neg(v))))


_unary(lambda c, v: call("exp", v), "exp")
_unary(lambda c, v: call("log", v), "log")
_unary(lambda c, v: call("sqrt", v), "sqrt")
_unary(lambda c, v: div(c.lit(1), call("sqrt", v)), "rsqrt", composite=True)
_unary(lambda c, v: div(c.lit(1), v), "reciprocal")
_unary(lambda c, v: call("abs", v), "abs", "absolute", floats=False)
_unary(lambda c, v: call("tanh", v), "tanh")
_unary(lambda c, v: call("erf", v), "erf")
_unary(lambda c, v: mul(v, v), "square", floats=False)
_unary(lambda c, v: call("max", v, c.lit(0)), "relu")
_unary(lambda c, v: call("min", call("max", v, c.lit(0)), c.lit(6)), "relu6")
_unary(_sigmoid, "sigmoid", composite=True)
_unary(lambda c, v: div(v, add(c.lit(1), call("exp", A.Neg(v)))), "silu", composite=True)
_unary(lambda c, v: div(v, add(c.lit(1), call("abs", v))), "softsign", composite=True)
_unary(lambda c, v: div(call("min", call("max", add(v, c.lit(3)), c.lit(0)), c.lit(6)), c.lit(6)), "hardsigmoid",
       composite=True)
_unary(lambda c, v: div(mul(v, call("min", call("max", add(v, c.lit(3)), c.lit(0)), c.lit(6))), c.lit(6)),
       "hardswish", composite=True)
_unary(lambda c, v: mul(v, call("tanh", call("log", add(c.lit(1), call("exp", v))))), "mish", composite=True)
_unary(lambda c, v: sub(v, call("tanh", v)), "tanhshrink", composite=True)


@lowering("gelu")
def lower_gelu(ctx):
    """GELU: exact ``0.5*x*(1+erf(x/sqrt(2)))`` or ``approximate='tanh'``
    ``0.5*x*(1+tanh(sqrt(2/pi)*(x+0.044715*x*x*x)))``."""
    x = ctx.operand("self")
    ctx.require_float(x)
    x = ctx.opmath(x)  # several operations: float32 for 16-bit inputs, one rounding
    approx = ctx.args.get("approximate", "none")
    if approx == "none":
        return ctx.map(lambda v: mul(mul(ctx.lit(0.5), v),
                                     add(ctx.lit(1), call("erf", mul(v, ctx.lit(0.7071067811865476))))), x)
    if approx == "tanh":
        inner = lambda v: mul(ctx.lit(0.7978845608028654), add(v, mul(ctx.lit(0.044715), mul(mul(v, v), v))))
        return ctx.map(lambda v: mul(mul(ctx.lit(0.5), v), add(ctx.lit(1), call("tanh", inner(v)))), x)
    ctx.unsupported("approximate")


@lowering("leaky_relu")
def lower_leaky_relu(ctx):
    """``x if x > 0 else negative_slope*x``."""
    x = ctx.operand("self")
    ctx.require_float(x)
    s = ctx.number("negative_slope")
    return ctx.map(lambda v: call("if_then_else", A.Compare(">", v, ctx.lit(0)), v, mul(v, ctx.lit(s))), x)


@lowering("elu")
def lower_elu(ctx):
    """``scale*x if x > 0 else scale*alpha*(exp(input_scale*x)-1)``."""
    x = ctx.operand("self")
    ctx.require_float(x)
    x = ctx.opmath(x)  # several operations: float32 for 16-bit inputs, one rounding
    alpha, scale, iscale = ctx.number("alpha"), ctx.number("scale"), ctx.number("input_scale")
    pos = lambda v: v if scale == 1 else mul(ctx.lit(scale), v)
    arg = lambda v: v if iscale == 1 else mul(ctx.lit(iscale), v)
    coef = alpha * scale
    neg = lambda v: (lambda e: e if coef == 1 else mul(ctx.lit(coef), e))(sub(call("exp", arg(v)), ctx.lit(1)))
    return ctx.map(lambda v: call("if_then_else", A.Compare(">", v, ctx.lit(0)), pos(v), neg(v)), x)


_SELU_ALPHA = 1.6732632423543772848170429916717
_SELU_SCALE = 1.0507009873554804934193349852946


@lowering("selu")
def lower_selu(ctx):
    """``scale*(x if x > 0 else alpha*(exp(x)-1))`` with SELU's constants."""
    x = ctx.operand("self")
    ctx.require_float(x)
    x = ctx.opmath(x)  # several operations: float32 for 16-bit inputs, one rounding
    return ctx.map(lambda v: call("if_then_else", A.Compare(">", v, ctx.lit(0)), mul(ctx.lit(_SELU_SCALE), v),
                                  mul(ctx.lit(_SELU_SCALE * _SELU_ALPHA), sub(call("exp", v), ctx.lit(1)))), x)


@lowering("softplus")
def lower_softplus(ctx):
    """``x if beta*x > threshold else log(1+exp(beta*x))/beta``."""
    x = ctx.operand("self")
    ctx.require_float(x)
    x = ctx.opmath(x)  # several operations: float32 for 16-bit inputs, one rounding
    beta, th = ctx.number("beta"), ctx.number("threshold")
    bx = lambda v: v if beta == 1 else mul(ctx.lit(beta), v)
    sp = lambda v: (lambda e: e if beta == 1 else div(e, ctx.lit(beta)))(call("log", add(ctx.lit(1), call("exp", bx(v)))))
    return ctx.map(lambda v: call("if_then_else", A.Compare(">", bx(v), ctx.lit(th)), v, sp(v)), x)


def _clamp_expr(ctx, v, lo, hi):
    if lo is not None:
        v = call("max", v, lo)
    if hi is not None:
        v = call("min", v, hi)
    return v


@lowering("clamp", "clip")
def lower_clamp(ctx):
    """``min(max(x, min), max)``; bounds are numbers or tensors (broadcast); ``None`` skips."""
    x = ctx.operand("self")
    lo, hi = ctx.args.get("min"), ctx.args.get("max")
    if lo is None and hi is None:
        ctx.fail("clamp needs min or max", "min")
    ops = [x] + [ctx.operand(n) for n, b in (("min", lo), ("max", hi)) if b is not None]

    def fn(v, *bounds):
        it = iter(bounds)
        return _clamp_expr(ctx, v, next(it) if lo is not None else None, next(it) if hi is not None else None)

    return ctx.map(fn, *ops)


@lowering("clamp_min")
def lower_clamp_min(ctx):
    """``max(self, min)``."""
    return ctx.map(lambda v, b: call("max", v, b), ctx.operand("self"), ctx.operand("min"))


@lowering("clamp_max")
def lower_clamp_max(ctx):
    """``min(self, max)``."""
    return ctx.map(lambda v, b: call("min", v, b), ctx.operand("self"), ctx.operand("max"))


@lowering("hardtanh")
def lower_hardtanh(ctx):
    """``min(max(x, min_val), max_val)``."""
    x = ctx.operand("self")
    return ctx.map(lambda v: _clamp_expr(ctx, v, ctx.lit(ctx.number("min_val")), ctx.lit(ctx.number("max_val"))), x)


@lowering("maximum", "fmax")
def lower_maximum(ctx):
    """Elementwise ``max(self, other)`` (broadcasting)."""
    return ctx.map(lambda a, b: call("max", a, b), ctx.operand("self"), ctx.operand("other"))


@lowering("minimum", "fmin")
def lower_minimum(ctx):
    """Elementwise ``min(self, other)`` (broadcasting)."""
    return ctx.map(lambda a, b: call("min", a, b), ctx.operand("self"), ctx.operand("other"))



_unary(lambda c, v: call("log", add(c.lit(1), v)), "log1p")
_unary(lambda c, v: sub(call("exp", v), c.lit(1)), "expm1")
_unary(lambda c, v: div(call("log", v), c.lit(math.log(2.0))), "log2")
_unary(lambda c, v: div(call("log", v), c.lit(math.log(10.0))), "log10")
_unary(lambda c, v: call("exp", mul(v, c.lit(math.log(2.0)))), "exp2")
_unary(lambda c, v: A.Neg(call("log", add(c.lit(1), call("exp", A.Neg(v))))), "log_sigmoid")


@lowering("celu")
def lower_celu(ctx):
    """``max(0,x) + min(0, alpha*(exp(x/alpha)-1))``."""
    x = ctx.operand("self")
    ctx.require_float(x)
    x = ctx.opmath(x)  # several operations: float32 for 16-bit inputs, one rounding
    a = ctx.number("alpha")
    return ctx.map(lambda v: add(call("max", v, ctx.lit(0)), call("min", ctx.lit(0), mul(
        ctx.lit(a), sub(call("exp", div(v, ctx.lit(a))), ctx.lit(1))))), x)


@lowering("threshold")
def lower_threshold(ctx):
    """``x if x > threshold else value``."""
    x = ctx.operand("self")
    th, val = ctx.number("threshold"), ctx.number("value")
    return ctx.map(lambda v: call("if_then_else", A.Compare(">", v, ctx.lit(th)), v, ctx.lit(val)), x)


@lowering("hardshrink", "softshrink")
def lower_shrink(ctx):
    """``hardshrink``: ``x`` where ``|x| > lambd`` else 0; ``softshrink``: ``x -/+ lambd``."""
    x = ctx.operand("self")
    lam = ctx.number("lambd")
    if ctx.op == "hardshrink":
        return ctx.map(lambda v: call("if_then_else", A.Compare(">", call("abs", v), ctx.lit(lam)), v, ctx.lit(0)), x)
    return ctx.map(lambda v: call("if_then_else", A.Compare(">", v, ctx.lit(lam)), sub(v, ctx.lit(lam)),
                                  call("if_then_else", A.Compare("<", v, ctx.lit(-lam)), add(v, ctx.lit(lam)),
                                       ctx.lit(0))), x)


@lowering("prelu", "_prelu_kernel")
def lower_prelu(ctx):
    """``x if x > 0 else w*x`` with a per-channel (dim 1) or single weight."""
    x, w = ctx.tensor("self"), ctx.tensor("weight")
    if w.rank == 1 and w.shape[0] > 1 and x.rank >= 2:
        w = reshape_view(w, (w.shape[0],) + (1,) * (x.rank - 2))
    return ctx.map(lambda v, wv: call("if_then_else", A.Compare(">", v, ctx.lit(0)), v, mul(wv, v)), x, w)


@lowering("glu")
def lower_glu(ctx):
    """``a * sigmoid(b)`` where ``a``, ``b`` are the halves of ``dim``."""
    x = ctx.tensor("self")
    dim = ctx.dim(ctx.args.get("dim", -1), x.rank)
    h = x.shape[dim] // 2
    a, b = slice_view(x, dim, 0, h, 1), slice_view(x, dim, h, h, 1)
    return ctx.map(lambda u, v: mul(u, _sigmoid(ctx, v)), a, b)


@lowering("addcmul", "addcdiv")
def lower_addcmul(ctx):
    """``self + value * t1 * t2`` / ``self + value * t1 / t2``."""
    val = ctx.number("value")
    op = mul if ctx.op == "addcmul" else div

    def fn(a, b, c):
        t = op(b, c)
        return add(a, t if val == 1 else mul(ctx.lit(val), t))

    return ctx.map(fn, ctx.operand("self"), ctx.operand("tensor1"), ctx.operand("tensor2"))


@lowering("lerp")
def lower_lerp(ctx):
    """``self + weight * (end - self)``."""
    return ctx.map(lambda a, b, w: add(a, mul(w, sub(b, a))), ctx.operand("self"), ctx.operand("end"),
                   ctx.operand("weight"))
