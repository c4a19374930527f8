"""Component templates, part 3: the program heads that create their own inputs: matmul variants
(the :data:`_MATMULS` table), attention (SDPA, multi-head, grouped-query, cross),
transformer and MLP blocks."""

from __future__ import annotations

import math

from .builder import _Builder, MAX_DIM, _num, _numel, RANDN, _Var
from .components import _reg


# ---- matmul heads -------------------------------------------------------------------

def _mm(b: _Builder, x: None, *, variant: str) -> _Var:
    v = variant
    if v == "square":
        N = b.dim("N", 2, MAX_DIM)
        A, B = b.input("A", (N, N)), b.input("B", (N, N))
        b.cost(2 * N ** 3)
        return b.assign("torch.matmul(A, B)", (N, N))
    if v in ("standard", "largek", "smallk", "irregular", "tallskinny", "transA", "transB", "transAB",
             "upper", "lower", "symmetric", "matvec", "softmax", "scale_softmax"):
        if v == "largek":
            M, K, N = b.dim("M", 1, 256), b.dim("K", 512, 131072), b.dim("N", 1, 256)
        elif v == "smallk":
            M, K, N = b.dim("M", 16, MAX_DIM), b.dim("K", 1, 32), b.dim("N", 16, MAX_DIM)
        elif v == "tallskinny":
            M, K, N = b.dim("M", 256, 65536), b.dim("K", 1, 64), b.dim("N", 1, 64)
        elif v == "matvec":
            M, K, N = b.dim("M", 2, MAX_DIM), b.dim("K", 2, 131072), 1
        elif v in ("upper", "lower", "symmetric"):
            M = K = N = b.dim("N", 2, MAX_DIM)
        else:
            M, K, N = b.dim("M", 1, MAX_DIM), b.dim("K", 1, MAX_DIM), b.dim("N", 1, MAX_DIM)
        if v == "irregular":
            M, K, N = M | 1, K | 1, N | 1
        sa = (K, M) if v in ("transA", "transAB") else (M, K)
        sb = (N, K) if v in ("transB", "transAB") else (K, N)
        if v == "upper":
            gen = "torch.triu(torch.randn({shape}, dtype=DTYPE))"
        elif v == "lower":
            gen = "torch.tril(torch.randn({shape}, dtype=DTYPE))"
        elif v == "symmetric":
            gen = "torch.randn({shape}, dtype=DTYPE).triu() + torch.randn({shape}, dtype=DTYPE).triu(1).T"
        else:
            gen = RANDN
        b.input("A", sa, gen)
        b.input("B", sb, gen)
        a = "A.T" if v in ("transA", "transAB") else "A"
        bb = "B.T" if v in ("transB", "transAB") else "B"
        b.cost(2 * M * N * K)
        if v == "upper":
            return b.assign(f"torch.triu(torch.matmul({a}, {bb}))", (M, N))
        if v == "lower":
            return b.assign(f"torch.tril(torch.matmul({a}, {bb}))", (M, N))
        if v == "softmax":
            b.cost(5 * M * N)
            b.fwd("x = torch.matmul(A, B)")
            return b.assign("torch.softmax(x, dim=-1)", (M, N))
        if v == "scale_softmax":
            b.cost(6 * M * N)
            sc = round(1 / math.sqrt(K), 6)
            b.fwd(f"x = torch.matmul(A, B) * {_num(sc)}")
            return b.assign("torch.softmax(x, dim=-1)", (M, N))
        return b.assign(f"torch.matmul({a}, {bb})", (M, N))
    if v in ("batched", "einsum_bmm", "batched4d", "bmm_head"):
        Bt, M, K, N = b.dim("batch", 1, 128), b.dim("M", 1, 4096), b.dim("K", 1, 4096), b.dim("N", 1, 4096)
        lead = (Bt, b.dim("heads", 1, 32)) if v == "batched4d" else (Bt,)
        b.input("A", lead + (M, K))
        b.input("B", lead + (K, N))
        b.cost(2 * _numel(lead) * M * N * K)
        expr = {"batched": "torch.bmm(A, B)", "bmm_head": "torch.bmm(A, B)",
                "einsum_bmm": "torch.einsum('bik,bkj->bij', A, B)", "batched4d": "torch.matmul(A, B)"}[v]
        return b.assign(expr, lead + (M, N))
    if v == "3d":
        Nb, M, K, L = b.dim("N", 1, 128), b.dim("M", 1, 4096), b.dim("K", 1, 4096), b.dim("L", 1, 4096)
        b.input("A", (Nb, M, K))
        b.input("B", (K, L))
        b.cost(2 * Nb * M * K * L)
        return b.assign("torch.matmul(A, B)", (Nb, M, L))
    if v == "4d":
        Bt, I, J, L, K = (b.dim("b", 1, 16), b.dim("i", 1, 256), b.dim("j", 1, 512), b.dim("l", 1, 1024),
                          b.dim("k", 1, 1024))
        b.input("A", (Bt, I, J, L))
        b.input("B", (L, K))
        b.cost(2 * Bt * I * J * L * K)
        return b.assign("torch.einsum('bijl,lk->bijk', A, B)", (Bt, I, J, K))
    if v in ("diag", "diag_scale"):
        N, M = b.dim("N", 2, MAX_DIM), b.dim("M", 1, MAX_DIM)
        b.input("A", (N,))
        b.input("B", (N, M))
        if v == "diag":
            b.cost(2 * N * N * M + N * N)
            return b.assign("torch.matmul(torch.diag(A), B)", (N, M))
        b.cost(N * M)
        return b.assign("A.unsqueeze(1) * B", (N, M))
    if v == "outer":
        M, N = b.dim("M", 1, MAX_DIM), b.dim("N", 1, MAX_DIM)
        b.input("A", (M,))
        b.input("B", (N,))
        b.cost(M * N)
        return b.assign("A.unsqueeze(1) * B.unsqueeze(0)", (M, N))
    raise AssertionError(v)


_MATMULS = {
    "MatmulSquare": "square", "Matmul2D": "standard", "MatmulBatched": "batched", "MatVec": "matvec",
    "MatmulLargeK": "largek", "MatmulSmallK": "smallk", "MatmulIrregular": "irregular",
    "MatmulTallSkinny": "tallskinny", "Matmul3DTensor": "3d", "Matmul4DTensor": "4d",
    "MatmulDiag": "diag", "DiagScale": "diag_scale", "MatmulSymmetric": "symmetric",
    "MatmulUpperTriangular": "upper", "MatmulLowerTriangular": "lower", "MatmulTransposedA": "transA",
    "MatmulTransposedB": "transB", "MatmulTransposedBoth": "transAB", "EinsumBatched": "einsum_bmm",
    "MatmulBatched4D": "batched4d", "OuterProduct": "outer",
}
for _n, _v in _MATMULS.items():
    _reg(_n, _mm, kind="head", family="matmul", variant=_v)
_reg("BMM", _mm, kind="head", family="matmul", variant="bmm_head")
_reg("MatmulSoftmaxHead", _mm, kind="head", family="block", variant="softmax")
_reg("MatmulScaleSoftmaxHead", _mm, kind="head", family="block", variant="scale_softmax")


# ---- attention heads ----------------------------------------------------------------

def _attn_core(b: _Builder, q: str, k: str, v: str, lead: tuple, S: int, T: int, D: int, *,
               sdpa: bool, causal: bool, out: str = "x") -> None:
    """Emit ``out = attention(q, k, v)``; q is lead+(S, D), k and v lead+(T, D)."""
    nlead = _numel(lead)
    b.cost(4 * nlead * S * T * D + 6 * nlead * S * T)
    if sdpa:
        arg = ", is_causal=True" if causal else ""
        b.fwd(f"{out} = F.scaled_dot_product_attention({q}, {k}, {v}{arg})")
        return
    # the materialised scores: written by the matmul, read and written by the scale, the mask
    # and the softmax, read by the second matmul (the GPU sizing's traffic and size cap)
    b.temp(nlead * S * T, passes=8 if causal else 6)
    sc = round(1 / math.sqrt(D), 6)
    b.fwd(f"scores = torch.matmul({q}, {k}.transpose(-2, -1)) * {_num(sc)}")
    if causal:
        mask = b.attr("causal_mask")
        b.init(f"self.register_buffer('{mask}', torch.triu(torch.ones({S}, {T}, dtype=torch.bool), diagonal=1))")
        b.fwd(f"scores = scores.masked_fill(self.{mask}, -10000.0)")
    b.fwd("attn = torch.softmax(scores, dim=-1)")
    b.fwd(f"{out} = torch.matmul(attn, {v})")


def _attention(b: _Builder, x: None, *, sdpa: bool = False, causal: bool = False) -> _Var:
    Bt, H = b.dim("batch", 1, 16), b.dim("heads", 1, 32)
    S, D = b.dim("seq", 2, 4096), b.dim("head_dim", 4, 128)
    T = S if causal else (S if b.chance("self", 0.6) else b.dim("kv_seq", 2, 4096))
    b.input("Q", (Bt, H, S, D))
    b.input("K", (Bt, H, T, D))
    b.input("V", (Bt, H, T, D))
    _attn_core(b, "Q", "K", "V", (Bt, H), S, T, D, sdpa=sdpa, causal=causal)
    return _Var("x", (Bt, H, S, D))


def _mha_body(b: _Builder, src: str, ctx: str, Bt: int, S: int, T: int, H: int, Hkv: int, D: int,
              *, sdpa: bool, causal: bool, out: str = "x") -> str:
    """Projections + attention + output projection; returns the output expression's var."""
    E, KV, rep = H * D, Hkv * D, H // Hkv
    qp = b.module("q_proj", f"nn.Linear({E}, {E})")
    kp = b.module("k_proj", f"nn.Linear({E}, {KV})")
    vp = b.module("v_proj", f"nn.Linear({E}, {KV})")
    op = b.module("out_proj", f"nn.Linear({E}, {E})")
    b.cost(2 * Bt * S * E * E * 2 + 2 * Bt * T * E * KV * 2)
    b.fwd(f"q = {qp}({src}).view({Bt}, {S}, {H}, {D}).transpose(1, 2)")
    b.fwd(f"k = {kp}({ctx}).view({Bt}, {T}, {Hkv}, {D}).transpose(1, 2)")
    b.fwd(f"v = {vp}({ctx}).view({Bt}, {T}, {Hkv}, {D}).transpose(1, 2)")
    if rep > 1:
        b.fwd(f"k = k.unsqueeze(2).expand({Bt}, {Hkv}, {rep}, {T}, {D}).reshape({Bt}, {H}, {T}, {D})")
        b.fwd(f"v = v.unsqueeze(2).expand({Bt}, {Hkv}, {rep}, {T}, {D}).reshape({Bt}, {H}, {T}, {D})")
        b.cost(2 * Bt * H * T * D)
    _attn_core(b, "q", "k", "v", (Bt, H), S, T, D, sdpa=sdpa, causal=causal, out=out)
    b.fwd(f"{out} = {out}.transpose(1, 2).reshape({Bt}, {S}, {E})")
    return f"{op}({out})"


def _mha(b: _Builder, x: None, *, kv: str = "mha", sdpa: bool = False, causal: bool = False,
         cross: bool = False) -> _Var:
    Bt, S, D = b.dim("batch", 1, 16), b.dim("seq", 2, 2048), b.dim("head_dim", 4, 128)
    if kv == "gqa":
        Hkv, rep = b.dim("kv_heads", 2, 8), b.dim("group", 2, 8)
        H = Hkv * rep
    elif kv == "mqa":
        H, Hkv = b.dim("heads", 2, 32), 1
    else:
        H = b.dim("heads", 1, 32)
        Hkv = H
    E = H * D
    T = b.dim("ctx_seq", 2, 2048) if cross else S
    b.input("x", (Bt, S, E))
    ctx = "x"
    if cross:
        b.input("context", (Bt, T, E))
        ctx = "context"
    out = _mha_body(b, "x", ctx, Bt, S, T, H, Hkv, D, sdpa=sdpa, causal=causal)
    return b.assign(out, (Bt, S, E))


def _transformer_block(b: _Builder, x: None) -> _Var:
    Bt, S, D, H = b.dim("batch", 1, 16), b.dim("seq", 2, 2048), b.dim("head_dim", 4, 128), b.dim("heads", 1, 16)
    E = H * D
    Fh = E * b.pick("mlp_ratio", [2, 4])
    b.input("x", (Bt, S, E))
    ln1 = b.module("ln1", f"nn.LayerNorm({E})")
    ln2 = b.module("ln2", f"nn.LayerNorm({E})")
    fc1 = b.module("fc1", f"nn.Linear({E}, {Fh})")
    fc2 = b.module("fc2", f"nn.Linear({Fh}, {E})")
    b.fwd(f"h = {ln1}(x)")
    causal = b.chance("causal", 0.5)
    out = _mha_body(b, "h", "h", Bt, S, S, H, H, D, sdpa=False, causal=causal, out="a")
    b.fwd(f"x = x + {out}")
    b.fwd(f"x = x + {fc2}(F.gelu({fc1}({ln2}(x))))")
    b.cost(4 * Bt * S * E * Fh + 30 * Bt * S * E)
    return _Var("x", (Bt, S, E))


def _mlp_head(b: _Builder, x: None, *, mlp: str) -> _Var:
    kind = mlp
    lead = (b.dim("batch", 1, 512),)
    if kind in ("ffn", "swiglu") and b.chance("has_seq", 0.5):
        lead = lead + (b.dim("seq", 1, 512),)
    E = b.dim("features", 2, 8192)
    Hd = b.dim("hidden", 2, MAX_DIM)
    b.input("x", lead + (E,))
    n = _numel(lead)
    if kind == "swiglu":
        w1 = b.module("w1", f"nn.Linear({E}, {Hd}, bias=False)")
        w3 = b.module("w3", f"nn.Linear({E}, {Hd}, bias=False)")
        w2 = b.module("w2", f"nn.Linear({Hd}, {E}, bias=False)")
        b.cost(6 * n * E * Hd + 8 * n * Hd)
        return b.assign(f"{w2}(F.silu({w1}(x)) * {w3}(x))", lead + (E,))
    if kind == "ffn":
        ln = b.module("norm", f"nn.LayerNorm({E})")
        fc1 = b.module("fc1", f"nn.Linear({E}, {Hd})")
        fc2 = b.module("fc2", f"nn.Linear({Hd}, {E})")
        b.cost(4 * n * E * Hd + 10 * n * Hd + 10 * n * E)
        return b.assign(f"x + {fc2}(F.gelu({fc1}({ln}(x))))", lead + (E,))
    raise AssertionError(kind)


_reg("ScaledDotProductAttention", _attention, kind="head", family="attention", sdpa=True)
_reg("ScaledDotProductAttentionCausal", _attention, kind="head", family="attention", sdpa=True, causal=True)
_reg("Attention", _attention, kind="head", family="attention")
_reg("CausalAttention", _attention, kind="head", family="attention", causal=True)
_reg("MultiHeadAttention", _mha, kind="head", family="attention")
_reg("MultiHeadAttentionSDPA", _mha, kind="head", family="attention", sdpa=True)
_reg("CausalMultiHeadAttention", _mha, kind="head", family="attention", causal=True)
_reg("GroupedQueryAttention", _mha, kind="head", family="attention", kv="gqa")
_reg("GroupedQueryAttentionCausal", _mha, kind="head", family="attention", kv="gqa", sdpa=True, causal=True)
_reg("MultiQueryAttention", _mha, kind="head", family="attention", kv="mqa")
_reg("MultiQueryAttentionCausal", _mha, kind="head", family="attention", kv="mqa", causal=True)
_reg("CrossAttention", _mha, kind="head", family="attention", cross=True)
_reg("TransformerBlock", _transformer_block, kind="head", family="attention")
_reg("SwiGLU", _mlp_head, kind="head", family="block", mlp="swiglu")
_reg("FFNResidual", _mlp_head, kind="head", family="block", mlp="ffn")


# ---- two-input and reshaped-input heads (shapes for graph, loop and math strategies) ----
# Each creates its own inputs. They add program shapes the translator's one-nest-per-operator
# output otherwise lacks: the same element-wise operator on two inputs (tensor concat to fuse
# operators), one shared-weight convolution on two inputs (partially equivalent then correct),
# a reduction over a reshaped view (index o*f+i: loop fusion), logarithms of products and sums
# of logarithms of positive values (expand log, logsimp).

_TWIN_ACTS = {"sigmoid": "torch.sigmoid({x})", "tanh": "torch.tanh({x})", "gelu": "F.gelu({x})",
              "silu": "F.silu({x})", "exp": "torch.exp({x})", "softplus": "F.softplus({x})",
              "elu": "F.elu({x})", "square": "{x} * {x}"}


def _pair_shape(b: _Builder) -> tuple:
    if b.chance("rank3", 0.4):
        return (b.dim("batch", 1, 64), b.dim("channels", 2, 256), b.dim("length", 2, 1024))
    return (b.dim("batch", 1, 512), b.dim("features", 2, 1024))


def _twin_activation(b: _Builder, x: None) -> _Var:
    """``act(x) <op> act(y)``: the same element-wise operator on two inputs of one shape."""
    shape = _pair_shape(b)
    xa, ya = b.input("x", shape), b.input("y", shape)
    act = _TWIN_ACTS[b.pick("act", sorted(_TWIN_ACTS))]
    op = b.pick("combine", ["+", "-", "*"])
    b.cost(10 * _numel(shape))
    return b.assign(f"{act.format(x=xa.name)} {op} {act.format(x=ya.name)}", shape)


def _siamese_conv(b: _Builder, x: None, *, nd: int) -> _Var:
    """One convolution (shared weights, "same" padding, no bias) applied to two inputs, the
    outputs combined (a siamese / two-view encoder)."""
    Bt, C, Co = b.dim("batch", 1, 16), b.dim("channels", 1, 64), b.dim("cout", 1, 64)
    k = b.pick("kernel", [3, 3, 5])
    sp = tuple(b.dim(f"s{i}", k, 256 if nd == 1 else 64) for i in range(nd))
    shape = (Bt, C) + sp
    xa, ya = b.input("x", shape), b.input("y", shape)
    m = b.module("conv", f"nn.Conv{nd}d({C}, {Co}, kernel_size={k}, padding={k // 2}, bias=False)")
    oshape = (Bt, Co) + sp
    b.cost(2 * 2 * _numel(oshape) * C * k ** nd + C * Co * k ** nd)
    how = b.pick("combine", ["+", "-", "cat"])
    if how == "cat":
        return b.assign(f"torch.cat([{m}({xa.name}), {m}({ya.name})], dim=1)", (Bt, 2 * Co) + sp)
    return b.assign(f"{m}({xa.name}) {how} {m}({ya.name})", oshape)


def _grouped_reduce(b: _Builder, x: None) -> _Var:
    """A reduction over a reshaped view: the last dim n is viewed as (groups, n/groups) and
    both new dims are reduced (a per-row statistic computed group by group)."""
    lead = (b.dim("batch", 1, 512),)
    if b.chance("rank3", 0.4):
        lead = lead + (b.dim("channels", 2, 64),)
    g, k = b.dim("groups", 2, 64), b.dim("group_size", 2, 256)
    xa = b.input("x", lead + (g * k,))
    fn = b.pick("reduce", ["sum", "mean", "amax"])
    r = len(lead)
    b.cost(_numel(lead) * g * k)
    view = ", ".join(str(s) for s in lead + (g, k))
    return b.assign(f"torch.{fn}({xa.name}.view({view}), dim=({r}, {r + 1}))", lead)


#: positive element-wise factors, bounded away from 0 and from overflow for every input (so the
#: log of their product is the sum of their logs in floating point too, and provably so:
#: steptp.engine.signs; a bare exp(x) or sigmoid(x) underflows to 0 or overflows at the
#: verifier's large-magnitude inputs, design.md §8)
_POS_FACTORS = {"sigmoid": "(torch.sigmoid({x}) + 1.0)", "exp": "torch.exp(torch.tanh({x}))",
                "softplus": "(F.softplus(torch.tanh({x})) + 1.0)", "square1": "({x} * {x} + 1.0)"}


def _log_product(b: _Builder, x: None, *, form: str) -> _Var:
    """``log(f(x) * g(y))`` (form ``product``) or ``log(f(x)) + log(g(y))`` (form ``sum``) with
    positive f, g: a log-likelihood of two independent factors."""
    shape = _pair_shape(b)
    xa, ya = b.input("x", shape), b.input("y", shape)
    names = sorted(_POS_FACTORS)
    f = _POS_FACTORS[b.pick("f", names)].format(x=xa.name)
    g = _POS_FACTORS[b.pick("g", names)].format(x=ya.name)
    b.cost(12 * _numel(shape))
    if form == "product":
        return b.assign(f"torch.log({f} * {g})", shape)
    return b.assign(f"torch.log({f}) + torch.log({g})", shape)


#: a shared factor of two products (a gate or scale applied to two branches)
_SHARED_FACTORS = {"plain": "{x}", "exp": "torch.exp({x})", "tanh": "torch.tanh({x})"}


def _shared_factor_sum(b: _Builder, x: None) -> _Var:
    """``g(x) * y + g(x) * z + y``: one factor scaling two branches plus a residual (the
    terms that share ``g(x)`` can be collected into ``g(x) * (y + z)``)."""
    shape = _pair_shape(b)
    xa, ya, za = b.input("x", shape), b.input("y", shape), b.input("z", shape)
    g = _SHARED_FACTORS[b.pick("factor", sorted(_SHARED_FACTORS))].format(x=xa.name)
    res = b.pick("residual", [ya.name, za.name])
    b.cost(8 * _numel(shape))
    return b.assign(f"{g} * {ya.name} + {g} * {za.name} + {res}", shape)


def _exp_product(b: _Builder, x: None) -> _Var:
    """``exp(x) * exp(y)`` or ``exp(x) / exp(y)``, scaled by ``z`` or not: a product of two
    exponential factors (e.g. two unnormalised likelihoods; one exp of the summed exponents)."""
    shape = _pair_shape(b)
    xa, ya = b.input("x", shape), b.input("y", shape)
    op = b.pick("combine", ["*", "/"])
    b.cost(10 * _numel(shape))
    if b.chance("scaled", 0.5):
        za = b.input("z", shape)
        return b.assign(f"{za.name} * torch.exp({xa.name}) {op} torch.exp({ya.name})", shape)
    return b.assign(f"torch.exp({xa.name}) {op} torch.exp({ya.name})", shape)


_reg("TwinActivation", _twin_activation, kind="head", family="pair")
_reg("SiameseConv1d", _siamese_conv, kind="head", family="conv", nd=1)
_reg("SiameseConv2d", _siamese_conv, kind="head", family="conv", nd=2)
_reg("GroupedReduce", _grouped_reduce, kind="head", family="reduction")
_reg("LogProduct", _log_product, kind="head", family="math", form="product")
_reg("LogSum", _log_product, kind="head", family="math", form="sum")
_reg("SharedFactorSum", _shared_factor_sum, kind="head", family="math")
_reg("ExpProduct", _exp_product, kind="head", family="math")
