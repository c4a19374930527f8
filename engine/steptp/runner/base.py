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
:class:`Runner` and one registration, ``steptp.runner.kinds.register(name, factory)``; the
search does not change: every decision that depends on the kind is an attribute or a method of
:class:`Runner` (where candidates are verified, how an entry is built, which summary fields and
run files the kind adds, what a round does, whether programs may be searched in parallel).

The **Builder** role (what becomes a pack) is :class:`Builder`: a remote runner ships the
:meth:`Runner.entry` payloads of a round and a builder turns them into what its node loads
(:class:`steptp.gpu.pack.PackBuilder` for the ``pack`` kind, handed in from above: this layer
does not import the GPU front end).

A :class:`MeasureInput` is one candidate of one program, measured against that program's root
(the speedup is the root's time over the candidate's, timed interleaved where the runner can);
``entry`` is what a remote runner ships (a dataset-format entry built by the caller: this layer
knows no dataset format). Units: microseconds. Nothing here imports anything above
:mod:`steptp.runner` (the layer test checks it).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Protocol

from ..leir.fileformat import LeirModule

#: The runner kinds shipped with the package (``stp search --runner``); the registry
#: (:func:`steptp.runner.kinds.names`) also holds the kinds registered later.
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


@dataclass
class SearchOutcome:
    """What a finished search hands to :meth:`Runner.summary_fields`: ``program`` (its name),
    ``root``, ``best`` and ``nodes`` (search nodes: ``id``, ``text``, ``status``, ``module``,
    ``time_us``, ``speedup``), ``retime`` (the runner's re-time of the best, a
    :class:`MeasureResult`, or None), ``summary`` (the summary so far), ``translation`` (the
    PyTorch translation of a ``.py`` program, else None) and ``device`` (``cpu``/``cuda``)."""

    program: str
    root: Any
    best: Any
    nodes: list
    retime: MeasureResult | None
    summary: dict
    translation: Any = None
    device: str = "cpu"


class Builder(Protocol):
    """The Builder role of a remote runner: turn a round's entries
    (``round_dir/dictionary.jsonl``, :meth:`Runner.entry` payloads) into what its node loads
    (``pack_dir``); returns a JSON-ready description (the pack's manifest summary)."""

    def build(self, round_dir: Path, pack_dir: Path) -> dict: ...


class Runner(Protocol):
    """Measure batches of candidates (the module docstring). Besides :meth:`run`, a kind
    declares what the search must do differently for it, so that the search never asks which
    kind it has."""

    kind: str
    #: True: candidates are verified and measured on this machine's device (``local``); False:
    #: measured elsewhere, so the search verifies them here on the CPU with the GPU's static
    #: checks (only those for a program too large to run here) and the node again, and a PyTorch
    #: program's translation needs its shapes only.
    measures_here: bool
    #: True: the runner re-times a search's best against its root (:meth:`run` with
    #: ``purpose="retime"``), the reported speedup.
    retimes: bool
    #: True: every program's search writes into ``OUT/<program>/`` even for one program (the
    #: runner keeps its own files in ``OUT``).
    per_program_dirs: bool
    #: True: programs may be searched in parallel worker processes (the measurements are not
    #: taken on this machine, so parallel searches do not disturb them).
    parallel_programs: bool

    def root_time_us(self, program: str, root: LeirModule) -> float | None:
        """The root's run time (µs) when known (``local``: timed now; ``pack``: from the node's
        results, None before the first round returns)."""
        ...

    def run(self, batch: list[MeasureInput]) -> list[RunnerFuture]:
        """One future per input, in order."""
        ...

    def entry(self, name: str, root: LeirModule, source: str | None, seed: int) -> Callable | None:
        """``fn(module, steps) -> dict``: the payload :class:`MeasureInput.entry` ships for a
        candidate of program ``name`` (``source``: the ``.py`` file it was translated from, or
        None), or None when the runner ships nothing."""
        ...

    def identity(self) -> dict:
        """How search caches and summaries record this runner: ``{"runner": kind}`` (a cache
        written with another runner is not replayed)."""
        ...

    def summary_fields(self, outcome: SearchOutcome) -> dict:
        """The fields this kind adds to a program's ``summary.json`` (e.g. PyTorch eager beside
        the local best; the node's device, baselines and speed of light)."""
        ...

    def run_files(self, summaries: list[dict], out: Path) -> dict[str, dict]:
        """Files this kind adds to a finished run's directory ``out``: ``{file name: JSON}``."""
        ...

    def pending(self) -> dict[str, dict]:
        """The payloads waiting for the next round, by entry id (empty when nothing waits)."""
        ...

    def add_pending(self, entries: dict[str, dict]) -> None:
        """Payloads that another process's runner (a search worker's) found pending."""
        ...

    def submit(self) -> dict | None:
        """Send what is pending (``pack``: write the round and its pack); returns ``{"round",
        "pack", "results", "entries"}`` when the search must wait, else None."""
        ...

    def worker_spec(self) -> tuple[str, dict]:
        """``(kind, options)`` of a runner of the same kind over the same files for a search
        worker process, rebuilt there by :func:`steptp.runner.kinds.create` (picklable
        options; it builds nothing: its :meth:`pending` comes back to this one)."""
        ...

    def reopen(self) -> "Runner":
        """A fresh runner of the same kind and options (reads what has arrived since)."""
        ...


def text_key(text: str) -> str:
    """The 12-hex-digit key of a program text in measurement keys and entry ids
    (``<program>:<key>``)."""
    import hashlib  # noqa: PLC0415

    return hashlib.sha256(text.encode()).hexdigest()[:12]


class Pending(Exception):
    """Raised by a search whose batch has a pending future: the search stops here and resumes,
    replayed from its caches, once the runner has the results."""


__all__ = ["KINDS", "MeasureInput", "MeasureResult", "RunnerFuture", "SearchOutcome", "Builder", "Runner", "Pending",
           "text_key"]
