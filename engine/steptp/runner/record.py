"""The one result record of a measurement (issue 45): what the GPU node writes and what the
search, ``stp gpu merge`` and the reports read, as versioned dataclasses.

Standard library only (``dataclasses``, ``json``): the GPU node imports it with nothing but
numpy and the TVM runtime, and so does the build side. Every line the node writes carries
``"schema": SCHEMA_VERSION``; a reader given a line of another version raises
:class:`SchemaError` with one line (``results written by schema N, this stp reads M``), which
callers turn into an exit code (never a traceback).

Two records:

* :class:`EntryRecord`: one measured entry (a candidate of a program, or a dataset entry):
  the device verdict of the original and of the transformed function (:class:`Check`: exec,
  equal, max abs/rel error over the trials), the interleaved timing of the pair
  (:class:`PairTiming`: medians with their interquartile range, the paired speedup with its
  95 % interval), the ``compute-sanitizer`` checks (:class:`SanitizerCheck`) and one
  ``status`` of :data:`STATUSES` with its ``reason``. Files: ``RESULTS/results.jsonl``,
  ``RESULTS/retime.jsonl``.
* :class:`ProgramBaselines`: one program's baselines measured on the node in one session,
  interleaved with our best: PyTorch eager called from Python against our function called
  from Python, eager captured in a CUDA graph against our kernels, ``torch.compile`` (default
  mode and ``max-autotune-no-cudagraphs``), each ratio with its 95 % interval
  (:class:`Ratio`), dtypes, the device. Every time that is None has a non-empty
  ``<field>_reason``. File: ``RESULTS/baselines.jsonl``.

Units: microseconds per call (``*_us``), seconds (``compile_s``). Source of the interval:
:func:`steptp.runner.stats.paired_speedup` (percentile bootstrap over the paired rounds).
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Iterable

#: Version of the records below; bump it when a field changes meaning or disappears.
SCHEMA_VERSION = 1

#: Every status an :class:`EntryRecord` can have: ``equal`` (Equal on the device, timed
#: when timing was asked), ``not_equal`` (ran, wrong output), ``fault`` (a CUDA error, a crash
#: or a time-out of the transformed function), ``build_failed`` (no library for it),
#: ``sanitizer`` (``compute-sanitizer`` found an error: rejected like a wrong output),
#: ``original_failed`` (the original itself did not run Equal: nothing to compare with),
#: ``unchecked`` (no CPU references on the node), ``timing_failed`` (Equal, its timing faulted).
STATUSES = ("equal", "not_equal", "fault", "build_failed", "sanitizer", "original_failed", "unchecked",
            "timing_failed")


class SchemaError(ValueError):
    """A results line of another schema version, or one that is not a record (one line)."""


def check_schema(obj: dict, where: str = "") -> None:
    """Raise :class:`SchemaError` unless ``obj["schema"] == SCHEMA_VERSION`` (a line without
    the key was written before the records were versioned: schema 0)."""
    got = obj.get("schema", 0) if isinstance(obj, dict) else None
    if got != SCHEMA_VERSION:
        pre = f"{where}: " if where else ""
        raise SchemaError(f"{pre}results written by schema {got}, this stp reads {SCHEMA_VERSION}")


def _take(cls, d: dict | None):
    """``cls(**d)`` with the keys ``cls`` knows (computed keys of ``to_json`` dropped)."""
    if d is None:
        return None
    names = {f.name for f in fields(cls)}
    return cls(**{k: v for k, v in d.items() if k in names})


@dataclass
class Check:
    """One function's verdict on the device over the trials (outputs poisoned, compared with
    the CPU references by :mod:`steptp.runner.tolerance`). ``exec`` None: not run."""

    exec: bool | None = None
    equal: bool | None = None
    reason: str = ""
    max_abs_err: float | None = None
    max_rel_err: float | None = None
    trials: int = 0
    first_call_ms: float | None = None


@dataclass
class PairTiming:
    """Interleaved timing of the original (A) and the transformed function (B) on trial 0's
    inputs by ``time_evaluator`` (kernels only, L2 flushed): medians per call in µs, their
    interquartile ranges ``[q1, q3]``, the median of the paired ratios A/B with its 95 %
    interval, ``number``: calls per measurement of B (``original_number``: of A);
    ``error``: a fault during the timing (then the figures are None)."""

    original_us: float | None = None
    transformed_us: float | None = None
    speedup: float | None = None
    ci: list[float] | None = None
    verdict: str | None = None
    rounds: int = 0
    number: int | None = None
    original_number: int | None = None
    device: str | None = None
    original_iqr_us: list[float] | None = None
    transformed_iqr_us: list[float] | None = None
    error: str = ""


@dataclass
class SanitizerCheck:
    """One ``compute-sanitizer --tool TOOL`` run of a function (launched once with the
    reference inputs in its own process): ``errors`` from its ``ERROR SUMMARY`` (racecheck:
    the errors of its ``RACECHECK SUMMARY``), ``first_error`` the first reported error line,
    ``reason`` why there is no verdict (time cap, tool failure); ``errors`` None then."""

    tool: str
    errors: int | None = None
    warnings: int | None = None
    first_error: str = ""
    returncode: int | None = None
    seconds: float = 0.0
    reason: str = ""

    @property
    def finding(self) -> bool:
        return bool(self.errors)


@dataclass
class EntryRecord:
    """One measured entry (module docstring). ``status``/``reason``/``time_us`` ... are
    derived (:attr:`status`) and written by :meth:`to_json` for readers without this class."""

    id: str
    program: str
    strategy: str = ""
    device: str = "cuda"
    device_name: str | None = None
    arch: str | None = None
    original: Check = field(default_factory=Check)
    transformed: Check = field(default_factory=Check)
    timing: PairTiming | None = None
    time_py_us: float | None = None
    time_py_us_reason: str = "timed from Python only for each program's best (baselines.jsonl: best_py_us)"
    sanitizer: list[SanitizerCheck] | None = None
    sanitizer_reason: str = "not run (compute-sanitizer checks only each program's re-timed best)"
    eager: dict | None = None  # PyTorch eager beside the original (steptp.gpu.eager.measure), per program
    cpu_equal: bool | None = None
    agree: bool | None = None
    unchecked: bool = False
    retried: str = ""
    #: For a re-timed record (``retime.jsonl``): the node's verdict under which it may be its
    #: program's best (:func:`steptp.gpu.sanitizer.best_verdict`): ``clean``, an ``unchecked:
    #: ...`` label where no compute-sanitizer can run, ``none`` where the tool exists and gave
    #: no clean verdict (not run, capped, a finding); ``""``: not decided (no gate).
    sanitizer_gate: str = ""
    build_failed: str = ""
    seconds_check: float = 0.0
    seconds_time: float = 0.0
    schema: int = SCHEMA_VERSION

    # -- derived -------------------------------------------------------------------------
    @property
    def status(self) -> str:
        """One of :data:`STATUSES` (order: build, references, original, transformed,
        sanitizer, timing)."""
        tr, orig = self.transformed, self.original
        if self.build_failed:
            return "build_failed"
        if self.unchecked:
            return "unchecked"
        if not orig.equal:
            return "original_failed" if orig.exec is not None or orig.reason else "fault"
        if not tr.exec:
            return "fault"
        if not tr.equal:
            return "not_equal"
        if any(s.finding for s in self.sanitizer or []):
            return "sanitizer"
        if self.timing is not None and (self.timing.error or self.timing.speedup is None):
            return "timing_failed"
        return "equal"

    @property
    def reason(self) -> str:
        """Why the status is not ``equal`` (empty when it is)."""
        st = self.status
        if st == "equal":
            return ""
        if st == "build_failed":
            return self.build_failed
        if st == "sanitizer":
            s = next(s for s in self.sanitizer or [] if s.finding)
            return f"compute-sanitizer {s.tool}: {s.errors} error(s): {s.first_error}"
        if st == "timing_failed":
            return self.timing.error or "not timed"
        if st in ("original_failed", "unchecked") or (st == "fault" and not self.original.equal):
            return self.original.reason or self.transformed.reason or st
        return self.transformed.reason or st

    @property
    def equal(self) -> bool:
        """Equal on the device (original too) and clean under the sanitizer where it ran."""
        return self.status in ("equal", "timing_failed")

    @property
    def time_us(self) -> float | None:
        """Kernels-only median µs per call of the transformed function (``time_evaluator``)."""
        return None if self.timing is None else self.timing.transformed_us

    @property
    def repeats(self) -> int:
        return 0 if self.timing is None else self.timing.rounds

    def sanitizer_clean(self) -> bool | None:
        """True: every check ran clean; False: a finding; None: not checked (see
        ``sanitizer_reason``) or no verdict (a cap hit)."""
        if not self.sanitizer:
            return None
        if any(s.finding for s in self.sanitizer):
            return False
        return True if all(s.errors == 0 for s in self.sanitizer) else None

    # -- JSON -----------------------------------------------------------------------------
    def to_json(self) -> dict:
        """A JSON-ready dict: the fields, plus the derived ``status``, ``reason``,
        ``time_us``, ``time_iqr_us``, ``repeats``, ``max_abs_err``, ``max_rel_err``,
        ``trials`` (of the transformed function) and ``sanitizer_clean``."""
        d = asdict(self)
        t = self.timing
        d.update(status=self.status, reason=self.reason, time_us=self.time_us,
                 time_iqr_us=None if t is None else t.transformed_iqr_us, repeats=self.repeats,
                 max_abs_err=self.transformed.max_abs_err, max_rel_err=self.transformed.max_rel_err,
                 trials=self.transformed.trials, sanitizer_clean=self.sanitizer_clean())
        if self.status not in STATUSES:  # a defect of this class, never of the data
            raise ValueError(f"unknown status {self.status!r}")
        return d

    @classmethod
    def from_json(cls, d: dict, where: str = "") -> "EntryRecord":
        """The record of a dict written by :meth:`to_json`. Raises :class:`SchemaError` for
        another schema version or a line that is not an entry record."""
        check_schema(d, where)
        try:
            rec = _take(cls, d)
            rec.original = _take(Check, d.get("original")) or Check()
            rec.transformed = _take(Check, d.get("transformed")) or Check()
            rec.timing = _take(PairTiming, d.get("timing"))
            rec.sanitizer = None if d.get("sanitizer") is None else [_take(SanitizerCheck, s) for s in d["sanitizer"]]
        except (TypeError, AttributeError) as e:
            raise SchemaError(f"{where + ': ' if where else ''}not an entry record ({e})") from None
        return rec


#: Time fields of :class:`ProgramBaselines` (µs per call, ``compile_s``/``compile_autotune_s``
#: in seconds); each None one has a non-empty ``<field>_reason``.
TIME_FIELDS = ("best_us", "best_py_us", "original_us", "eager_us", "eager_graph_us", "compile_us",
               "compile_autotune_us", "compile_s", "compile_autotune_s")

#: The ratios: name -> (baseline field, our field). ``speedup_vs_X`` = X's time / ours (> 1:
#: ours faster), measured interleaved, like with like: Python calls against Python calls,
#: kernels against kernels.
RATIOS = {"speedup_vs_original": ("original_us", "best_us"),
          "speedup_vs_eager": ("eager_us", "best_py_us"),
          "speedup_vs_eager_graph": ("eager_graph_us", "best_us"),
          "speedup_vs_compile": ("compile_us", "best_py_us"),
          "speedup_vs_compile_autotune": ("compile_autotune_us", "best_py_us")}


@dataclass
class Ratio:
    """Paired speedup of ours over a baseline (:func:`steptp.runner.stats.paired_speedup`
    with ``a`` the baseline): the median of the per-round ratios baseline/ours, its 95 %
    bootstrap interval, ``verdict`` faster/slower/same, the rounds."""

    speedup: float
    ci: list[float]
    verdict: str
    rounds: int


@dataclass
class ProgramBaselines:
    """One program's baselines (module docstring). ``best_id``: the entry timed as our best
    (None: the original, nothing beat it); ``device``: ``cuda`` or ``cuda-sim`` (the
    simulated device: its figures are CPU figures, GPU-only baselines are None);
    ``dtypes``: the program's tensors' dtypes; ``torch_dtype``: the model's floating dtype;
    ``allow_tf32``: PyTorch's TF32 switches while eager and ``torch.compile`` ran
    (``{"matmul": bool, "cudnn": bool}``, both False: IEEE f32 like our kernels; None: no
    PyTorch baseline ran); ``eager_params`` (``"program"``: the model ran with the program's
    own parameter values, else ``"own seeded: <why>"``), ``eager_check`` (``"equal"``: its
    output matched our original's on trial 0, ``"mismatch: ..."``: eager is not comparable and
    not timed), ``eager_mode`` (``train``/``eval``), ``best_sanitizer`` (the compute-sanitizer
    verdict of ``best_id``: ``clean``, ``unchecked: ...`` where no tool can check; None for
    the original);
    ``iqr_us``: per time field its interquartile range ``[q1, q3]``; ``ratios``: per name of
    :data:`RATIOS` a :class:`Ratio`; ``reasons``: per None time or ratio field why;
    ``cpu_figures``: what ran on the CPU of the simulated device instead (never GPU figures)."""

    program: str
    name: str = ""
    best_id: str | None = None
    device: str = "cuda"
    device_name: str | None = None
    torch_version: str | None = None
    dtypes: dict = field(default_factory=dict)
    torch_dtype: str | None = None
    allow_tf32: dict | None = None
    eager_params: str | None = None
    eager_check: str | None = None
    eager_mode: str | None = None
    best_sanitizer: str | None = None
    best_us: float | None = None
    best_py_us: float | None = None
    original_us: float | None = None
    eager_us: float | None = None
    eager_graph_us: float | None = None
    compile_us: float | None = None
    compile_autotune_us: float | None = None
    compile_s: float | None = None
    compile_autotune_s: float | None = None
    iqr_us: dict = field(default_factory=dict)
    ratios: dict = field(default_factory=dict)
    reasons: dict = field(default_factory=dict)
    rounds: int = 0
    cpu_figures: dict = field(default_factory=dict)
    seconds: float = 0.0
    schema: int = SCHEMA_VERSION

    def set_reason(self, name: str, why: str, *, keep: bool = True) -> None:
        """Record why ``name`` is None (``keep``: an earlier reason stays)."""
        if not (keep and self.reasons.get(name)):
            self.reasons[name] = why

    def set_reason_now(self, name: str, why: str) -> None:
        """Record why ``name`` is None, replacing an earlier reason."""
        self.reasons[name] = why

    def missing_reasons(self) -> list[str]:
        """Time and ratio fields that are None without a reason (must be empty)."""
        out = [f for f in TIME_FIELDS if getattr(self, f) is None and not self.reasons.get(f)]
        return out + [r for r in RATIOS if self.ratios.get(r) is None and not self.reasons.get(r)]

    def fill_ratio_reasons(self) -> None:
        """Drop the reasons of fields that have a value; give every missing ratio the reason
        of the missing time it needs."""
        for f in TIME_FIELDS:
            if getattr(self, f) is not None:
                self.reasons.pop(f, None)
        for r, (base, ours) in RATIOS.items():
            if self.ratios.get(r) is not None:
                self.reasons.pop(r, None)
                continue
            why = [f"{f}: {self.reasons.get(f) or 'not measured'}" for f in (base, ours) if getattr(self, f) is None]
            self.reasons[r] = "; ".join(why) or "not timed interleaved"

    def to_json(self) -> dict:
        """A JSON-ready dict (ratios as dicts). Raises ``ValueError`` when a None field has no
        reason (a defect of the writer)."""
        self.fill_ratio_reasons()
        miss = self.missing_reasons()
        if miss:
            raise ValueError(f"{self.program}: baseline fields without a value or a reason: {miss}")
        d = asdict(self)
        d["ratios"] = {k: (None if v is None else asdict(v) if isinstance(v, Ratio) else v)
                       for k, v in self.ratios.items()}
        return d

    @classmethod
    def from_json(cls, d: dict, where: str = "") -> "ProgramBaselines":
        """Raises :class:`SchemaError` for another schema version or a malformed line."""
        check_schema(d, where)
        try:
            b = _take(cls, d)
            b.ratios = {k: (None if v is None else _take(Ratio, v)) for k, v in (d.get("ratios") or {}).items()}
        except (TypeError, AttributeError) as e:
            raise SchemaError(f"{where + ': ' if where else ''}not a baselines record ({e})") from None
        return b

    def summary_fields(self) -> dict:
        """The per-program ``summary.json`` fields (issue 44): ``best_us`` (kernels),
        ``best_py_us`` (from Python), ``original_us``, ``eager_us``, ``eager_graph_us``,
        ``compile_us``, ``compile_autotune_us``, ``compile_s``, ``compile_autotune_s``; per
        ratio of :data:`RATIOS` (``speedup_vs_original``, ``speedup_vs_eager``, ``speedup_vs_eager_graph``,
        ``speedup_vs_compile``, ``speedup_vs_compile_autotune``) the value and
        ``<ratio>_ci`` ([lo, hi]); for each of these that is None ``<field>_reason``; and
        ``dtypes``, ``torch_dtype``, ``baseline_device``, ``device_name``, ``allow_tf32``,
        ``eager_params``, ``eager_check``, ``best_sanitizer``."""
        self.fill_ratio_reasons()
        out: dict = {f: getattr(self, f) for f in TIME_FIELDS}
        for r in RATIOS:
            v = self.ratios.get(r)
            out[r] = None if v is None else v.speedup
            out[f"{r}_ci"] = None if v is None else list(v.ci)
        for k in list(out):
            if out[k] is None and not k.endswith("_ci"):
                out[f"{k}_reason"] = self.reasons.get(k) or "not measured"
        out.update(dtypes=dict(self.dtypes), torch_dtype=self.torch_dtype, baseline_device=self.device,
                   device_name=self.device_name, allow_tf32=dict(self.allow_tf32) if self.allow_tf32 else None,
                   eager_params=self.eager_params, eager_check=self.eager_check, best_sanitizer=self.best_sanitizer)
        return out


def absent_baselines(program: str, why: str, **kw) -> ProgramBaselines:
    """A :class:`ProgramBaselines` with every figure None for the same reason ``why``."""
    b = ProgramBaselines(program=program, **kw)
    for f in TIME_FIELDS:
        b.set_reason(f, why)
    return b


# ---------------------------------------------------------------------------
# Files
# ---------------------------------------------------------------------------


def _lines(path: Path) -> Iterable[tuple[int, dict]]:
    """``(line number, object)`` of a JSONL file; a line that is not JSON (one cut by an
    interruption: the node's rerun repairs it) is skipped."""
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            yield n, json.loads(line)
        except ValueError:
            continue


def read_entries(path: str | os.PathLike) -> dict[str, EntryRecord]:
    """The :class:`EntryRecord` s of a JSONL file (``results.jsonl``, ``retime.jsonl``) by
    entry id; empty when the file is missing. Raises :class:`SchemaError`."""
    p = Path(path)
    if not p.is_file():
        return {}
    out = {}
    for n, d in _lines(p):
        r = EntryRecord.from_json(d, f"{p}:{n}")
        out[r.id] = r
    return out


def read_baselines(path: str | os.PathLike) -> dict[str, ProgramBaselines]:
    """The :class:`ProgramBaselines` of ``baselines.jsonl`` (a file or a results directory)
    by program key; the last line of a program wins. Raises :class:`SchemaError`."""
    p = Path(path)
    p = p / "baselines.jsonl" if p.is_dir() else p
    if not p.is_file():
        return {}
    out = {}
    for n, d in _lines(p):
        b = ProgramBaselines.from_json(d, f"{p}:{n}")
        out[b.program] = b
    return out


@dataclass
class RoundResults:
    """What a node's run left in a results directory: ``entries`` (``results.jsonl``),
    ``retimes`` (``retime.jsonl``: each program's best measured again, with its sanitizer
    checks), ``baselines`` (``baselines.jsonl``), by entry id / program key."""

    entries: dict
    retimes: dict
    baselines: dict

    def program_of(self, entry_id: str) -> str | None:
        """The pack's program key of an entry id (``EntryRecord.program``), or None."""
        r = self.entries.get(entry_id) or self.retimes.get(entry_id)
        return None if r is None else r.program

    def baselines_of(self, entry_id: str) -> "ProgramBaselines | None":
        """The baselines of the program that entry ``entry_id`` belongs to, or None."""
        k = self.program_of(entry_id)
        return None if k is None else self.baselines.get(k)

    def best(self, program: str) -> EntryRecord | None:
        """The re-timed record of ``program``'s best (the one its baselines name), or None."""
        b = self.baselines.get(program)
        if b is not None and b.best_id:
            return self.retimes.get(b.best_id) or self.entries.get(b.best_id)
        return None


def read_results(results_dir: str | os.PathLike) -> RoundResults:
    """Read a results directory of ``python -m steptp.gpu.run`` (missing files: empty).
    Raises :class:`SchemaError` (one line) for a file of another schema version."""
    d = Path(results_dir)
    return RoundResults(read_entries(d / "results.jsonl"), read_entries(d / "retime.jsonl"), read_baselines(d))


def baseline_summary(results_dir: str | os.PathLike, entry_id: str | None = None, program: str | None = None) -> dict:
    """The per-program ``summary.json`` fields (:meth:`ProgramBaselines.summary_fields`) of
    the program that entry ``entry_id`` belongs to (or of the pack's program key
    ``program``) from a results directory; every field None with the reason when the node
    measured no baselines for it. Raises :class:`SchemaError` for another schema version."""
    res = read_results(results_dir)
    key = program if program is not None else (res.program_of(entry_id) if entry_id is not None else None)
    b = res.baselines.get(key) if key is not None else None
    if b is None:
        b = absent_baselines(key or "", "the node measured no baselines for this program "
                                        "(python -m steptp.gpu.run ... --baselines)")
    return b.summary_fields()


def write_jsonl(path: str | os.PathLike, records: Iterable) -> None:
    """Write records (anything with ``to_json``) as JSONL, atomically (temporary file renamed
    into place)."""
    p = Path(path)
    tmp = p.with_name(f".{p.name}.{os.getpid()}.tmp")
    tmp.write_text("".join(json.dumps(r.to_json()) + "\n" for r in records), encoding="utf-8")
    os.replace(tmp, p)


__all__ = ["SCHEMA_VERSION", "STATUSES", "SchemaError", "check_schema", "Check", "PairTiming", "SanitizerCheck",
           "EntryRecord", "TIME_FIELDS", "RATIOS", "Ratio", "ProgramBaselines", "absent_baselines", "read_entries",
           "read_baselines", "RoundResults", "read_results", "baseline_summary", "write_jsonl"]
