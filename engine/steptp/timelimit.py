"""A wall-clock limit for pure-Python work in the current process (``SIGALRM``).

Used around the rule engine's work for one candidate (site enumeration, parameter
domains, application) in ``stp dataset`` and ``stp eval``, so that a pathological
rule/program pair costs that rule, not the run, and around each sympy call of
:mod:`steptp.engine.algebra`. The verification itself has its own limit (a worker
process, see :class:`steptp.runner.worker.IsolatedRunner`).

Limits nest: an inner limit never outlives an outer one. When the outer deadline comes
first, the outer limit's handler runs at its deadline inside the inner block; otherwise the
outer timer is re-armed on exit with what is left of it (at once if that is nothing).
An outer limit whose exception is swallowed inside an inner block (a best-effort
``except Exception`` there) fires again as soon as the inner block exits, so an outer
deadline is never lost.

Limits: POSIX only and the main thread only (elsewhere it is a no-op); a long call inside
native code (egglog's Rust, TVM's C++) is interrupted when it returns to Python.
"""

from __future__ import annotations

import contextlib
import signal
import threading
import time
from typing import Callable

#: Delay (s) used to fire an outer timer whose deadline passed while an inner limit ran.
_AT_ONCE = 1e-6


class WorkTimeout(TimeoutError):
    """The work exceeded its time limit."""


@contextlib.contextmanager
def time_limit(seconds: float, what: str = "work", error: Callable[[], BaseException] | None = None):
    """Raise :class:`WorkTimeout` (or ``error()`` when given) in the block when it runs
    longer than ``seconds`` (``<= 0``: no limit).

    Restores the previous ``SIGALRM`` handler and timer: a timer running outside (an
    outer limit) keeps its deadline - it fires inside the block when it comes first, else it
    is re-armed on exit with what is left of it - and fires once."""
    usable = (seconds and seconds > 0 and hasattr(signal, "setitimer")
              and threading.current_thread() is threading.main_thread())
    if not usable:
        yield
        return

    start = time.monotonic()
    deadline = start + seconds
    old = signal.getsignal(signal.SIGALRM)
    prev_delay, prev_interval = signal.getitimer(signal.ITIMER_REAL)
    # an outer timer whose handler is Python code can fire in the block; any other (SIG_DFL,
    # SIG_IGN, set outside Python) is only re-armed on exit
    outer = start + prev_delay if prev_delay > 0 else None
    delegate = outer is not None and callable(old)
    outer_fired = False
    outer_exc: list[BaseException] = []

    def on_alarm(signum, frame):
        nonlocal outer_fired
        now = time.monotonic()
        if delegate and not outer_fired and now >= outer - 1e-3:
            outer_fired = True
            try:
                old(signum, frame)  # the outer limit raises here
            except BaseException as exc:
                outer_exc.append(exc)
                raise
            left = deadline - time.monotonic()
            if left > 0:  # its handler returned: this limit goes on
                signal.setitimer(signal.ITIMER_REAL, left)
                return
        elif now < deadline - 1e-3:  # the outer (not ours to run) came first: wait for ours
            signal.setitimer(signal.ITIMER_REAL, deadline - now)
            return
        raise error() if error is not None else WorkTimeout(f"{what} exceeded its time limit of {seconds:g} s")

    signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, min(seconds, prev_delay) if prev_delay > 0 else seconds)
    inflight: BaseException | None = None
    try:
        yield
    except BaseException as exc:
        inflight = exc
        raise
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old if old is not None else signal.SIG_DFL)  # None: set outside Python
        if outer_exc and inflight is not outer_exc[0]:
            # the outer limit fired in the block but code there swallowed its exception
            # (``except Exception``): its deadline has passed, so it fires again now, outside
            signal.setitimer(signal.ITIMER_REAL, _AT_ONCE)
        elif outer is not None and not outer_fired:
            signal.setitimer(signal.ITIMER_REAL, max(outer - time.monotonic(), _AT_ONCE), prev_interval)
        elif outer is not None and prev_interval > 0:  # a periodic outer timer goes on
            signal.setitimer(signal.ITIMER_REAL, prev_interval, prev_interval)


__all__ = ["WorkTimeout", "time_limit"]
