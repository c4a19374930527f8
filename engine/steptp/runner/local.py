"""The ``local`` runner (:mod:`steptp.runner.base`): candidates timed on this machine's
device when :meth:`LocalRunner.run` is called; every future is done at once.

Search samples: :func:`steptp.runner.timing.measure` (paper App. C.2: TVM ``time_evaluator``,
``warmup`` 3 calls, ``repeat`` 3 measurements, the median; cached per program text), the
speedup the root's median over the candidate's. Re-time (``purpose="retime"``): root and
candidate timed again **interleaved** (:func:`steptp.runner.timing.compare`, ``retime_rounds``
rounds, same inputs), the speedup the median of the paired ratios with its bootstrap 95 %
interval; the search reports it only when the interval lies above 1.
"""

from __future__ import annotations

from pathlib import Path

from ..leir.fileformat import LeirModule
from .base import MeasureInput, MeasureResult, RunnerFuture, SearchOutcome
from .device import DEVICES


class LocalRunner:
    """Measure here (module docstring). ``device``: ``cpu`` or ``cuda``; ``repeat``,
    ``warmup``: measurements and warm-up calls of a sample; ``retime_rounds``: interleaved
    rounds of a re-time; ``timer``: optional ``fn(module) -> µs`` replacing the timing of
    samples (a fixed protocol in tests; then no re-time is taken). Raises ``ValueError`` for an
    unknown device."""

    kind = "local"
    measures_here = True
    per_program_dirs = False
    parallel_programs = False  # timing here in parallel would measure the contention

    def __init__(self, device: str = "cpu", repeat: int = 3, warmup: int = 3, retime_rounds: int = 10, timer=None):
        if device not in DEVICES:
            raise ValueError(f"unknown device {device!r}; expected one of {DEVICES}")
        self.device, self.repeat, self.warmup = device, repeat, warmup
        self.retime_rounds, self.timer = retime_rounds, timer
        self.retimes = timer is None  # no re-time with a custom timer (a fixed protocol in tests)
        self._options = {"device": device, "repeat": repeat, "warmup": warmup, "retime_rounds": retime_rounds,
                         "timer": timer}
        self._roots: dict[str, float] = {}

    def _time(self, module: LeirModule) -> float:
        if self.timer is not None:
            return float(self.timer(module))
        from .timing import measure  # noqa: PLC0415

        return float(measure(module, self.device, repeat=self.repeat, warmup=self.warmup).median_us)

    def root_time_us(self, program: str, root: LeirModule) -> float:
        """The root's median (µs), timed once per program. Raises Lowering/Build/ExecError
        when the root does not build or run here."""
        if program not in self._roots:
            self._roots[program] = self._time(root)
        return self._roots[program]

    def run(self, batch: list[MeasureInput]) -> list[RunnerFuture]:
        """Time every input now (module docstring); a candidate that does not build or run is
        a ``timing_failed`` result, never an exception."""
        return [RunnerFuture(self._one(x)) for x in batch]

    def _one(self, x: MeasureInput) -> MeasureResult:
        try:
            root_us = self.root_time_us(x.program, x.root)
            if x.purpose == "retime":
                if self.timer is not None:
                    return MeasureResult("timing_failed", reason="no re-time with a custom timer")
                from .timing import compare  # noqa: PLC0415

                c = compare(x.root, x.module, self.device, rounds=self.retime_rounds)
                return MeasureResult("equal", c.candidate_us, c.baseline_us, c.speedup, list(c.ci), c.verdict,
                                     extra={"rounds": self.retime_rounds})
            t = self._time(x.module)
        except Exception as e:  # noqa: BLE001 - one candidate that cannot be timed is one rejection
            return MeasureResult("timing_failed", reason=f"{type(e).__name__}: {' '.join(str(e).split())[:300]}")
        return MeasureResult("equal", t, root_us, root_us / t if t > 0 else None)

    def entry(self, name: str, root: LeirModule, source: str | None, seed: int) -> None:
        """Nothing is shipped: the candidates are here."""
        return None

    def identity(self) -> dict:
        """``{"runner": kind}``: how caches and summaries record this runner."""
        return {"runner": self.kind}

    def summary_fields(self, outcome: SearchOutcome) -> dict:
        """For a PyTorch program on the CPU: ``eager_time_us`` (PyTorch eager,
        :func:`steptp.runner.baseline.eager_time_us`), ``speedup_vs_eager`` (over the re-timed
        best, else the best sample) and ``root_speedup_vs_eager``; ``eager_error`` when eager
        cannot be timed. Nothing else."""
        tr = outcome.translation
        if tr is None or outcome.device != "cpu":
            return {}
        from .baseline import eager_time_us  # noqa: PLC0415

        out: dict = {}
        try:
            eager = eager_time_us(tr)
            out["eager_time_us"] = eager
            best_us = (outcome.summary.get("confirmed") or {}).get("best_time_us") or outcome.best.time_us
            out["speedup_vs_eager"] = eager / best_us if best_us else None
            out["root_speedup_vs_eager"] = eager / outcome.root.time_us if outcome.root.time_us else None
        except Exception as e:  # noqa: BLE001 - the comparison is informative only
            out["eager_error"] = f"{type(e).__name__}: {str(e)[:200]}"
        return out

    def run_files(self, summaries: list[dict], out: Path) -> dict[str, dict]:
        """No files of its own."""
        return {}

    def pending(self) -> dict[str, dict]:
        """Nothing is ever pending here."""
        return {}

    def add_pending(self, entries: dict[str, dict]) -> None:
        """Nothing is ever pending here (``entries`` is empty)."""

    def submit(self) -> None:
        """Nothing is ever pending here."""
        return None

    def worker_spec(self) -> tuple[str, dict]:
        """``("local", options)`` (the local runner is not used in worker processes)."""
        return self.kind, dict(self._options)

    def reopen(self) -> "LocalRunner":
        """A fresh local runner with the same options."""
        return LocalRunner(**self._options)


__all__ = ["LocalRunner"]
