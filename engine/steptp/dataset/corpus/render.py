"""Building one program: a program type's recipe applied component by component under the work
budget (drawn sizes halved until the estimated work fits), and rendering the KernelBench-
style file with its header (:class:`ProgramType`, :func:`program_source`)."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Any

from .builder import (_args, _Builder, CorpusError, DEFAULT_BUDGET, _DTYPE_ALIASES, DTYPES, GPU_BUDGET,
                      GPU_MAX_BYTES, GPU_MAX_DIM, GPU_TARGET_US, _HEADER_TAG, _MAX_ATTEMPTS, _numel, _Reject,
                      _tup, _Var)
from .components import COMPONENTS, _input_head
# registered, in this order, before _MIXABLE reads COMPONENTS
from . import layers, heads  # noqa: E402,F401,I001




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
        """Generate one program of this type (see :func:`~steptp.dataset.corpus.generate_program`)."""
        return program_source(self, rng, dtype, budget, seed=seed)

    @property
    def components(self) -> tuple:
        """The fixed component chain (empty for random compositions)."""
        return self.recipe


# --------------------------------------------------------------------------------------
# building a program
# --------------------------------------------------------------------------------------

def _apply(b: _Builder, comp, x: _Var | None) -> _Var:
    """``comp.apply`` recording the component's work and the elements it reads and writes
    (the running tensor, or the inputs a head creates, plus its result and the traffic of its
    large intermediates, :meth:`_Builder.temp`) in ``b.parts``."""
    w0, n0, t0 = b.work, len(b.inputs), b.traffic
    out = comp.apply(b, x)
    read = _numel(x.shape) if x is not None else sum(_numel(i.shape) for i in b.inputs[n0:])
    b.parts.append((b.work - w0, read + _numel(out.shape) + b.traffic - t0))
    return out


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
        x = _apply(b, comp, x)
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
        x = _apply(b, head, x)
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
        x = _apply(b, comp, x)
        b.trace.append((name, x.shape))
        if b.residual is None:
            b.residual = (len(b.fwd_lines), x.shape)
        last = name
    return x


def _plan(pt: ProgramType, rng: random.Random, budget: int, dtype: str = "float32") -> tuple[_Builder, _Var]:
    """Draw sizes, then halve drawn sizes until the estimated work fits the budget; with a GPU
    budget (``budget >= GPU_BUDGET``) then fit the estimated eager time (:func:`_fit_gpu`)."""
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
            if budget >= GPU_BUDGET:
                out = _fit_gpu(pt, b, rng, budget, _effective_dtype(dtype, b))
            return b, out
        last_err = f"smallest shapes need {b.work} > budget {budget}"
    raise CorpusError(f"{pt.name}: cannot draw a program within budget {budget} ({last_err})")


# --------------------------------------------------------------------------------------
# GPU sizing: an estimate of PyTorch eager's time on an H200, and the fit to GPU_TARGET_US
# --------------------------------------------------------------------------------------

_H200_DRAM = 4.8e12                 # bytes/s (NVIDIA H200 datasheet; steptp.roofline.GPUS["h200"])
_EFF_MEMORY, _EFF_COMPUTE = 0.7, 0.5
#: dtype -> (SIMT FLOP/s, GEMM-like FLOP/s) of the H200 (steptp.roofline's table: FP16 non-tensor
#: 133.8 / tensor 989.4, FP32 66.9, FP64 33.5 / tensor 66.9 TFLOPS). float32 GEMM-like work gets
#: 150 TFLOPS, between the FP32 pipe (matmul: no TF32 by default) and TF32 (494.7, which cuDNN
#: uses for float32 convolutions by default): the sizing cannot tell a matmul from a convolution.
_RATES = {"float16": (133.8e12, 989.4e12), "float32": (66.9e12, 150e12), "float64": (33.5e12, 66.9e12)}
_ITEMSIZE = {"float16": 2, "float32": 4, "float64": 8}
_HOST_US, _KERNEL_MIN_US = 5.0, 2.0


def eager_estimate_us(parts, dtype: str) -> float:
    """Estimated PyTorch-eager time (µs, H200) of a program from its components' ``(work,
    elements read + written)`` (``_Builder.parts``): each component one kernel of
    ``max(2 µs, work / (0.5 x peak), bytes / (0.7 x DRAM bandwidth))``, the peak a GEMM's
    (tensor cores for float16/float64) when its work exceeds 16 per element moved, else the SIMT
    peak of ``dtype``; the program ``max(5 µs x components, sum of kernels)`` (the host side of
    eager runs ahead of the GPU). The same model as benchmarks/gpu_corpus_sizes.py, which traces
    the real ATen ops; this one sees components, not ops, and is good to a factor of 2-3."""
    simt, gemm = _RATES.get(dtype, _RATES["float32"])
    size = _ITEMSIZE.get(dtype, 4)
    kernels = 0.0
    for work, elems in parts:
        rate = gemm if work >= 16 * elems else simt
        kernels += max(_KERNEL_MIN_US, work / (_EFF_COMPUTE * rate) * 1e6,
                       elems * size / (_EFF_MEMORY * _H200_DRAM) * 1e6)
    return max(_HOST_US * len(parts), kernels)


def _effective_dtype(requested: str, b: _Builder) -> str:
    return "float32" if requested == "float16" and b.no_half else requested


def _too_big(b: _Builder, dtype: str) -> bool:
    """Whether an input, a weight, a component's result or a large intermediate is over
    :data:`GPU_MAX_BYTES`, or the inputs and weights together over twice that (they are all
    created on the host first)."""
    known = [_numel(i.shape) for i in b.inputs] + b.weights
    largest = max(known + [_numel(s) for _, s in b.trace if s] + b.temps + [1])
    size = _ITEMSIZE.get(dtype, 4)
    return largest * size > GPU_MAX_BYTES or sum(known) * size > 2 * GPU_MAX_BYTES


def _grow_cap(hi: int) -> int:
    """How far the GPU sizing may grow a size drawn with maximum ``hi`` (:data:`GPU_MAX_DIM`)."""
    return GPU_MAX_DIM if hi >= 256 else hi


def _fit_gpu(pt: ProgramType, b: _Builder, rng: random.Random, budget: int, dtype: str) -> _Var:
    """Double (or halve) drawn sizes, one at a time, until :func:`eager_estimate_us` lies in
    :data:`GPU_TARGET_US`, keeping the work within ``budget``, every tensor within
    :data:`GPU_MAX_BYTES` and every size between its draw's minimum and :func:`_grow_cap`.
    A size whose change breaks a constraint (a rejected shape, the budget, overshooting the
    range) is restored and frozen. Growth prefers the sizes furthest below their cap (log
    scale), so shapes stay balanced."""
    lo_us, hi_us = GPU_TARGET_US
    out = _build(pt, b)
    frozen: set[str] = set()
    for _step in range(400):
        t = eager_estimate_us(b.parts, dtype)
        big = _too_big(b, dtype)
        if lo_us <= t <= hi_us and not big:
            break
        grow = t < lo_us and not big
        if grow:
            keys = sorted(k for k in b.lo if k not in frozen and b.values[k] < _grow_cap(b.hi[k]))
            weights = [math.log((_grow_cap(b.hi[k]) + 1) / b.values[k]) + 1e-3 for k in keys]
        else:
            keys = sorted(k for k in b.lo if k not in frozen and b.values[k] > b.lo[k])
            weights = [math.log(b.values[k] + 1) ** 2 for k in keys]
        if not keys:
            break
        u = rng.random() * sum(weights)
        for k, w in zip(keys, weights):
            u -= w
            if u <= 0:
                break
        old = b.values[k]
        b.values[k] = min(_grow_cap(b.hi[k]), old * 2) if grow else max(b.lo[k], old // 2)
        try:
            out = _build(pt, b)
            ok = b.work <= budget and (not grow or (eager_estimate_us(b.parts, dtype) <= hi_us
                                                    and not _too_big(b, dtype)))
        except _Reject:
            ok = False
        if not ok:
            b.values[k] = old
            frozen.add(k)
            out = _build(pt, b)
    return out


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
    if budget >= GPU_BUDGET:
        L.append(f"# eager_estimate_us: {eager_estimate_us(b.parts, dtype):.0f} (GPU sizing, H200)")
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


def program_source(pt: ProgramType, rng: random.Random | int, dtype: str = "float32",
                   budget: int = DEFAULT_BUDGET, *, seed: int | None = None) -> str:
    """The Python source of one program of type ``pt`` (arguments as
    :func:`~steptp.dataset.corpus.generate_program`, which looks ``pt`` up by name).
    Raises :class:`CorpusError` for an unknown dtype or a budget too small for the type."""
    requested = _norm_dtype(dtype)
    if isinstance(rng, int) and not isinstance(rng, bool):
        seed = rng if seed is None else seed
        rng = random.Random(rng)
    if not isinstance(rng, random.Random):
        raise CorpusError("rng must be a random.Random or an int seed")
    budget = int(budget)
    if budget < 1:
        raise CorpusError("budget must be positive")
    b, out = _plan(pt, rng, budget, requested)
    return _render(pt, b, out, seed=seed, requested=requested, budget=budget)
