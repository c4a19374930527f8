"""Exception hierarchy of the backend.

Every error carries a one-line human-readable ``reason`` that names the equation, tensor or
loop at fault (it is what ends up in ``VerifyResult.reason`` and in dataset reports).

::

    BackendError (RuntimeError)
    ├── LoweringError     LEIR -> TVMScript failed: semantic error, unsupported construct,
    │                     or a loop hazard TVM would silently miscompile (vectorised/parallel
    │                     reduction, loop-carried dependence).
    ├── BuildError        TVM parse/compile or nvcc failed.
    │   └── PreflightError  GPU preflight rejected a kernel TVM would accept silently
    │                       (thread limits, unbound equations, ...); ``problems`` lists all.
    └── ExecError         running the compiled kernel failed: bad input arrays, a runtime
        │                 error, a crash or a time limit in an isolated worker.
        ├── WorkerFailure the worker was killed at its time limit, crashed or is unreachable
        └── FormMismatch  the CPU performance form's outputs differ from the verification form's

All classes pickle (the isolated worker sends them back to the parent process).
"""

from __future__ import annotations


class BackendError(RuntimeError):
    """Base class; ``reason`` is the message (first positional argument)."""

    stage = "backend"

    @property
    def reason(self) -> str:
        return str(self.args[0]) if self.args else self.__class__.__name__


class LoweringError(BackendError):
    """The LEIR program cannot be lowered to TVMScript (names the equation/tensor)."""

    stage = "lower"


class BuildError(BackendError):
    """TVMScript parsing, ``tvm.compile`` or nvcc failed."""

    stage = "build"


class PreflightError(BuildError):
    """GPU preflight failed; ``problems`` is the full list of reasons (``reason`` joins them)."""

    stage = "preflight"

    def __init__(self, problems):
        problems = [problems] if isinstance(problems, str) else list(problems)
        super().__init__("; ".join(problems))
        self.problems = problems

    def __reduce__(self):
        return (self.__class__, (self.problems,))


class ExecError(BackendError):
    """Running the kernel failed (bad inputs, runtime error, crash, time limit)."""

    stage = "exec"


class WorkerFailure(ExecError):
    """The worker process running a call was killed at its time limit, crashed or became
    unreachable. Either the program's fault (a non-terminating or crashing kernel) or the
    machine's (load, memory): only running the same call once more in a fresh worker tells
    (:func:`steptp.verify.confirm_failure`). Raised by
    :meth:`steptp.runner.worker.IsolatedRunner.call`."""


class FormMismatch(ExecError):
    """The CPU performance form (opt-level 3, ``-mcpu``, polynomial ``exp``, vector splits)
    computes other outputs than the verification form of the same program on the same inputs:
    a miscompile in code only the timed form uses. ``verification`` and ``performance`` hold
    the two TVMScript texts. Raised before a CPU timing is reported
    (:func:`steptp.runner.timing.check_performance_form`)."""

    def __init__(self, reason: str, verification: str = "", performance: str = ""):
        super().__init__(reason)
        self.verification = verification
        self.performance = performance

    def __reduce__(self):
        return (self.__class__, (self.reason, self.verification, self.performance))


def short_tvm_error(exc: BaseException, limit: int = 400) -> str:
    """One-line summary of a TVM exception: its type plus the most informative line.

    TVM messages are long multi-line tracebacks; this keeps the ``Check failed`` /
    ``error:`` line (or the first non-empty line) and squeezes whitespace.
    """
    text = str(exc)
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    best = None
    for key in ("Check failed", "error:", "Error:", "not supported", "not implemented", "Cannot"):
        for ln in lines:
            if key in ln:
                best = ln
                break
        if best:
            break
    if best is None:
        best = lines[0] if lines else ""
    best = " ".join(best.split())
    out = f"{type(exc).__name__}: {best}" if best else type(exc).__name__
    return out if len(out) <= limit else out[: limit - 3] + "..."


__all__ = ["BackendError", "LoweringError", "BuildError", "PreflightError", "ExecError", "WorkerFailure", "FormMismatch", "short_tvm_error"]
