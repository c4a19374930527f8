"""PyTorch baselines timed by the one timing loop (:func:`steptp.runner.cuda_timing.time_rounds`).

:func:`torch_timer` turns ``fn(*args)`` (a PyTorch model or ``torch.compile`` of it) into a
*timer* ``timer(number) -> seconds per call`` that the timing loop interleaves with our
kernels: on ``cuda`` each measurement first overwrites an L2-sized buffer (the same flush as
our kernels get) and is timed with CUDA events; on the CPU with ``time.perf_counter``.
Imports torch only when a timer is made, so the runner stays importable with the TVM runtime
alone (GPU packs carry this module).
"""

from __future__ import annotations

import time
from typing import Callable, Sequence


def torch_timer(fn: Callable, args: Sequence, device: str, flush_bytes: int = 0) -> Callable[[int], float]:
    """A timer of ``fn(*args)`` on ``device`` (``cpu`` or ``cuda``): ``timer(number)`` runs
    ``number`` calls under ``torch.no_grad`` and returns seconds per call. ``flush_bytes``: on
    ``cuda`` the L2 flush before each measurement (:func:`steptp.runner.cuda_timing.l2_flush_bytes`).
    Raises what ``fn`` raises."""
    import torch  # noqa: PLC0415

    if device == "cuda":
        flush = torch.empty(max(1, flush_bytes // 4), dtype=torch.float32, device="cuda") if flush_bytes else None

        def measure(number: int) -> float:
            with torch.no_grad():
                if flush is not None:
                    flush.zero_()
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                for _ in range(number):
                    fn(*args)
                end.record()
                end.synchronize()
            return start.elapsed_time(end) * 1e-3 / number
    else:
        def measure(number: int) -> float:
            with torch.no_grad():
                t0 = time.perf_counter()
                for _ in range(number):
                    fn(*args)
                return (time.perf_counter() - t0) / number
    return measure


def eager_time_us(tr, repeat: int = 3, warmup: int = 3, min_repeat_s: float = 0.02) -> float:
    """PyTorch eager run time (µs, median of ``repeat`` measurements of at least
    ``min_repeat_s`` each, after ``warmup`` calls; the one timing loop) of a translation's model
    (``tr.model`` on ``tr.example_inputs``) on the CPU with ONE intra-op thread (as the LEIR
    timings: TVM's pool runs one thread unless ``TVM_NUM_THREADS`` is set; several torch threads
    on a shared machine also spin against other processes and inflate small kernels' times by
    1000x)."""
    import os  # noqa: PLC0415

    import torch  # noqa: PLC0415

    args = tr.example_inputs
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(max(1, int(os.environ.get("TVM_NUM_THREADS") or 1)))
    except ValueError:
        torch.set_num_threads(1)
    try:
        return _eager(tr.model, args, repeat, warmup, min_repeat_s)
    finally:
        torch.set_num_threads(threads)


def _eager(model, args, repeat: int, warmup: int, min_repeat_s: float) -> float:
    """Median microseconds per call of ``model(*args)`` on the CPU by the one timing loop
    (:func:`steptp.runner.cuda_timing.time_rounds` over :func:`torch_timer`)."""
    import statistics  # noqa: PLC0415

    from .cuda_timing import time_rounds  # noqa: PLC0415

    secs, _ = time_rounds([torch_timer(model, args, "cpu")], "cpu", rounds=repeat, warmup=warmup,
                          min_repeat_ms=min_repeat_s * 1e3, max_number=1 << 20)
    return statistics.median(secs[0]) * 1e6


__all__ = ["torch_timer", "eager_time_us"]
