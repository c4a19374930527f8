"""Worker isolation: the one place where work runs in a separate process under a limit.

:class:`IsolatedRunner` runs module-level functions in a worker process (forked from a fork
server that imported TVM once, or spawned: :func:`start_method`), one call at a time, under a
time limit. Verification, CUDA runs and CUDA timings all go through it, so that a hanging
kernel, a crash or a sticky CUDA error costs one call: the worker is killed (time limit), found
dead (crash) or discarded after a device error (``discard_on_error``), and the next call starts
a fresh process with a fresh CUDA context (the fork server never initialises CUDA).

Imports only the standard library and :mod:`steptp.backend.errors` (which imports nothing),
so it also runs on a GPU node that has only numpy and ``apache-tvm-ffi``
(:mod:`steptp.gpu.run`).
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
import sys
import threading
from typing import Callable

from ..backend.errors import BackendError, ExecError, WorkerFailure


class WorkerCallError(RuntimeError):
    """A call could not be handed to the worker (its function or arguments do not pickle):
    a defect of the caller, not of the candidate, so it is never reported as an Exec
    failure of a program. Raised by :meth:`IsolatedRunner.call`."""


def _worker_main(conn, env: dict | None = None, cwd: str | None = None) -> None:  # pragma: no cover - child
    if env is not None:  # the starting process's environment and directory, as a spawned child has them
        os.environ.clear()
        os.environ.update(env)
    if cwd is not None:
        with contextlib.suppress(OSError):
            os.chdir(cwd)
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            return
        if msg is None:
            return
        fn, args, kwargs = msg
        try:
            reply = ("ok", fn(*args, **kwargs))
        except BackendError as e:
            reply = ("err", e)
        except BaseException as e:  # noqa: BLE001
            reply = ("err", ExecError(f"{type(e).__name__}: {e}"))
        try:
            conn.send(reply)
        except (BrokenPipeError, ConnectionResetError, EOFError):
            return  # the caller is gone (killed, or stopped its run): nothing to answer
        except Exception as e:  # unpicklable result
            try:
                conn.send(("err", ExecError(f"worker could not send its result: {e}")))
            except (BrokenPipeError, ConnectionResetError, EOFError):
                return


@contextlib.contextmanager
def without_main_module():
    """Hide ``__main__``'s file/spec while a spawn child starts, so the child does not
    re-import the caller's script (the worker only runs functions of this package; an
    unguarded script would otherwise run again in the child). Serialised: two threads starting
    workers at once would otherwise restore ``__file__`` under each other, and a child started
    in between re-imports the caller's module by path (seen on a GPU node, 8 reference threads
    under ``python -m steptp.gpu.run``: ``attempted relative import with no known parent package``)."""
    with _MAIN_LOCK:
        main = sys.modules.get("__main__")
        saved = {}
        for attr in ("__file__", "__spec__"):
            if main is not None and hasattr(main, attr):
                saved[attr] = getattr(main, attr)
        try:
            if "__file__" in saved:
                del main.__file__
            if "__spec__" in saved:
                main.__spec__ = None
            yield
        finally:
            for attr, val in saved.items():
                setattr(main, attr, val)


_MAIN_LOCK = threading.RLock()


_ENV_LOCK = threading.Lock()

#: Modules the fork server imports once, so that a worker forked from it starts in tens of
#: milliseconds instead of importing PyTorch and TVM again (6-7 s of CPU on a 2-core machine).
#: A module that does not import (a GPU node has only ``apache-tvm-ffi``) is skipped.
PRELOAD = ("tvm", "steptp.backend.build", "steptp.verify")
#: What a runtime-only worker's fork server imports (a GPU node's workers, and their emulation
#: here: they load the pack's ``libtvm_runtime.so``, which must not meet TVM's compiler library).
RUNTIME_PRELOAD = ("tvm_ffi", "numpy", "steptp.backend.cuda_runtime")
_CTX = None
_CTX_PRELOAD: tuple | None = None


def start_method() -> str:
    """How workers start: ``$STP_WORKER_START`` (``forkserver`` or ``spawn``), by default
    ``forkserver`` where the platform has it (a clean server process that never initialised
    CUDA or TVM's thread pool forks each worker: tvm-0.27 notes, fork safety), else ``spawn``."""
    want = os.environ.get("STP_WORKER_START", "").strip().lower()
    if want in ("spawn", "forkserver"):
        return want if want in multiprocessing.get_all_start_methods() else "spawn"
    return "forkserver" if "forkserver" in multiprocessing.get_all_start_methods() else "spawn"


def _context(preload: str | None = "compiler"):
    """The start context of a worker: one fork server per process (``preload="compiler"``:
    :data:`PRELOAD`; ``"runtime"``: :data:`RUNTIME_PRELOAD`, fixed by its first worker); a
    worker whose preload differs from the server's, or ``preload=None`` (a worker that needs
    neither, e.g. the engine's: spawning it costs less than waiting for TVM), is spawned."""
    global _CTX, _CTX_PRELOAD
    if preload not in ("compiler", "runtime", None):
        raise ValueError(f"preload must be 'compiler', 'runtime' or None, not {preload!r}")
    want = RUNTIME_PRELOAD if preload == "runtime" else PRELOAD
    with _ENV_LOCK:  # threads creating workers at once (a GPU node's) agree on one server
        if preload is None or start_method() == "spawn" or (_CTX_PRELOAD is not None and _CTX_PRELOAD != want):
            return multiprocessing.get_context("spawn")
        if _CTX is None:
            _CTX, _CTX_PRELOAD = multiprocessing.get_context("forkserver"), want
            _CTX.set_forkserver_preload(list(want))
        return _CTX


@contextlib.contextmanager
def _environment(env: dict[str, str]):
    """Set ``env`` in ``os.environ`` for the duration (serialised: one worker start at a time
    may change the environment), then restore the previous values."""
    if not env:
        yield
        return
    with _ENV_LOCK:
        old = {k: os.environ.get(k) for k in env}
        os.environ.update(env)
        try:
            yield
        finally:
            for k, v in old.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v


def signal_name(code: int | None) -> str:
    """``SIGSEGV`` for exit code -11, ``exit code 3`` for 3, ``unknown`` for None."""
    if code is None:
        return "unknown"
    if code < 0:
        try:
            return signal.Signals(-code).name
        except ValueError:
            return f"signal {-code}"
    return f"exit code {code}"


class IsolatedRunner:
    """A worker process (``multiprocessing`` forkserver or spawn context, :func:`start_method`;
    it starts with this process's environment and working directory) that runs one call at a
    time under a time limit. ``preload``: what its fork server has imported (``"compiler"``:
    TVM; ``"runtime"``: a worker that loads TVM's runtime library alone, a GPU node's, never
    starts with TVM's compiler imported; None: spawned, nothing imported; :func:`_context`).
    Raises ``ValueError`` for another ``preload``.

    ``call(fn, *args, timeout_s=None, discard_on_error=False)`` runs a module-level
    function ``fn`` in the worker and returns its result, re-raises a
    :class:`~steptp.backend.errors.BackendError` it raised, and raises
    :class:`~steptp.backend.errors.WorkerFailure` (an ``ExecError``) when the worker exceeds
    the time limit (it is killed) or dies (segfault...). With ``discard_on_error`` (device work: CUDA errors such
    as an illegal address are sticky, they poison the process's CUDA context) the worker is
    also discarded after an ``ExecError``. A dead, killed or discarded worker is restarted
    lazily on the next call, so one bad kernel costs one call. Arguments that do not pickle
    raise :class:`WorkerCallError` (a caller defect), the worker untouched. Starting a
    worker costs tens of milliseconds from the fork server (6-7 s spawned: ``import tvm``).
    ``restarts`` counts workers replaced.

    Use as a context manager, or call :meth:`close`.
    """

    def __init__(self, timeout_s: float = 60.0, env: dict[str, str] | None = None, preload: str | None = "compiler"):
        self.timeout_s = timeout_s
        self.env = dict(env or {})
        self._ctx = _context(preload)
        self._proc = None
        self._conn = None
        self.restarts = 0

    def start(self) -> None:
        """Start the worker if it is not running (see the class docstring for the cost).
        ``env`` (e.g. ``{"CUDA_VISIBLE_DEVICES": "1"}``: a worker pinned to one GPU) is given
        to the child over this process's environment (and set here while a spawned child
        starts), so the child and every replacement of it have it."""
        if self._proc is not None and self._proc.is_alive():
            return
        parent, child = self._ctx.Pipe(duplex=True)
        with _ENV_LOCK:
            env = {**os.environ, **self.env}
        proc = self._ctx.Process(target=_worker_main, args=(child, env, os.getcwd()), daemon=True,
                                 name="stp-worker")
        with without_main_module(), _environment(self.env):
            proc.start()
        child.close()
        self._proc, self._conn = proc, parent

    @property
    def pid(self) -> int | None:
        """Process id of the running worker, or None."""
        return self._proc.pid if self._proc is not None and self._proc.is_alive() else None

    def discard(self) -> None:
        """Kill the worker now (the next call starts a fresh one); counts as a restart."""
        self._kill()

    def _kill(self) -> None:
        if self._proc is None:
            return
        if self._proc.is_alive():
            self._proc.kill()
        self._proc.join(5)
        try:
            self._conn.close()
        except Exception:
            pass
        self._proc = self._conn = None
        self.restarts += 1

    def _send(self, msg) -> None:
        try:
            self._conn.send(msg)
        except (BrokenPipeError, ConnectionResetError, EOFError):
            self._kill()
            self.start()
            self._conn.send(msg)

    def call(self, fn: Callable, *args, timeout_s: float | None = None, discard_on_error: bool = False, **kwargs):
        """Run ``fn(*args, **kwargs)`` in the worker (see the class docstring)."""
        limit = self.timeout_s if timeout_s is None else timeout_s
        self.start()
        try:
            self._send((fn, args, kwargs))
        except (BrokenPipeError, ConnectionResetError, EOFError) as e:
            self._kill()
            raise WorkerFailure(f"worker process unreachable: {e}") from None
        except Exception as e:  # noqa: BLE001  (pickling: TypeError, PicklingError, AttributeError...)
            name = getattr(fn, "__qualname__", repr(fn))
            raise WorkerCallError(f"cannot send {name}(...) to the worker process: {type(e).__name__}: {e}") from None
        if not self._conn.poll(limit):
            self._kill()
            raise WorkerFailure(f"time limit of {limit:g} s exceeded; the worker process was killed")
        try:
            status, value = self._conn.recv()
        except (EOFError, OSError):
            self._proc.join(5)
            code = self._proc.exitcode
            self._kill()
            raise WorkerFailure(f"worker process crashed ({signal_name(code)})") from None
        if status == "err":
            if discard_on_error and isinstance(value, ExecError):
                self._kill()
            raise value
        return value

    def close(self) -> None:
        """Stop the worker (politely, then by force)."""
        if self._proc is None:
            return
        try:
            self._conn.send(None)
            self._proc.join(2)
        except Exception:
            pass
        if self._proc.is_alive():
            self._proc.kill()
            self._proc.join(2)
        self._proc = self._conn = None

    def __enter__(self) -> "IsolatedRunner":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self):  # pragma: no cover
        try:
            self.close()
        except Exception:
            pass


__all__ = ["IsolatedRunner", "WorkerCallError", "without_main_module", "signal_name"]
