"""Corpus settings (budgets, dtypes, categories), the deterministic draws (only
``rng.random()``) and the :class:`_Builder` that records named sizes, emits a program's code
and sums its estimated work."""

from __future__ import annotations

import math
import random
import re
from dataclasses import dataclass
from typing import Any, Sequence


#: default per-program work budget (estimated FLOPs + input elements): CPU-verifiable quickly
DEFAULT_BUDGET = 1 << 20
#: the ``--gpu`` budget. A budget at least this large also selects the *GPU sizing*
#: (:func:`~steptp.dataset.corpus.render.eager_estimate_us`): drawn sizes are then doubled or
#: halved until a program's estimated PyTorch-eager time on an H200 lies in
#: :data:`GPU_TARGET_US` (the field's 0.1-15 ms, KernelBench), no tensor over
#: :data:`GPU_MAX_BYTES`. 2^38 leaves room for an f16 GEMM of ~0.5 ms on tensor cores.
GPU_BUDGET = 1 << 38
#: estimated eager time (µs, H200) the GPU sizing aims at: inside the field's 0.1-15 ms with a
#: margin for the estimate's error (a factor of 2-3: benchmarks/gpu_corpus_sizes.py)
GPU_TARGET_US = (500.0, 3000.0)
#: largest tensor (bytes) the GPU sizing lets a program have: 1 GiB
GPU_MAX_BYTES = 1 << 30
#: the GPU sizing may grow a size drawn with a maximum of at least 256 (a length, a feature
#: count: not a head or group count) past that maximum, up to this (KernelBench's resized level-1
#: problems use rows of 393,216 elements; a 1-D input needs more); :data:`GPU_MAX_BYTES` binds first
GPU_MAX_DIM = 1 << 28
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


def _module_weight(ctor: str) -> int:
    """Elements of the weight an ``nn.Linear(I, O...)`` or ``nn.Conv*(C, Co, kernel_size=K...)``
    constructor creates (``C * Co / groups * prod(K)``); 0 for other modules (norms, pools: at
    most a channel vector)."""
    m = re.match(r"nn\.Linear\((\d+), (\d+)", ctor)
    if m:
        return int(m.group(1)) * int(m.group(2))
    m = re.match(r"nn\.Conv(?:Transpose)?\dd\((\d+), (\d+), kernel_size=(\d+|\([\d, ]+\))", ctor)
    if m:
        nd = int(re.search(r"(\d)d\(", ctor).group(1))
        k = [int(v) for v in re.findall(r"\d+", m.group(3))]
        kvol = _numel(k if len(k) > 1 else k * nd)
        g = re.search(r"groups=(\d+)", ctor)
        return int(m.group(1)) * int(m.group(2)) // (int(g.group(1)) if g else 1) * kvol
    return 0


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
        self.hi: dict[str, int] = {}          # ... and their maximum (the GPU sizing grows them up to it)
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
        self.parts: list[tuple[int, int]] = []  # per component: (work, elements read + written)
        self.weights: list[int] = []            # elements of each parameter tensor (the GPU sizing's cap)
        self.temps: list[int] = []              # elements of large intermediates inside a component
        self.traffic = 0                        # elements those intermediates move (all passes)

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
            self.hi[key] = hi
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
        self.weights.append(_module_weight(ctor))
        return f"self.{name}"

    def param(self, base: str, shape: Sequence[int], scale: float | None = None) -> str:
        init = f"torch.randn({_tup(shape)})"
        if scale is not None:
            init += f" * {_num(scale)}"
        self.work += _numel(shape)
        out = self.module(base, f"nn.Parameter({init})")
        self.weights[-1] = _numel(shape)
        return out

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

    def temp(self, numel: int, passes: int = 1) -> None:
        """A large intermediate inside a component (attention scores): its elements count in the
        GPU sizing's size cap, ``passes x numel`` in the component's memory traffic."""
        self.temps.append(int(numel))
        self.traffic += int(numel) * passes

    def half_unsupported(self, what: str) -> None:
        if what not in self.no_half:
            self.no_half.append(what)
