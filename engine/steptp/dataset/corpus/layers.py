"""Component templates, part 2: pooling, convolutions (the :data:`_CONVS` table), linear layers
and shape glue, shape ops and losses."""

from __future__ import annotations

import math

from .builder import _Builder, _divisors, _index, LOGPROBS, MAX_DIM, _num, _numel, PROBS, _Reject, SIGNS, _tup, _Var
from .components import _reg, _spatial_gt1


# ---- pooling -----------------------------------------------------------------------

def _pool_out(L: int, k: int, s: int, p: int, d: int, ceil: bool) -> int:
    num = L + 2 * p - d * (k - 1) - 1
    if ceil:
        out = -(-num // s) + 1
        if (out - 1) * s >= L + p:
            out -= 1
    else:
        out = num // s + 1
    return out


def _pool(b: _Builder, x: _Var, *, op: str, nd: int = 0) -> _Var:
    r = len(x.shape)
    nd = nd or r - 2
    if r != nd + 2:
        raise _Reject(f"{op}{nd}d on rank {r}")
    sp = x.shape[2:]
    if b.single:
        k = b.pick("kernel", [2, 3, 4])
        s = b.pick("stride", [k, k, 1, 2])
        p = b.pick("padding", list(range(0, k // 2 + 1)))
        d = b.pick("dilation", [1, 1, 2]) if op == "Max" else 1
        ceil = b.chance("ceil_mode", 0.3)
        incl = b.chance("count_include_pad", 0.7) if op == "Avg" and p else True
    else:
        k = b.pick("kernel", [2, 2, 3])
        s, p, d, ceil, incl = k, 0, 1, False, True
    out = tuple(_pool_out(L, k, s, p, d, ceil) for L in sp)
    # avg_pool3d on CPU wants the unpadded input at least as large as the window
    if any(o < 1 for o in out) or any(d * (k - 1) + 1 > L for L in sp):
        raise _Reject("pooling window larger than the input")
    args = [f"kernel_size={k}"]
    if s != k:
        args.append(f"stride={s}")
    if p:
        args.append(f"padding={p}")
    if d != 1:
        args.append(f"dilation={d}")
    if ceil:
        args.append("ceil_mode=True")
    if not incl:
        args.append("count_include_pad=False")
    if op == "Avg" and nd == 3:
        b.half_unsupported("avg_pool3d")
    m = b.module(f"{op.lower()}_pool", f"nn.{op}Pool{nd}d({', '.join(args)})")
    oshape = x.shape[:2] + out
    b.cost(_numel(oshape) * k ** nd)
    return b.assign(f"{m}({x.name})", oshape)


def _pool_ok(shape: tuple) -> bool:
    return len(shape) >= 3 and min(shape[2:]) >= 3


def _global_avg_pool(b: _Builder, x: _Var) -> _Var:
    r = len(x.shape)
    dims = tuple(range(2, r))
    b.cost(_numel(x.shape))
    return b.assign(f"torch.mean({x.name}, dim={_tup(dims)}, keepdim=True)", x.shape[:2] + (1,) * (r - 2))


_reg("MaxPool", _pool, ranks=(3, 4, 5), mix=True, accept=_pool_ok, family="pool", op="Max")
_reg("AvgPool", _pool, ranks=(3, 4, 5), mix=True, accept=_pool_ok, family="pool", op="Avg")
for _nd in (1, 2, 3):
    _reg(f"MaxPool{_nd}d", _pool, ranks=(_nd + 2,), family="pool", op="Max", nd=_nd)
    _reg(f"AvgPool{_nd}d", _pool, ranks=(_nd + 2,), family="pool", op="Avg", nd=_nd)
_reg("GlobalAvgPool", _global_avg_pool, ranks=(3, 4, 5), mix=True, accept=_spatial_gt1, family="pool")


# ---- convolution -------------------------------------------------------------------

def _conv(b: _Builder, x: _Var, *, nd: int, transposed: bool = False, flags: str = "") -> _Var:
    f = set(flags.split())
    if len(x.shape) != nd + 2:
        raise _Reject(f"conv{nd}d on rank {len(x.shape)}")
    C, sp = x.shape[1], x.shape[2:]
    if "pointwise" in f:
        k = (1,) * nd
    else:
        opts = {1: [1, 3, 5, 7], 2: [1, 3, 3, 5], 3: [1, 3, 3]}[nd] if not transposed else \
            {1: [2, 3, 5], 2: [2, 3, 4], 3: [2, 3]}[nd]
        if "asym" in f:
            k = tuple(b.pick(f"k{i}", opts) for i in range(nd))
        else:
            k = (b.pick("k", opts),) * nd
    if "stride" in f:
        s = b.pick("stride", [2, 2, 3])
    elif transposed and not b.single:
        s = b.pick("stride", [1, 2])
    else:
        s = 1
    d = b.pick("dilation", [2, 3]) if "dil" in f else 1
    if "pad" in f:
        p = b.pick("padding", [1, 1, 2])
    elif transposed and not b.single:
        p = b.pick("padding", [0, 1])
    else:
        p = 0
    if transposed:
        p = min(p, (d * (min(k) - 1)) // 2)      # keep the output non-empty
    op = b.pick("output_padding", [0, 1]) if transposed and s > 1 and ("pad" in f or not b.single) else 0
    g = 1
    if "groups" in f:
        g = b.pick("groups", [v for v in _divisors(C) if v > 1])
        cout = g * b.dim("cout_per_group", 1, 64)
    elif "depthwise" in f:
        g = C
        cout = C * b.pick("multiplier", [1, 1, 2])
    else:
        cout = b.dim("cout", 2, 512)
    bias = b.chance("bias", 0.5) if b.single else True
    if transposed:
        out = tuple((L - 1) * s - 2 * p + d * (kk - 1) + op + 1 for L, kk in zip(sp, k))
    else:
        out = tuple((L + 2 * p - d * (kk - 1) - 1) // s + 1 for L, kk in zip(sp, k))
    if any(o < 1 for o in out):
        raise _Reject("convolution output is empty")
    kstr = str(k[0]) if len(set(k)) == 1 else _tup(k)
    args = [str(C), str(cout), f"kernel_size={kstr}"]
    for name, val, default in (("stride", s, 1), ("padding", p, 0), ("output_padding", op, 0),
                               ("groups", g, 1), ("dilation", d, 1)):
        if val != default:
            args.append(f"{name}={val}")
    if not bias:
        args.append("bias=False")
    cls = f"ConvTranspose{nd}d" if transposed else f"Conv{nd}d"
    m = b.module("conv_transpose" if transposed else "conv", f"nn.{cls}({', '.join(args)})")
    oshape = (x.shape[0], cout) + out
    kvol = _numel(k)
    if transposed:
        b.cost(2 * _numel(x.shape) * (cout // g) * kvol + _numel(oshape))
    else:
        b.cost(2 * _numel(oshape) * (C // g) * kvol)
    b.cost(C * cout // g * kvol)
    return b.assign(f"{m}({x.name})", oshape)


_CONVS = {   # name: (nd, transposed, flags, usable as a composite head)
    "Conv1d": (1, False, "", True),
    "Conv1dDilatedStrided": (1, False, "dil stride", False),
    "Conv1dPadded": (1, False, "pad", False),
    "Conv2d": (2, False, "", True),
    "Conv2dAsymKernel": (2, False, "asym", False),
    "Conv2dStridedPadded": (2, False, "stride pad", False),
    "Conv2dDilatedPadded": (2, False, "dil pad asym", False),
    "Conv2dGrouped": (2, False, "groups", False),
    "Conv2dDepthwise": (2, False, "depthwise", False),
    "Conv2dDepthwiseAsym": (2, False, "depthwise asym stride", False),
    "Conv2dPointwise": (2, False, "pointwise", False),
    "Conv3d": (3, False, "", True),
    "Conv3dAsymKernel": (3, False, "asym", False),
    "Conv3dStridedPadded": (3, False, "stride pad", False),
    "Conv3dGrouped": (3, False, "groups", False),
    "ConvTranspose1d": (1, True, "", True),
    "ConvTranspose1dDilated": (1, True, "dil pad stride", False),
    "ConvTranspose2d": (2, True, "", True),
    "ConvTranspose2dAsym": (2, True, "asym pad", False),
    "ConvTranspose2dStridedGrouped": (2, True, "stride pad groups", False),
    "ConvTranspose2dDilated": (2, True, "dil pad stride asym", False),
    "ConvTranspose3d": (3, True, "", True),
    "ConvTranspose3dStridedPaddedGrouped": (3, True, "stride pad groups asym", False),
}
for _n, (_nd, _tr, _fl, _head) in _CONVS.items():
    _reg(_n, _conv, ranks=(_nd + 2,), mix=False, family="conv", nd=_nd, transposed=_tr, flags=_fl)


# ---- linear layers / shape glue (composites) ---------------------------------------

def _gemm(b: _Builder, x: _Var, *, bias: bool = True) -> _Var:
    I = x.shape[-1]
    O = b.dim("out_features", 2, MAX_DIM)
    args = f"{I}, {O}" + ("" if bias else ", bias=False")
    m = b.module("gemm" if b.single is False else "linear", f"nn.Linear({args})")
    oshape = x.shape[:-1] + (O,)
    b.cost(2 * _numel(x.shape) * O + I * O)
    return b.assign(f"{m}({x.name})", oshape)


def _matmul_param(b: _Builder, x: _Var) -> _Var:
    I = x.shape[-1]
    O = b.dim("out_features", 2, MAX_DIM)
    w = b.param("weight", (I, O), scale=round(1 / math.sqrt(I), 4))
    b.cost(2 * _numel(x.shape) * O)
    return b.assign(f"torch.matmul({x.name}, {w})", x.shape[:-1] + (O,))


def _flatten(b: _Builder, x: _Var) -> _Var:
    if b.single:
        s = b.pick("start_dim", list(range(len(x.shape) - 1)))
    else:
        s = 1
    out = x.shape[:s] + (_numel(x.shape[s:]),)
    b.cost(_numel(x.shape))
    return b.assign(f"torch.flatten({x.name}, {s})" if s else f"torch.flatten({x.name})", out)


_reg("Gemm", _gemm, ranks=(2,), mix=True, family="matmul")
_reg("Linear", _gemm, ranks=(2, 3), family="matmul")
_reg("LinearNoBias", _gemm, ranks=(2, 3), family="matmul", bias=False)
_reg("Matmul", _matmul_param, ranks=(2, 3), family="matmul")
_reg("Flatten", _flatten, ranks=(3, 4, 5), mix=True, family="shape")


# ---- shape ops (single) ------------------------------------------------------------

def _transpose(b: _Builder, x: _Var) -> _Var:
    r = len(x.shape)
    a = b.pick("dim0", list(range(r)))
    c = b.pick("dim1", [i for i in range(r) if i != a])
    out = list(x.shape)
    out[a], out[c] = out[c], out[a]
    b.cost(_numel(x.shape))
    return b.assign(f"{x.name}.transpose({a}, {c})", out)


def _permute(b: _Builder, x: _Var) -> _Var:
    r = len(x.shape)
    rest = list(range(r))
    perm = []
    for i in range(r):
        perm.append(rest.pop(_index(b.uniform(f"p{i}", 0.0, 1.0, 6), len(rest))))
    if perm == list(range(r)):
        perm = perm[1:] + perm[:1]
    b.cost(_numel(x.shape))
    return b.assign(f"{x.name}.permute({', '.join(map(str, perm))})", [x.shape[i] for i in perm])


def _reshape(b: _Builder, x: _Var) -> _Var:
    n, f = x.shape[0], _numel(x.shape[1:])
    divs = [d for d in _divisors(f) if 1 < d < f] or [1]
    a = b.pick("split", divs)
    b.cost(_numel(x.shape))
    fn = b.pick("fn", ["view", "reshape"])
    return b.assign(f"{x.name}.{fn}({n}, {a}, {f // a})", (n, a, f // a))


def _cat(b: _Builder, x: _Var) -> _Var:
    r = len(x.shape)
    d = b.pick("dim", list(range(r)))
    ys = list(x.shape)
    ys[d] = b.dim("extent", 1, 1024)
    y = b.input("y", ys)
    out = list(x.shape)
    out[d] += ys[d]
    b.cost(_numel(out))
    return b.assign(f"torch.cat([{x.name}, {y.name}], dim={d})", out)


def _slice(b: _Builder, x: _Var) -> _Var:
    r = len(x.shape)
    d = b.pick("dim", list(range(r)))
    L = x.shape[d]
    start = _index(b.uniform("start", 0.0, 1.0, 6), L)
    stop = start + 1 + _index(b.uniform("stop", 0.0, 1.0, 6), L - start)
    out = list(x.shape)
    out[d] = stop - start
    b.cost(_numel(out))
    return b.assign(f"{x.name}[{':, ' * d}{start}:{stop}]", out)


def _select(b: _Builder, x: _Var) -> _Var:
    r = len(x.shape)
    d = b.pick("dim", list(range(1, r)))
    i = _index(b.uniform("index", 0.0, 1.0, 6), x.shape[d])
    out = x.shape[:d] + x.shape[d + 1:]
    b.cost(_numel(out))
    return b.assign(f"{x.name}[{':, ' * d}{i}]", out)


def _expand(b: _Builder, x: _Var) -> _Var:
    # x is (N, F); expand a new middle dim
    n, f = x.shape
    s = b.dim("repeat", 2, 512)
    b.cost(n * s * f)
    return b.assign(f"{x.name}.unsqueeze(1).expand({n}, {s}, {f})", (n, s, f))


def _squeeze(b: _Builder, x: _Var) -> _Var:
    # a keepdim reduction makes a singleton dim, squeeze removes it
    r = len(x.shape)
    d = b.pick("dim", list(range(1, r)))
    out = x.shape[:d] + x.shape[d + 1:]
    b.cost(_numel(x.shape))
    return b.assign(f"torch.sum({x.name}, dim={d}, keepdim=True).squeeze({d})", out)


def _outer(b: _Builder, x: _Var) -> _Var:
    n, f = x.shape
    y = b.input("y", (n, b.dim("g", 2, 4096)))
    out = (n, f, y.shape[1])
    b.cost(_numel(out))
    return b.assign(f"{x.name}.unsqueeze(2) * {y.name}.unsqueeze(1)", out)


_reg("Transpose", _transpose, ranks=(2, 3, 4), family="shape")
_reg("Permute", _permute, ranks=(3, 4), family="shape")
_reg("Reshape", _reshape, ranks=(2, 3), family="shape")
_reg("Concat", _cat, ranks=(2, 3, 4), family="shape")
_reg("Slice", _slice, ranks=(2, 3, 4), family="shape")
_reg("Select", _select, ranks=(2, 3, 4), family="shape")
_reg("Expand", _expand, ranks=(2,), family="shape")
_reg("Squeeze", _squeeze, ranks=(2, 3, 4), family="shape")
_reg("BatchedOuter", _outer, ranks=(2,), family="shape")


# ---- losses (single; they reduce to a scalar) ---------------------------------------

def _loss(b: _Builder, x: _Var, *, name: str) -> _Var:
    n, f = x.shape[0], x.shape[1]
    b.cost(6 * _numel(x.shape))
    if name == "MSELoss":
        t = b.input("targets", x.shape)
        return b.assign(f"F.mse_loss({x.name}, {t.name})", ())
    if name == "L1Loss":
        t = b.input("targets", x.shape)
        return b.assign(f"torch.mean(torch.abs({x.name} - {t.name}))", ())
    if name == "CrossEntropyLoss":
        t = b.input("targets", (n,), f"torch.randint(0, {f}, {{tuple}})", kind="long")
        return b.assign(f"F.cross_entropy({x.name}, {t.name})", ())
    if name == "NLLLoss":
        t = b.input("targets", (n,), f"torch.randint(0, {f}, {{tuple}})", kind="long")
        if b.set_gen(x, LOGPROBS):
            return b.assign(f"F.nll_loss({x.name}, {t.name})", ())
        return b.assign(f"F.nll_loss(torch.log_softmax({x.name}, dim=1), {t.name})", ())
    if name == "SmoothL1Loss":
        t = b.input("targets", x.shape)
        return b.assign(f"F.smooth_l1_loss({x.name}, {t.name})", ())
    if name == "HuberLoss":
        t = b.input("targets", x.shape)
        delta = b.uniform("delta", 0.25, 2.0)
        return b.assign(f"F.huber_loss({x.name}, {t.name}, delta={_num(delta)})", ())
    if name == "KLDivLoss":
        if not b.set_gen(x, PROBS):
            raise _Reject("kl_div needs probabilities")
        t = b.input("targets", x.shape, PROBS)
        return b.assign(f"F.kl_div(torch.log({x.name}), {t.name}, reduction='batchmean')", ())
    if name == "HingeLoss":
        t = b.input("targets", x.shape, SIGNS)
        return b.assign(f"torch.mean(torch.clamp(1 - {x.name} * {t.name}, min=0))", ())
    if name == "TripletMarginLoss":
        pos = b.input("positive", x.shape)
        neg = b.input("negative", x.shape)
        margin = b.pick("margin", [0.5, 1.0, 1.0, 2.0])
        return b.assign(f"F.triplet_margin_loss({x.name}, {pos.name}, {neg.name}, margin={_num(margin)})", ())
    if name == "CosineSimilarityLoss":
        t = b.input("targets", x.shape)
        return b.assign(f"torch.mean(1 - F.cosine_similarity({x.name}, {t.name}, dim=1))", ())
    if name == "CosineSimilarity":
        t = b.input("y", x.shape)
        return b.assign(f"F.cosine_similarity({x.name}, {t.name}, dim=1)", (n,))
    raise AssertionError(name)


_LOSSES = ("MSELoss", "L1Loss", "CrossEntropyLoss", "NLLLoss", "SmoothL1Loss", "HuberLoss", "KLDivLoss",
           "HingeLoss", "TripletMarginLoss", "CosineSimilarityLoss", "CosineSimilarity")
for _n in _LOSSES:
    _reg(_n, _loss, ranks=(2,), family="loss", name=_n)
