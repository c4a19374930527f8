"""The worker pool: one isolated worker process per kind of work, per process.

Every command that runs work in a separate process gets its worker here, so isolation, time
limits, restarts and shutdown are decided in one place (:class:`~steptp.runner.worker.IsolatedRunner`
is constructed nowhere else in the package's front ends):

* ``shared(kind, timeout_s)`` - the process-wide worker of ``kind``, started lazily on its
  first call; a worker that died, was killed at its time limit or was discarded after a
  device error is restarted on the next call (by the worker itself), and a worker that was
  closed (:meth:`~steptp.runner.worker.IsolatedRunner.close`) is simply started again.
* ``close_all()`` - stop every worker of this process (also registered with ``atexit``).

Kinds in use: ``"rewards"`` (:mod:`steptp.rewards`: a trainer's completions), ``"verify"`` (builds and runs of :func:`steptp.verify.verify_pair`: ``stp
verify``, ``dataset``, ``eval``, ``search``), ``"engine"`` (:class:`steptp.rules.service.EngineService`:
rule listing and application under an address-space limit, kept apart because that limit
stays on the process), ``"gpu-run:<thread>"`` / ``"gpu-ref:<thread>"`` (:mod:`steptp.gpu.run`: one
GPU worker per thread, pinned to its GPU, and one CPU reference worker per thread),
``"check"`` (the checks of :func:`steptp.verify.static_check` under an address-space cap: a GPU search at size), ``"cuda"`` (CUDA timings of :mod:`steptp.runner.timing`, discarded
after a CUDA error). Work of one kind shares one worker, one call at a time: callers that
run calls from several threads must use their own kind.
"""

from __future__ import annotations

import atexit
import threading

from .worker import IsolatedRunner

_WORKERS: dict[str, IsolatedRunner] = {}
_LOCK = threading.Lock()


def shared(kind: str = "verify", timeout_s: float | None = None, env: dict[str, str] | None = None,
           preload: str | None = "compiler") -> IsolatedRunner:
    """The process-wide worker of ``kind`` (any name; see the module docstring for those in
    use), created on first use. ``timeout_s``: seconds, the default time limit of its calls
    from now on (a call's own ``timeout_s`` wins); None leaves it (60 s for a new worker).
    ``env``: environment variables its process (and every replacement) starts with, fixed
    when the worker is created (``{"CUDA_VISIBLE_DEVICES": "1"}`` pins it to one GPU);
    ``preload``: what the worker starts with imported (``"compiler"``, ``"runtime"`` for a GPU
    node's worker, None: spawned bare; :class:`~steptp.runner.worker.IsolatedRunner`), fixed
    when it is created.
    Never starts the process itself: the first ``call`` does (about 1-2 s)."""
    with _LOCK:
        w = _WORKERS.get(kind)
        if w is None:
            w = _WORKERS[kind] = IsolatedRunner(timeout_s=60.0 if timeout_s is None else timeout_s, env=env,
                                                preload=preload)
            if len(_WORKERS) == 1:
                atexit.register(close_all)
        elif timeout_s is not None:
            w.timeout_s = timeout_s
        return w


def close_all() -> None:
    """Stop every worker of this process (they start again when next used)."""
    with _LOCK:
        workers = list(_WORKERS.values())
    for w in workers:
        w.close()


__all__ = ["shared", "close_all"]
