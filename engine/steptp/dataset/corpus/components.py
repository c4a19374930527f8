"""Component templates, part 1: the :class:`Component` record and the :data:`COMPONENTS`
registry, the ``Input`` head, elementwise ops (unary and binary tables, masks), softmax,
reductions, scans and normalisation."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

from .builder import _Builder, _divisors, MASK, MAX_DIM, NEAR_ONE, _num, _numel, POSITIVE, RANDN, _Reject, _tup, _Var


# --------------------------------------------------------------------------------------
# components
# --------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Component:
    """A component template.

    ``kind`` is ``"head"`` (creates the program inputs and ignores the running tensor) or
    ``"op"`` (maps the running tensor). ``ranks`` lists the input ranks an op accepts;
    ``mix`` marks ops that random compositions may draw; ``accept(shape)`` is an extra
    precondition on the input shape; ``kw`` are fixed arguments of the template function.
    """

    name: str
    fn: Callable[..., _Var]
    kind: str = "op"
    ranks: tuple = (2, 3, 4)
    mix: bool = False
    accept: Callable[[tuple], bool] | None = None
    family: str = ""
    kw: tuple = ()

    def accepts(self, b: _Builder, x: _Var, strict: bool = True) -> bool:
        """Whether this op can be applied to ``x``: rank and kind; with ``strict`` also the
        shape precondition that random compositions use to avoid degenerate chains."""
        if self.kind == "head":
            return True
        if x.kind != "float" or len(x.shape) not in self.ranks:
            return False
        if self.name == "ResidualAdd":
            return b.residual is not None and b.residual[1] == x.shape
        return not strict or self.accept is None or bool(self.accept(x.shape))

    def apply(self, b: _Builder, x: _Var | None) -> _Var:
        """Emit this component's code for the running tensor ``x`` and return the new one."""
        return self.fn(b, x, **dict(self.kw))


COMPONENTS: dict[str, Component] = {}


def _reg(cname: str, fn: Callable[..., _Var], /, *, kind: str = "op", ranks: tuple = (2, 3, 4),
         mix: bool = False, accept: Callable[[tuple], bool] | None = None, family: str = "",
         **kw: Any) -> None:
    if cname in COMPONENTS:
        raise RuntimeError(f"component {cname} registered twice")
    COMPONENTS[cname] = Component(cname, fn, kind, tuple(ranks), mix, accept, family,
                                 tuple(sorted(kw.items())))


# ---- the Input head ----------------------------------------------------------------

def _input_shape(b: _Builder, rank: int) -> tuple:
    if rank == 1:
        return (b.dim("n", 2, 65536),)
    if rank == 2:
        return (b.dim("batch", 1, 512), b.dim("features", 2, MAX_DIM))
    if rank == 3:
        return (b.dim("batch", 1, 64), b.dim("channels", 2, 256), b.dim("length", 4, 4096))
    if rank == 4:
        if b.chance("square", 0.5):
            hw = b.dim("hw", 4, 512)
            sp = (hw, hw)
        else:
            sp = (b.dim("h", 4, 512), b.dim("w", 4, 512))
        return (b.dim("batch", 1, 32), b.dim("channels", 2, 256)) + sp
    if rank == 5:
        if b.chance("cube", 0.5):
            s = b.dim("dhw", 4, 128)
            sp = (s, s, s)
        else:
            sp = (b.dim("d", 2, 64), b.dim("h", 4, 128), b.dim("w", 4, 128))
        return (b.dim("batch", 1, 16), b.dim("channels", 2, 64)) + sp
    raise _Reject(f"rank {rank}")


def _input_head(b: _Builder, ranks: Sequence[int]) -> _Var:
    rank = b.pick("rank", sorted(ranks))
    return b.input("x", _input_shape(b, rank))


# ---- elementwise unary table -------------------------------------------------------
# name: (expression with {x}, params {name: (lo, hi) float | [choices]}, cost/element,
#        mixable, domain)   domain: None | "pos" (needs positive inputs) | "small"

_UNARY: dict[str, tuple] = {
    "ReLU": ("torch.relu({x})", {}, 1, True, None),
    "LeakyReLU": ("F.leaky_relu({x}, negative_slope={slope})", {"slope": (0.01, 0.3)}, 1, True, None),
    "Sigmoid": ("torch.sigmoid({x})", {}, 4, True, None),
    "Tanh": ("torch.tanh({x})", {}, 4, True, None),
    "GELU": ("F.gelu({x})", {}, 8, True, None),
    "GELUTanh": ("F.gelu({x}, approximate='tanh')", {}, 8, True, None),
    "NewGELU": ("0.5 * {x} * (1.0 + torch.tanh(0.7978845608028654 * ({x} + 0.044715 * torch.pow({x}, 3.0))))",
                {}, 10, False, None),
    "SELU": ("torch.selu({x})", {}, 4, True, None),
    "ELU": ("F.elu({x}, alpha={alpha})", {"alpha": (0.5, 1.5)}, 4, True, None),
    "Softplus": ("F.softplus({x})", {}, 4, True, None),
    "Softsign": ("F.softsign({x})", {}, 2, True, None),
    "HardSigmoid": ("F.hardsigmoid({x})", {}, 2, True, None),
    "HardTanh": ("F.hardtanh({x}, min_val={lo}, max_val={hi})", {"lo": (-2.0, -0.25), "hi": (0.25, 2.0)},
                 1, True, None),
    "HardSwish": ("F.hardswish({x})", {}, 2, True, None),
    "Swish": ("{x} * torch.sigmoid({x})", {}, 5, True, None),
    "SiLU": ("F.silu({x})", {}, 5, True, None),
    "Mish": ("F.mish({x})", {}, 10, True, None),
    "Scale": ("{x} * {c}", {"c": (0.1, 2.5)}, 1, True, None),
    "Divide": ("{x} / {c}", {"c": (0.5, 4.0)}, 1, True, None),
    "AddConst": ("{x} + {c}", {"c": (0.1, 2.0)}, 1, True, None),
    "Subtract": ("{x} - {c}", {"c": (0.1, 2.0)}, 1, True, None),
    "Clamp": ("torch.clamp({x}, min={lo}, max={hi})", {"lo": (-2.0, -0.1), "hi": (0.1, 2.0)}, 1, True, None),
    "ClampMin": ("torch.clamp({x}, min={c})", {"c": (-1.0, 0.5)}, 1, True, None),
    "ClampMax": ("torch.clamp({x}, max={c})", {"c": (-0.5, 1.0)}, 1, True, None),
    "Dropout": ("F.dropout({x}, p={p}, training=False)", {"p": (0.1, 0.5)}, 1, True, None),
    "Abs": ("torch.abs({x})", {}, 1, True, None),
    "Square": ("{x} ** 2", {}, 1, False, None),
    "Pow": ("torch.pow({x}, {p})", {"p": [2, 3, 2.0, 3.0]}, 2, False, None),
    "Exp": ("torch.exp({x})", {}, 4, False, None),
    "Sqrt": ("torch.sqrt({x})", {}, 4, False, "pos"),
    "Log": ("torch.log({x})", {}, 4, False, "pos"),
    "ScaleShift": ("{x} * {a} + {c}", {"a": (0.25, 3.0), "c": (-1.0, 1.0)}, 2, False, None),
}


def _unary(b: _Builder, x: _Var, *, name: str) -> _Var:
    expr, params, cost, _mix, domain = _UNARY[name]
    vals = {}
    for p, spec in params.items():
        if isinstance(spec, tuple):
            vals[p] = _num(b.uniform(p, float(spec[0]), float(spec[1])))
        else:
            vals[p] = _num(b.pick(p, spec))
    if domain == "pos" and not b.set_gen(x, POSITIVE):
        raise _Reject(f"{name} needs positive inputs")
    b.cost(cost * _numel(x.shape))
    return b.assign(expr.format(x=x.name, **vals), x.shape)


for _n, _spec in _UNARY.items():
    _reg(_n, _unary, ranks=(1, 2, 3, 4, 5), mix=_spec[3], family="elementwise", name=_n)


# ---- tensor-tensor elementwise -----------------------------------------------------

def _broadcast_shape(b: _Builder, shape: tuple) -> tuple:
    """A shape broadcastable to ``shape``: some dims set to 1, maybe leading dims dropped."""
    out = [s if not b.chance(f"bc{i}", 0.35) else 1 for i, s in enumerate(shape)]
    drop = b.pick("bcdrop", list(range(len(shape))))
    return tuple(out[drop:]) if drop and b.chance("bcdropok", 0.5) else tuple(out)


_BINARY = {   # name: (expression, cost, second-input generator)
    "AddBroadcast": ("{x} + {y}", 1, RANDN),
    "SubBroadcast": ("{x} - {y}", 1, RANDN),
    "MulBroadcast": ("{x} * {y}", 1, RANDN),
    "DivBroadcast": ("{x} / {y}", 1, POSITIVE),
    "Maximum": ("torch.max({x}, {y})", 1, RANDN),
    "Minimum": ("torch.min({x}, {y})", 1, RANDN),
}


def _binary(b: _Builder, x: _Var, *, name: str) -> _Var:
    expr, cost, gen = _BINARY[name]
    y = b.input("y", _broadcast_shape(b, x.shape), gen)
    b.cost(cost * _numel(x.shape))
    return b.assign(expr.format(x=x.name, y=y.name), x.shape)


for _n in _BINARY:
    _reg(_n, _binary, ranks=(1, 2, 3, 4), family="elementwise", name=_n)


def _masked_fill(b: _Builder, x: _Var) -> _Var:
    m = b.input("mask", _broadcast_shape(b, x.shape), MASK, kind="bool")
    v = b.pick("value", [0.0, -1.0, 1.0, -10000.0])
    b.cost(_numel(x.shape))
    return b.assign(f"{x.name}.masked_fill({m.name}, {_num(v)})", x.shape)


_reg("MaskedFill", _masked_fill, ranks=(2, 3, 4), family="elementwise")


def _tri(b: _Builder, x: _Var, *, fn: str) -> _Var:
    k = b.pick("diagonal", [0, 0, 1, -1])
    b.cost(_numel(x.shape))
    arg = f", diagonal={k}" if k else ""
    return b.assign(f"torch.{fn}({x.name}{arg})", x.shape)


_reg("Triu", _tri, ranks=(2,), family="elementwise", fn="triu")
_reg("Tril", _tri, ranks=(2,), family="elementwise", fn="tril")


# ---- parameterised elementwise (composites) ------------------------------------------

def _chan_shape(shape: tuple) -> tuple:
    return (shape[1],) if len(shape) == 2 else (shape[1],) + (1,) * (len(shape) - 2)


def _bias_add(b: _Builder, x: _Var) -> _Var:
    p = b.param("bias", _chan_shape(x.shape))
    b.cost(_numel(x.shape))
    return b.assign(f"{x.name} + {p}", x.shape)


def _multiply(b: _Builder, x: _Var) -> _Var:
    p = b.param("multiplier", _chan_shape(x.shape))
    b.cost(_numel(x.shape))
    return b.assign(f"{x.name} * {p}", x.shape)


def _residual_add(b: _Builder, x: _Var) -> _Var:
    if b.residual is None or b.residual[1] != x.shape:
        raise _Reject("no residual of the same shape")
    if not b.residual_used:
        b.fwd_lines.insert(b.residual[0], "residual = x")
        b.residual_used = True
    b.cost(_numel(x.shape))
    return b.assign(f"{x.name} + residual", x.shape)


_reg("BiasAdd", _bias_add, ranks=(2, 3, 4, 5), mix=True, family="elementwise")
_reg("Multiply", _multiply, ranks=(2, 3, 4, 5), mix=True, family="elementwise")
_reg("ResidualAdd", _residual_add, ranks=(2, 3, 4, 5), mix=True, family="elementwise")


# ---- softmax / reductions / scans --------------------------------------------------

def _red_dim(b: _Builder, x: _Var) -> int:
    if not b.single:
        return 1
    r = len(x.shape)
    d = b.pick("dim", list(range(r)) + [-1])
    return d


def _composite_red_dims(shape: tuple) -> tuple:
    """Dims a composite reduces: the channel dim, or the spatial dims once channels are 1."""
    if shape[1] > 1:
        return (1,)
    rest = tuple(i for i in range(2, len(shape)) if shape[i] > 1)
    return rest or (1,)


def _softmax(b: _Builder, x: _Var, *, fn: str) -> _Var:
    d = _red_dim(b, x)
    b.cost(5 * _numel(x.shape))
    return b.assign(f"torch.{fn}({x.name}, dim={d})", x.shape)


def _gt1(shape: tuple) -> bool:
    return len(shape) >= 2 and shape[1] > 1


def _any_gt1(shape: tuple) -> bool:
    return len(shape) >= 2 and any(s > 1 for s in shape[1:])


_reg("Softmax", _softmax, ranks=(2, 3, 4, 5), mix=True, accept=_gt1, family="softmax", fn="softmax")
_reg("LogSoftmax", _softmax, ranks=(2, 3, 4, 5), mix=True, accept=_gt1, family="softmax", fn="log_softmax")

_REDUCE = {   # name: (expression with {x} {d} {k}, cost/element, output kind, input gen, mixable)
    "Sum": ("torch.sum({x}, dim={d}, keepdim={k})", 1, "float", None, True),
    "Mean": ("torch.mean({x}, dim={d}, keepdim={k})", 1, "float", None, True),
    "Max": ("torch.max({x}, dim={d}, keepdim={k})[0]", 1, "float", None, True),
    "Min": ("torch.min({x}, dim={d}, keepdim={k})[0]", 1, "float", None, True),
    "LogSumExp": ("torch.logsumexp({x}, dim={d}, keepdim={k})", 5, "float", None, True),
    "Prod": ("torch.prod({x}, dim={d}, keepdim={k})", 1, "float", NEAR_ONE, False),
    "Argmax": ("torch.argmax({x}, dim={d}, keepdim={k})", 1, "long", None, False),
    "Argmin": ("torch.argmin({x}, dim={d}, keepdim={k})", 1, "long", None, False),
    "VectorNorm": ("torch.norm({x}, p=2, dim={d}, keepdim={k})", 2, "float", None, False),
    "SumMultiDim": ("torch.sum({x}, dim={d}, keepdim={k})", 1, "float", None, False),
    "MeanMultiDim": ("torch.mean({x}, dim={d}, keepdim={k})", 1, "float", None, False),
}


def _reduce(b: _Builder, x: _Var, *, name: str) -> _Var:
    expr, cost, kind, gen, _mix = _REDUCE[name]
    r = len(x.shape)
    if name.endswith("MultiDim"):
        a = b.pick("dim_a", list(range(r)))
        c = b.pick("dim_b", [i for i in range(r) if i != a])
        dims = tuple(sorted((a, c)))
        keep = b.chance("keepdim", 0.5)
        dstr = _tup(dims)
    elif b.single:
        d = _red_dim(b, x)
        dims = (d % r,)
        keep = b.chance("keepdim", 0.5)
        dstr = str(d)
    else:
        dims = _composite_red_dims(x.shape)
        if name in ("Max", "Min"):      # torch.max/min reduce one dim at a time
            dims = dims[:1]
        keep = True
        dstr = str(dims[0]) if len(dims) == 1 else _tup(dims)
    if gen:
        b.set_gen(x, gen)
    out = tuple((1 if i in dims else s) for i, s in enumerate(x.shape) if keep or i not in dims)
    b.cost(cost * _numel(x.shape))
    return b.assign(expr.format(x=x.name, d=dstr, k=_num(keep)), out, kind=kind)


for _n, _spec in _REDUCE.items():
    _reg(_n, _reduce, ranks=(2, 3, 4, 5) if _spec[4] or "Multi" in _n else (1, 2, 3, 4), mix=_spec[4],
         accept=_any_gt1, family="reduction", name=_n)


def _scan(b: _Builder, x: _Var, *, variant: str) -> _Var:
    r = len(x.shape)
    d = b.pick("dim", list(range(r)))
    L = x.shape[d]
    b.cost(_numel(x.shape) * L)            # naive (masked full reduction) cost
    if variant == "cumsum":
        return b.assign(f"torch.cumsum({x.name}, dim={d})", x.shape)
    if variant == "cumprod":
        b.set_gen(x, NEAR_ONE)
        return b.assign(f"torch.cumprod({x.name}, dim={d})", x.shape)
    if variant == "reverse":
        return b.assign(f"torch.cumsum({x.name}.flip({d}), dim={d}).flip({d})", x.shape)
    if variant == "exclusive":
        if L < 2:
            raise _Reject("exclusive cumsum over a singleton dim")
        pre = ":, " * d
        return b.assign(f"torch.cat([torch.zeros_like({x.name}[{pre}:1]), "
                        f"torch.cumsum({x.name}[{pre}:-1], dim={d})], dim={d})", x.shape)
    if variant == "masked":
        m = b.input("mask", x.shape, MASK, kind="bool")
        return b.assign(f"torch.cumsum({x.name} * {m.name}, dim={d})", x.shape)
    raise AssertionError(variant)


for _n, _v in (("Cumsum", "cumsum"), ("Cumprod", "cumprod"), ("CumsumReverse", "reverse"),
               ("CumsumExclusive", "exclusive"), ("MaskedCumsum", "masked")):
    _reg(_n, _scan, ranks=(1, 2, 3), family="scan", variant=_v)


# ---- normalisation -----------------------------------------------------------------

#: fewest values a normalisation computes its statistics over (train-mode batch norm with two
#: values per channel divides by a tiny variance: the program is numerically ill-conditioned)
_MIN_STAT = 8


def _batch_norm(b: _Builder, x: _Var, *, nd: int = 0, eval_mode: bool = False) -> _Var:
    r = len(x.shape)
    nd = nd or {2: 1, 3: 1, 4: 2, 5: 3}[r]
    if {1: (2, 3), 2: (4,), 3: (5,)}[nd] and r not in {1: (2, 3), 2: (4,), 3: (5,)}[nd]:
        raise _Reject(f"BatchNorm{nd}d on rank {r}")
    C = x.shape[1]
    if not eval_mode and _numel(x.shape) // C < _MIN_STAT:
        raise _Reject("batch norm (train) statistics over too few values")
    m = b.module("bn", f"nn.BatchNorm{nd}d({C})")
    if eval_mode:
        b.init(f"{m}.running_mean.uniform_(-0.5, 0.5)")
        b.init(f"{m}.running_var.uniform_(0.5, 1.5)")
        b.init(f"{m}.eval()")
    b.cost(6 * _numel(x.shape))
    return b.assign(f"{m}({x.name})", x.shape)


def _instance_norm(b: _Builder, x: _Var) -> _Var:
    nd = len(x.shape) - 2
    if _numel(x.shape[2:]) < _MIN_STAT:
        raise _Reject("instance norm statistics over too few values")
    m = b.module("instance_norm", f"nn.InstanceNorm{nd}d({x.shape[1]})")
    b.cost(6 * _numel(x.shape))
    return b.assign(f"{m}({x.name})", x.shape)


def _group_norm(b: _Builder, x: _Var) -> _Var:
    C = x.shape[1]
    sp = _numel(x.shape[2:])
    # PyTorch needs > 1 value a group; fewer than _MIN_STAT values make ill-conditioned statistics
    g = b.pick("groups", [d for d in _divisors(C) if (C // d) * sp >= _MIN_STAT]
               or [d for d in _divisors(C) if (C // d) * sp > 1])
    m = b.module("group_norm", f"nn.GroupNorm({g}, {C})")
    b.cost(6 * _numel(x.shape))
    return b.assign(f"{m}({x.name})", x.shape)


def _layer_norm(b: _Builder, x: _Var) -> _Var:
    k = b.pick("ndims", [1, 2]) if b.single and len(x.shape) >= 3 else 1
    ns = x.shape[-k:]
    if _numel(ns) < 2:
        raise _Reject("layer norm over a single element")
    m = b.module("layer_norm", f"nn.LayerNorm({ns[0] if k == 1 else _tup(ns)})")
    b.cost(6 * _numel(x.shape))
    return b.assign(f"{m}({x.name})", x.shape)


def _rms_norm(b: _Builder, x: _Var) -> _Var:
    b.cost(4 * _numel(x.shape))
    return b.assign(f"{x.name} / torch.sqrt(torch.mean({x.name} ** 2, dim=1, keepdim=True) + 1e-05)", x.shape)


def _frobenius_norm(b: _Builder, x: _Var) -> _Var:
    b.cost(3 * _numel(x.shape))
    return b.assign(f"{x.name} / torch.norm({x.name}, p='fro')", x.shape)


def _l1_norm(b: _Builder, x: _Var) -> _Var:
    b.cost(3 * _numel(x.shape))
    return b.assign(f"{x.name} / torch.sum(torch.abs({x.name}), dim=1, keepdim=True)", x.shape)


def _l2_norm(b: _Builder, x: _Var) -> _Var:
    b.cost(3 * _numel(x.shape))
    return b.assign(f"{x.name} / torch.norm({x.name}, p=2, dim=1, keepdim=True)", x.shape)


def _spatial_gt1(shape: tuple) -> bool:
    return len(shape) >= 3 and _numel(shape[2:]) > 1


def _in_ok(shape: tuple) -> bool:
    return len(shape) >= 3 and _numel(shape[2:]) >= _MIN_STAT


def _bn_ok(shape: tuple) -> bool:
    return _numel(shape) // shape[1] >= _MIN_STAT


_reg("BatchNorm", _batch_norm, ranks=(2, 3, 4, 5), mix=True, accept=_bn_ok, family="norm")
_reg("BatchNorm1d", _batch_norm, ranks=(2, 3), family="norm", nd=1)
_reg("BatchNorm2d", _batch_norm, ranks=(4,), family="norm", nd=2)
_reg("BatchNorm3d", _batch_norm, ranks=(5,), family="norm", nd=3)
_reg("BatchNorm2dEval", _batch_norm, ranks=(4,), family="norm", nd=2, eval_mode=True)
_reg("BatchNorm1dEval", _batch_norm, ranks=(2, 3), family="norm", nd=1, eval_mode=True)
_reg("InstanceNorm", _instance_norm, ranks=(3, 4, 5), mix=True, accept=_in_ok, family="norm")
_reg("InstanceNorm1d", _instance_norm, ranks=(3,), family="norm")
_reg("InstanceNorm2d", _instance_norm, ranks=(4,), family="norm")
_reg("InstanceNorm3d", _instance_norm, ranks=(5,), family="norm")
_reg("GroupNorm", _group_norm, ranks=(2, 3, 4, 5), mix=True, accept=lambda s: _numel(s[1:]) > 1,
     family="norm")
_reg("LayerNorm", _layer_norm, ranks=(2, 3, 4, 5), mix=True, accept=lambda s: s[-1] > 1, family="norm")
_reg("RMSNorm", _rms_norm, ranks=(2, 3, 4, 5), mix=True, family="norm")
_reg("FrobeniusNorm", _frobenius_norm, ranks=(2, 3, 4), family="norm")
_reg("L1Norm", _l1_norm, ranks=(2, 3, 4), family="norm")
_reg("L2Norm", _l2_norm, ranks=(2, 3, 4, 5), mix=True, family="norm")
