"""The search's **Runner** role (TVM MetaSchedule's ``Runner`` / ``RunnerFuture``): measure a
batch of verified candidates and answer with futures that may be *pending*.

One interface, chosen by :func:`steptp.runner.kinds.create`:

=======  =====================================================================================
local    this machine's ``--device`` (:mod:`steptp.runner.local`): every future is done when
         :meth:`Runner.run` returns (TVM ``time_evaluator``, the one timing loop of
         :mod:`steptp.runner.timing`)
pack     a GPU node reached through files (:mod:`steptp.runner.pack`): the batch is written
         as a round's pack (``OUT/rounds/<k>/``) and its futures stay pending until the node's
         results lie in ``OUT/rounds/<k>/results`` (``python -m steptp.gpu.run``); the same
         command, run again, finds them done (MetaSchedule's ``RPCRunner`` without the socket)
=======  =====================================================================================

A third kind (e.g. TVM RPC to a GPU machine that is online) is a new module implementing
:class:`Runner` and one more line in :func:`steptp.runner.kinds.create`; the search does not
change.

A :class:`MeasureInput` is one candidate of one program, measured against that program's root
(the speedup is the root's time over the candidate's, timed interleaved where the runner can);
``entry`` is what a remote runner ships (a dataset-format entry built by the caller: this layer
knows no dataset format). Units: microseconds. Nothing here imports anything above
:mod:`steptp.runner` (the layer test checks it).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from ..leir.fileformat import LeirModule

#: The runner kinds :func:`create` knows (``stp search --runner``).
KINDS = ("local", "pack")


@dataclass
class MeasureInput:
    """One candidate to measure: ``key`` (unique within the search: the program's name and the
    candidate's text hash), ``program`` (name), ``root`` and ``module`` (LEIR, one signature),
    ``purpose`` (``search``: a sample; ``retime``: the final best measured again, interleaved
    with its root, for the reported speedup), ``entry`` (the payload a remote runner ships)."""

    key: str
    program: str
    root: LeirModule
    module: LeirModule
    purpose: str = "search"
    entry: dict | None = None


@dataclass
class MeasureResult:
    """A runner's answer for one :class:`MeasureInput`. ``status``: ``equal`` (verified where
    it ran, where the runner verifies, and timed) or the rejection (``not_equal``,
    ``timing_failed``, ``fault``, ``sanitizer``); ``time_us`` the candidate's median (µs);
    ``root_us`` the root's median timed beside it (µs, None when the runner does not time the
    root per candidate); ``speedup`` root/candidate (the median of paired ratios when timed
    interleaved) with its 95 % interval ``ci``; ``verdict`` (``faster``/``slower``/``same``);
    ``extra``: runner-specific JSON-ready fields (baselines of the program, device name)."""

    status: str
    time_us: float | None = None
    root_us: float | None = None
    speedup: float | None = None
    ci: list | None = None
    verdict: str | None = None
    reason: str = ""
    extra: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return {"status": self.status, "time_us": self.time_us, "root_us": self.root_us, "speedup": self.speedup,
                "ci": self.ci, "verdict": self.verdict, "reason": self.reason, "extra": self.extra}

    @classmethod
    def from_dict(cls, d: dict) -> "MeasureResult":
        return cls(**{k: d.get(k) for k in ("status", "time_us", "root_us", "speedup", "ci", "verdict")},
                   reason=d.get("reason") or "", extra=d.get("extra") or {})


class RunnerFuture:
    """The future of one measurement (MetaSchedule's ``RunnerFuture``): :meth:`done` says
    whether the result is known; :meth:`result` returns it (``RuntimeError`` while pending)."""

    def __init__(self, result: MeasureResult | None = None):
        self._result = result

    def done(self) -> bool:
        return self._result is not None

    def result(self) -> MeasureResult:
        if self._result is None:
            raise RuntimeError("the measurement is pending")
        return self._result


class Runner(Protocol):
    """Measure batches of candidates (the module docstring)."""

    kind: str

    def root_time_us(self, program: str, root: LeirModule) -> float | None:
        """The root's run time (µs) when known (``local``: timed now; ``pack``: from the node's
        results, None before the first round returns)."""
        ...

    def run(self, batch: list[MeasureInput]) -> list[RunnerFuture]:
        """One future per input, in order."""
        ...

    def submit(self) -> dict | None:
        """Send what is pending (``pack``: write the round and its pack); returns ``{"round",
        "pack", "results", "entries"}`` when the search must wait, else None."""
        ...


class Pending(Exception):
    """Raised by a search whose batch has a pending future: the search stops here and resumes,
    replayed from its caches, once the runner has the results."""


__all__ = ["KINDS", "MeasureInput", "MeasureResult", "RunnerFuture", "Runner", "Pending"]
