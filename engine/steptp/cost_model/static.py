"""A static cost model of a LEIR program: estimated run time in nanoseconds, from the
program text alone (no build, no run). Used by ``EnginePolicy(rank="cost")`` to order
candidates; it ranks, it does not predict absolute times.

For every equation instance (its enclosing loops give the iteration count ``n``):

* compute: ``n * ops / (freq * lanes)`` where ``ops`` counts arithmetic nodes (``+ - * /``
  = 1, ``// %`` = 4, ``exp log sqrt tanh erf **`` = 12, ``max min abs`` = 1, comparisons
  and ``if_then_else`` = 1) and ``lanes`` = min(extent, vector width) when the innermost
  loop is ``V`` (vector width = 32 bytes / dtype bytes on the CPU, AVX2; 1 on CUDA, where
  the SIMT lanes are the threads).
* latency (CPU): an accumulation ``X = X op f`` whose innermost loop is one of its
  reduction axes (the index is not in ``X``'s subscript) chains every iteration on the
  previous one (LLVM may not reassociate floating-point sums without fast-math), so it
  takes at least ``n * reduce_latency_cycles / freq`` (4 cycles: a floating-point add or
  FMA); a spatial innermost loop leaves the iterations independent.
* memory: every tensor access moves ``n * dtype_bytes * stride_factor / reuse`` bytes at
  the bandwidth of its scope (``g`` 20 GB/s on the CPU (one core's DRAM share), 50 GB/s
  when the elements the equation can touch (per access, the product of the extents of the
  loops its subscript uses) fit in 16 MiB (last-level cache) and 100 GB/s when they fit in
  1 MiB (L2); ``s``/``l`` treated as cache/registers: 4x and 16x faster). ``stride_factor``
  is 1 when the innermost loop index is in the last subscript (contiguous), 8 when it is in another
  subscript (one cache line of 64 B per element), and the access costs once per
  innermost-loop trip (``reuse`` = innermost extent) when the innermost index does not
  occur at all (register reuse).
* equation time = max(compute, latency, memory) (roofline), divided by the parallelism of its
  parallel loops: ``P`` loops (up to ``cores``). ``B`` loops are serial (the backend lowers
  them to serial loops on the CPU).
* overheads: 5 µs per entry of a ``P`` region (thread-pool fork/join) times the trip count of
  the loops around it, 20 ns per loop entry of an unrolled (``U``) loop saved (unrolling
  removes branch overhead).

A ``cuda`` target is estimated by the GPU model instead (:mod:`steptp.cost_model.gpu`: grid
from ``B`` loops, occupancy, serial work and latency per thread, coalescing, one launch per
top-level nest).

Sources: roofline model (Williams, Waterman, Patterson, CACM 2009); instruction latencies
(Agner Fog, "Instruction tables": FP add/FMA 3-4 cycles on current x86); target limits from
:mod:`steptp.backend.hardware` (CUDA) and ``TVM_NUM_THREADS`` (CPU threads of the timed
build, 1 unless set: :mod:`steptp.runner.timing`).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

from ..leir import ast as A
from ..leir.analysis import index_names, self_reference_kind
from ..roofline import GPUS
from .gpu import estimate_gpu_ns
from .opcount import _accesses, _ops  # noqa: F401  (re-exported: features.py reads them here)

@dataclass(frozen=True)
class Target:
    """What the cost model needs to know about a device: ``kind`` (cpu/cuda), ``cores``
    (CPU threads), ``freq_ghz``, ``vector_bytes`` (SIMD register), ``bw_gbs`` (global
    memory bandwidth available to the kernel), ``sms`` (CUDA multiprocessors)."""

    kind: str = "cpu"
    cores: int = 1
    freq_ghz: float = 2.5
    vector_bytes: int = 32
    bw_gbs: float = 20.0
    sms: int = GPUS["h100"].sms  # stp roofline's device table
    cache_gbs: float = 100.0
    cache_bytes: int = 1 << 20
    l3_gbs: float = 50.0
    l3_bytes: int = 16 << 20
    reduce_latency_cycles: float = 4.0

    @staticmethod
    def for_name(name: str) -> "Target":
        if name == "cuda":
            return Target("cuda", cores=1, freq_ghz=1.7, vector_bytes=4, bw_gbs=3000.0, sms=GPUS["h100"].sms)
        try:  # steptp.runner.timing runs TVM's CPU pool with TVM_NUM_THREADS threads (1 unless set)
            cores = max(1, int(os.environ.get("TVM_NUM_THREADS") or 1))
        except ValueError:
            cores = 1
        return Target("cpu", cores=cores)


def serial_chain(eq: A.Assign, loops: tuple[A.Loop, ...]) -> bool:
    """Whether consecutive iterations of the innermost loop of ``loops`` chain through the
    accumulator of ``eq``: ``eq`` accumulates (``X = X op f``,
    :func:`~steptp.leir.analysis.self_reference_kind`), the innermost loop is not ``V`` and its
    index is not in ``X``'s subscript (a reduction axis)."""
    if not loops or loops[-1].kind == "V" or self_reference_kind(eq) is None:
        return False
    return not any(loops[-1].var in index_names(i) for i in eq.target.indices)


def _footprint(eq: A.Assign, loops: tuple[A.Loop, ...]) -> int:
    """Bytes the equation can touch: per distinct access, the dtype size times the product
    of the extents of the loops whose index its subscript uses (an upper bound on the
    elements it reaches)."""
    total = 0
    for acc in {(a.name, a.indices): a for a in _accesses(eq)}.values():
        used = set().union(*[index_names(i) for i in acc.indices]) if acc.indices else set()
        total += A.DTYPE_BYTES.get(acc.dtype, 4) * math.prod(lp.extent for lp in loops if lp.var in used)
    return total


def estimate_ns(program: A.Program, target: Target | str = "cpu") -> float:
    """Estimated run time of ``program`` in nanoseconds on ``target`` (see the module
    docstring for the model); a ``cuda`` target is estimated by the GPU model
    (:func:`steptp.cost_model.gpu.estimate_gpu_ns`: threads and blocks from ``B`` loops,
    occupancy, serial work per thread, coalescing, one launch per nest)."""
    tgt = Target.for_name(target) if isinstance(target, str) else target
    if tgt.kind == "cuda":  # the GPU model: grid, occupancy, coalescing, launches
        return estimate_gpu_ns(program)
    total = 0.0
    for nest in program.nests:
        total += _nest_ns(nest, (), tgt)
    return total


def static_scores(base: A.Program, programs: list[A.Program], target: Target | str = "cpu") -> list[float]:
    """The static ranking, the one place it is computed: predicted ln speedup of each of
    ``programs`` over ``base``, ``ln((estimate_ns(base) + 1) / (estimate_ns(p) + 1))``
    (higher is better). Used by ``EnginePolicy(rank="cost")`` (cheapest candidates first)
    and by the static scorer (:class:`steptp.cost_model.learned.CostScorer`)."""
    b = estimate_ns(base, target) + 1.0
    return [math.log(b / (estimate_ns(p, target) + 1.0)) for p in programs]


def _nest_ns(nest: A.Nest, outer: tuple[A.Loop, ...], tgt: Target) -> float:
    loops = outer + nest.loops
    t = 0.0
    # parallel regions: fork/join overhead once per entry
    if tgt.kind == "cpu":
        trips = 1
        for lp in loops:
            if lp.kind == "P":
                t += 5000.0 * trips
                break
            trips *= lp.extent
    for lp in nest.loops:
        if lp.kind == "U":
            t -= 20.0 * math.prod(x.extent for x in loops)
    for item in nest.body:
        if isinstance(item, A.Assign):
            t += _eq_ns(item, loops, tgt)
        else:
            t += _nest_ns(item, loops, tgt)
    return max(t, 0.0)


def _eq_ns(eq: A.Assign, loops: tuple[A.Loop, ...], tgt: Target) -> float:
    n = math.prod(lp.extent for lp in loops) if loops else 1
    inner = loops[-1] if loops else None
    nbytes = A.DTYPE_BYTES.get(eq.target.dtype, 4)
    lanes = 1
    if inner is not None and inner.kind == "V" and tgt.kind == "cpu":
        lanes = max(1, min(inner.extent, tgt.vector_bytes // nbytes))
    compute_ns = n * _ops(eq.value) / (tgt.freq_ghz * lanes)
    if tgt.kind == "cpu" and serial_chain(eq, loops):  # one accumulator latency per iteration
        compute_ns = max(compute_ns, n * tgt.reduce_latency_cycles / tgt.freq_ghz)
    mem_ns = 0.0
    # GB/s = bytes/ns; an equation whose data fit in L2 (1 MiB) or the L3 (16 MiB) runs at its bandwidth
    bw = tgt.bw_gbs
    if tgt.kind == "cpu":
        fp = _footprint(eq, loops)
        bw = tgt.cache_gbs if fp <= tgt.cache_bytes else tgt.l3_gbs if fp <= tgt.l3_bytes else tgt.bw_gbs
    for acc in _accesses(eq):
        b = A.DTYPE_BYTES.get(acc.dtype, 4)
        scope_speed = {"g": 1.0, "s": 4.0, "l": 16.0}.get(acc.scope, 1.0)
        if not acc.indices:
            moved = n * b / max(inner.extent, 1) if inner else b
        elif inner is None:
            moved = n * b
        else:
            last = index_names(acc.indices[-1])
            used = set().union(*[index_names(i) for i in acc.indices])
            if inner.var in last:
                moved = n * b
            elif inner.var in used:
                moved = n * b * 8
            else:
                moved = n * b / max(inner.extent, 1)
        mem_ns += moved / (bw * scope_speed)
    par = 1
    for lp in loops:
        if lp.kind == "P":
            par *= lp.extent
    par = min(par, tgt.cores)
    return max(compute_ns, mem_ns) / max(par, 1)
