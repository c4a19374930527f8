"""The evaluator of a search (:class:`Measure`): verify every candidate against the ROOT
program, time the Equal ones.

* Verification: :func:`steptp.verify.verify_pair` (root vs. candidate, 3 seeded random +
  2 ordered trials, in a worker process with a time limit). With ``device="cpu"`` the GPU preflight and
  CUDA code generation are skipped (``gpu_check=False``); with ``device="cuda"`` they are
  part of the Build check and the candidate runs on the GPU (``device="cuda"``).
* Timing: :func:`steptp.runner.timing.measure` (a performance build: no NaN poisoning;
  paper App. B.2: TVM ``time_evaluator``, 3 warm-up runs, 3 repetitions), reported in
  microseconds. The median of the repetitions is used.
* Caches: verification results and times per canonical program text, so a program seen
  twice (in one search or across searches of the same root) costs nothing the second time.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from ..leir import LeirModule
from .core import Evaluation, canonical


class RootFailed(RuntimeError):
    """The root program cannot be timed (the search has no reference runtime)."""


class TargetUnavailable(RuntimeError):
    """The requested device (e.g. ``cuda``) is not present on this machine."""


def cuda_problem() -> str:
    """'' when CUDA programs can be built, run and timed here, else one line saying what is
    missing (:func:`steptp.backend.cuda_runtime.cuda_available`)."""
    from ..backend.cuda_runtime import cuda_available

    return cuda_available() or ""


def time_us(module: LeirModule, device: str = "cpu", repeat: int = 3, warmup: int = 3) -> float:
    """Run time of ``module`` in microseconds on ``device``: the median of ``repeat``
    measurements of :func:`steptp.runner.timing.measure` (cached there by program text).
    On the CPU TVM runs one thread unless ``TVM_NUM_THREADS`` is set before the first
    measurement (see that module), so ``P`` loops only pay off with more threads."""
    from ..runner.timing import measure

    return float(measure(module, device, repeat=repeat, warmup=warmup).median_us)


@dataclass
class Measure:
    """Verify-then-time evaluator of one search (see the module docstring).

    ``root``: the program every candidate is compared with. ``device``: ``cpu`` or
    ``cuda`` (``stp search --device``). ``trials``/``seed``: verification trials (paper: 3).
    ``timeout_s``: time limit of one verification. ``repeat``/``warmup``: timing
    repetitions (paper: 3/3). ``timer``: optional ``fn(module) -> µs`` replacing
    :func:`time_us` (for another device or a fixed measurement protocol).
    """

    root: LeirModule
    device: str = "cpu"
    trials: int = 3
    seed: int = 0
    timeout_s: float = 120.0
    repeat: int = 3
    warmup: int = 3
    timer: object = None
    _verified: dict = field(default_factory=dict)
    _times: dict = field(default_factory=dict)
    _funcs: dict = field(default_factory=dict)
    root_time_us: float = 0.0

    def __post_init__(self):
        if self.device not in ("cpu", "cuda"):
            raise ValueError(f"unknown device {self.device!r} (cpu or cuda)")
        why = cuda_problem() if self.device == "cuda" else ""
        if why:
            raise TargetUnavailable(f"--device cuda: {why}")
        try:
            self.root_time_us = self._time(self.root)
        except Exception as e:  # noqa: BLE001 - LoweringError/BuildError/ExecError of the timing build
            raise RootFailed(f"the root program cannot be timed: {' '.join(str(e).split())[:300]}") from None

    def _time(self, module: LeirModule) -> float:
        key = canonical(module)
        hit = self._times.get(key)
        if hit is None:
            if self.timer is not None:
                hit = float(self.timer(module))
            else:
                hit = time_us(module, self.device, repeat=self.repeat, warmup=self.warmup)
            self._times[key] = hit
        return hit

    def same_code(self, parent: LeirModule, module: LeirModule) -> bool:
        """True when ``module`` builds to the same code as ``parent`` on this device, so
        timing it would measure the parent again: on ``cpu``, their performance-form PrimFuncs
        are structurally equal up to the names of variables and loops
        (``tvm_ffi.structural_equal(..., map_free_vars=True)``; a ``B`` loop is a serial loop
        there, so a thread binding changes nothing). Always False on ``cuda`` and with a custom
        ``timer``. Never raises (a program that does not lower is not called a no-op)."""
        if self.device != "cpu" or self.timer is not None:
            return False
        try:
            import tvm_ffi  # noqa: PLC0415

            return bool(tvm_ffi.structural_equal(self._perf_func(parent), self._perf_func(module),
                                                 map_free_vars=True))
        except Exception:  # noqa: BLE001
            return False

    def _perf_func(self, module: LeirModule):
        from ..backend.build import parse_tvmscript  # noqa: PLC0415
        from ..backend.perf import perf_cpu_text  # noqa: PLC0415

        key = canonical(module)
        hit = self._funcs.get(key)
        if hit is None:
            hit = self._funcs[key] = parse_tvmscript(perf_cpu_text(module))
        return hit

    def evaluate(self, module: LeirModule) -> Evaluation:
        """Verify ``module`` against the root (3 random + 2 ordered trials); time it when Equal. The returned
        :class:`Evaluation` carries ``seconds`` spent per stage (verify, time)."""
        from ..verify import verify_pair

        key = canonical(module)
        ev = Evaluation("not_equal", seconds={"verify": 0.0, "time": 0.0})
        res = self._verified.get(key)
        if res is None:
            t0 = time.perf_counter()
            res = verify_pair(self.root, module, trials=self.trials, seed=self.seed, isolated=True,
                              timeout_s=self.timeout_s, gpu_check=self.device == "cuda",
                              device=None if self.device == "cpu" else self.device)
            ev.seconds["verify"] = time.perf_counter() - t0
            self._verified[key] = res
        ev.verify = res.to_dict()
        if not res.equal:
            ev.reason = res.reason or "not equal"
            return ev
        t0 = time.perf_counter()
        try:
            ev.time_us = self._time(module)
        except Exception as e:  # noqa: BLE001 - a program that verifies but cannot be timed is one rejection
            ev.status, ev.reason = "timing_failed", f"{type(e).__name__}: {str(e)[:300]}"
            return ev
        finally:
            ev.seconds["time"] = time.perf_counter() - t0
        ev.status = "equal"
        return ev
