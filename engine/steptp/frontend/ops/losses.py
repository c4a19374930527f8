"""Loss functions: MSE, L1, Huber, hinge, KL divergence, cosine similarity, cross entropy, NLL,
pairwise distance and triplet margin, binary cross entropy."""

from __future__ import annotations

import math

from ...leir import ast as A
from ..ir import FLOAT_CODES, Buffer, Lazy, Value, add, call, div, expand_view, mul, sub
from .context import lowering
from .reductions import _drop, _reduce_shape, _softmax_parts
from .shape import _index_operand


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
