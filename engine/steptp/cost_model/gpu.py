"""A static GPU cost model of a LEIR program: estimated run time in nanoseconds on one CUDA
device, from the program text alone (no build, no run). ``--rank cost`` with ``--device cuda``
(:func:`steptp.cost_model.static.estimate_ns` with a ``cuda`` target delegates here); it ranks
candidates, it does not predict absolute times.

Each top-level nest is one kernel launch (the backend's GPU form). For a kernel:

* **grid**: threads per block ``T`` = product of the extents of its ``B`` loops bound to
  ``threadIdx`` (variables ``t?``), blocks ``G`` = product of those bound to ``blockIdx``
  (``b?``); every other loop runs serially inside one thread. A kernel with no ``B`` loop
  runs on one thread.
* **occupancy**: warps per block ``ceil(T / 32)`` (a partly filled warp costs a whole
  one), resident blocks per SM ``min(32, 2048 // (32 * warps))``, waves
  ``ceil(G / (SMs * resident blocks))``; ``occupancy`` = resident warps / 64.
* **issue (throughput)**: every thread executes, per serial iteration of each equation, its
  arithmetic (:func:`steptp.cost_model.opcount._value_ops`: 1 per ``+ - * /``, 12 per ``exp``...,
  subscripts excluded: their arithmetic is address computation) plus one instruction per
  memory access; warps issue at 4 warp-instructions per cycle per SM.
  **Register reuse** (issue 44): a local (``l``) operand is a register (no load); inside
  unrolled (``U``) loops an access whose subscript does not use a loop's variable is loaded
  once for all its iterations (the register micro-tile reads each element of a shared tile
  once per ``micro`` products), and the unrolled copies of an accumulation into different
  elements are independent chains whose latencies overlap.
* **latency**: one thread's serial chain: per iteration ``4 * ops`` cycles (dependent FP
  latency) plus the global accesses' latency (``GLOBAL_LATENCY`` cycles for the share of an
  access's traffic that first touches DRAM, ``CACHED_LATENCY`` for the rest) divided by the warps
  resident on the SM that can hide it (``min(occupancy * 64, 16)``); multiplied by the waves.
  This is what makes a reduction run serially in one thread per row slow.
* **memory**: per access, the bytes a warp moves, by the index of the warp's lanes (the
  lowest thread axis the kernel binds, ``tx``, else ``ty``, else ``tz``: CUDA numbers a
  block's threads x fastest): coalesced (the lane index in the last subscript: one 4-byte
  word per lane), strided (in another subscript: a 32-byte sector per lane) or broadcast
  (absent: one sector per warp); DRAM traffic is the unique
  footprint (product of the extents of the loops the subscript uses, times the dtype size,
  capped at what the warp traffic moves) at ``DRAM_GBS``; the rest of the warp traffic is
  served by L2 at ``L2_GBS``; shared (``s``) accesses at ``SHARED_GBS``, counted with the
  register tile's reuse (issue gpu-reach: an element read inside unrolled loops its subscript
  does not use moves once for all their iterations, as its load does), local (``l``) free.
* kernel time = ``LAUNCH_NS`` x launches + max(issue, latency, memory) (roofline with a
  latency bound); serial loops around the first ``B`` loop are host loops, one launch per
  iteration.

Defaults describe an H100/H200-class device (132 SMs, 1.7 GHz, HBM3 about 3.3 TB/s). Sources:
roofline (Williams et al., CACM 2009); occupancy and coalescing rules from the CUDA C
Programming Guide (compute capability 9.0: 2048 threads, 32 blocks and 64 warps per SM, 32-byte
sectors); launch overhead of back-to-back kernels 2-5 µs (PyTorch eager runs one per op).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..leir import ast as A
from ..leir.analysis import index_names
from ..roofline import GPUS
from .opcount import _accesses, _value_ops

#: Nanoseconds per kernel launch (back-to-back launches of small kernels). Measured on the
#: H200 (issue 37): the six translated originals of the 40-program corpus whose kernels do
#: almost no work took 3.4-3.9 µs per kernel (TVM's time_evaluator loop; e.g. LogProduct, 6
#: kernels, 21.0 µs). With 3500 instead of 3000, on the 742 samples: within-program tau 0.276
#: -> 0.278, top-3 recall 0.192 -> 0.200, pooled Spearman 0.944 -> 0.946.
LAUNCH_NS = 3500.0
#: Cycles a thread's serial chain waits for a global access that misses to DRAM when no other
#: warp hides it.
GLOBAL_LATENCY = 400.0
#: ... and for one served by L1/L2 (about an L1 hit on sm_90). An access's wait is weighted by
#: the share of its traffic that is first-touch DRAM traffic (its footprint over the bytes it
#: moves): the serial loops of the translated programs mostly re-read cached data (a GEMM row
#: per output). On the 742 H200 samples of ``gpu_samples_h200.json.gz``, against charging
#: every access 400 cycles: within-program Kendall tau 0.261 -> 0.276, pooled Spearman 0.909
#: -> 0.944, measured slowdowns predicted as slowdowns 9/18 -> 14/18, the originals' median
#: overestimate 28x -> 3.4x (60 cycles: 0.264, 0.937, 9/18, 5.3x).
CACHED_LATENCY = 30.0


@dataclass(frozen=True)
class GpuTarget:
    """The device the estimate is for: ``sms`` multiprocessors at ``freq_ghz``; per SM at most
    ``threads_per_sm`` threads, ``blocks_per_sm`` blocks, ``warps_per_sm`` warps; memory
    bandwidths in GB/s (= bytes per ns)."""

    sms: int = GPUS["h100"].sms  # the device table of stp roofline
    freq_ghz: float = 1.7
    threads_per_sm: int = 2048
    blocks_per_sm: int = 32
    warps_per_sm: int = 64
    dram_gbs: float = 3300.0
    l2_gbs: float = 10000.0
    shared_gbs: float = 30000.0
    warp: int = 32


@dataclass(frozen=True)
class KernelEstimate:
    """One kernel (top-level nest): ``threads`` per block, ``blocks``, ``waves``,
    ``occupancy`` (resident warps / the SM's maximum), its time split in ns, and ``launches``:
    the kernel is launched once per iteration of the serial loops around its first ``B`` loop
    (host loops)."""

    threads: int
    blocks: int
    waves: int
    occupancy: float
    issue_ns: float
    latency_ns: float
    memory_ns: float
    launches: int = 1

    @property
    def ns(self) -> float:
        return self.launches * LAUNCH_NS + max(self.issue_ns, self.latency_ns, self.memory_ns)


def _grid(loops: tuple[A.Loop, ...]) -> tuple[int, int]:
    threads = blocks = 1
    for lp in loops:
        if lp.kind == "B":
            if lp.var.startswith("t"):
                threads *= lp.extent
            else:
                blocks *= lp.extent
    return threads, blocks


def _equations(nest: A.Nest, outer: tuple[A.Loop, ...] = ()):
    loops = outer + nest.loops
    for item in nest.body:
        if isinstance(item, A.Assign):
            yield loops, item
        else:
            yield from _equations(item, loops)


def _load_share(acc: A.Tensor, unrolled: list) -> float:
    """Instructions per iteration for access ``acc`` (module docstring: register reuse): 0 for
    a local (register) tensor, else 1 over the extents of the unrolled loops its subscript does
    not use."""
    if acc.scope == "l":
        return 0.0
    used = set().union(*[index_names(i) for i in acc.indices]) if acc.indices else set()
    return 1.0 / math.prod(lp.extent for lp in unrolled if lp.var not in used)


def _warp_bytes(acc: A.Tensor, lane_var: str | None, tgt: GpuTarget) -> float:
    """Bytes one warp moves for one access of ``acc`` (see the module docstring)."""
    b = A.DTYPE_BYTES.get(acc.dtype, 4)
    if lane_var is None or not acc.indices:
        return 32.0  # one sector for the whole warp (broadcast)
    if lane_var in index_names(acc.indices[-1]):
        return float(tgt.warp * b)  # coalesced
    if any(lane_var in index_names(i) for i in acc.indices):
        return float(tgt.warp * 32)  # strided: a sector per lane
    return 32.0


def kernel_estimate(nest: A.Nest, tgt: GpuTarget | None = None) -> KernelEstimate:
    """The estimate of one top-level nest launched as one kernel (module docstring)."""
    tgt = tgt or GpuTarget()
    threads, blocks = _grid(nest.loops)
    for loops, _ in _equations(nest):
        t, b = _grid(loops)
        threads, blocks = max(threads, t), max(blocks, b)
    warps_per_block = max(1, math.ceil(threads / tgt.warp))
    resident = max(1, min(tgt.blocks_per_sm, tgt.threads_per_sm // (warps_per_block * tgt.warp) or 1))
    resident_warps = min(tgt.warps_per_sm, resident * warps_per_block)
    # a grid smaller than the device leaves SMs idle: warps per busy SM
    busy_sms = min(tgt.sms, blocks)
    per_sm_blocks = min(resident, math.ceil(blocks / max(busy_sms, 1)))
    active_warps = max(1, min(tgt.warps_per_sm, per_sm_blocks * warps_per_block))
    waves = max(1, math.ceil(blocks / (tgt.sms * resident)))
    occupancy = active_warps / tgt.warps_per_sm
    issue_cycles = latency_cycles = 0.0
    dram = l2 = shared = 0.0
    # a warp's lanes run along the lowest thread axis the kernel binds (x, else y, else z)
    axes = {lp.var[:2] for lp in nest.all_loops() if lp.kind == "B" and lp.var.startswith("t")}
    lane_axis = next((a for a in ("tx", "ty", "tz") if a in axes), None)
    for loops, eq in _equations(nest):
        # the equation's own loop on that axis (an inner phase of a block-fused kernel has its
        # own; a phase outside it is a broadcast)
        lane = next((lp.var for lp in loops if lp.kind == "B" and lane_axis and lp.var.startswith(lane_axis)), None)
        serial = math.prod(lp.extent for lp in loops if lp.kind != "B")
        accs = list(_accesses(eq))
        ops = _value_ops(eq.value)
        unrolled = [lp for lp in loops if lp.kind == "U"]
        # register reuse: a local (register) operand costs no load; an access inside unrolled
        # loops whose variables its subscript does not use is loaded once for all their
        # iterations (the compiler keeps it in a register: a register tile's reuse of a shared
        # tile's element), so it costs 1/extent of those loops per iteration
        per_iter_instr = ops + sum(_load_share(a, unrolled) for a in accs)
        # independent accumulators of an unrolled micro-tile overlap their latencies
        written = set().union(*[index_names(i) for i in eq.target.indices]) if eq.target.indices else set()
        ilp = math.prod(lp.extent for lp in unrolled if lp.var in written)
        warps_total = blocks * warps_per_block
        issue_cycles += warps_total * serial * per_iter_instr / (4.0 * busy_sms)
        hide = max(1.0, min(active_warps, 16))
        warp_iters = warps_total * serial
        wait = 0.0  # cycles one iteration of the serial chain waits for its global accesses
        for a in accs:
            moved = warp_iters * _warp_bytes(a, lane, tgt)
            if a.scope == "l":
                continue
            if a.scope == "s":
                # a register tile reuses each shared element over the unrolled loops its
                # subscript does not use (the compiler loads it once for all of them)
                shared += moved * _load_share(a, unrolled)
                continue
            used = set().union(*[index_names(i) for i in a.indices]) if a.indices else set()
            unique = A.DTYPE_BYTES.get(a.dtype, 4) * math.prod(lp.extent for lp in loops if lp.var in used)
            first = min(unique, moved)
            dram += first
            l2 += moved - first
            miss = first / moved if moved > 0 else 1.0  # the share of this access's traffic from DRAM
            wait += CACHED_LATENCY + (GLOBAL_LATENCY - CACHED_LATENCY) * miss
        latency_cycles += waves * serial * (4.0 * ops / ilp + wait / hide)
    memory_ns = dram / tgt.dram_gbs + l2 / tgt.l2_gbs + shared / tgt.shared_gbs
    return KernelEstimate(threads, blocks, waves, occupancy, issue_cycles / tgt.freq_ghz,
                          latency_cycles / tgt.freq_ghz, memory_ns, _host_launches(nest))


def _host_launches(nest: A.Nest) -> int:
    """Launches of a top-level nest: the product of the extents of the loops before its first
    ``B`` loop when it has one (the backend runs them on the host, one launch per iteration;
    on an H200 a ``loop_reorder`` that put a 35-iteration reduction loop outside the bound
    loop ran 26x slower), else 1."""
    if not any(lp.kind == "B" for lp in nest.all_loops()):
        return 1
    host = 1
    for lp in nest.loops:
        if lp.kind == "B":
            break
        host *= lp.extent
    return host


def estimate_gpu_ns(program: A.Program, tgt: GpuTarget | None = None) -> float:
    """Estimated run time of ``program`` in nanoseconds on a CUDA device: the sum over its
    top-level nests of :func:`kernel_estimate` (each a launch). Ranks candidates for
    ``--rank cost --device cuda``."""
    tgt = tgt or GpuTarget()
    return sum(kernel_estimate(n, tgt).ns for n in program.nests)


__all__ = ["GpuTarget", "KernelEstimate", "kernel_estimate", "estimate_gpu_ns", "LAUNCH_NS", "GLOBAL_LATENCY",
           "CACHED_LATENCY"]
