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


__all__ = ["torch_timer"]
