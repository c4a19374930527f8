"""The ``pack`` runner (:mod:`steptp.runner.base`): measurements by a GPU node reached through
files, in rounds (TVM MetaSchedule's builder/runner split; issue 37's GPU packs).

Layout under the search directory ``out``::

    rounds/<k>/dictionary.jsonl   the round's entries (one per candidate, dataset format)
    rounds/<k>/pack/              the pack built from them (the ``builder``, a
                                  :class:`steptp.runner.base.Builder` passed in from the GPU
                                  front end: this layer does not import it)
    rounds/<k>/results/           what ``python -m steptp.gpu.run PACK -o RESULTS --time
                                  --retime-best 1`` writes on the node: ``results.jsonl`` (one
                                  record per entry), ``retime.jsonl`` (each program's fastest
                                  entry measured a second time in the same call)

:meth:`PackRunner.run` answers from every complete round's results (a round is complete when
every entry of its manifest has a record); an input without one is *pending* and joins the
next round. :meth:`PackRunner.submit` writes that round (or finds it already written, with the
same entries, by an earlier run that is still waiting) and says where the node must write its
results. A re-time (``purpose="retime"``) is answered by the node's own second measurement of
that entry when there is one, else by an entry ``<key>:retime`` of a later round.

The node's records are read by :func:`_read_results`. The summary fields this kind adds (the
node's device, baselines, speed of light) and the run's ``gpu_summary.json`` are
:mod:`steptp.runner.pack_summary`'s.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Callable

from ..leir.fileformat import LeirModule
from .base import MeasureInput, MeasureResult, RunnerFuture, SearchOutcome, text_key


class PackError(ValueError):
    """A round directory that cannot be read (one line; the CLI's exit 2)."""


class PackRunner:
    """Measure through packs (module docstring). ``out``: the search directory; ``builder``:
    the :class:`steptp.runner.base.Builder` (or a function ``fn(round_dir, pack_dir) -> dict``)
    building ``pack_dir`` from ``round_dir/dictionary.jsonl``; None in a search worker, which
    builds nothing."""

    kind = "pack"
    measures_here = False
    retimes = True
    per_program_dirs = True  # OUT holds the rounds
    parallel_programs = True  # nothing is timed here

    def __init__(self, out: str | Path, builder=None):
        self.out = Path(out)
        self.builder = builder
        self._results: dict = {}    # entry id -> EntryRecord, every complete round
        self._retimes: dict = {}    # entry id -> the node's second measurement (EntryRecord)
        self._baselines: dict = {}  # the pack's program key -> ProgramBaselines (the latest round's)
        self._skipped: dict[str, str] = {}  # entry id -> why the pack builder left it out
        self._pending: dict[str, dict] = {}   # entry id -> entry of the next round
        self.rounds_done = 0
        self._load()

    @property
    def rounds_dir(self) -> Path:
        return self.out / "rounds"

    def _round_dirs(self) -> list[Path]:
        if not self.rounds_dir.is_dir():
            return []
        return sorted((p for p in self.rounds_dir.iterdir() if p.is_dir() and p.name.isdigit()),
                      key=lambda p: int(p.name))

    def _load(self) -> None:
        for d in self._round_dirs():
            self._skipped.update(_skipped(d))
            got = _complete(d)
            if got is None:
                continue
            self.rounds_done += 1
            try:
                res = _read_results(d / "results")
            except ValueError as e:
                raise PackError(f"{d / 'results'}: {e}") from None
            self._results.update(res.entries)
            self._retimes.update(res.retimes)
            self._baselines.update(res.baselines)

    def root_time_us(self, program: str, root: LeirModule) -> float | None:
        """The root's smallest median timed beside any candidate of ``program`` (µs), None
        before the first round returns."""
        times = [r.root_us for k, r in self._parsed().items() if k.split(":", 1)[0] == program and r.root_us]
        return min(times) if times else None

    def _parsed(self) -> dict[str, MeasureResult]:
        return {k: _measure_result(v) for k, v in self._results.items()}

    def result(self, key: str, purpose: str = "search") -> MeasureResult | None:
        """The result of entry ``key`` (a re-time: the node's second measurement, else the
        ``<key>:retime`` entry), None while pending."""
        eid = key if purpose == "search" else f"{key}:retime"
        if eid in self._skipped and eid not in self._results:
            return MeasureResult("build_failed", reason=f"not packed: {self._skipped[eid]}")
        if purpose == "retime":
            rec = self._retimes.get(key) or self._results.get(f"{key}:retime")
            return None if rec is None else _measure_result(rec, self._baselines.get(rec.program))
        rec = self._results.get(key)
        return None if rec is None else _measure_result(rec)

    def run(self, batch: list[MeasureInput]) -> list[RunnerFuture]:
        """Futures answered from the complete rounds; the others pending, their entries kept
        for :meth:`submit`."""
        out = []
        for x in batch:
            res = self.result(x.key, x.purpose)
            if res is None:
                if x.entry is None:
                    raise ValueError(f"{x.key}: the pack runner needs the entry to ship")
                eid = x.key if x.purpose == "search" else f"{x.key}:retime"
                self._pending[eid] = {**x.entry, "id": eid}
            out.append(RunnerFuture(res))
        return out

    def pending(self) -> dict[str, dict]:
        """The entries waiting for the next round (by entry id)."""
        return dict(self._pending)

    pending_entries = pending  # the former name

    def entry(self, name: str, root: LeirModule, source: str | None, seed: int):
        """``fn(module, steps) -> entry``: the dataset-format entry a pack is built from
        (:func:`steptp.gpu.pack.collect` reads it): the root as the original, so every timing on
        the node is a speedup over the root; the ``.py`` source when the program came from one,
        so the node times PyTorch eager beside it."""
        return entry_fn(name, root, source, seed)

    def identity(self) -> dict:
        """``{"runner": kind}``: how caches and summaries record this runner."""
        return {"runner": self.kind}

    def summary_fields(self, outcome: SearchOutcome) -> dict:
        """``rounds``, the node's device, its baselines and the speed of light
        (:func:`steptp.runner.pack_summary.remote_fields`)."""
        from .pack_summary import remote_fields  # noqa: PLC0415

        return remote_fields(self, outcome)

    def run_files(self, summaries: list[dict], out: Path) -> dict[str, dict]:
        """``gpu_summary.json`` (:func:`steptp.runner.pack_summary.gpu_aggregate`) once every
        program has its summary."""
        from .pack_summary import gpu_aggregate  # noqa: PLC0415

        return {"gpu_summary.json": gpu_aggregate(summaries, Path(out))} if summaries else {}

    def worker_spec(self) -> tuple[str, dict]:
        """``("pack", {"out"})``: a worker's runner over the same rounds, building nothing."""
        return self.kind, {"out": str(self.out)}

    def reopen(self) -> "PackRunner":
        """A fresh runner over the same rounds and builder (reads the rounds again)."""
        return PackRunner(self.out, self.builder)

    def add_pending(self, entries: dict[str, dict]) -> None:
        """Entries another process's runner found pending (a search worker's)."""
        self._pending.update(entries)

    def submit(self) -> dict | None:
        """Write the pending entries as the next round (or find the waiting round holding the
        same entries); returns ``{"round", "pack", "results", "entries"}`` or None when
        nothing is pending. A waiting round with other entries (an interrupted run that chose
        differently, or other settings) is written again."""
        if not self._pending:
            return None
        entries = [self._pending[k] for k in sorted(self._pending)]
        dirs = self._round_dirs()
        last = dirs[-1] if dirs else None
        if last is not None and _complete(last) is None:
            d = last  # a round still waiting for the node: the same place
        else:
            d = self.rounds_dir / str(int(last.name) + 1 if last is not None else 0)
        _write_round(d, entries, self._build)
        skipped = _skipped(d)
        self._skipped.update(skipped)
        self._pending.clear()
        return {"round": int(d.name), "pack": str(d / "pack"), "results": str(d / "results"),
                "entries": len(entries) - len(skipped), "skipped": len(skipped)}


    def _build(self, round_dir: Path, pack_dir: Path) -> dict:
        if self.builder is None:
            raise PackError(f"{round_dir}: no pack builder (a search worker's runner submits nothing)")
        build = getattr(self.builder, "build", None)
        return build(round_dir, pack_dir) if build is not None else self.builder(round_dir, pack_dir)


def entry_fn(name: str, root: LeirModule, source: str | None, seed: int):
    """``fn(module, steps) -> entry`` of :meth:`PackRunner.entry`. ``steps``: the candidate's
    steps (typed :class:`steptp.policy.steps.Step` objects or ``{"rule", ...}`` dicts); the
    entry's strategy is the last step's rule."""
    from ..leir.printer import format_program  # noqa: PLC0415
    from ..leir.signatures import signature_dict  # noqa: PLC0415

    sig = signature_dict(root)
    orig = format_program(root.program)
    src = str(Path(source).resolve()) if source else None

    def entry(module: LeirModule, steps: list) -> dict:
        text = format_program(module.program)
        last = steps[-1] if steps else None
        rule = "" if last is None else (last["rule"] if isinstance(last, dict) else last.rule)
        return {"id": f"{name}:{text_key(text)}", "program": name, "signature": sig,
                "strategy": {"id": rule}, "original": {"leir": orig},
                "transformed": {"leir": text}, "seed": seed, "source": src, "verification": {"equal": True}}

    return entry


def _read_results(d: Path):
    """The node's records of one round's results directory
    (:class:`steptp.runner.record.RoundResults`: entries and second measurements by entry id,
    baselines by the pack's program key). Raises :class:`steptp.runner.record.SchemaError` (a
    ``ValueError``, one line) for results of another schema version."""
    from .record import read_results  # noqa: PLC0415

    return read_results(d)


def _measure_result(rec, baselines=None) -> MeasureResult:
    """What a node record (:class:`steptp.runner.record.EntryRecord`) says of one entry:
    ``equal`` only when Equal on the device, not rejected by compute-sanitizer, and timed (a
    re-timed best the node's sanitizer gate refused, ``sanitizer_gate == "none"``: the tool
    exists there and gave no clean verdict, answers ``sanitizer`` with that reason);
    ``extra``: the device, PyTorch eager beside the original, the sanitizer verdict and, for a
    program's re-timed best, its baselines' summary fields
    (:meth:`steptp.runner.record.ProgramBaselines.summary_fields`)."""
    t = rec.timing
    st = rec.status
    ok = st == "equal" and t is not None and t.speedup is not None
    status = "equal" if ok else ("timing_failed" if st == "equal" else st)
    reason = "" if ok else (rec.reason or "not measured")
    if ok and rec.sanitizer_gate == "none":
        # the node has compute-sanitizer and it gave this entry no clean verdict: no best
        status, reason = "sanitizer", ("no compute-sanitizer verdict where the tool exists ("
                                       + (rec.sanitizer_reason or "not run") + ")")
    return MeasureResult(status, None if t is None else t.transformed_us, None if t is None else t.original_us,
                         None if t is None else t.speedup, None if t is None else t.ci,
                         None if t is None else t.verdict, reason=reason,
                         extra={"device": None if t is None else t.device, "eager": rec.eager,
                                "device_name": rec.device_name, "sanitizer_clean": rec.sanitizer_clean(),
                                "sanitizer_gate": rec.sanitizer_gate,
                                **({"baselines": baselines.summary_fields()} if baselines is not None else {})})


def _skipped(d: Path) -> dict[str, str]:
    """Entries the pack builder of round ``d`` left out (a candidate that does not build for the
    GPU, an original that fails), by entry id, with the reason: answered as ``build_failed``."""
    man = d / "pack" / "manifest.json"
    try:
        doc = json.loads(man.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return {x["id"]: x.get("reason", "") for x in doc.get("skipped", []) if isinstance(x, dict) and "id" in x}


def _complete(d: Path) -> bool | None:
    """True when round ``d``'s results hold a record for every entry of its manifest (or its
    pack holds no entry at all: every one was left out), else None."""
    res, man = d / "results" / "results.jsonl", d / "pack" / "manifest.json"
    if man.exists() and not res.exists():
        try:
            if not json.loads(man.read_text(encoding="utf-8")).get("entries"):
                return True
        except (OSError, ValueError):
            return None
    if not res.exists() or not man.exists():
        return None
    try:
        want = {e["id"] for e in json.loads(man.read_text(encoding="utf-8")).get("entries", [])}
    except (OSError, ValueError, KeyError) as e:
        raise PackError(f"{man}: not a pack manifest ({e})") from None
    got = set()
    for line in res.read_text(encoding="utf-8").splitlines():
        try:
            got.add(json.loads(line)["id"])
        except (ValueError, KeyError, TypeError):
            continue  # a line cut by an interruption: the node's rerun repairs it
    return True if want <= got else None


def _write_round(d: Path, entries: list[dict], write_pack: Callable[[Path, Path], dict]) -> None:
    """Write ``dictionary.jsonl`` and build the pack, unless the same entries' pack is already
    complete there (a command run again while the node has not answered)."""
    from ..io import write_jsonl_atomic  # noqa: PLC0415

    d.mkdir(parents=True, exist_ok=True)
    text = "".join(json.dumps(e, sort_keys=True) + "\n" for e in entries)
    f = d / "dictionary.jsonl"
    same = f.exists() and "".join(json.dumps(json.loads(x), sort_keys=True) + "\n"
                                  for x in f.read_text(encoding="utf-8").splitlines() if x.strip()) == text
    if same and (d / "pack" / "manifest.json").exists():
        return
    write_jsonl_atomic(f, entries)
    for sub in ("pack", "results"):
        if (d / sub).exists():
            shutil.rmtree(d / sub)
    write_pack(d, d / "pack")


__all__ = ["PackRunner", "PackError", "entry_fn"]
