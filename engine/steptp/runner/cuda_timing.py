"""The one timing loop of the package (moved here from :mod:`steptp.backend.cuda_runtime`, issue 45).

Every time the package reports comes from :func:`time_rounds`: TVM's ``time_evaluator`` for
our loaded functions (a C++ loop of ``number`` calls, timed by the device's timer), *timers*
``timer(number) -> seconds per call`` for everything else (PyTorch eager, its CUDA graph,
``torch.compile``, our own function called from Python: :func:`python_timer`), calibrated per
function and interleaved round by round (A B, B A ...), each measurement on ``cuda`` from a
flushed L2 cache (:func:`l2_flush_bytes`).

Imports numpy, the standard library and :mod:`steptp.backend.cuda_runtime` (the TVM runtime
only): a GPU pack carries this module and runs it with ``apache-tvm-ffi`` alone.
Sources: ``tvm.runtime.Module.time_evaluator`` (apache-tvm 0.27, the global function
``runtime.RPCTimeEvaluator``; docs/tvm-0.27-notes.md §4), Triton's ``do_bench`` for the L2
flush of twice the cache.
"""

from __future__ import annotations

import math
import struct
import time
from typing import Callable, Sequence

from ..backend import cuda_runtime as cr
from ..backend.errors import ExecError


def l2_flush_bytes(device: str) -> int:
    """Bytes written on ``device`` before each measurement to evict its L2 cache: twice
    :func:`steptp.backend.cuda_runtime.l2_cache_bytes` on ``cuda`` (the usual GPU benchmarking
    protocol, e.g. Triton's ``do_bench``; the simulated device's L2 is ``STP_CUDA_SIM_L2_BYTES``),
    0 on ``cpu`` (CPU timings keep warm caches, as MetaSchedule's default CPU runner does)."""
    if device != "cuda":
        return 0
    return 2 * (cr.l2_cache_bytes() or 0)


def time_function(module, device: str, args: Sequence, *, number: int, repeat: int, min_repeat_ms: float = 0.0,
                  func: str = "main", flush_bytes: int | None = None) -> list[float]:
    """TVM ``time_evaluator`` of ``module[func](*args)`` on ``device``: one warm-up call,
    then ``repeat`` measurements, each the mean time of ``number`` consecutive calls, in
    **seconds**; ``min_repeat_ms`` > 0 lets TVM raise ``number`` until one measurement lasts
    that long. Before each measurement TVM writes ``flush_bytes`` bytes on the device
    (``cache_flush_bytes``; default :func:`l2_flush_bytes`: the L2 cache on ``cuda``, nothing
    on ``cpu``, where caches stay warm); the flush is not timed. Source:
    ``tvm.runtime.Module.time_evaluator`` (apache-tvm 0.27, ``runtime.RPCTimeEvaluator``;
    notes §4). Raises :class:`ExecError` on a fault."""
    if flush_bytes is None:
        flush_bytes = l2_flush_bytes(device)
    dev = cr._device(device)
    try:
        if device == "cuda" and cr._SIM_STICKY:
            raise ExecError(f"CUDA error: an illegal memory access was encountered (simulated sticky error, first "
                            f"raised by {cr._SIM_STICKY[0]})")
        feval = cr._global("runtime.RPCTimeEvaluator")(module, func, dev.dlpack_device_type(), dev.index, int(number),
                                                       int(repeat), int(min_repeat_ms), 100, 0, 1, int(flush_bytes),
                                                       "")
        blob = feval(*args)
    except ExecError:
        raise
    except Exception as e:  # noqa: BLE001
        raise ExecError(f"timing failed on {device}: {cr._short(e)}") from None
    return list(struct.unpack("@" + "d" * int(repeat), bytes(blob)))


def python_timer(call: Callable[[], object], sync: Callable[[], object],
                 flush: Callable[[], object] | None = None) -> Callable[[int], float]:
    """A timer of ``call()`` as a user calls it from Python: ``timer(number)`` runs
    ``flush()`` (when given: overwrite the L2, not timed) and ``sync()``, then ``number``
    calls between two ``time.perf_counter`` readings, the second after ``sync()`` (the
    device's queue drained), and returns wall seconds per call. The same timer serves
    PyTorch eager (``sync`` = ``torch.cuda.synchronize``) and our TVM function called from
    Python (``sync`` = :func:`steptp.backend.cuda_runtime.sync`), so the two pay the same
    Python and launch costs. Raises what ``call`` raises."""

    def measure(number: int) -> float:
        if flush is not None:
            flush()
        sync()
        t0 = time.perf_counter()
        for _ in range(number):
            call()
        sync()
        return (time.perf_counter() - t0) / number

    return measure


def time_rounds(fns: Sequence, device: str, *, rounds: int, warmup: int = 3, min_repeat_ms: float = 0.0,
                max_number: int = 1_000_000, number: int | None = None) -> tuple[list[list[float]], list[int]]:
    """The one calibrated timing loop of the package, for one or more loaded functions on
    ``device``; each of ``fns`` is ``(module, func name, args)``, or a *timer*: a callable
    ``timer(number) -> seconds per call`` that makes one measurement of ``number`` calls
    itself (:func:`python_timer`; the PyTorch baselines of :mod:`steptp.runner.baseline`
    and :mod:`steptp.gpu.baselines`, which flush the L2 on ``cuda``; its warm-up calls are
    ``timer(1)``).

    ``warmup`` calls of each; then a number of calls per measurement *for each function*: with
    ``min_repeat_ms`` > 0 enough that one measurement of it lasts that many milliseconds
    (probed with 3 single calls; at least ``number`` when given, at most ``max_number``), as
    TVM's ``time_evaluator`` calibrates each function; else ``number`` (1 when None). (One
    number for all, fitted to the fastest, ran a 10 ms original 80 times per measurement
    beside a 24 µs candidate: 3 s per GPU pack entry on an H200.) Then ``rounds`` rounds of
    one measurement of each, the order reversed every other round (A B, B A, A B ...: drift
    hits all alike; on ``cuda`` each of our measurements starts from a flushed L2,
    :func:`l2_flush_bytes`). Returns (seconds per call, one list per function with one value
    per round; the number of calls per measurement of each function). Used by
    :func:`time_interleaved` (``stp time``, ``dataset --time``, search, GPU packs),
    :func:`steptp.runner.timing.measure` (one function) and the GPU node's baselines.
    Raises :class:`ExecError` on a fault of our functions (a timer raises what it raises)."""
    flush = l2_flush_bytes(device)

    def one(fn, n: int) -> float:
        if callable(fn):
            return fn(n)
        mod, func, args = fn
        return time_function(mod, device, args, number=n, repeat=1, func=func, flush_bytes=flush)[0]

    try:
        for fn in fns:
            for _ in range(warmup):
                if callable(fn):
                    fn(1)
                else:
                    fn[0][fn[1]](*fn[2])
        cr.sync(device)
    except Exception as e:  # noqa: BLE001
        raise ExecError(f"kernel execution failed on {device}: {cr._short(e)}") from None
    numbers = [number or 1] * len(fns)
    if min_repeat_ms > 0:
        for i, fn in enumerate(fns):
            probe = min(one(fn, 1) for _ in range(3))
            want = math.ceil(min_repeat_ms * 1e-3 / max(probe, 1e-9))
            numbers[i] = min(max_number, max(number or 1, want))
    times: list[list[float]] = [[] for _ in fns]
    order = list(zip(fns, times, numbers))
    for r in range(rounds):
        for fn, acc, n in (order if r % 2 == 0 else order[::-1]):
            acc.append(one(fn, n))
    return times, numbers


def time_interleaved(a: tuple, b: tuple, device: str, *, rounds: int, warmup: int = 3, min_repeat_ms: float = 0.0,
                     max_number: int = 1_000_000) -> tuple[list[float], list[float], list[int]]:
    """Interleaved timing of two loaded functions on ``device`` (``a`` and ``b`` are
    ``(module, func name, args)``): :func:`time_rounds` of the pair. Returns (seconds per
    call of A per round, of B per round, [calls per measurement of A, of B]). Raises
    :class:`ExecError` on a fault."""
    (ta, tb), numbers = time_rounds((a, b), device, rounds=rounds, warmup=warmup, min_repeat_ms=min_repeat_ms,
                                    max_number=max_number)
    return ta, tb, numbers


__all__ = ["l2_flush_bytes", "time_function", "python_timer", "time_rounds", "time_interleaved"]
