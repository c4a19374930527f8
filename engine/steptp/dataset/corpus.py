"""KernelBench-style PyTorch program corpus (paper §3.1).

``stp corpus`` writes self-contained ``.py`` programs in KernelBench's layout (``class
Model(nn.Module)``, ``get_inputs()``, ``get_init_inputs()``, only ``torch`` imported). Each
program instantiates one *program type* with randomized shapes and dtype.

Design
------
The registry is data. :data:`COMPONENTS` is a table of *component templates*: a head
(creates the program inputs, e.g. ``BMM`` or ``MultiHeadAttention``) or an op (maps the
running tensor ``x`` to a new one, e.g. ``Conv2d``, ``ReLU``, ``GroupNorm``). Most ops come
from small tables (unary expressions, reductions, convolution variants, losses...). A
program type is a *recipe*, a chain of component names:

* ``single``    one KernelBench level-1 style operator (``("Softmax",)``, ``("Conv2dDepthwise",)``)
* ``block``     a popular architecture (matmul + softmax, gemm + activation, attention, MLP)
* ``composite`` a fixed chain of 2-5 components in KernelBench level-2 style
  (``Conv2d -> ReLU -> BiasAdd``)
* ``random``    ``RandomN_<Head>``: a head plus ops drawn at generation time from the mixable
  components whose input-shape constraints hold, N components in total (N = 2..5)

When a chain starts with an op, an ``Input`` head of a rank the op accepts is inserted.

Shapes and the work budget
--------------------------
Every size is a named draw (log-uniform, up to :data:`MAX_DIM`), recorded by a
:class:`_Builder`. Building a recipe emits the code and sums an estimated *work*: FLOPs of
the naive loop nests (``2*M*N*K`` for a matmul, ``out * in_ch/groups * kernel`` for a
convolution, ``numel * L`` for a cumulative scan...) plus the elements of every input.
While the work exceeds the budget, a drawn size (chosen at random, larger sizes more
likely) is halved and the recipe is rebuilt. :data:`DEFAULT_BUDGET` keeps a
program small enough that CPU verification of its translation takes well under a second;
pass a larger ``budget`` (e.g. :data:`GPU_BUDGET`) for GPU runs.

Dtypes
------
float16, float32 and float64 (drawn per program). Inputs and parameters are created in the
program's dtype (``DTYPE`` in the file; ``self.to(DTYPE)`` casts the parameters). A
component without a float16 CPU kernel in PyTorch (``avg_pool3d``) makes a float16 request
fall back to float32; the header records the request and the reason.

Determinism
-----------
Only ``random.Random(seed).random()`` is used; no clocks, no hash-order dependence. Same
arguments, byte-identical files. Each file's header records type, seed, requested dtype
and budget, which are exactly the arguments that regenerate it.
"""

from __future__ import annotations

import hashlib
import json
import math
import random
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

__all__ = [
    "DEFAULT_BUDGET", "GPU_BUDGET", "MAX_DIM", "DTYPES", "DTYPE_WEIGHTS", "CATEGORIES",
    "Component", "ProgramType", "CorpusError", "COMPONENTS", "PROGRAM_TYPES",
    "generate_program", "generate_corpus", "verify_corpus", "format_report", "parse_header", "program_seed",
]

#: default per-program work budget (estimated FLOPs + input elements): CPU-verifiable quickly
DEFAULT_BUDGET = 1 << 20
#: a budget suited to GPU runs (dims up to :data:`MAX_DIM` become reachable)
GPU_BUDGET = 1 << 34
#: largest size any single dimension is drawn from (paper §3.1: "up to 16,384")
MAX_DIM = 16384
#: dtypes a corpus draws from, and their weights
DTYPES = ("float16", "float32", "float64")
DTYPE_WEIGHTS = (0.25, 0.5, 0.25)
#: program type categories
CATEGORIES = ("single", "block", "composite", "random")

_DTYPE_ALIASES = {
    "float16": "float16", "f16": "float16", "half": "float16", "fp16": "float16",
    "float32": "float32", "f32": "float32", "float": "float32", "fp32": "float32",
    "float64": "float64", "f64": "float64", "double": "float64", "fp64": "float64",
}
_HEADER_TAG = "# Step-TP corpus program"
_MAX_ATTEMPTS = 60


class CorpusError(ValueError):
    """Bad arguments to the corpus generator (unknown type or dtype, unsatisfiable budget)."""


class _Reject(Exception):
    """A component cannot be applied to the current shapes (internal; triggers a redraw)."""


# --------------------------------------------------------------------------------------
# deterministic draws (only rng.random() is used, so results do not depend on the
# algorithms behind randrange/choice in a given Python version)
# --------------------------------------------------------------------------------------

def _logint(u: float, lo: int, hi: int) -> int:
    if hi <= lo:
        return lo
    v = int(math.exp(math.log(lo) + u * (math.log(hi + 1) - math.log(lo))))
    return max(lo, min(hi, v))


def _index(u: float, n: int) -> int:
    return min(n - 1, int(u * n))


def _numel(shape: Sequence[int]) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


def _num(v: Any) -> str:
    """A literal for generated code (floats rounded when drawn, so repr is short)."""
    if isinstance(v, bool):
        return "True" if v else "False"
    if isinstance(v, float):
        r = repr(v)
        return r
    return str(v)


def _tup(shape: Sequence[int]) -> str:
    shape = tuple(shape)
    if len(shape) == 1:
        return f"({shape[0]},)"
    return "(" + ", ".join(map(str, shape)) + ")"


def _args(shape: Sequence[int]) -> str:
    return ", ".join(map(str, shape))


def _divisors(n: int) -> list[int]:
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return sorted(set(small + [n // d for d in small]))


# --------------------------------------------------------------------------------------
# builder
# --------------------------------------------------------------------------------------

@dataclass
class _Var:
    name: str
    shape: tuple
    kind: str = "float"        # float | long | bool
    is_input: bool = False


@dataclass
class _Input:
    name: str
    shape: tuple
    gen: str                   # expression template with {shape} (args) and {tuple}
    kind: str = "float"


# input generators: {shape} is "2, 3", {tuple} is "(2, 3)"
RANDN = "torch.randn({shape}, dtype=DTYPE)"
RAND = "torch.rand({shape}, dtype=DTYPE)"
POSITIVE = "torch.rand({shape}, dtype=DTYPE) + 0.5"
NEAR_ONE = "torch.rand({shape}, dtype=DTYPE) * 0.4 + 0.8"
PROBS = "torch.softmax(torch.randn({shape}, dtype=DTYPE), dim=-1)"
LOGPROBS = "torch.log_softmax(torch.randn({shape}, dtype=DTYPE), dim=1)"
MASK = "torch.rand({shape}) < 0.5"
SIGNS = "torch.randint(0, 2, {tuple}).to(DTYPE) * 2 - 1"


class _Builder:
    """Records draws (so a recipe can be rebuilt after a size is shrunk) and emits code."""

    def __init__(self, rng: random.Random, budget: int):
        self.rng = rng
        self.budget = budget
        self.values: dict[str, Any] = {}
        self.lo: dict[str, int] = {}          # shrinkable integer draws -> their minimum
        self.single = False

    # ---- per build ----
    def begin(self) -> None:
        self.scope = ""
        self.inputs: list[_Input] = []
        self.init_lines: list[str] = []
        self.fwd_lines: list[str] = []
        self.work = 0
        self.attrs: set[str] = set()
        self.trace: list[tuple[str, tuple]] = []
        self.no_half: list[str] = []
        self.has_state = False
        self.residual: tuple | None = None     # (line index, shape) of the residual source
        self.residual_used = False

    # ---- draws ----
    def _key(self, k: str, kind: str = "") -> str:
        return f"{self.scope}{kind}{k}"

    def dim(self, k: str, lo: int, hi: int) -> int:
        """A size drawn log-uniformly in [lo, hi]; the shrinker may halve it."""
        key = self._key(k)
        if key not in self.values:
            hi = max(lo, min(hi, MAX_DIM))
            self.values[key] = _logint(self.rng.random(), lo, hi)
            self.lo[key] = lo
        return self.values[key]

    def pick(self, k: str, options: Sequence[Any]) -> Any:
        """One of ``options``; the draw is kept as a fraction, so it adapts to new options."""
        if not options:
            raise _Reject(f"no option for {k}")
        key = self._key(k, "p:")
        if key not in self.values:
            self.values[key] = self.rng.random()
        return options[_index(self.values[key], len(options))]

    def pick_fixed(self, k: str, options: Sequence[Any]) -> Any:
        """One of ``options``, kept as the value itself across rebuilds."""
        key = self._key(k, "f:")
        if key not in self.values:
            if not options:
                raise _Reject(f"no option for {k}")
            self.values[key] = options[_index(self.rng.random(), len(options))]
        return self.values[key]

    def uniform(self, k: str, lo: float, hi: float, nd: int = 2) -> float:
        key = self._key(k, "u:")
        if key not in self.values:
            self.values[key] = round(lo + self.rng.random() * (hi - lo), nd)
        return self.values[key]

    def chance(self, k: str, p: float) -> bool:
        key = self._key(k, "c:")
        if key not in self.values:
            self.values[key] = self.rng.random() < p
        return self.values[key]

    # ---- emission ----
    def attr(self, base: str) -> str:
        name, i = base, 1
        while name in self.attrs:
            i += 1
            name = f"{base}{i}"
        self.attrs.add(name)
        return name

    def module(self, base: str, ctor: str) -> str:
        """``self.<name> = ctor`` in ``__init__``; returns ``self.<name>``."""
        name = self.attr(base)
        self.init_lines.append(f"self.{name} = {ctor}")
        self.has_state = True
        return f"self.{name}"

    def param(self, base: str, shape: Sequence[int], scale: float | None = None) -> str:
        init = f"torch.randn({_tup(shape)})"
        if scale is not None:
            init += f" * {_num(scale)}"
        self.work += _numel(shape)
        return self.module(base, f"nn.Parameter({init})")

    def init(self, line: str) -> None:
        self.init_lines.append(line)

    def fwd(self, line: str) -> None:
        self.fwd_lines.append(line)

    def assign(self, expr: str, shape: Sequence[int], kind: str = "float", name: str = "x") -> _Var:
        self.fwd_lines.append(f"{name} = {expr}")
        return _Var(name, tuple(shape), kind)

    def input(self, name: str, shape: Sequence[int], gen: str = RANDN, kind: str = "float") -> _Var:
        shape = tuple(int(s) for s in shape)
        if any(s < 1 for s in shape):
            raise _Reject(f"input {name} has an empty dimension {shape}")
        self.inputs.append(_Input(name, shape, gen, kind))
        self.work += _numel(shape)
        return _Var(name, shape, kind, is_input=True)

    def set_gen(self, var: _Var, gen: str) -> bool:
        """Change how an input is drawn (e.g. positive values for ``log``); False if not an input."""
        if not var.is_input:
            return False
        for inp in self.inputs:
            if inp.name == var.name:
                inp.gen = gen
                return True
        return False

    def cost(self, n: int) -> None:
        self.work += int(n)

    def half_unsupported(self, what: str) -> None:
        if what not in self.no_half:
            self.no_half.append(what)


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


# --------------------------------------------------------------------------------------
# program types
# --------------------------------------------------------------------------------------

@dataclass(frozen=True)
class ProgramType:
    """A program type: a recipe (chain of component names) or a random composition.

    Calling it (``PROGRAM_TYPES[name](rng, dtype, budget)``) generates one program's source.
    """

    name: str
    category: str
    family: str
    recipe: tuple = ()
    random_head: str = ""
    random_len: int = 0
    description: str = ""

    def __call__(self, rng: random.Random | int, dtype: str = "float32", budget: int = DEFAULT_BUDGET,
                 *, seed: int | None = None) -> str:
        """Generate one program of this type (see :func:`generate_program`)."""
        return generate_program(self.name, rng, dtype, budget, seed=seed)

    @property
    def components(self) -> tuple:
        """The fixed component chain (empty for random compositions)."""
        return self.recipe


PROGRAM_TYPES: dict[str, ProgramType] = {}


def _type(name: str, category: str, family: str, recipe: Sequence[str] = (), *, head: str = "",
          length: int = 0, description: str = "") -> None:
    if name in PROGRAM_TYPES:
        raise RuntimeError(f"program type {name} registered twice")
    if not re.fullmatch(r"[A-Za-z][A-Za-z0-9_]*", name):
        raise RuntimeError(f"bad program type name {name!r}")
    for c in recipe:
        if c not in COMPONENTS:
            raise RuntimeError(f"program type {name}: unknown component {c}")
    PROGRAM_TYPES[name] = ProgramType(name, category, family, tuple(recipe), head, length, description)


# single operators: every non-mixing-only op and every head is a level-1 style type
_SINGLE_SKIP = {"BatchNorm", "InstanceNorm", "MaxPool", "AvgPool", "Gemm", "Matmul", "BMM",
                "MatmulSoftmaxHead", "MatmulScaleSoftmaxHead", "SwiGLU", "FFNResidual", "ResidualAdd",
                "BiasAdd", "Multiply", "ScaledDotProductAttention", "ScaledDotProductAttentionCausal",
                "Attention", "CausalAttention", "MultiHeadAttention", "MultiHeadAttentionSDPA",
                "CausalMultiHeadAttention", "GroupedQueryAttention", "GroupedQueryAttentionCausal",
                "MultiQueryAttention", "MultiQueryAttentionCausal", "CrossAttention", "TransformerBlock"}
for _n, _c in COMPONENTS.items():
    if _n not in _SINGLE_SKIP:
        _type(_n, "single", _c.family, (_n,))
_type("Conv2dDepthwiseSeparable", "single", "conv", ("Conv2dDepthwise", "Conv2dPointwise"))

# popular blocks (paper §3.1: matmul + softmax, gemm + activation, attention, MLP)
_BLOCKS = {
    "MatmulSoftmax": ("MatmulSoftmaxHead",), "MatmulScaleSoftmax": ("MatmulScaleSoftmaxHead",),
    "GemmSoftmax": ("Gemm", "Softmax"), "GemmReLU": ("Gemm", "ReLU"), "GemmGELU": ("Gemm", "GELU"),
    "GemmSiLU": ("Gemm", "SiLU"), "GemmTanh": ("Gemm", "Tanh"), "GemmSigmoid": ("Gemm", "Sigmoid"),
    "MLP": ("Gemm", "ReLU", "Gemm"), "MLPGELU": ("Gemm", "GELU", "Gemm"),
    "DeepMLP": ("Gemm", "ReLU", "Gemm", "ReLU", "Gemm"), "SwiGLU": ("SwiGLU",), "FFNResidual": ("FFNResidual",),
    "GemmCrossEntropy": ("Gemm", "CrossEntropyLoss"), "GemmMSELoss": ("Gemm", "MSELoss"),
    "ScaledDotProductAttention": ("ScaledDotProductAttention",),
    "ScaledDotProductAttentionCausal": ("ScaledDotProductAttentionCausal",),
    "Attention": ("Attention",), "CausalAttention": ("CausalAttention",),
    "MultiHeadAttention": ("MultiHeadAttention",), "MultiHeadAttentionSDPA": ("MultiHeadAttentionSDPA",),
    "CausalMultiHeadAttention": ("CausalMultiHeadAttention",), "GroupedQueryAttention": ("GroupedQueryAttention",),
    "GroupedQueryAttentionCausal": ("GroupedQueryAttentionCausal",), "MultiQueryAttention": ("MultiQueryAttention",),
    "MultiQueryAttentionCausal": ("MultiQueryAttentionCausal",), "CrossAttention": ("CrossAttention",),
    "TransformerBlock": ("TransformerBlock",),
}
for _n, _r in _BLOCKS.items():
    _type(_n, "block", COMPONENTS[_r[0]].family if len(_r) == 1 else "block", _r)

# KernelBench level-2 style chains (2-5 components); the type name is the chain
_COMPOSITES = """
Conv2d ReLU BiasAdd | ConvTranspose2d BiasAdd Clamp Scale Divide | Conv2d Mish Mish | ConvTranspose2d Subtract Tanh
Conv3d Softmax MaxPool MaxPool | Conv3d ReLU LeakyReLU GELU Sigmoid | Conv3d Divide Max GlobalAvgPool BiasAdd
Gemm Scale LeakyReLU | ConvTranspose2d MaxPool HardTanh Mean Tanh | ConvTranspose2d BatchNorm Tanh MaxPool GroupNorm
ConvTranspose3d Mean AddConst Softmax Tanh | Gemm Divide Sum Scale | ConvTranspose3d BatchNorm Subtract
ConvTranspose2d Mish AddConst HardTanh Scale | Conv2d InstanceNorm Divide | ConvTranspose2d GELU GroupNorm
ConvTranspose3d BiasAdd ResidualAdd Multiply ResidualAdd | Conv2d AddConst Scale Sigmoid GroupNorm
Gemm Scale ResidualAdd Clamp LogSumExp | Conv3d GroupNorm Mean | Conv3d Min Softmax | Conv2d Min Tanh Tanh
ConvTranspose3d AddConst HardSwish | Conv3d HardSwish GroupNorm Mean | Gemm Mish Mish | Gemm GroupNorm HardTanh
Conv2d ClampMax AddConst Multiply | Conv2d Scale Min | Gemm Multiply BatchNorm | ConvTranspose3d LayerNorm GELU Scale
Conv2d Subtract HardSwish MaxPool Mish | ConvTranspose2d Min Sum GELU AddConst | Gemm Swish BiasAdd GroupNorm
ConvTranspose3d AvgPool Clamp Softmax Scale | Gemm Scale ResidualAdd | Gemm BatchNorm GELU ReLU
ConvTranspose2d GlobalAvgPool BiasAdd LogSumExp Sum | Conv3d Max LogSumExp ReLU | Gemm Sigmoid LogSumExp
Conv2d Subtract Tanh Subtract AvgPool | Conv3d Mish Tanh | Conv3d Scale Tanh Multiply Sigmoid
ConvTranspose3d Softmax Sigmoid | ConvTranspose3d Scale AvgPool BiasAdd Scale | Gemm Subtract Mean LogSumExp GELU
Conv2d Mish BatchNorm | Gemm Scale HardTanh GELU | Conv2d Multiply LeakyReLU GELU | Gemm Sigmoid Sum
Conv2d ReLU HardSwish | ConvTranspose3d LogSumExp HardSwish Subtract Clamp | Gemm Swish Scale
ConvTranspose3d Swish GroupNorm HardSwish | ConvTranspose3d ReLU GroupNorm | Gemm GroupNorm LeakyReLU Sum
Gemm ReLU Divide | Gemm LogSumExp LeakyReLU GELU | Conv2d AvgPool Sigmoid Sum | Gemm Dropout Softmax
Conv2d GELU GlobalAvgPool | Gemm ClampMax Subtract | Conv2d HardSwish ReLU | Gemm Sigmoid Scale ResidualAdd
Conv2d Divide LeakyReLU | ConvTranspose3d BatchNorm AvgPool AvgPool | Conv2d BatchNorm Scale
ConvTranspose3d LeakyReLU Multiply LeakyReLU Max | Gemm GroupNorm ClampMax BiasAdd | Gemm BiasAdd ReLU
ConvTranspose3d Scale BatchNorm GlobalAvgPool | ConvTranspose3d MaxPool MaxPool Sum
Conv3d Multiply InstanceNorm Clamp Multiply | Gemm Max Subtract GELU | Gemm Swish Divide Clamp Tanh
Conv2d Tanh Scale BiasAdd MaxPool | Conv3d GroupNorm ClampMax Clamp Dropout | Gemm BatchNorm Scale Softmax
Conv2d GroupNorm Scale MaxPool Clamp | Gemm Divide GELU | Conv2d Subtract Subtract Mish
Gemm GroupNorm Swish Multiply Swish | ConvTranspose3d MaxPool Softmax Subtract Swish
Conv3d LeakyReLU Sum Clamp GELU | ConvTranspose2d Softmax BiasAdd Scale Sigmoid
Conv2d GroupNorm Tanh HardSwish ResidualAdd | ConvTranspose2d AddConst ClampMax GELU Scale
Gemm BiasAdd HardTanh Mish GroupNorm | Gemm AddConst Swish Tanh GELU | ConvTranspose3d Multiply Max GlobalAvgPool Clamp
Gemm BatchNorm BiasAdd Divide Swish | Gemm GELU Softmax | Gemm Subtract Multiply ReLU | ConvTranspose3d Clamp Divide
Conv2d Flatten Gemm | Conv2d ReLU MaxPool Flatten Gemm | Conv1d ReLU MaxPool | Conv1d GELU LayerNorm
BMM Scale Softmax | BMM InstanceNorm ResidualAdd Multiply | Gemm Gemm | Gemm LayerNorm GELU | Gemm RMSNorm SiLU
Matmul Mish Mish | Matmul Scale ResidualAdd | Matmul GELU Softmax | Conv2d BatchNorm ReLU MaxPool
Conv2d ReLU GlobalAvgPool Flatten Gemm | ConvTranspose1d Tanh BiasAdd | Conv3d Softplus L2Norm
Gemm LogSoftmax | Conv2d LayerNorm ReLU | ConvTranspose2d RMSNorm GELU
"""
for _chain in (c.split() for c in _COMPOSITES.replace("\n", "|").split("|") if c.strip()):
    _type("_".join(_chain), "composite", "composite", _chain)

# random compositions (paper §3.1: "sampling and assembling 2-5 components")
_RANDOM_HEADS = ("Gemm", "Conv2d", "Conv3d", "ConvTranspose2d", "Input")
for _len in (2, 3, 4, 5):
    for _h in _RANDOM_HEADS:
        _type(f"Random{_len}_{_h}", "random", "random", head=_h, length=_len)


# --------------------------------------------------------------------------------------
# building a program
# --------------------------------------------------------------------------------------

def _build(pt: ProgramType, b: _Builder) -> _Var:
    b.begin()
    b.single = pt.category == "single"
    if pt.category == "random":
        return _build_random(pt, b)
    x: _Var | None = None
    first = COMPONENTS[pt.recipe[0]]
    if first.kind == "op":
        b.scope = "c0."
        x = _input_head(b, first.ranks)
        b.trace.append(("input", x.shape))
    for i, name in enumerate(pt.recipe):
        b.scope = f"c{i + 1}."
        comp = COMPONENTS[name]
        if x is not None and not comp.accepts(b, x, strict=False) and comp.name != "ResidualAdd":
            raise _Reject(f"{name} does not accept {x.shape}")
        x = comp.apply(b, x)
        b.trace.append((name, x.shape))
        if i == 0 and b.residual is None:
            b.residual = (len(b.fwd_lines), x.shape)
    assert x is not None
    return x


_MIXABLE = tuple(sorted(n for n, c in COMPONENTS.items() if c.mix))


def _build_random(pt: ProgramType, b: _Builder) -> _Var:
    n_ops = pt.random_len
    b.scope = "c0."
    if pt.random_head == "Input":
        x = _input_head(b, (2, 3, 4))
        b.trace.append(("input", x.shape))
    else:
        head = COMPONENTS[pt.random_head]
        x = _input_head(b, head.ranks) if head.kind == "op" else None
        b.scope = "c1."
        x = head.apply(b, x)
        b.trace.append((head.name, x.shape))
        b.residual = (len(b.fwd_lines), x.shape)
        n_ops -= 1
    last = ""
    for i in range(n_ops):
        b.scope = f"r{i}."
        cands = [n for n in _MIXABLE if COMPONENTS[n].accepts(b, x) and n != last]
        name = b.pick_fixed("op", cands)
        comp = COMPONENTS[name]
        if not comp.accepts(b, x):
            raise _Reject(f"{name} no longer fits {x.shape}")
        x = comp.apply(b, x)
        b.trace.append((name, x.shape))
        if b.residual is None:
            b.residual = (len(b.fwd_lines), x.shape)
        last = name
    return x


def _plan(pt: ProgramType, rng: random.Random, budget: int) -> tuple[_Builder, _Var]:
    """Draw sizes, then halve drawn sizes until the estimated work fits the budget."""
    last_err = "?"
    for _attempt in range(_MAX_ATTEMPTS):
        b = _Builder(rng, budget)
        try:
            out = _build(pt, b)
        except _Reject as e:
            last_err = str(e)
            continue
        frozen: set[str] = set()
        while b.work > budget:
            keys = sorted(k for k, lo in b.lo.items() if b.values[k] > lo and k not in frozen)
            if not keys:
                break
            # larger sizes shrink first (weight log(v)^2), so small drawn sizes tend to stay
            weights = [math.log(b.values[k] + 1) ** 2 for k in keys]
            u = rng.random() * sum(weights)
            for k, w in zip(keys, weights):
                u -= w
                if u <= 0:
                    break
            old = b.values[k]
            b.values[k] = max(b.lo[k], old // 2)
            try:
                out = _build(pt, b)
            except _Reject:
                b.values[k] = old
                frozen.add(k)
                out = _build(pt, b)
        if b.work <= budget:
            return b, out
        last_err = f"smallest shapes need {b.work} > budget {budget}"
    raise CorpusError(f"{pt.name}: cannot draw a program within budget {budget} ({last_err})")


def _norm_dtype(dtype: Any) -> str:
    key = str(dtype).replace("torch.", "").lower()
    if key not in _DTYPE_ALIASES:
        raise CorpusError(f"unknown dtype {dtype!r}: expected one of {', '.join(DTYPES)}")
    return _DTYPE_ALIASES[key]


def _render(pt: ProgramType, b: _Builder, out: _Var, *, seed: int | None, requested: str, budget: int) -> str:
    dtype = requested
    fallback = ""
    if requested == "float16" and b.no_half:
        dtype = "float32"
        fallback = f" ({', '.join(b.no_half)} has no float16 CPU kernel in PyTorch)"
    comps = [n for n, _ in b.trace]
    L: list[str] = []
    L.append(f"{_HEADER_TAG} (generated by steptp.dataset.corpus; do not edit)")
    L.append(f"# type: {pt.name}")
    L.append(f"# category: {pt.category}")
    L.append(f"# family: {pt.family}")
    L.append(f"# components: {' -> '.join(c for c in comps if c != 'input')}")
    L.append(f"# seed: {seed if seed is not None else 'none'}")
    L.append(f"# dtype: {dtype}")
    L.append(f"# requested_dtype: {requested}{fallback}")
    L.append(f"# budget: {budget}")
    L.append(f"# work: {b.work}")
    L.append("# inputs: " + ", ".join(
        f"{i.name} {_tup(i.shape)} {dtype if i.kind == 'float' else ('int64' if i.kind == 'long' else 'bool')}"
        for i in b.inputs))
    L.append("# shapes: " + " | ".join(f"{n} {_tup(s) if s else '()'}" for n, s in b.trace))
    okind = {"float": dtype, "long": "int64", "bool": "bool"}[out.kind]
    L.append(f"# output: {_tup(out.shape) if out.shape else '()'} {okind}")
    L.append("import torch")
    L.append("import torch.nn as nn")
    L.append("import torch.nn.functional as F")
    L.append("")
    L.append(f"DTYPE = torch.{dtype}")
    L.append("")
    L.append("")
    L.append("class Model(nn.Module):")
    desc = " -> ".join(c for c in comps if c != "input")
    L.append(f'    """{pt.name}: {desc}."""')
    L.append("")
    L.append("    def __init__(self):")
    L.append("        super(Model, self).__init__()")
    for line in b.init_lines:
        L.append(f"        {line}")
    if b.has_state:
        L.append("        self.to(DTYPE)")
    L.append("")
    L.append(f"    def forward(self, {', '.join(i.name for i in b.inputs)}):")
    body = list(b.fwd_lines)
    if body and body[-1].startswith(f"{out.name} = "):
        last = body.pop()
        body.append("return " + last[len(out.name) + 3:])
    else:
        body.append(f"return {out.name}")
    for line in body:
        L.append(f"        {line}")
    L.append("")
    L.append("")
    L.append("def get_inputs():")
    for i in b.inputs:
        L.append(f"    {i.name} = " + i.gen.format(shape=_args(i.shape), tuple=_tup(i.shape)))
    L.append(f"    return [{', '.join(i.name for i in b.inputs)}]")
    L.append("")
    L.append("")
    L.append("def get_init_inputs():")
    L.append("    return []")
    return "\n".join(L) + "\n"


def generate_program(type_name: str, rng: random.Random | int, dtype: str = "float32",
                     budget: int = DEFAULT_BUDGET, *, seed: int | None = None) -> str:
    """Generate the Python source of one program of type ``type_name``.

    ``rng`` is a ``random.Random`` (consumed) or an int seed (then it is also the recorded
    seed). ``dtype`` is ``float16``/``float32``/``float64`` (aliases ``f16``... accepted);
    float16 falls back to float32 when a component has no float16 CPU kernel. ``budget`` bounds
    the estimated work (FLOPs + input elements). ``seed`` is only recorded in the header.
    Deterministic: the same arguments give the same text. Raises :class:`CorpusError` for an
    unknown type or dtype, or a budget too small for the type's smallest shapes.
    """
    if type_name not in PROGRAM_TYPES:
        raise CorpusError(f"unknown program type {type_name!r} ({len(PROGRAM_TYPES)} types known)")
    requested = _norm_dtype(dtype)
    if isinstance(rng, int) and not isinstance(rng, bool):
        seed = rng if seed is None else seed
        rng = random.Random(rng)
    if not isinstance(rng, random.Random):
        raise CorpusError("rng must be a random.Random or an int seed")
    budget = int(budget)
    if budget < 1:
        raise CorpusError("budget must be positive")
    pt = PROGRAM_TYPES[type_name]
    b, out = _plan(pt, rng, budget)
    return _render(pt, b, out, seed=seed, requested=requested, budget=budget)


def program_seed(seed: int, index: int, salt: str = "program") -> int:
    """The seed of program ``index`` in a corpus generated with ``seed`` (32-bit, stable)."""
    h = hashlib.sha256(f"stp-corpus:{salt}:{seed}:{index}".encode()).digest()
    return int.from_bytes(h[:4], "big")


def _type_order(names: list[str], seed: int, count: int) -> list[str]:
    out: list[str] = []
    rnd = 0
    while len(out) < count:
        r = random.Random(program_seed(seed, rnd, "order"))
        perm = list(names)
        for i in range(len(perm) - 1, 0, -1):       # Fisher-Yates on rng.random() only
            j = _index(r.random(), i + 1)
            perm[i], perm[j] = perm[j], perm[i]
        out.extend(perm)
        rnd += 1
    return out[:count]


def generate_corpus(outdir: str | Path, count: int, seed: int = 0, budget: int = DEFAULT_BUDGET,
                    types: Iterable[str] | None = None, *, dtypes: Sequence[str] | None = None) -> list[Path]:
    """Write ``count`` programs to ``outdir`` and return their paths (in order).

    Types are taken round-robin in a seeded shuffle of ``types`` (default: all of
    :data:`PROGRAM_TYPES`), so ``count >= len(types)`` covers every type. Program ``i`` is
    ``outdir/{i:05d}_{type}.py``, generated with seed :func:`program_seed` ``(seed, i)`` and a
    dtype drawn from ``dtypes`` (default float16/32/64 weighted by :data:`DTYPE_WEIGHTS`).
    Also writes ``outdir/corpus.json`` (arguments and one line per program) and removes corpus
    programs left in ``outdir`` by an earlier run that this one did not write (other files are
    never touched). Same arguments, byte-identical files.
    """
    if count < 0:
        raise CorpusError("count must be >= 0")
    names = sorted(PROGRAM_TYPES) if types is None else list(dict.fromkeys(types))
    for n in names:
        if n not in PROGRAM_TYPES:
            raise CorpusError(f"unknown program type {n!r}")
    if not names:
        raise CorpusError("no program types selected")
    if dtypes is None:
        choices, weights = list(DTYPES), list(DTYPE_WEIGHTS)
    else:
        choices = [_norm_dtype(d) for d in dtypes]
        weights = [1.0] * len(choices)
    out = Path(outdir)
    out.mkdir(parents=True, exist_ok=True)
    order = _type_order(names, seed, count)
    paths: list[Path] = []
    manifest = []
    for i, tname in enumerate(order):
        pseed = program_seed(seed, i)
        u = random.Random(program_seed(seed, i, "dtype")).random() * sum(weights)
        dtype = choices[-1]
        for c, w in zip(choices, weights):
            u -= w
            if u < 0:
                dtype = c
                break
        src = generate_program(tname, pseed, dtype, budget)
        p = out / f"{i:05d}_{tname}.py"
        p.write_text(src)
        paths.append(p)
        manifest.append({"file": p.name, "type": tname, "category": PROGRAM_TYPES[tname].category,
                         "seed": pseed, "dtype": dtype})
    keep = {p.name for p in paths}
    for stale in sorted(out.glob("*.py")):      # programs of an earlier, larger run in the same dir
        if stale.name not in keep and re.fullmatch(r"\d{5,}_\w+\.py", stale.name):
            with stale.open() as fh:
                if fh.read(len(_HEADER_TAG)) == _HEADER_TAG:
                    stale.unlink()
    (out / "corpus.json").write_text(json.dumps(
        {"seed": seed, "count": count, "budget": budget, "types": len(names), "programs": manifest},
        indent=1) + "\n")
    return paths


def parse_header(source: str | Path) -> dict:
    """The ``# key: value`` header of a corpus program (from its text or path) as a dict.

    ``seed``, ``budget`` and ``work`` become ints; ``components`` a list. Empty dict when
    the text is not a corpus program.
    """
    text = source.read_text() if isinstance(source, Path) else str(source)
    if not text.startswith(_HEADER_TAG):
        if "\n" not in text and Path(text).exists():
            text = Path(text).read_text()
        if not text.startswith(_HEADER_TAG):
            return {}
    info: dict[str, Any] = {}
    for line in text.splitlines()[1:]:
        m = re.match(r"# (\w+): (.*)$", line)
        if not m:
            break
        info[m.group(1)] = m.group(2)
    for k in ("seed", "budget", "work"):
        if k in info and info[k].lstrip("-").isdigit():
            info[k] = int(info[k])
    info["components"] = [c for c in info.get("components", "").split(" -> ") if c]
    if "requested_dtype" in info:
        info["requested_dtype"] = info["requested_dtype"].split()[0]
    return info


# --------------------------------------------------------------------------------------
# verification through the translator
# --------------------------------------------------------------------------------------

_OP_PATTERNS = (
    re.compile(r"\bop(?:erator)?\s*[`'\"]([\w.:<>-]+)[`'\"]", re.I),
    re.compile(r"\bunsupported (?:op|operator|function|method|module)\s*[:=]?\s*[`'\"]?([\w.:<>-]+)", re.I),
    re.compile(r"\b(?:op|operator|target)\s*[:=]\s*[`'\"]?([\w.:<>-]+)", re.I),
)


def _failure_op(exc: BaseException) -> str:
    for attr in ("op", "op_name", "target", "operator"):
        v = getattr(exc, attr, None)
        if v:
            return str(v)
    msg = str(exc)
    for pat in _OP_PATTERNS:
        m = pat.search(msg)
        if m:
            return m.group(1)
    return type(exc).__name__


def _short(msg: str, n: int = 200) -> str:
    """First line of a failure message, with paths and standalone numbers normalized."""
    lines = str(msg).strip().splitlines()
    msg = " ".join(lines[0].split()) if lines else ""
    msg = re.sub(r"[^\s'\"]*/[^\s'\"]+", "<path>", msg)        # paths differ per program
    msg = re.sub(r"(?<![\w.])[-+]?\d+(?:\.\d+)?(?:e[-+]?\d+)?(?![\w.])", "N", msg)
    return msg[:n]


def _verify_one(path: str, trials: int, seed: int, verify_kwargs: dict | None = None) -> dict:
    info = parse_header(Path(path))
    rec: dict[str, Any] = {"path": str(path), "type": info.get("type", Path(path).stem),
                           "category": info.get("category", "?"), "dtype": info.get("dtype", "?"),
                           "components": info.get("components", []), "ok": False}
    t0 = time.perf_counter()
    try:
        from steptp.frontend import translate_file  # type: ignore[attr-defined]
    except Exception as e:  # translator not there (yet)
        rec.update(stage="import", op="translator", reason=f"{type(e).__name__}: {e}")
        return rec
    try:
        tr = translate_file(Path(path))
    except Exception as e:
        rec.update(stage="translate", op=_failure_op(e), reason=f"{type(e).__name__}: {e}")
        rec["seconds"] = round(time.perf_counter() - t0, 3)
        return rec
    try:
        res = tr.verify(trials=trials, seed=seed, **(verify_kwargs or {}))
    except Exception as e:
        rec.update(stage="verify", op=_failure_op(e), reason=f"{type(e).__name__}: {e}")
        rec["seconds"] = round(time.perf_counter() - t0, 3)
        return rec
    rec["seconds"] = round(time.perf_counter() - t0, 3)
    if getattr(res, "equal", False):
        rec["ok"] = True
        return rec
    stage = "mismatch"
    for name in ("build", "exec"):
        if hasattr(res, name) and not getattr(res, name):
            stage = name
            break
    reason = getattr(res, "reason", "") or ""
    err = getattr(res, "max_abs_err", None)
    if not reason and err is not None:
        reason = f"max_abs_err {err:.3g}, max_rel_err {getattr(res, 'max_rel_err', float('nan')):.3g}"
    rec.update(stage=stage, op="+".join(rec["components"]) if stage == "mismatch" else stage, reason=reason)
    return rec


def verify_corpus(paths: Iterable[str | Path], *, trials: int = 3, seed: int = 0, workers: int = 1,
                  progress: Callable[[int, int, dict], None] | None = None,
                  verify_kwargs: dict | None = None) -> dict:
    """Translate and verify corpus programs with ``steptp.frontend.translate_file``.

    For each path: ``translate_file(path)`` then ``.verify(trials=trials, seed=seed,
    **verify_kwargs)``; a program succeeds when the result's ``equal`` is true. ``workers > 1``
    runs programs in spawned worker processes. ``progress(done, total, record)`` is called
    after each one. :func:`format_report` renders the result as text.

    Returns a JSON-serialisable report: ``total``, ``ok``, ``success_rate``, ``translated``
    (programs whose translation did not raise), ``by_category`` and ``by_dtype``
    (``{"total", "ok"}``), ``failures_by_op`` (op -> ``{"count", "stages", "types",
    "reasons" (normalized message -> count), "example"}``; the op is the one named by the
    translator's error, or for a numeric mismatch the program's component chain),
    ``failures`` (one record per failed program) and ``seconds``.
    """
    plist = [str(p) for p in paths]
    t0 = time.perf_counter()
    records: list[dict] = []
    if workers > 1 and len(plist) > 1:
        import multiprocessing as mp
        from concurrent.futures import ProcessPoolExecutor

        with ProcessPoolExecutor(max_workers=workers, mp_context=mp.get_context("spawn")) as ex:
            n = len(plist)
            for i, rec in enumerate(ex.map(_verify_one, plist, [trials] * n, [seed] * n, [verify_kwargs] * n)):
                records.append(rec)
                if progress:
                    progress(i + 1, len(plist), rec)
    else:
        for i, p in enumerate(plist):
            rec = _verify_one(p, trials, seed, verify_kwargs)
            records.append(rec)
            if progress:
                progress(i + 1, len(plist), rec)
    return _report(records, time.perf_counter() - t0)


def _report(records: list[dict], seconds: float) -> dict:
    def tally(key: str) -> dict:
        out: dict[str, dict] = {}
        for r in records:
            d = out.setdefault(str(r.get(key)), {"total": 0, "ok": 0})
            d["total"] += 1
            d["ok"] += bool(r["ok"])
        return dict(sorted(out.items()))

    by_op: dict[str, dict] = {}
    for r in records:
        if r["ok"]:
            continue
        g = by_op.setdefault(r.get("op", "?"), {"count": 0, "stages": {}, "types": [], "reasons": {},
                                                "example": r["path"]})
        g["count"] += 1
        g["stages"][r.get("stage", "?")] = g["stages"].get(r.get("stage", "?"), 0) + 1
        if r["type"] not in g["types"]:
            g["types"].append(r["type"])
        reason = _short(r.get("reason", ""))
        g["reasons"][reason] = g["reasons"].get(reason, 0) + 1
    for g in by_op.values():
        g["types"].sort()
        g["reasons"] = dict(sorted(g["reasons"].items(), key=lambda kv: (-kv[1], kv[0])))
    total = len(records)
    ok = sum(bool(r["ok"]) for r in records)
    return {
        "total": total,
        "ok": ok,
        "success_rate": round(ok / total, 4) if total else 0.0,
        "translated": sum(r.get("stage") not in ("translate", "import") for r in records),
        "by_category": tally("category"),
        "by_dtype": tally("dtype"),
        "failures_by_op": dict(sorted(by_op.items(), key=lambda kv: (-kv[1]["count"], kv[0]))),
        "failures": [r for r in records if not r["ok"]],
        "seconds": round(seconds, 2),
    }


def format_report(report: dict, max_reasons: int = 2) -> str:
    """A human-readable summary of a :func:`verify_corpus` report (success rate, per category
    and dtype, failures grouped by op with their most common reasons)."""
    lines = [f"verified {report['ok']}/{report['total']} programs "
             f"({100 * report['success_rate']:.1f}%), translated {report['translated']}, "
             f"{report['seconds']:.1f}s"]
    for key in ("by_category", "by_dtype"):
        parts = [f"{k} {v['ok']}/{v['total']}" for k, v in report[key].items()]
        lines.append(f"  {key[3:]}: " + ", ".join(parts))
    if report["failures_by_op"]:
        lines.append("failures by op:")
    for op, g in report["failures_by_op"].items():
        stages = ", ".join(f"{k} {v}" for k, v in g["stages"].items())
        types = ", ".join(g["types"][:6]) + (" ..." if len(g["types"]) > 6 else "")
        lines.append(f"  {g['count']:4d}  {op}  [{stages}]  types: {types}")
        for r in list(g["reasons"])[:max_reasons]:
            lines.append(f"          {r}")
    return "\n".join(lines)
