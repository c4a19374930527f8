"""A wall-clock limit for pure-Python work in the current process (``SIGALRM``).

Used around the rule engine's work for one candidate (site enumeration, parameter
domains, application) in ``stp dataset``, so that a pathological rule/program pair costs
that rule, not the run. The verification itself has its own limit (a worker process, see
:class:`steptp.backend.build.IsolatedRunner`).

Limits: POSIX only and the main thread only (elsewhere it is a no-op); a long call inside
native code (egglog's Rust, TVM's C++) is interrupted when it returns to Python.
"""

from __future__ import annotations

import contextlib
import signal
import threading


class WorkTimeout(TimeoutError):
    """The work exceeded its time limit."""


@contextlib.contextmanager
def time_limit(seconds: float, what: str = "work"):
    """Raise :class:`WorkTimeout` in the block when it runs longer than ``seconds``
    (``<= 0``: no limit). Restores any previous ``SIGALRM`` handler and timer."""
    usable = (seconds and seconds > 0 and hasattr(signal, "setitimer")
              and threading.current_thread() is threading.main_thread())
    if not usable:
        yield
        return

    def on_alarm(signum, frame):
        raise WorkTimeout(f"{what} exceeded its time limit of {seconds:g} s")

    old = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


__all__ = ["WorkTimeout", "time_limit"]
