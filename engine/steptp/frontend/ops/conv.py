"""Convolution (1-3-D, grouped, dilated, transposed) and pooling (max, average, adaptive
average)."""

from __future__ import annotations

import math

from ...leir import ast as A
from ..ir import Buffer, Value, add, call, div, iadd, imul, mul, reshape_view, sub
from .context import lowering
from .matmul import _bias_nest


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
