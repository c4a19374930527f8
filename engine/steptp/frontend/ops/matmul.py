"""Matrix products and attention: matmul/mm/bmm/linear/addmm, mv/dot/outer/baddbmm, einsum and
scaled dot-product attention."""

from __future__ import annotations

import math

from ...leir import ast as A
from ..ir import Buffer, Value, add, bread, call, div, mul, permute_view, reshape_view, sub
from .context import lowering, OpContext
from .reductions import _drop, _softmax_parts


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
