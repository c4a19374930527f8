"""Reductions and normalisation: sum/prod/mean/amax/argmax/logsumexp, softmax and log-softmax,
var/std/vector norms, layer/RMS/batch/instance/group norm."""

from __future__ import annotations

import math
from typing import Sequence

from ...leir import ast as A
from ..ir import Buffer, Emitter, Value, View, add, bread, call, div, mul, reshape_view, sub
from .context import lowering, OpContext, STATS_REDUCTION


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
        from ..ir import LEIR_TO_TORCH
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


@lowering("frobenius_norm")
def lower_frobenius(ctx):
    """``sqrt(sum x*x)`` over ``dim``."""
    x = ctx.tensor("self")
    dims = ctx.dims(ctx.args.get("dim"), x.rank)
    keep = bool(ctx.args.get("keepdim", False))
    s = ctx.em.reduce(ctx.acc_temp(_reduce_shape(x, dims, keep)), "sum", x, dims, keep, fn=lambda v, sp: mul(v, v))
    return ctx.map(lambda v: call("sqrt", v), s)
