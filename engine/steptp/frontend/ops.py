"""One lowering function per ATen op, in the registry :data:`OPS` (op name -> function).

A lowering function receives an :class:`OpContext` (the fx node, its arguments bound to the
op schema's names with graph values already lowered, the result's static shape/dtype) and
returns the lowered :class:`~steptp.frontend.ir.Value` (or a tuple of them for multi-result
ops such as ``max.dim``). It emits nests through ``ctx.em`` (an :class:`Emitter`) and names
its result with ``ctx.result()`` (the program output's name when the node is an output).

Conventions of the emitted LEIR (see ``ir.py`` for the binding policy):

* one op = one or more nests, each with its own loops; elementwise ops write a fresh tensor;
* reductions append their reduced loops and rely on implicit init (``D=D+...``,
  ``D=max(D,...)``); multi-step ops (softmax, mean, layer norm) use fresh intermediates;
* views (reshape, transpose, permute, unsqueeze, expand, select, slice ...) emit nothing: they
  are index remappings applied where the value is read;
* dtypes: every tensor carries its PyTorch dtype; an equation may mix dtypes (the backend
  types LEIR expressions like PyTorch - wider float wins, ints promote to float - and casts
  the right-hand side to the target's dtype), so ``x.to(dtype)`` is a copy nest. Sums,
  products, matmuls, convolutions and norm statistics over f16/bf16 accumulate in an f32
  intermediate (then one cast nest), as PyTorch's CPU kernels do;
* any unsupported argument value raises :class:`TranslationError` naming op, argument, node.

Numerics follow PyTorch's formulas (e.g. ``gelu = 0.5*x*(1+erf(x*0.7071067811865476))``,
``sigmoid = 1/(1+exp(-x))``, softmax as max / sum of exp(x-max) / divide).
"""

from __future__ import annotations

import math
from typing import Any, Callable, Sequence

import torch.fx as fx

from ..leir import ast as A
from .ir import (FLOAT_CODES, Buffer, Emitter, Fill, Lazy, TranslationError, Value, View, add, bread, call, div,
                 expand_view, iadd, imul, literal, mul, permute_view, reshape_view, select_view, slice_view, sub)

# ---------------------------------------------------------------------------
# Context and registry
# ---------------------------------------------------------------------------


class OpContext:
    """Everything a lowering function needs for one fx node.

    ``args`` maps schema argument names to values: lowered graph values (:class:`Value`,
    tuples for multi-result producers), Python numbers/lists/None otherwise."""

    def __init__(self, node: fx.Node, op: str, overload: str, args: dict[str, Any], em: Emitter,
                 result_fn: Callable[..., Buffer], meta_fn: Callable[..., tuple[tuple[int, ...], str]],
                 needs_fn: Callable[[fx.Node, int], bool] = lambda n, k: True):
        self._needs_fn = needs_fn
        self.node = node
        self.op = op
        self.overload = overload
        self.args = args
        self.em = em
        self._result_fn = result_fn
        self._meta_fn = meta_fn

    @property
    def qualname(self) -> str:
        """``aten.<op>.<overload>`` (as in error messages)."""
        return f"aten.{self.op}.{self.overload}" if self.overload else self.op

    # -- metadata -------------------------------------------------------------

    def meta(self, k: int | None = None) -> tuple[tuple[int, ...], str]:
        """(shape, LEIR dtype) of the node's result (element ``k`` of a tuple result)."""
        return self._meta_fn(self.node, k)

    @property
    def out_shape(self) -> tuple[int, ...]:
        """Static shape of the (first) result."""
        return self.meta(0 if isinstance(self.node.meta.get("val"), (tuple, list)) else None)[0]

    @property
    def out_dtype(self) -> str:
        """LEIR dtype of the (first) result."""
        return self.meta(0 if isinstance(self.node.meta.get("val"), (tuple, list)) else None)[1]

    # -- errors and arguments -------------------------------------------------

    def fail(self, message: str, argument: str | None = None) -> TranslationError:
        """Raise a :class:`TranslationError` naming this op, ``argument`` and the node."""
        raise TranslationError(message, op=self.qualname, argument=argument, node=self.node)

    def unsupported(self, argument: str) -> TranslationError:
        """Raise a :class:`TranslationError` for an unsupported value of ``argument``."""
        raise TranslationError(f"unsupported value {self.args.get(argument)!r}", op=self.qualname,
                               argument=argument, node=self.node)

    def tensor(self, name: str) -> Value:
        """The tensor argument ``name``; raises if it is not a tensor."""
        v = self.args.get(name)
        if not isinstance(v, Value):
            self.fail(f"expected a tensor, got {type(v).__name__}", name)
        return v

    def operand(self, name: str, dtype: str | None = None) -> Value:
        """A tensor argument, or a Python number as a constant of ``dtype`` (default: the
        result dtype). Tensors of another dtype are fine: LEIR expressions are typed like
        PyTorch's (wider float wins, ints promote to float) and the value is cast to the
        target's dtype on assignment (backend ``tvmscript`` "Types")."""
        dtype = dtype or self.out_dtype
        v = self.args.get(name)
        if isinstance(v, (bool, int, float)):
            return Fill(v, dtype)
        if not isinstance(v, Value):
            self.fail(f"expected a tensor or a number, got {type(v).__name__}", name)
        return v

    def number(self, name: str) -> float | int:
        """The number argument ``name``; raises if it is not a Python number."""
        v = self.args.get(name)
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            self.fail(f"expected a number, got {v!r}", name)
        return v

    def lit(self, v, dtype: str | None = None) -> A.Expr:
        """A LEIR literal for ``v`` in ``dtype`` (default: the result dtype)."""
        return literal(v, dtype or self.out_dtype)

    def dim(self, d: int, rank: int, argument: str = "dim") -> int:
        """Normalise a (possibly negative) dimension; rank 0 accepts 0 and -1."""
        r = max(rank, 1)
        if not isinstance(d, int) or not -r <= d < r:
            self.fail(f"dimension {d!r} out of range for rank {rank}", argument)
        return d % r

    def dims(self, ds, rank: int, argument: str = "dim") -> list[int]:
        """Normalised, sorted, de-duplicated reduction dims (``None``/``[]`` = all dims)."""
        if ds is None or (isinstance(ds, (list, tuple)) and len(ds) == 0):
            return list(range(rank))
        if isinstance(ds, int):
            ds = [ds]
        return sorted({self.dim(d, rank, argument) for d in ds}) if rank else []

    def require_float(self, *values: Value) -> None:
        """Raise unless every tensor among ``values`` has a floating-point dtype."""
        for v in values:
            if isinstance(v, Value) and v.dtype not in FLOAT_CODES:
                self.fail(f"only floating-point tensors are supported here, got {v.dtype}")

    # -- results and nests ----------------------------------------------------

    def result(self, k: int | None = None) -> Buffer:
        """The buffer this node's result (element ``k``) is written to."""
        return self._result_fn(self.node, k)

    def needs_item(self, k: int) -> bool:
        """Whether element ``k`` of this node's tuple result is used (by a live ``getitem``)."""
        return self._needs_fn(self.node, k)

    def temp(self, shape: Sequence[int], dtype: str | None = None) -> Buffer:
        """A fresh intermediate of ``dtype`` (default: the result dtype)."""
        return self.em.temp(shape, dtype or self.out_dtype)

    def map(self, fn: Callable[..., A.Expr], *operands: Value, out: Buffer | None = None) -> Buffer:
        """Elementwise ``out = fn(operands...)`` (broadcasting) into the node's result."""
        return self.em.map(out or self.result(), fn, *operands)

    def acc_dtype(self, dtype: str | None = None, n: int = 1, long_at: int | None = None) -> str:
        """Accumulation dtype of a sum of ``n`` terms of ``dtype``: float32 for 16-bit floats
        (PyTorch accumulates f16/bf16 sums, matmuls and norms in float32), float64 for float32
        sums of at least :data:`LONG_REDUCTION` terms (a sequential float32 sum of millions of
        terms drifts by ~1e-3 relative; PyTorch's CPU kernels use cascade sums or double
        accumulators there, e.g. batch-norm statistics and cumsum), else ``dtype``."""
        dtype = dtype or self.out_dtype
        if dtype in ("f16", "bf16"):
            return "f32"
        if dtype == "f32" and n >= (long_at or LONG_REDUCTION):
            return "f64"
        return dtype

    def acc_temp(self, shape: Sequence[int], dtype: str | None = None, n: int = 1,
                 long_at: int | None = None) -> Buffer:
        """A fresh intermediate in the accumulation dtype (:meth:`acc_dtype`)."""
        return self.em.temp(shape, self.acc_dtype(dtype, n, long_at))

    def accumulate(self, out: Buffer, build: Callable[[Buffer], Any], n: int = 1) -> Buffer:
        """``build(target)`` emits nests accumulating ``n`` terms into ``target``: ``out``
        itself, or, when :meth:`acc_dtype` is wider, a temp of that dtype and then a cast
        nest ``out = temp``."""
        acc_dt = self.acc_dtype(out.dtype, n)
        if acc_dt == out.dtype:
            build(out)
            return out
        acc = self.em.temp(out.shape, acc_dt)
        build(acc)
        return self.em.copy(out, acc)


#: float32 sums of at least this many terms accumulate in float64 (:meth:`OpContext.acc_dtype`)
LONG_REDUCTION = 1 << 16
#: the same for normalisation statistics (mean/variance of layer/group/instance/batch norm,
#: var/std): a normalised output amplifies the error of the mean by 1/std, and PyTorch's CPU
#: kernels compute these statistics with double accumulators or cascade sums
STATS_REDUCTION = 1 << 8

#: op name (ATen schema name without namespace, or ``getitem``) -> lowering function
OPS: dict[str, Callable[[OpContext], Any]] = {}


def lowering(*names: str):
    """Register a lowering function for the given op names."""

    def deco(fn):
        for n in names:
            if n in OPS:
                raise AssertionError(f"duplicate lowering for {n}")
            OPS[n] = fn
        return fn

    return deco


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


def _unary(fn: Callable[[OpContext, A.Expr], A.Expr], *names: str, floats: bool = True):
    def lower(ctx):
        x = ctx.operand("self")
        if floats:
            ctx.require_float(x)
        return ctx.map(lambda v: fn(ctx, v), x)

    lower.__name__ = f"lower_{names[0]}"
    lower.__doc__ = f"Elementwise {names[0]}."
    lowering(*names)(lower)
    return lower


def _sigmoid(ctx, v):
    return div(ctx.lit(1), add(ctx.lit(1), call("exp", A.Neg(v))))


_unary(lambda c, v: call("exp", v), "exp")
_unary(lambda c, v: call("log", v), "log")
_unary(lambda c, v: call("sqrt", v), "sqrt")
_unary(lambda c, v: div(c.lit(1), call("sqrt", v)), "rsqrt")
_unary(lambda c, v: div(c.lit(1), v), "reciprocal")
_unary(lambda c, v: call("abs", v), "abs", "absolute", floats=False)
_unary(lambda c, v: call("tanh", v), "tanh")
_unary(lambda c, v: call("erf", v), "erf")
_unary(lambda c, v: mul(v, v), "square", floats=False)
_unary(lambda c, v: call("max", v, c.lit(0)), "relu")
_unary(lambda c, v: call("min", call("max", v, c.lit(0)), c.lit(6)), "relu6")
_unary(_sigmoid, "sigmoid")
_unary(lambda c, v: div(v, add(c.lit(1), call("exp", A.Neg(v)))), "silu")
_unary(lambda c, v: div(v, add(c.lit(1), call("abs", v))), "softsign")
_unary(lambda c, v: div(call("min", call("max", add(v, c.lit(3)), c.lit(0)), c.lit(6)), c.lit(6)), "hardsigmoid")
_unary(lambda c, v: div(mul(v, call("min", call("max", add(v, c.lit(3)), c.lit(0)), c.lit(6))), c.lit(6)),
       "hardswish")
_unary(lambda c, v: mul(v, call("tanh", call("log", add(c.lit(1), call("exp", v))))), "mish")
_unary(lambda c, v: sub(v, call("tanh", v)), "tanhshrink")


@lowering("gelu")
def lower_gelu(ctx):
    """GELU: exact ``0.5*x*(1+erf(x/sqrt(2)))`` or ``approximate='tanh'``
    ``0.5*x*(1+tanh(sqrt(2/pi)*(x+0.044715*x*x*x)))``."""
    x = ctx.operand("self")
    ctx.require_float(x)
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
    return ctx.map(lambda v: call("if_then_else", A.Compare(">", v, ctx.lit(0)), mul(ctx.lit(_SELU_SCALE), v),
                                  mul(ctx.lit(_SELU_SCALE * _SELU_ALPHA), sub(call("exp", v), ctx.lit(1)))), x)


@lowering("softplus")
def lower_softplus(ctx):
    """``x if beta*x > threshold else log(1+exp(beta*x))/beta``."""
    x = ctx.operand("self")
    ctx.require_float(x)
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


# ---------------------------------------------------------------------------
# Matrix products
# ---------------------------------------------------------------------------


def _matmul_nest(ctx: OpContext, a: Value, b: Value, out: Buffer) -> Buffer:
    """``out = a @ b`` with torch.matmul semantics (1-D operands, broadcast batch dims)."""
    ctx.require_float(a, b)
    for v, n in ((a, "self"), (b, "other")):
        if v.rank == 0:
            ctx.fail("matmul of a 0-d tensor", n)
    k = a.shape[-1]
    if b.shape[-2 if b.rank >= 2 else 0] != k:
        ctx.fail(f"inner dimensions differ: {a.shape} @ {b.shape}")
    sp = ctx.em.space(out.shape, [k])
    o = list(sp.out)
    (kk,) = sp.red
    nb = out.rank - (a.rank >= 2) - (b.rank >= 2)  # number of batch dims of the output
    batch = o[:nb]
    rest = o[nb:]
    n_idx = rest.pop(0) if a.rank >= 2 else None
    m_idx = rest.pop(0) if b.rank >= 2 else None

    def operand_index(v: Value, tail: list) -> tuple:
        vb = v.rank - len(tail)
        bshape = v.shape[:vb]
        bidx = [A.Int(0) if bshape[j] == 1 else batch[nb - vb + j] for j in range(vb)]
        return tuple(bidx + tail)

    ia = operand_index(a, ([n_idx] if a.rank >= 2 else []) + [kk])
    ib = operand_index(b, [kk] + ([m_idx] if b.rank >= 2 else []))
    tgt = out.ref(sp.out)
    ctx.em.emit(sp.loops, A.Assign(tgt, add(tgt, mul(a.read(ia), b.read(ib)))))
    return out


@lowering("matmul")
def lower_matmul(ctx):
    """``torch.matmul``: 1-D/2-D/batched operands with broadcasting; one reduction nest
    ``O=O+A*B`` over the contracted axis."""
    a, b = ctx.tensor("self"), ctx.tensor("other")
    return ctx.accumulate(ctx.result(), lambda t: _matmul_nest(ctx, a, b, t), a.shape[-1])


@lowering("mm")
def lower_mm(ctx):
    """``mm(self, mat2)``: 2-D matrix product."""
    a, b = ctx.tensor("self"), ctx.tensor("mat2")
    return ctx.accumulate(ctx.result(), lambda t: _matmul_nest(ctx, a, b, t), a.shape[-1])


@lowering("bmm")
def lower_bmm(ctx):
    """``bmm(self, mat2)``: batched 3-D matrix product."""
    a, b = ctx.tensor("self"), ctx.tensor("mat2")
    if a.rank != 3 or b.rank != 3:
        ctx.fail("bmm needs two 3-D tensors", "self")
    return ctx.accumulate(ctx.result(), lambda t: _matmul_nest(ctx, a, b, t), a.shape[-1])


def _bias_nest(ctx: OpContext, out: Buffer, bias: Value, scale=1) -> None:
    """``out = out + bias`` (broadcast) as its own nest (accumulates onto the product)."""
    sp = ctx.em.space(out.shape)
    tgt = out.ref(sp.out)
    b = bread(bias, sp.out, out.shape)
    ctx.em.emit(sp.loops, A.Assign(tgt, add(tgt, b if scale == 1 else mul(ctx.lit(scale), b))))


@lowering("linear")
def lower_linear(ctx):
    """``linear(input, weight, bias)``: ``O[..,o] = O + X[..,k]*W[o,k]``, then a bias nest
    ``O = O + b[o]``."""
    x, w = ctx.tensor("input"), ctx.tensor("weight")
    ctx.require_float(x, w)
    if w.rank != 2 or x.rank < 1:
        ctx.fail(f"weight must be 2-D (got {w.shape})", "weight")
    wt = permute_view(w, [1, 0])
    bias = ctx.tensor("bias") if ctx.args.get("bias") is not None else None

    def build(t):
        _matmul_nest(ctx, x, wt, t)
        if bias is not None:
            _bias_nest(ctx, t, bias)

    return ctx.accumulate(ctx.result(), build, x.shape[-1])


@lowering("addmm")
def lower_addmm(ctx):
    """``beta*self + alpha*(mat1 @ mat2)``."""
    beta, alpha = ctx.args.get("beta", 1), ctx.args.get("alpha", 1)
    if alpha != 1:
        ctx.unsupported("alpha")
    a, b = ctx.tensor("mat1"), ctx.tensor("mat2")

    def build(t):
        _matmul_nest(ctx, a, b, t)
        if beta != 0:
            _bias_nest(ctx, t, ctx.tensor("self"), beta)

    return ctx.accumulate(ctx.result(), build, a.shape[-1])


# ---------------------------------------------------------------------------
# Reductions
# ---------------------------------------------------------------------------


def _reduce_shape(x: Value, dims: Sequence[int], keepdim: bool) -> tuple[int, ...]:
    return tuple(1 if d in dims else n for d, n in enumerate(x.shape) if keepdim or d not in dims)


def _count(x: Value, dims: Sequence[int]) -> int:
    """Number of terms of a reduction of ``x`` over ``dims``."""
    return math.prod(x.shape[d] for d in dims)


@lowering("sum")
def lower_sum(ctx):
    """``sum(self, dim, keepdim)``: one reduction nest ``O=O+X``."""
    x = ctx.tensor("self")
    dims = ctx.dims(ctx.args.get("dim"), x.rank)
    keep = bool(ctx.args.get("keepdim", False))
    return ctx.accumulate(ctx.result(), lambda t: ctx.em.reduce(t, "sum", x, dims, keep), _count(x, dims))


@lowering("prod")
def lower_prod(ctx):
    """``prod(self, dim, keepdim)``: one reduction nest ``O=O*X``."""
    x = ctx.tensor("self")
    dims = ctx.dims(ctx.args.get("dim"), x.rank)
    keep = bool(ctx.args.get("keepdim", False))
    return ctx.accumulate(ctx.result(), lambda t: ctx.em.reduce(t, "prod", x, dims, keep))


@lowering("mean")
def lower_mean(ctx):
    """``mean(self, dim, keepdim)``: a sum nest into a fresh tensor, then ``O = S/n``."""
    x = ctx.tensor("self")
    dims = ctx.dims(ctx.args.get("dim"), x.rank)
    keep = bool(ctx.args.get("keepdim", False))
    s = ctx.em.reduce(ctx.acc_temp(_reduce_shape(x, dims, keep), n=_count(x, dims)), "sum", x, dims, keep)
    n = math.prod(x.shape[d] for d in dims)
    return ctx.map(lambda v: div(v, ctx.lit(n)), s)


@lowering("amax")
def lower_amax(ctx):
    """``amax(self, dim, keepdim)``: ``O=max(O,X)`` (implicit init -inf)."""
    x = ctx.tensor("self")
    return ctx.em.reduce(ctx.result(), "max", x, ctx.dims(ctx.args.get("dim"), x.rank),
                         bool(ctx.args.get("keepdim", False)))


@lowering("amin")
def lower_amin(ctx):
    """``amin(self, dim, keepdim)``: ``O=min(O,X)`` (implicit init +inf)."""
    x = ctx.tensor("self")
    return ctx.em.reduce(ctx.result(), "min", x, ctx.dims(ctx.args.get("dim"), x.rank),
                         bool(ctx.args.get("keepdim", False)))


def _arg_index(ctx: OpContext, kind: str, x: Value, extreme: Value, dim: int, keepdim: bool, out: Buffer) -> Buffer:
    """First index along ``dim`` where ``x`` equals ``extreme`` (its max/min): an init nest
    ``I = n`` and a nest ``I = min(I, if_then_else(X==M, a, n))``."""
    n = x.shape[dim]
    kept = [d for d in range(x.rank) if d != dim]
    sp0 = ctx.em.space([x.shape[d] for d in kept])
    tgt0 = out.ref(ctx.em.target_index(sp0, x.rank, [dim], keepdim))
    ctx.em.emit(sp0.loops, A.Assign(tgt0, A.Int(n)))
    sp = ctx.em.space([x.shape[d] for d in kept], [n])
    full = sp.full(x.rank, [dim])
    tgt = out.ref(ctx.em.target_index(sp, x.rank, [dim], keepdim))
    m = extreme.read(ctx.em.target_index(sp, x.rank, [dim], keepdim)) if extreme.rank == out.rank else None
    if m is None:
        raise AssertionError("extreme/index rank mismatch")
    (r,) = sp.red
    cand = call("if_then_else", A.Compare("==", x.read(full), m), r, A.Int(n))
    ctx.em.emit(sp.loops, A.Assign(tgt, call("min", tgt, cand)))
    return out


def _max_min(ctx, kind: str):
    x = ctx.tensor("self")
    if ctx.overload in ("default",):  # full reduction to a 0-d tensor (exact: no accumulation dtype)
        return ctx.em.reduce(ctx.result(), kind, x, list(range(x.rank)), False)
    if ctx.overload in ("other",):  # elementwise binary maximum / minimum
        return ctx.map(lambda a, b: call(kind, a, b), ctx.operand("self"), ctx.operand("other"))
    if ctx.overload != "dim":
        ctx.fail(f"overload {ctx.overload} is not supported")
    dim = ctx.dim(ctx.args["dim"], x.rank)
    keep = bool(ctx.args.get("keepdim", False))
    need_idx = ctx.needs_item(1)
    vals = ctx.result(0) if ctx.needs_item(0) or not need_idx else ctx.temp(ctx.meta(0)[0])
    ctx.em.reduce(vals, kind, x, [dim], keep)
    idx = None
    if need_idx:
        idx = _arg_index(ctx, kind, x, vals, dim, keep, ctx.result(1))
    return (vals, idx)


@lowering("max")
def lower_max(ctx):
    """``max``: full reduction, elementwise ``maximum`` or ``max.dim`` (values, indices)."""
    return _max_min(ctx, "max")


@lowering("min")
def lower_min(ctx):
    """``min``: full reduction, elementwise ``minimum`` or ``min.dim`` (values, indices)."""
    return _max_min(ctx, "min")


def _argext(ctx, kind: str):
    x = ctx.tensor("self")
    dim = ctx.args.get("dim")
    if dim is None:
        ctx.fail("argmax/argmin without dim (over the flattened tensor) is not supported", "dim")
    dim = ctx.dim(dim, x.rank)
    keep = bool(ctx.args.get("keepdim", False))
    m = ctx.em.reduce(ctx.temp(_reduce_shape(x, [dim], keep), x.dtype), kind, x, [dim], keep)
    return _arg_index(ctx, kind, x, m, dim, keep, ctx.result())


@lowering("argmax")
def lower_argmax(ctx):
    """``argmax(self, dim, keepdim)``: max nest, then first index attaining it (i64)."""
    return _argext(ctx, "max")


@lowering("argmin")
def lower_argmin(ctx):
    """``argmin(self, dim, keepdim)``: min nest, then first index attaining it (i64)."""
    return _argext(ctx, "min")


@lowering("logsumexp")
def lower_logsumexp(ctx):
    """``log(sum(exp(x - m))) + m`` with ``m = max(x)`` over ``dim``: three nests."""
    x = ctx.tensor("self")
    ctx.require_float(x)
    dims = ctx.dims(ctx.args.get("dim"), x.rank)
    keep = bool(ctx.args.get("keepdim", False))
    m = ctx.em.reduce(ctx.temp(_reduce_shape(x, dims, True)), "max", x, dims, True)
    s = ctx.em.reduce(ctx.acc_temp(_reduce_shape(x, dims, True), x.dtype, _count(x, dims)), "sum", x, dims, True,
                      fn=lambda v, sp: call("exp", sub(v, m.read(Emitter.target_index(sp, x.rank, dims, True)))))
    ms = m if keep else reshape_view(m, _reduce_shape(x, dims, False))
    ss = s if keep else reshape_view(s, _reduce_shape(x, dims, False))
    return ctx.map(lambda a, b: add(call("log", a), b), ss, ms)


def _softmax_parts(ctx: OpContext, x: Value, dim: int):
    """Max and sum-of-exp nests of a softmax over ``dim`` (kept as size-1 dims removed)."""
    ctx.require_float(x)
    red = tuple(n for d, n in enumerate(x.shape) if d != dim)
    m = ctx.em.reduce(ctx.temp(red, x.dtype), "max", x, [dim], False)
    s = ctx.em.reduce(ctx.acc_temp(red, x.dtype, x.shape[dim]), "sum", x, [dim], False,
                      fn=lambda v, sp: call("exp", sub(v, m.read(sp.out))))
    return m, s


def _softmax_dim(ctx, x):
    return ctx.dim(ctx.args["dim"], x.rank)


def _drop(idx: Sequence[A.Expr], dim: int) -> tuple:
    return tuple(i for d, i in enumerate(idx) if d != dim)


def _lower_softmax_family(ctx, scalar_value: int, combine):
    """Shared body of softmax / log_softmax over ``dim``: the max nest ``M`` and the
    sum-of-exp nest ``S`` (``_softmax_parts``), then ``O = combine(X, M, S)``; a 0-d input
    gives the constant ``scalar_value``."""
    x = ctx.tensor("self")
    dim = _softmax_dim(ctx, x)
    if x.rank == 0:
        return ctx.map(lambda v: ctx.lit(scalar_value), x)
    m, s = _softmax_parts(ctx, x, dim)
    out = ctx.result()
    sp = ctx.em.space(out.shape)
    xi, ri = x.read(sp.out), _drop(sp.out, dim)
    ctx.em.emit(sp.loops, A.Assign(out.ref(sp.out), combine(xi, m.read(ri), s.read(ri))))
    return out


@lowering("softmax", "_softmax")
def lower_softmax(ctx):
    """Softmax over ``dim``: ``M=max(M,X)``, ``S=S+exp(X-M)``, ``O=exp(X-M)/S``."""
    return _lower_softmax_family(ctx, 1, lambda xi, mi, si: div(call("exp", sub(xi, mi)), si))


@lowering("log_softmax", "_log_softmax")
def lower_log_softmax(ctx):
    """Log-softmax over ``dim``: max and sum-of-exp nests, then ``O = X-M-log(S)``."""
    return _lower_softmax_family(ctx, 0, lambda xi, mi, si: sub(sub(xi, mi), call("log", si)))


# ---------------------------------------------------------------------------
# Normalisation
# ---------------------------------------------------------------------------


def _moments(ctx: OpContext, x: Value, dims: list[int]):
    """Sum ``S`` and centred sum of squares ``Q`` over ``dims`` (kept as size-1 dims)."""
    n = math.prod(x.shape[d] for d in dims)
    shp = _reduce_shape(x, dims, True)
    s = ctx.em.reduce(ctx.acc_temp(shp, x.dtype, n, STATS_REDUCTION), "sum", x, dims, True)

    def centred(v, sp):
        d = sub(v, div(s.read(Emitter.target_index(sp, x.rank, dims, True)), ctx.lit(n, x.dtype)))
        return mul(d, d)

    q = ctx.em.reduce(ctx.acc_temp(shp, x.dtype, n, STATS_REDUCTION), "sum", x, dims, True, fn=centred)
    return s, q, n


@lowering("layer_norm")
def lower_layer_norm(ctx):
    """``layer_norm(input, normalized_shape, weight, bias, eps)`` over the trailing dims:
    sum nest, centred-square-sum nest, then ``O=(X-S/n)/sqrt(Q/n+eps)*W+B``."""
    x = ctx.tensor("input")
    ctx.require_float(x)
    k = len(ctx.args["normalized_shape"])
    dims = list(range(x.rank - k, x.rank))
    eps = ctx.number("eps")
    s, q, n = _moments(ctx, x, dims)
    w, b = ctx.args.get("weight"), ctx.args.get("bias")

    def fn(xv, sv, qv, *wb):
        it = iter(wb)
        y = div(sub(xv, div(sv, ctx.lit(n))), call("sqrt", add(div(qv, ctx.lit(n)), ctx.lit(eps))))
        if w is not None:
            y = mul(y, next(it))
        if b is not None:
            y = add(y, next(it))
        return y

    out = ctx.result()
    sp = ctx.em.space(out.shape)
    reads = [x.read(sp.out), s.read(_keep_idx(sp.out, dims)), q.read(_keep_idx(sp.out, dims))]
    for v in (w, b):
        if v is not None:
            reads.append(bread(v, sp.out, out.shape))
    ctx.em.emit(sp.loops, A.Assign(out.ref(sp.out), fn(*reads)))
    return out


def _keep_idx(idx: Sequence[A.Expr], dims: Sequence[int]) -> tuple:
    """Index of a keepdim reduction result for the full index ``idx``: 0 at ``dims``."""
    return tuple(A.Int(0) if d in dims else i for d, i in enumerate(idx))


@lowering("rms_norm")
def lower_rms_norm(ctx):
    """``rms_norm(input, normalized_shape, weight, eps)``: ``S=S+X*X`` over the trailing
    dims, then ``O = X/sqrt(S/n+eps)*W`` (eps defaults to the dtype's machine epsilon)."""
    import torch

    x = ctx.tensor("input")
    ctx.require_float(x)
    k = len(ctx.args["normalized_shape"])
    dims = list(range(x.rank - k, x.rank))
    n = math.prod(x.shape[d] for d in dims)
    eps = ctx.args.get("eps")
    if eps is None:
        from .ir import LEIR_TO_TORCH
        eps = torch.finfo(LEIR_TO_TORCH[x.dtype]).eps
    s = ctx.em.reduce(ctx.acc_temp(_reduce_shape(x, dims, True), x.dtype, n, STATS_REDUCTION), "sum", x, dims,
                      True, fn=lambda v, sp: mul(v, v))
    w = ctx.args.get("weight")
    out = ctx.result()
    sp = ctx.em.space(out.shape)
    sv = s.read(_keep_idx(sp.out, dims))
    y = div(x.read(sp.out), call("sqrt", add(div(sv, ctx.lit(n)), ctx.lit(eps))))
    if w is not None:
        y = mul(y, bread(ctx.tensor("weight"), sp.out, out.shape))
    ctx.em.emit(sp.loops, A.Assign(out.ref(sp.out), y))
    return out


# ---------------------------------------------------------------------------
# Views and copies (no nests)
# ---------------------------------------------------------------------------


@lowering("view", "reshape", "_unsafe_view", "flatten", "unflatten", "squeeze", "unsqueeze", "view_as",
          "reshape_as")
def lower_reshape(ctx):
    """Row-major reshapes (view, reshape, flatten, unflatten, squeeze, unsqueeze): an index
    remapping of the input, no nest."""
    x = ctx.args.get("self") if "self" in ctx.args else ctx.args.get("input")
    if not isinstance(x, Value):
        ctx.fail("expected a tensor", "self")
    return reshape_view(x, ctx.out_shape)


@lowering("transpose")
def lower_transpose(ctx):
    """``transpose(self, dim0, dim1)``: index remapping."""
    x = ctx.tensor("self")
    d0, d1 = ctx.dim(ctx.args["dim0"], x.rank, "dim0"), ctx.dim(ctx.args["dim1"], x.rank, "dim1")
    perm = list(range(x.rank))
    if x.rank:
        perm[d0], perm[d1] = perm[d1], perm[d0]
    return permute_view(x, perm)


@lowering("t", "numpy_T", "mT", "adjoint")
def lower_t(ctx):
    """``x.t()`` / ``x.T`` / ``x.mT``: reverse (or swap the last two) dims."""
    x = ctx.tensor("self")
    if ctx.op in ("mT", "adjoint"):
        perm = list(range(x.rank - 2)) + [x.rank - 1, x.rank - 2]
    else:
        perm = list(reversed(range(x.rank)))
    return permute_view(x, perm)


@lowering("permute")
def lower_permute(ctx):
    """``permute(self, dims)``: index remapping."""
    x = ctx.tensor("self")
    dims = [ctx.dim(d, x.rank, "dims") for d in ctx.args["dims"]]
    if sorted(dims) != list(range(x.rank)):
        ctx.fail(f"not a permutation: {ctx.args['dims']}", "dims")
    return permute_view(x, dims)


@lowering("expand", "expand_as", "broadcast_to")
def lower_expand(ctx):
    """``expand``/``expand_as``/``broadcast_to``: broadcasting index remapping."""
    return expand_view(ctx.tensor("self"), ctx.out_shape)


@lowering("broadcast_tensors")
def lower_broadcast_tensors(ctx):
    """``broadcast_tensors(tensors)``: a tuple of broadcasting views."""
    vals = ctx.node.meta["val"]
    return tuple(expand_view(v, tuple(int(n) for n in m.shape)) for v, m in zip(ctx.args["tensors"], vals))


@lowering("select")
def lower_select(ctx):
    """``select(self, dim, index)`` (``x[i]``): a constant subscript."""
    x = ctx.tensor("self")
    dim = ctx.dim(ctx.args["dim"], x.rank)
    i = ctx.args["index"]
    n = x.shape[dim]
    if not -n <= i < n:
        ctx.fail(f"index {i} out of range for size {n}", "index")
    return select_view(x, dim, i % n)


@lowering("slice")
def lower_slice(ctx):
    """``slice(self, dim, start, end, step)`` (``x[a:b:s]``): an affine subscript."""
    x = ctx.tensor("self")
    dim = ctx.dim(ctx.args.get("dim", 0), x.rank)
    n = x.shape[dim]
    step = ctx.args.get("step", 1)
    if not isinstance(step, int) or step <= 0:
        ctx.unsupported("step")
    start, _end, _ = slice(ctx.args.get("start"), ctx.args.get("end"), step).indices(n)
    length = ctx.out_shape[dim]
    return slice_view(x, dim, start, length, step)


@lowering("contiguous", "clone", "alias", "detach", "lift_fresh_copy", "_assert_tensor_metadata_noop")
def lower_identity(ctx):
    """Copies/aliases with no numeric effect: the value itself (copied only if an output)."""
    return ctx.tensor("self")


@lowering("dropout", "feature_dropout", "alpha_dropout", "feature_alpha_dropout", "native_dropout")
def lower_dropout(ctx):
    """Dropout: the identity when ``train`` is false or ``p == 0``; in training mode with
    ``p > 0`` it is random and raises (translate the model in eval mode). ``native_dropout``
    (functionalised graphs) also returns its all-true mask."""
    if ctx.args.get("train") and ctx.args.get("p", 0) != 0:
        ctx.fail("dropout in training mode with p > 0 is random; put the model in eval() mode "
                 "(stp translate --eval, translate_file(eval_mode=True))", "train")
    x = ctx.tensor("input")
    if ctx.op == "native_dropout":
        return (x, Fill(True, "bool", x.shape))
    return x


@lowering("to", "_to_copy", "type_as")
def lower_to(ctx):
    """``to``/``_to_copy``/``type_as``: the identity when the dtype does not change, else a
    copy nest into a tensor of the new dtype (the assignment casts)."""
    x = ctx.tensor("self")
    if ctx.out_dtype == x.dtype:
        return x
    return ctx.map(lambda v: v, x)


@lowering("getitem")
def lower_getitem(ctx):
    """``operator.getitem`` on a multi-result op (``max.dim(...)[0]``)."""
    seq, i = ctx.args["self"], ctx.args["index"]
    if not isinstance(seq, (tuple, list)):
        ctx.fail(f"getitem on {type(seq).__name__}", "self")
    v = seq[i]
    if v is None:
        ctx.fail(f"result {i} of the producer was not computed", "index")
    return v


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


# ---------------------------------------------------------------------------
# Concatenation, flips, repeats, cumulative ops
# ---------------------------------------------------------------------------


@lowering("cat", "concat", "concatenate")
def lower_cat(ctx):
    """``cat(tensors, dim)``: one copy nest per input, writing at its offset along ``dim``."""
    xs = [v for v in ctx.args["tensors"] if not (isinstance(v, Value) and v.shape == (0,))]
    out = ctx.result()
    dim = ctx.dim(ctx.args.get("dim", 0), out.rank)
    off = 0
    for j, x in enumerate(xs):
        if not isinstance(x, Value) or x.dtype != out.dtype:
            ctx.fail("inputs must be tensors of the result dtype", "tensors")
        sp = ctx.em.space(x.shape)
        tidx = list(sp.out)
        tidx[dim] = add(tidx[dim], A.Int(off)) if off else tidx[dim]
        ctx.em.emit(sp.loops, A.Assign(out.ref(tidx), x.read(sp.out)))
        off += x.shape[dim]
    return out


@lowering("stack")
def lower_stack(ctx):
    """``stack(tensors, dim)``: one copy nest per input at index ``j`` of the new dim."""
    xs = ctx.args["tensors"]
    out = ctx.result()
    dim = ctx.dim(ctx.args.get("dim", 0), out.rank)
    for j, x in enumerate(xs):
        if not isinstance(x, Value) or x.dtype != out.dtype:
            ctx.fail("inputs must be tensors of the result dtype", "tensors")
        sp = ctx.em.space(x.shape)
        tidx = list(sp.out)
        tidx.insert(dim, A.Int(j))
        ctx.em.emit(sp.loops, A.Assign(out.ref(tidx), x.read(sp.out)))
    return out


@lowering("split", "split_with_sizes", "chunk", "unbind", "tensor_split")
def lower_split(ctx):
    """``split``/``chunk``/``unbind``: a tuple of slice (or select) views."""
    x = ctx.tensor("self")
    dim = ctx.dim(ctx.args.get("dim", 0), x.rank)
    metas = ctx.node.meta.get("val")
    views, off = [], 0
    for k, m in enumerate(metas):
        n = int(m.shape[dim]) if ctx.op != "unbind" else 1
        if ctx.op == "unbind":
            views.append(select_view(x, dim, k))
        else:
            views.append(slice_view(x, dim, off, n, 1))
        off += n
    return tuple(views)


@lowering("flip")
def lower_flip(ctx):
    """``flip(self, dims)``: index ``n-1-i`` along each flipped dim (a view)."""
    x = ctx.tensor("self")
    dims = {ctx.dim(d, x.rank, "dims") for d in ctx.args["dims"]}

    def remap(idx):
        return tuple(sub(A.Int(x.shape[d] - 1), i) if d in dims and x.shape[d] > 1 else i for d, i in enumerate(idx))

    return View(x, x.shape, remap, "flip")


@lowering("repeat")
def lower_repeat(ctx):
    """``repeat(self, repeats)``: index ``i % n`` (a view)."""
    x = ctx.tensor("self")
    shape = ctx.out_shape
    off = len(shape) - x.rank

    def remap(idx):
        return tuple(A.Int(0) if n == 1 else (idx[off + d] if shape[off + d] == n else
                                              A.BinOp("%", idx[off + d], A.Int(n))) for d, n in enumerate(x.shape))

    return View(x, shape, remap, "repeat")


def _cumulative(ctx, kind: str):
    x = ctx.tensor("self")
    dim = ctx.dim(ctx.args["dim"], x.rank)
    out = ctx.result()
    if x.rank == 0 or x.shape[dim] == 1:
        return ctx.map(lambda v: v, x)
    n = x.shape[dim]

    def build(t: Buffer):
        # the scanned axis is the innermost serial loop; the other axes follow the policy
        sp = ctx.em.space([m for d, m in enumerate(x.shape) if d != dim], [n])
        (r,) = sp.red
        idx = sp.full(x.rank, [dim])
        prev = list(idx)
        prev[dim] = sub(r, A.Int(1))
        ident = ctx.lit(0 if kind == "sum" else 1, t.dtype)
        carry = call("if_then_else", A.Compare(">", r, A.Int(0)), t.ref(prev), ident)
        v = x.read(idx)
        ctx.em.emit(sp.loops, A.Assign(t.ref(idx), add(carry, v) if kind == "sum" else mul(carry, v)))

    return ctx.accumulate(out, build, n)


@lowering("cumsum")
def lower_cumsum(ctx):
    """``cumsum(self, dim)`` as a scan: ``O_i = if_then_else(i>0, O_{i-1}, 0) + X_i`` with the
    scanned axis as the innermost serial loop (a recurrence; no implicit init)."""
    return _cumulative(ctx, "sum")


@lowering("cumprod")
def lower_cumprod(ctx):
    """``cumprod(self, dim)`` as a scan: ``O_i = if_then_else(i>0, O_{i-1}, 1) * X_i``."""
    return _cumulative(ctx, "prod")


# ---------------------------------------------------------------------------
# More reductions and normalisations
# ---------------------------------------------------------------------------


def _correction(ctx) -> float:
    if ctx.overload == "correction":
        c = ctx.args.get("correction")
        return 1 if c is None else c
    return 1 if ctx.args.get("unbiased", True) else 0


def _var(ctx, root: bool):
    x = ctx.tensor("self")
    ctx.require_float(x)
    dims = ctx.dims(ctx.args.get("dim"), x.rank)
    keep = bool(ctx.args.get("keepdim", False))
    _s, q, n = _moments(ctx, x, dims)
    qv = q if keep else reshape_view(q, _reduce_shape(x, dims, False))
    denom = n - _correction(ctx)
    f = (lambda v: call("sqrt", div(v, ctx.lit(denom)))) if root else (lambda v: div(v, ctx.lit(denom)))
    return ctx.map(f, qv)


@lowering("var")
def lower_var(ctx):
    """``var(self, dim, correction, keepdim)``: sum nest, centred square-sum nest, divide."""
    return _var(ctx, False)


@lowering("std")
def lower_std(ctx):
    """``std``: like ``var`` then ``sqrt``."""
    return _var(ctx, True)


@lowering("linalg_vector_norm", "norm")
def lower_vector_norm(ctx):
    """Vector p-norms over ``dim``: ``sqrt(sum x*x)`` (p=2), ``sum |x|`` (1), ``max |x|`` (inf),
    ``(sum |x|**p)**(1/p)`` otherwise."""
    x = ctx.tensor("self")
    ctx.require_float(x)
    p = ctx.args.get("ord", ctx.args.get("p", 2))
    if p is None or p == "fro":
        p = 2
    if isinstance(p, str):
        ctx.unsupported("ord")
    dims = ctx.dims(ctx.args.get("dim"), x.rank)
    keep = bool(ctx.args.get("keepdim", False))
    shp = _reduce_shape(x, dims, keep)
    if p == 2:
        s = ctx.em.reduce(ctx.acc_temp(shp, n=_count(x, dims)), "sum", x, dims, keep, fn=lambda v, sp: mul(v, v))
        return ctx.map(lambda v: call("sqrt", v), s)
    if p == 1:
        return ctx.accumulate(ctx.result(), lambda t: ctx.em.reduce(t, "sum", x, dims, keep,
                                                                     fn=lambda v, sp: call("abs", v)),
                              _count(x, dims))
    if p == math.inf:
        return ctx.em.reduce(ctx.result(), "max", x, dims, keep, fn=lambda v, sp: call("abs", v))
    if p == -math.inf:
        return ctx.em.reduce(ctx.result(), "min", x, dims, keep, fn=lambda v, sp: call("abs", v))
    if p == 0:
        ctx.unsupported("ord")
    s = ctx.em.reduce(ctx.acc_temp(shp, n=_count(x, dims)), "sum", x, dims, keep,
                      fn=lambda v, sp: A.BinOp("**", call("abs", v), ctx.lit(p)))
    return ctx.map(lambda v: A.BinOp("**", v, ctx.lit(1.0 / p)), s)


def _normalize_nest(ctx, x: Value, s: Value, q: Value, n: int, eps: float, weight, bias, out: Buffer) -> Buffer:
    """``out = (x - s/n)/sqrt(q/n + eps)*w + b`` where ``s``, ``q`` are views of ``x``'s shape
    and ``w``, ``b`` broadcast (or ``None``)."""
    ops = [x, s, q] + [v for v in (weight, bias) if v is not None]

    def fn(xv, sv, qv, *wb):
        it = iter(wb)
        y = div(sub(xv, div(sv, ctx.lit(n))), call("sqrt", add(div(qv, ctx.lit(n)), ctx.lit(eps))))
        if weight is not None:
            y = mul(y, next(it))
        if bias is not None:
            y = add(y, next(it))
        return y

    return ctx.map(fn, *ops, out=out)


def _channel(v: Value | None, rank: int) -> Value | None:
    """A per-channel vector ``[C]`` as a view broadcasting over ``[N, C, *spatial]``."""
    if v is None:
        return None
    return reshape_view(v, (v.shape[0],) + (1,) * (rank - 2))


@lowering("batch_norm", "_native_batch_norm_legit_functional", "_native_batch_norm_legit_no_training",
          "_native_batch_norm_legit")
def lower_batch_norm(ctx):
    """Batch norm over ``[N, C, *spatial]``: running statistics in eval mode
    (``(x-rm)/sqrt(rv+eps)*w+b``), batch statistics (biased variance) in training mode.
    Running-stat updates (a side effect) are not translated."""
    x = ctx.tensor("input")
    ctx.require_float(x)
    training = ctx.args.get("training", ctx.op != "_native_batch_norm_legit_no_training")
    eps = ctx.number("eps")
    w, b = _channel(ctx.args.get("weight"), x.rank), _channel(ctx.args.get("bias"), x.rank)
    multi = isinstance(ctx.node.meta.get("val"), (tuple, list))
    if multi and any(ctx.needs_item(k) for k in range(1, len(ctx.node.meta["val"]))):
        ctx.fail("only the normalised output of batch norm is supported (saved statistics are used)")
    out = ctx.result(0) if multi else ctx.result()
    if training:
        dims = [0] + list(range(2, x.rank))
        s, q, n = _moments(ctx, x, dims)
        _normalize_nest(ctx, x, s, q, n, eps, w, b, out)
    else:
        rm, rv = _channel(ctx.tensor("running_mean"), x.rank), _channel(ctx.tensor("running_var"), x.rank)
        ops = [x, rm, rv] + [v for v in (w, b) if v is not None]

        def fn(xv, mv, vv, *wb):
            it = iter(wb)
            y = div(sub(xv, mv), call("sqrt", add(vv, ctx.lit(eps))))
            if w is not None:
                y = mul(y, next(it))
            if b is not None:
                y = add(y, next(it))
            return y

        ctx.map(fn, *ops, out=out)
    if multi:
        return (out,) + (None,) * (len(ctx.node.meta["val"]) - 1)
    return out


@lowering("instance_norm")
def lower_instance_norm(ctx):
    """Instance norm (``use_input_stats``): statistics over the spatial dims per (n, c)."""
    x = ctx.tensor("input")
    ctx.require_float(x)
    if not ctx.args.get("use_input_stats", True):
        ctx.unsupported("use_input_stats")
    dims = list(range(2, x.rank))
    s, q, n = _moments(ctx, x, dims)
    w, b = _channel(ctx.args.get("weight"), x.rank), _channel(ctx.args.get("bias"), x.rank)
    return _normalize_nest(ctx, x, s, q, n, ctx.number("eps"), w, b, ctx.result())


@lowering("group_norm")
def lower_group_norm(ctx):
    """Group norm: statistics over (channels of a group, spatial) per (n, group)."""
    x = ctx.tensor("input")
    ctx.require_float(x)
    g = ctx.args["num_groups"]
    N, C = x.shape[0], x.shape[1]
    if C % g:
        ctx.unsupported("num_groups")
    cg = C // g
    xg = reshape_view(x, (N, g, cg) + x.shape[2:])
    dims = list(range(2, xg.rank))
    s, q, n = _moments(ctx, xg, dims)

    def per_channel(stat: Value) -> Value:
        return View(stat, x.shape, lambda idx: (idx[0], A.BinOp("//", idx[1], A.Int(cg))) + (A.Int(0),) *
                    (xg.rank - 2), "group")

    w, b = _channel(ctx.args.get("weight"), x.rank), _channel(ctx.args.get("bias"), x.rank)
    return _normalize_nest(ctx, x, per_channel(s), per_channel(q), n, ctx.number("eps"), w, b, ctx.result())


# ---------------------------------------------------------------------------
# Convolution and pooling
# ---------------------------------------------------------------------------


def _ints(ctx, name: str, k: int, default=None) -> list[int]:
    v = ctx.args.get(name, default)
    if v is None or (isinstance(v, (list, tuple)) and len(v) == 0):
        v = default
    if isinstance(v, int):
        return [v] * k
    v = list(v)
    if len(v) == 1 and k > 1:
        v = v * k
    if len(v) != k or not all(isinstance(i, int) for i in v):
        ctx.fail(f"expected {k} integers, got {v!r}", name)
    return v


def _pad(ctx, x: Value, lo: list[int], hi: list[int], value) -> Value:
    """Pad the trailing ``len(lo)`` dims of ``x`` with ``value``: a nest
    ``P = if_then_else(lo<=h & h<H+lo ..., X[h-lo ...], value)``; ``x`` if no padding."""
    k = len(lo)
    if not any(lo) and not any(hi):
        return x
    shape = x.shape[:-k] + tuple(n + a + b for n, a, b in zip(x.shape[-k:], lo, hi))
    p = ctx.temp(shape, x.dtype)
    sp = ctx.em.space(shape)
    idx = list(sp.out)
    cond = None
    src = idx[:-k]
    for j in range(k):
        i = idx[x.rank - k + j]
        n = x.shape[x.rank - k + j]
        src.append(sub(i, A.Int(lo[j])) if lo[j] else i)
        parts = []
        if lo[j]:
            parts.append(A.Compare("<=", A.Int(lo[j]), i))
        if hi[j]:
            parts.append(A.Compare("<", i, A.Int(n + lo[j])))
        for c in parts:
            cond = c if cond is None else A.BoolOp("and", cond, c)
    ctx.em.emit(sp.loops, A.Assign(p.ref(idx), call("if_then_else", cond, x.read(src), ctx.lit(value, x.dtype))))
    return p


def _conv(ctx, x: Value, w: Value, bias, stride, lo, hi, dilation, groups) -> Buffer:
    k = x.rank - 2
    ctx.require_float(x, w)
    out = ctx.result()
    xp = _pad(ctx, x, lo, hi, 0)
    O, Cg = w.shape[0], w.shape[1]
    if x.shape[1] != Cg * groups or O % groups:
        ctx.fail(f"channel mismatch: input {x.shape}, weight {w.shape}, groups {groups}", "weight")
    Og = O // groups
    sp = ctx.em.space(out.shape, list(w.shape[1:]))
    n, o, *osp = sp.out
    c, *ks = sp.red
    if groups == 1:
        cin = c
    else:  # input channel of group o // Og
        grp = o if Og == 1 else A.BinOp("//", o, A.Int(Og))
        cin = iadd(imul(grp, Cg), c)
    pos = [iadd(imul(osp[j], stride[j]), imul(ks[j], dilation[j])) for j in range(k)]

    def build(t: Buffer):
        tgt = t.ref(sp.out)
        ctx.em.emit(sp.loops, A.Assign(tgt, add(tgt, mul(xp.read((n, cin, *pos)), w.read((o, c, *ks))))))
        if bias is not None:
            _bias_nest(ctx, t, reshape_view(bias, (bias.shape[0],) + (1,) * k))

    return ctx.accumulate(out, build, math.prod(w.shape[1:]))


def _conv_transpose(ctx, x: Value, w: Value, bias, stride, pad, out_pad, dilation, groups) -> Buffer:
    """Transposed convolution as TVM's topi does it: a dilate-and-pad nest
    ``P[j] = if_then_else(q>=0 & q%s==0 & q//s<H, X[q//s], 0)`` with ``q = j - (d*(K-1)-p)``,
    then a convolution of ``P`` with the flipped kernel, then the bias nest."""
    k = x.rank - 2
    ctx.require_float(x, w)
    out = ctx.result()
    C, Og = w.shape[0], w.shape[1]
    if x.shape[1] != C or C % groups:
        ctx.fail(f"channel mismatch: input {x.shape}, weight {w.shape}, groups {groups}", "weight")
    Cg = C // groups
    ksz = w.shape[2:]
    osz = out.shape[2:]
    lo = [dilation[j] * (ksz[j] - 1) - pad[j] for j in range(k)]
    pshape = x.shape[:2] + tuple(osz[j] + (ksz[j] - 1) * dilation[j] for j in range(k))
    p = ctx.temp(pshape, x.dtype)
    sp = ctx.em.space(pshape)
    cond = None
    src = list(sp.out[:2])
    for j in range(k):
        jj = sp.out[2 + j]
        q = sub(jj, A.Int(lo[j])) if lo[j] > 0 else (add(jj, A.Int(-lo[j])) if lo[j] < 0 else jj)
        parts = []
        if lo[j] > 0:
            parts.append(A.Compare(">=", jj, A.Int(lo[j])))
        if stride[j] > 1:
            parts.append(A.Compare("==", A.BinOp("%", q, A.Int(stride[j])), A.Int(0)))
        qi = q if stride[j] == 1 else A.BinOp("//", q, A.Int(stride[j]))
        parts.append(A.Compare("<", qi, A.Int(x.shape[2 + j])))
        for c in parts:
            cond = c if cond is None else A.BoolOp("and", cond, c)
        src.append(qi)
    ctx.em.emit(sp.loops, A.Assign(p.ref(sp.out), call("if_then_else", cond, x.read(src), ctx.lit(0))))
    sp = ctx.em.space(out.shape, [Cg] + list(ksz))
    n, o, *oy = sp.out
    c, *ks = sp.red
    if groups == 1:
        cin, oo = c, o
    else:
        grp = o if Og == 1 else A.BinOp("//", o, A.Int(Og))
        cin, oo = iadd(imul(grp, Cg), c), (A.Int(0) if Og == 1 else A.BinOp("%", o, A.Int(Og)))
    pos = [iadd(oy[j], imul(ks[j], dilation[j])) for j in range(k)]
    flipped = [sub(A.Int(ksz[j] - 1), ks[j]) if ksz[j] > 1 else ks[j] for j in range(k)]

    def build(t: Buffer):
        tgt = t.ref(sp.out)
        ctx.em.emit(sp.loops, A.Assign(tgt, add(tgt, mul(p.read((n, cin, *pos)), w.read((cin, oo, *flipped))))))
        if bias is not None:
            _bias_nest(ctx, t, reshape_view(bias, (bias.shape[0],) + (1,) * k))

    return ctx.accumulate(out, build, math.prod(w.shape[1:]))


@lowering("conv_transpose1d", "conv_transpose2d", "conv_transpose3d")
def lower_conv_transpose(ctx):
    """Transposed convolution ``[N,C,*S] x [C,O/g,*K]`` (stride, padding, output_padding,
    dilation, groups): dilate-and-pad nest, flipped-kernel convolution nest, bias nest."""
    x, w = ctx.tensor("input"), ctx.tensor("weight")
    k = x.rank - 2
    if k < 1 or w.rank != x.rank:
        ctx.fail(f"unsupported ranks input {x.shape}, weight {w.shape}", "input")
    return _conv_transpose(ctx, x, w, ctx.args.get("bias"), _ints(ctx, "stride", k, 1), _ints(ctx, "padding", k, 0),
                           _ints(ctx, "output_padding", k, 0), _ints(ctx, "dilation", k, 1),
                           ctx.args.get("groups", 1))


@lowering("conv1d", "conv2d", "conv3d", "convolution", "_convolution")
def lower_conv(ctx):
    """Convolution ``[N,C,*S] x [O,C/g,*K]``: an optional zero-pad nest, the reduction nest
    ``Y[n,o,h,..] = Y + P[n, g*Cg+c, h*s+kh*d, ..] * W[o,c,kh,..]``, then a bias nest.
    Stride, padding (ints, ``'valid'``, ``'same'``), dilation and groups are supported
    (``convolution(transposed=True)`` goes to the transposed lowering)."""
    x, w = ctx.tensor("input"), ctx.tensor("weight")
    k = x.rank - 2
    if k < 1 or w.rank != x.rank:
        ctx.fail(f"unsupported ranks input {x.shape}, weight {w.shape}", "input")
    if ctx.args.get("transposed"):
        return _conv_transpose(ctx, x, w, ctx.args.get("bias"), _ints(ctx, "stride", k, 1),
                               _ints(ctx, "padding", k, 0), _ints(ctx, "output_padding", k, 0),
                               _ints(ctx, "dilation", k, 1), ctx.args.get("groups", 1))
    stride = _ints(ctx, "stride", k, 1)
    dilation = _ints(ctx, "dilation", k, 1)
    pad = ctx.args.get("padding", 0)
    if isinstance(pad, str):
        if pad == "valid":
            lo = hi = [0] * k
        elif pad == "same":
            tot = [dilation[j] * (w.shape[2 + j] - 1) for j in range(k)]
            lo = [t // 2 for t in tot]
            hi = [t - t // 2 for t in tot]
        else:
            ctx.unsupported("padding")
    else:
        lo = hi = _ints(ctx, "padding", k, 0)
    bias = ctx.args.get("bias")
    return _conv(ctx, x, w, bias, stride, lo, hi, dilation, ctx.args.get("groups", 1))


def _pool_geometry(ctx, x: Value, k: int):
    kernel = _ints(ctx, "kernel_size", k)
    stride = _ints(ctx, "stride", k, kernel)
    pad = _ints(ctx, "padding", k, 0)
    dil = _ints(ctx, "dilation", k, 1) if "dilation" in ctx.args else [1] * k
    osp = ctx.out_shape[-k:]
    hi = [max(0, (osp[j] - 1) * stride[j] + (kernel[j] - 1) * dil[j] + 1 - x.shape[x.rank - k + j] - pad[j])
          for j in range(k)]
    return kernel, stride, pad, hi, dil


def _window_index(sp_out, ks, stride, dil, k):
    off = len(sp_out) - k
    return [iadd(imul(sp_out[off + j], stride[j]), imul(ks[j], dil[j])) for j in range(k)]


def _pool_dims(ctx) -> int:
    return int(ctx.op.rstrip("d")[-1])


@lowering("max_pool1d", "max_pool2d", "max_pool3d")
def lower_max_pool(ctx):
    """Max pooling (kernel, stride, padding, dilation, ceil_mode): a -inf pad nest when
    needed, then ``Y = max(Y, P[.., h*s+kh*d, ..])`` over the window."""
    x = ctx.tensor("self")
    k = _pool_dims(ctx)
    kernel, stride, pad, hi, dil = _pool_geometry(ctx, x, k)
    xp = _pad(ctx, x, pad, hi, -math.inf)
    out = ctx.result()
    lead = x.rank - k
    sp = ctx.em.space(out.shape, kernel)
    idx = list(sp.out[:lead]) + _window_index(sp.out, sp.red, stride, dil, k)
    tgt = out.ref(sp.out)
    ctx.em.emit(sp.loops, A.Assign(tgt, call("max", tgt, xp.read(idx))))
    return out


@lowering("avg_pool1d", "avg_pool2d", "avg_pool3d")
def lower_avg_pool(ctx):
    """Average pooling with a constant divisor (``count_include_pad=True`` and windows inside
    the padded input, or ``divisor_override``): zero-pad nest, window-sum nest, divide."""
    x = ctx.tensor("self")
    ctx.require_float(x)
    k = _pool_dims(ctx)
    kernel, stride, pad, hi, dil = _pool_geometry(ctx, x, k)
    div_override = ctx.args.get("divisor_override")
    if div_override is None:
        if any(h > p for h, p in zip(hi, pad)):
            ctx.fail("ceil_mode windows past the padded input need a variable divisor", "ceil_mode")
        if not ctx.args.get("count_include_pad", True) and any(pad):
            ctx.fail("count_include_pad=False with padding needs a variable divisor", "count_include_pad")
    xp = _pad(ctx, x, pad, hi, 0)
    lead = x.rank - k
    s = ctx.acc_temp(ctx.out_shape)
    sp = ctx.em.space(s.shape, kernel)
    idx = list(sp.out[:lead]) + _window_index(sp.out, sp.red, stride, [1] * k, k)
    tgt = s.ref(sp.out)
    ctx.em.emit(sp.loops, A.Assign(tgt, add(tgt, xp.read(idx))))
    d = div_override or math.prod(kernel)
    return ctx.map(lambda v: div(v, ctx.lit(d)), s)


@lowering("adaptive_avg_pool1d", "adaptive_avg_pool2d", "adaptive_avg_pool3d")
def lower_adaptive_avg_pool(ctx):
    """Adaptive average pooling when each output size divides the input size (uniform windows)."""
    x = ctx.tensor("self")
    ctx.require_float(x)
    k = _pool_dims(ctx)
    osz = ctx.out_shape[-k:]
    isz = x.shape[-k:]
    if any(i % o for i, o in zip(isz, osz)):
        ctx.fail(f"output size {list(osz)} does not divide the input size {list(isz)}", "output_size")
    kernel = [i // o for i, o in zip(isz, osz)]
    lead = x.rank - k
    s = ctx.acc_temp(ctx.out_shape)
    sp = ctx.em.space(s.shape, kernel)
    idx = list(sp.out[:lead]) + _window_index(sp.out, sp.red, kernel, [1] * k, k)
    tgt = s.ref(sp.out)
    ctx.em.emit(sp.loops, A.Assign(tgt, add(tgt, x.read(idx))))
    return ctx.map(lambda v: div(v, ctx.lit(math.prod(kernel))), s)


# ---------------------------------------------------------------------------
# einsum, attention, losses
# ---------------------------------------------------------------------------


@lowering("einsum")
def lower_einsum(ctx):
    """``einsum(equation, tensors)`` (explicit or implicit output, no ellipsis, no repeated
    index within one operand): one nest, output indices then summed indices, product of reads."""
    eq = ctx.args["equation"].replace(" ", "")
    ops = ctx.args["tensors"]
    if "..." in eq:
        ctx.unsupported("equation")
    if "->" in eq:
        lhs, rhs = eq.split("->")
    else:
        lhs = eq
        letters = lhs.replace(",", "")
        rhs = "".join(sorted(c for c in set(letters) if letters.count(c) == 1))
    terms = lhs.split(",")
    if len(terms) != len(ops) or any(len(set(t)) != len(t) for t in terms):
        ctx.unsupported("equation")
    sizes: dict[str, int] = {}
    for t, v in zip(terms, ops):
        if not isinstance(v, Value) or v.rank != len(t) or v.dtype != ctx.out_dtype:
            ctx.fail("operand rank/dtype does not match the equation", "tensors")
        for c, n in zip(t, v.shape):
            if sizes.get(c, n) != n and 1 not in (n, sizes.get(c)):
                ctx.fail(f"size mismatch for index {c}", "tensors")
            sizes[c] = max(sizes.get(c, n), n)
    summed = [c for c in dict.fromkeys(lhs.replace(",", "")) if c not in rhs]
    out = ctx.result()
    sp = ctx.em.space([sizes[c] for c in rhs], [sizes[c] for c in summed])
    env = dict(zip(rhs, sp.out)) | dict(zip(summed, sp.red))
    prod = None
    for t, v in zip(terms, ops):
        r = v.read(tuple(A.Int(0) if n == 1 else env[c] for c, n in zip(t, v.shape)))
        prod = r if prod is None else mul(prod, r)
    if not summed:
        ctx.em.emit(sp.loops, A.Assign(out.ref(sp.out), prod))
        return out

    def build(t: Buffer):
        tgt = t.ref(sp.out)
        ctx.em.emit(sp.loops, A.Assign(tgt, add(tgt, prod)))

    return ctx.accumulate(out, build, math.prod(sizes[c] for c in summed))


@lowering("scaled_dot_product_attention")
def lower_sdpa(ctx):
    """``softmax(Q K^T * scale [+ mask | causal]) V``: score nest, scale/mask nest, the three
    softmax nests, output nest. ``dropout_p`` must be 0."""
    q, kk, v = ctx.tensor("query"), ctx.tensor("key"), ctx.tensor("value")
    ctx.require_float(q, kk, v)
    if ctx.args.get("dropout_p", 0):
        ctx.unsupported("dropout_p")
    if ctx.args.get("enable_gqa") and q.shape[-3] != kk.shape[-3]:
        ctx.unsupported("enable_gqa")
    scale = ctx.args.get("scale")
    if scale is None:
        scale = 1.0 / math.sqrt(q.shape[-1])
    L, S = q.shape[-2], kk.shape[-2]
    batch = tuple(max(a, b) for a, b in zip(q.shape[:-2], kk.shape[:-2]))
    scores = ctx.acc_temp(batch + (L, S))
    _matmul_nest(ctx, q, permute_view(kk, list(range(kk.rank - 2)) + [kk.rank - 1, kk.rank - 2]), scores)
    mask = ctx.args.get("attn_mask")
    causal = ctx.args.get("is_causal", False)
    z = ctx.acc_temp(scores.shape, q.dtype)
    sp = ctx.em.space(z.shape)
    e = mul(scores.read(sp.out), ctx.lit(scale))
    if isinstance(mask, Value):
        mv = bread(mask, sp.out, z.shape)
        e = call("if_then_else", mv, e, ctx.lit(-math.inf)) if mask.dtype == "bool" else add(e, mv)
    if causal:
        e = call("if_then_else", A.Compare("<=", sp.out[-1], sp.out[-2]), e, ctx.lit(-math.inf))
    ctx.em.emit(sp.loops, A.Assign(z.ref(sp.out), e))
    dim = z.rank - 1
    m, s = _softmax_parts(ctx, z, dim)
    p = ctx.acc_temp(z.shape, q.dtype)
    sp = ctx.em.space(p.shape)
    ri = _drop(sp.out, dim)
    ctx.em.emit(sp.loops, A.Assign(p.ref(sp.out), div(call("exp", sub(z.read(sp.out), m.read(ri))), s.read(ri))))
    return ctx.accumulate(ctx.result(), lambda t: _matmul_nest(ctx, p, v, t), S)


def _loss_reduce(ctx, elem: Buffer | Value, reduction: int):
    """Apply a loss ``reduction`` (0 none, 1 mean, 2 sum) to the elementwise loss ``elem``."""
    if reduction == 0:
        return elem
    dims = list(range(elem.rank))
    if reduction == 2:
        return ctx.accumulate(ctx.result(), lambda t: ctx.em.reduce(t, "sum", elem, dims, False),
                              math.prod(elem.shape))
    s = ctx.em.reduce(ctx.acc_temp((), elem.dtype, math.prod(elem.shape)), "sum", elem, dims, False)
    n = math.prod(elem.shape)
    return ctx.map(lambda v: div(v, ctx.lit(n)), s)


def _elementwise_loss(ctx, fn, a_name="self", b_name="target"):
    a, b = ctx.operand(a_name), ctx.operand(b_name)
    red = ctx.args.get("reduction", 1)
    shape = tuple(max(x, y) for x, y in zip((1,) * (len(b.shape) - len(a.shape)) + a.shape,
                                           (1,) * (len(a.shape) - len(b.shape)) + b.shape))
    e = ctx.temp(shape) if red else ctx.result()
    ctx.em.map(e, fn, a, b)
    return _loss_reduce(ctx, e, red)


@lowering("mse_loss")
def lower_mse_loss(ctx):
    """``mse_loss``: elementwise ``(a-b)*(a-b)``, then mean/sum."""
    return _elementwise_loss(ctx, lambda a, b: mul(sub(a, b), sub(a, b)))


@lowering("l1_loss")
def lower_l1_loss(ctx):
    """``l1_loss``: ``abs(a-b)``, then mean/sum."""
    return _elementwise_loss(ctx, lambda a, b: call("abs", sub(a, b)))


@lowering("smooth_l1_loss", "huber_loss")
def lower_huber(ctx):
    """Smooth-L1 (``beta``) / Huber (``delta``): quadratic below the threshold, linear above."""
    if ctx.op == "smooth_l1_loss":
        beta = ctx.number("beta")
        if beta == 0:
            return _elementwise_loss(ctx, lambda a, b: call("abs", sub(a, b)))
        f = lambda a, b: call("if_then_else", A.Compare("<", call("abs", sub(a, b)), ctx.lit(beta)),
                              div(mul(mul(ctx.lit(0.5), sub(a, b)), sub(a, b)), ctx.lit(beta)),
                              sub(call("abs", sub(a, b)), ctx.lit(0.5 * beta)))
    else:
        d = ctx.number("delta")
        f = lambda a, b: call("if_then_else", A.Compare("<", call("abs", sub(a, b)), ctx.lit(d)),
                              mul(mul(ctx.lit(0.5), sub(a, b)), sub(a, b)),
                              mul(ctx.lit(d), sub(call("abs", sub(a, b)), ctx.lit(0.5 * d))))
    return _elementwise_loss(ctx, f)


@lowering("hinge_embedding_loss")
def lower_hinge(ctx):
    """Hinge embedding loss: ``x`` where target is 1, ``max(0, margin-x)`` where it is -1
    (``target`` of ±1 values): ``if_then_else(t==1, x, 0) + if_then_else(t==-1, max(0,m-x), 0)``."""
    m = ctx.number("margin")
    f = lambda x, t: add(call("if_then_else", A.Compare("==", t, ctx.lit(1)), x, ctx.lit(0)),
                         call("if_then_else", A.Compare("==", t, ctx.lit(-1)),
                              call("max", ctx.lit(0), sub(ctx.lit(m), x)), ctx.lit(0)))
    return _elementwise_loss(ctx, f)


@lowering("kl_div")
def lower_kl_div(ctx):
    """``kl_div(input, target)`` with log-space input: ``t*(log(t)-x)`` (``log_target``:
    ``exp(t)*(t-x)``), then the reduction (``batchmean`` arrives as sum and a division)."""
    if ctx.args.get("log_target"):
        f = lambda x, t: mul(call("exp", t), sub(t, x))
    else:
        f = lambda x, t: mul(t, sub(call("log", t), x))
    return _elementwise_loss(ctx, f)


@lowering("cosine_similarity")
def lower_cosine_similarity(ctx):
    """``sum(a*b) / sqrt(max(sum(a*a)*sum(b*b), eps*eps))`` over ``dim`` (PyTorch's formula)."""
    a, b = ctx.operand("x1"), ctx.operand("x2")
    ctx.require_float(a, b)
    shape = tuple(max(x, y) for x, y in zip(a.shape, b.shape)) if a.rank == b.rank else None
    if shape is None:
        ctx.fail("operands must have the same rank", "x2")
    a, b = expand_view(a, shape), expand_view(b, shape)
    dim = ctx.dim(ctx.args.get("dim", 1), len(shape))
    eps = ctx.number("eps")
    red = tuple(n for d, n in enumerate(shape) if d != dim)
    def product(u: Value, v: Value) -> Value:
        return Lazy(shape, u.dtype, lambda idx: mul(u.read(idx), v.read(idx)))

    ab = ctx.em.reduce(ctx.acc_temp(red), "sum", product(a, b), [dim], False)
    aa = ctx.em.reduce(ctx.acc_temp(red), "sum", product(a, a), [dim], False)
    bb = ctx.em.reduce(ctx.acc_temp(red), "sum", product(b, b), [dim], False)
    return ctx.map(lambda p, x, y: div(p, call("sqrt", call("max", mul(x, y), ctx.lit(eps * eps)))), ab, aa, bb)


# ---------------------------------------------------------------------------
# Long tail: more activations, pointwise ops, products, padding, gathers, losses
# ---------------------------------------------------------------------------

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


@lowering("fill")
def lower_fill(ctx):
    """``fill(self, value)``: a constant of ``self``'s shape."""
    v = ctx.args.get("value")
    if isinstance(v, Value):
        return expand_view(v, ctx.out_shape)
    return Fill(ctx.number("value"), ctx.out_dtype, ctx.out_shape)


@lowering("narrow")
def lower_narrow(ctx):
    """``narrow(self, dim, start, length)``: a slice view."""
    x = ctx.tensor("self")
    dim = ctx.dim(ctx.args["dim"], x.rank)
    start = ctx.args["start"]
    if not isinstance(start, int):
        ctx.unsupported("start")
    return slice_view(x, dim, start % x.shape[dim] if start < 0 else start, ctx.args["length"], 1)


@lowering("diagonal")
def lower_diagonal(ctx):
    """``diagonal(self, offset, dim1, dim2)``: a view (diagonal appended as the last dim)."""
    x = ctx.tensor("self")
    d1, d2 = ctx.dim(ctx.args.get("dim1", 0), x.rank, "dim1"), ctx.dim(ctx.args.get("dim2", 1), x.rank, "dim2")
    off = ctx.args.get("offset", 0)
    keep = [d for d in range(x.rank) if d not in (d1, d2)]

    def remap(idx):
        out = [None] * x.rank
        for j, d in enumerate(keep):
            out[d] = idx[j]
        i = idx[-1]
        out[d1], out[d2] = (i, iadd(i, A.Int(off))) if off >= 0 else (iadd(i, A.Int(-off)), i)
        return tuple(out)

    return View(x, ctx.out_shape, remap, "diagonal")


@lowering("diag")
def lower_diag(ctx):
    """``diag``: a 1-D input becomes a diagonal matrix (``if_then_else(j-i==k, x, 0)``), a
    2-D input yields its diagonal (a view)."""
    x = ctx.tensor("self")
    k = ctx.args.get("diagonal", 0)
    if x.rank == 2:
        return View(x, ctx.out_shape, lambda idx: (idx[0], iadd(idx[0], A.Int(k))) if k >= 0 else
                    (iadd(idx[0], A.Int(-k)), idx[0]), "diag")
    if x.rank != 1:
        ctx.fail("diag needs a 1-D or 2-D tensor", "self")
    out = ctx.result()
    sp = ctx.em.space(out.shape)
    i, j = sp.out
    cond = A.Compare("==", j, iadd(i, A.Int(k)))
    src = i if k >= 0 else j
    ctx.em.emit(sp.loops, A.Assign(out.ref(sp.out), call("if_then_else", cond, x.read((src,)), ctx.lit(0))))
    return out


@lowering("constant_pad_nd", "pad")
def lower_constant_pad(ctx):
    """Constant padding (``F.pad(x, pad, value=v)``): one ``if_then_else`` nest; negative
    pads crop. Other modes are rejected."""
    x = ctx.tensor("self")
    if ctx.op == "pad" and ctx.args.get("mode", "constant") != "constant":
        ctx.unsupported("mode")
    pad = list(ctx.args["pad"])
    value = ctx.args.get("value") or 0
    k = len(pad) // 2
    lo = [pad[2 * (k - 1 - j)] for j in range(k)]
    hi = [pad[2 * (k - 1 - j) + 1] for j in range(k)]
    out = ctx.result()
    sp = ctx.em.space(out.shape)
    idx = list(sp.out)
    src = idx[:x.rank - k]
    cond = None
    for j in range(k):
        d = x.rank - k + j
        i = idx[d]
        src.append(iadd(i, A.Int(-lo[j])))
        parts = []
        if lo[j] > 0:
            parts.append(A.Compare("<=", A.Int(lo[j]), i))
        if hi[j] > 0:
            parts.append(A.Compare("<", i, A.Int(x.shape[d] + lo[j])))
        for c in parts:
            cond = c if cond is None else A.BoolOp("and", cond, c)
    v = x.read(src)
    ctx.em.emit(sp.loops, A.Assign(out.ref(sp.out), v if cond is None else
                                   call("if_then_else", cond, v, ctx.lit(value))))
    return out


def _index_operand(ctx, name: str) -> Value:
    v = ctx.tensor(name)
    if v.dtype not in ("i64", "i32", "i16", "i8", "u8"):
        ctx.fail(f"expected an integer index tensor, got {v.dtype}", name)
    return v


@lowering("index_select")
def lower_index_select(ctx):
    """``index_select(self, dim, index)``: indirect subscript ``X[.., I[j], ..]``."""
    x, ind = ctx.tensor("self"), _index_operand(ctx, "index")
    dim = ctx.dim(ctx.args["dim"], x.rank)

    def remap(idx):
        return tuple(idx[:dim]) + (ind.read((idx[dim],) if ind.rank else ()),) + tuple(idx[dim + 1:])

    return ctx.map(lambda v: v, View(x, ctx.out_shape, remap, "index_select"))


@lowering("embedding")
def lower_embedding(ctx):
    """``embedding(weight, indices)``: ``O[.., d] = W[I[..], d]`` (indirect subscript)."""
    w, ind = ctx.tensor("weight"), _index_operand(ctx, "indices")
    n = ind.rank
    return ctx.map(lambda v: v, View(w, ctx.out_shape, lambda idx: (ind.read(idx[:n]),) + tuple(idx[n:]),
                                     "embedding"))


@lowering("gather")
def lower_gather(ctx):
    """``gather(self, dim, index)``: ``O[i..] = X[.., I[i..], ..]`` at ``dim``."""
    x, ind = ctx.tensor("self"), _index_operand(ctx, "index")
    dim = ctx.dim(ctx.args["dim"], x.rank)
    return ctx.map(lambda v: v, View(x, ctx.out_shape, lambda idx: tuple(idx[:dim]) + (ind.read(idx),) +
                                     tuple(idx[dim + 1:]), "gather"))


@lowering("mv", "dot", "vdot", "inner")
def lower_mv(ctx):
    """``mv``/``dot``: the matmul reduction nest."""
    a = ctx.tensor("self")
    b = ctx.args.get("vec", ctx.args.get("tensor", ctx.args.get("other")))
    if not isinstance(b, Value):
        ctx.fail("expected a tensor", "vec")
    if ctx.op == "inner" and b.rank > 1:
        b = permute_view(b, list(range(b.rank - 2)) + [b.rank - 1, b.rank - 2])
    return ctx.accumulate(ctx.result(), lambda t: _matmul_nest(ctx, a, b, t), a.shape[-1])


@lowering("outer", "ger")
def lower_outer(ctx):
    """``outer(a, b)``: ``O[i,j] = a[i]*b[j]``."""
    a = ctx.tensor("self")
    b = ctx.args.get("vec2")
    return ctx.map(mul, reshape_view(a, (a.shape[0], 1)), b)


@lowering("baddbmm", "addmv", "addbmm")
def lower_baddbmm(ctx):
    """``beta*self + alpha*(A @ B)`` (``addbmm`` also sums over the batch)."""
    beta, alpha = ctx.args.get("beta", 1), ctx.args.get("alpha", 1)
    if ctx.op == "addmv":
        a, b = ctx.tensor("mat"), ctx.tensor("vec")
    else:
        a, b = ctx.tensor("batch1"), ctx.tensor("batch2")
    if ctx.op == "addbmm":  # sum_b A[b] @ B[b] == A' @ B' with the batch folded into k
        a = reshape_view(permute_view(a, [1, 0, 2]), (a.shape[1], a.shape[0] * a.shape[2]))
        b = reshape_view(b, (b.shape[0] * b.shape[1], b.shape[2]))

    def build(t):
        if alpha == 1:
            _matmul_nest(ctx, a, b, t)
        else:
            p = ctx.acc_temp(t.shape)
            _matmul_nest(ctx, a, b, p)
            ctx.em.map(t, lambda v: mul(ctx.lit(alpha), v), p)
            if beta != 0:
                _bias_nest(ctx, t, ctx.tensor("self"), beta)
            return
        if beta != 0:
            _bias_nest(ctx, t, ctx.tensor("self"), beta)

    return ctx.accumulate(ctx.result(), build)


@lowering("frobenius_norm")
def lower_frobenius(ctx):
    """``sqrt(sum x*x)`` over ``dim``."""
    x = ctx.tensor("self")
    dims = ctx.dims(ctx.args.get("dim"), x.rank)
    keep = bool(ctx.args.get("keepdim", False))
    s = ctx.em.reduce(ctx.acc_temp(_reduce_shape(x, dims, keep)), "sum", x, dims, keep, fn=lambda v, sp: mul(v, v))
    return ctx.map(lambda v: call("sqrt", v), s)


def _class_log_probs(ctx, logits: Value) -> Buffer:
    """Log-softmax over the class dim (1, or 0 for an unbatched input) into a fresh tensor."""
    dim = 1 if logits.rank >= 2 else 0
    m, s = _softmax_parts(ctx, logits, dim)
    lp = ctx.acc_temp(logits.shape, logits.dtype)
    sp = ctx.em.space(lp.shape)
    ri = _drop(sp.out, dim)
    ctx.em.emit(sp.loops, A.Assign(lp.ref(sp.out), sub(sub(logits.read(sp.out), m.read(ri)), call("log", s.read(ri)))))
    return lp


def _nll(ctx, logp: Value, target: Value, reduction: int, ignore: int, weight=None):
    """Negative log-likelihood of class-index ``target`` under ``logp`` ([N, C, *d])."""
    cdim = 1 if logp.rank >= 2 else 0
    tshape = target.shape
    per = ctx.acc_temp(tshape, logp.dtype) if reduction else ctx.result()
    sp = ctx.em.space(tshape)
    t = target.read(sp.out)
    src = list(sp.out)
    src.insert(cdim, t)
    term = A.Neg(logp.read(src))
    if weight is not None:
        term = mul(weight.read((t,)), term)
    valid = A.Compare("!=", t, A.int_literal(ignore))
    ctx.em.emit(sp.loops, A.Assign(per.ref(sp.out), call("if_then_else", valid, term, ctx.lit(0, per.dtype))))
    if reduction == 0:
        return per
    dims = list(range(len(tshape)))
    if reduction == 2:
        return ctx.accumulate(ctx.result(), lambda o: ctx.em.reduce(o, "sum", per, dims, False),
                              math.prod(tshape))
    tot = ctx.em.reduce(ctx.acc_temp((), logp.dtype, math.prod(tshape)), "sum", per, dims, False)
    cnt = ctx.em.reduce(ctx.acc_temp((), logp.dtype, math.prod(tshape)), "sum", Lazy(tshape, per.dtype, lambda idx: call(
        "if_then_else", A.Compare("!=", target.read(idx), A.int_literal(ignore)),
        weight.read((target.read(idx),)) if weight is not None else ctx.lit(1, per.dtype), ctx.lit(0, per.dtype))),
        dims, False)
    return ctx.map(div, tot, cnt)


@lowering("cross_entropy_loss")
def lower_cross_entropy(ctx):
    """Cross entropy: log-softmax nests over the class dim, then the NLL of integer targets
    (indirect subscript, ``ignore_index`` masked, mean over the non-ignored) or, for
    probability targets, ``-sum t*logp``. ``label_smoothing`` must be 0."""
    x = ctx.tensor("self")
    ctx.require_float(x)
    if ctx.args.get("label_smoothing", 0):
        ctx.unsupported("label_smoothing")
    t = ctx.tensor("target")
    w = ctx.args.get("weight")
    red = ctx.args.get("reduction", 1)
    lp = _class_log_probs(ctx, x)
    if t.dtype in FLOAT_CODES:
        if w is not None:
            ctx.unsupported("weight")
        cdim = 1 if x.rank >= 2 else 0
        per_shape = tuple(n for d, n in enumerate(x.shape) if d != cdim)
        per = ctx.acc_temp(per_shape, x.dtype) if red else ctx.result()
        ctx.em.reduce(per, "sum", lp, [cdim], False,
                      fn=lambda v, sp: A.Neg(mul(t.read(sp.full(x.rank, [cdim])), v)))
        if red == 0:
            return per
        if red == 2:
            return ctx.accumulate(ctx.result(), lambda o: ctx.em.reduce(o, "sum", per, list(range(per.rank)), False))
        n = math.prod(per_shape)
        s = ctx.em.reduce(ctx.acc_temp((), x.dtype), "sum", per, list(range(per.rank)), False)
        return ctx.map(lambda v: div(v, ctx.lit(n)), s)
    return _nll(ctx, lp, _index_operand(ctx, "target"), red, ctx.args.get("ignore_index", -100), w)


@lowering("nll_loss", "nll_loss_nd", "nll_loss2d")
def lower_nll_loss(ctx):
    """``nll_loss(logp, target)``: ``-logp[n, target[n]]`` (indirect subscript), masked by
    ``ignore_index``, optional class weights, mean over the (weighted) non-ignored targets."""
    x = ctx.tensor("self")
    w = ctx.args.get("weight")
    return _nll(ctx, x, _index_operand(ctx, "target"), ctx.args.get("reduction", 1),
                ctx.args.get("ignore_index", -100), w)


def _pairwise_distance(ctx, a: Value, b: Value, p: float, eps: float, keepdim: bool = False) -> Buffer:
    shape = tuple(max(x, y) for x, y in zip(a.shape, b.shape))
    a, b = expand_view(a, shape), expand_view(b, shape)
    diff = Lazy(shape, a.dtype, lambda idx: add(sub(a.read(idx), b.read(idx)), ctx.lit(eps, a.dtype)))
    dim = len(shape) - 1
    rs = _reduce_shape(diff, [dim], keepdim)
    if p == 2:
        s = ctx.em.reduce(ctx.acc_temp(rs, a.dtype), "sum", diff, [dim], keepdim, fn=lambda v, sp: mul(v, v))
        return ctx.em.map(ctx.temp(rs, a.dtype), lambda v: call("sqrt", v), s)
    if p == 1:
        return ctx.em.reduce(ctx.acc_temp(rs, a.dtype), "sum", diff, [dim], keepdim, fn=lambda v, sp: call("abs", v))
    s = ctx.em.reduce(ctx.acc_temp(rs, a.dtype), "sum", diff, [dim], keepdim,
                      fn=lambda v, sp: A.BinOp("**", call("abs", v), ctx.lit(p)))
    return ctx.em.map(ctx.temp(rs, a.dtype), lambda v: A.BinOp("**", v, ctx.lit(1.0 / p)), s)


@lowering("pairwise_distance")
def lower_pairwise_distance(ctx):
    """``||x1 - x2 + eps||_p`` over the last dim."""
    d = _pairwise_distance(ctx, ctx.tensor("x1"), ctx.tensor("x2"), ctx.number("p"), ctx.number("eps"),
                           bool(ctx.args.get("keepdim", False)))
    return ctx.map(lambda v: v, d)


@lowering("triplet_margin_loss")
def lower_triplet_margin_loss(ctx):
    """``max(d(a,p) - d(a,n) + margin, 0)`` with pairwise p-norm distances, then the reduction."""
    a, pos, neg = ctx.tensor("anchor"), ctx.tensor("positive"), ctx.tensor("negative")
    p, eps, margin = ctx.number("p"), ctx.number("eps"), ctx.number("margin")
    dp = _pairwise_distance(ctx, a, pos, p, eps)
    dn = _pairwise_distance(ctx, a, neg, p, eps)
    if ctx.args.get("swap"):
        ds = _pairwise_distance(ctx, pos, neg, p, eps)
        dn = ctx.em.map(ctx.temp(dn.shape, dn.dtype), lambda x, y: call("min", x, y), dn, ds)
    red = ctx.args.get("reduction", 1)
    e = ctx.temp(dp.shape) if red else ctx.result()
    ctx.em.map(e, lambda x, y: call("max", add(sub(x, y), ctx.lit(margin)), ctx.lit(0)), dp, dn)
    return _loss_reduce(ctx, e, red)


@lowering("binary_cross_entropy")
def lower_bce(ctx):
    """``-(t*max(log(x),-100) + (1-t)*max(log(1-x),-100))`` (PyTorch clamps the logs)."""
    if ctx.args.get("weight") is not None:
        ctx.unsupported("weight")
    f = lambda x, t: A.Neg(add(mul(t, call("max", call("log", x), ctx.lit(-100))),
                              mul(sub(ctx.lit(1), t), call("max", call("log", sub(ctx.lit(1), x)), ctx.lit(-100)))))
    return _elementwise_loss(ctx, f)


@lowering("binary_cross_entropy_with_logits")
def lower_bce_logits(ctx):
    """``(1-t)*x + log(1+exp(-x))`` in the stable form ``max(x,0) - x*t + log(1+exp(-|x|))``."""
    if ctx.args.get("weight") is not None or ctx.args.get("pos_weight") is not None:
        ctx.unsupported("weight")
    f = lambda x, t: add(sub(call("max", x, ctx.lit(0)), mul(x, t)),
                         call("log", add(ctx.lit(1), call("exp", A.Neg(call("abs", x))))))
    return _elementwise_loss(ctx, f)


@lowering("soft_margin_loss")
def lower_soft_margin(ctx):
    """``log(1 + exp(-t*x))``."""
    return _elementwise_loss(ctx, lambda x, t: call("log", add(ctx.lit(1), call("exp", A.Neg(mul(t, x))))))


__all__ = ["OpContext", "OPS", "lowering"]
