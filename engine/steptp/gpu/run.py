"""Run a GPU pack (``stp gpu pack``) with the TVM runtime only: ``python -m steptp.gpu.run PACK -o RESULTS``.

Needs numpy, ``apache-tvm-ffi`` and what the pack carries (``PACK/lib``: TVM's runtime
libraries; ``PACK/python``: this module and the few it imports), a CUDA 13 driver and
runtime (``libcudart.so.13``) and Python 3.11-3.13; no TVM compiler, LLVM, lark, egglog,
sympy or torch (torch, where it imports, adds the PyTorch baseline). Recipe on a GPU node::

    pip install --no-index --no-deps --target /tmp/site apache_tvm_ffi-*.whl   # if missing
    PYTHONPATH=PACK/python:/tmp/site python -m steptp.gpu.run PACK -o RESULTS --time

References: a CPU worker runs each original's verification-form CPU build (``PACK/refs``) on
the regenerated, digest-checked inputs, ahead of and in parallel with the GPU work, and
writes them to ``RESULTS/references/`` (:func:`steptp.gpu.node.prepare_references`; a pack
made with ``--store-references`` carries them instead).

GPU work: ``-j`` long-lived worker processes (default 1: one per GPU) run the entries of one
program at a time (:func:`steptp.gpu.node.run_entries`): each batch library is loaded once
per worker, the CUDA context is kept, inputs and device tensors are made once per program.
Each original and transformed function runs on every trial (3 random + 2 ordered), outputs
poisoned, and is compared with the CPU references by the one tolerance rule
(:mod:`steptp.runner.tolerance`, with the original's rounding allowance). A CUDA error
discards the worker: the entry that caused it runs once more in a fresh worker and is an Exec
failure (with the CUDA error text) if it fails again; the rest continue in a fresh worker. A
time-out or crash, whose entry is unknown, reruns that call's entries one by one the same way.
``--time`` times the original and the transformed function **interleaved** (A, B, B, A ...
rounds of ``time_evaluator`` measurements on the same inputs, L2 flushed before each on CUDA)
and reports the median of the paired ratios with a bootstrap 95 % interval
(:func:`steptp.runner.stats.paired_speedup`). Where ``torch`` imports and an original came
from a ``.py`` file, PyTorch eager is timed on the same inputs, interleaved with the original
(:mod:`steptp.gpu.eager`): records gain ``eager`` (``eager_us``, ``original_us``), microseconds
per call; ``--no-eager`` turns it off.

After the entries (:mod:`steptp.gpu.session`): ``--sanitizer`` runs each re-timed best under
``compute-sanitizer`` (:mod:`steptp.gpu.sanitizer`; a finding rejects it); ``--baselines``
measures per program, interleaved with our best, PyTorch eager from Python against our
function from Python and eager in a CUDA graph against our kernels, ``--compile`` /
``--autotune`` add ``torch.compile`` (default / ``max-autotune-no-cudagraphs``), each capped
(``--baseline-cap-s``, ``--compile-cap-s``): ``RESULTS/baselines.jsonl``
(:mod:`steptp.gpu.baselines`). Every line the node writes is a versioned record of
:mod:`steptp.runner.record`; results of another schema version are refused (exit 2).

Outputs: ``RESULTS/results.jsonl`` (one line per entry, appended as it finishes: a rerun
resumes), ``summary.json`` (verification and timing throughput apart, entries/s) and
``report.md`` (per program: the original's and the best transformed entry's time against
eager). ``--deadline-s`` stops cleanly before the deadline, keeping what finished. Exit 0 when
entries ran, 1 when every entry failed to run (or the deadline left none done), 2 for a bad
pack or a machine without what the pack needs.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from pathlib import Path

import numpy as np

from ..backend import cuda_runtime as cr
from ..backend.errors import BackendError
from ..runner.pool import shared
from ..runner.record import Check, EntryRecord, PairTiming, SchemaError, read_entries
from ..runner.worker import IsolatedRunner


#: Pack formats this runner reads (``/1``: references stored; ``/2``: computed on the node).
FORMATS = ("stp-gpu-pack/1", "stp-gpu-pack/2")


class PackRunError(ValueError):
    """A pack that cannot be run (missing, wrong format, unreadable)."""


def read_manifest(pack: str | os.PathLike) -> dict:
    """``PACK/manifest.json``; :class:`PackRunError` when absent or not a pack."""
    p = Path(pack) / "manifest.json"
    try:
        m = json.loads(p.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise PackRunError(f"{p}: cannot read the pack manifest ({e})") from None
    if not isinstance(m, dict) or m.get("format") not in FORMATS:
        raise PackRunError(f"{p}: not an stp GPU pack (format {m.get('format') if isinstance(m, dict) else None!r})")
    return m


# ---------------------------------------------------------------------------
# Driver
# ---------------------------------------------------------------------------


def _repair_tail(path: Path) -> None:
    """Drop a last line cut short by an interruption (no newline), so appends start clean."""
    if not path.is_file():
        return
    data = path.read_bytes()
    if data and not data.endswith(b"\n"):
        path.write_bytes(data[: data.rfind(b"\n") + 1])


def _records(path: Path) -> list[EntryRecord]:
    """The records of a results file (:func:`steptp.runner.record.read_entries`); a file of
    another schema version is a :class:`PackRunError` (one line)."""
    try:
        return list(read_entries(path).values())
    except SchemaError as e:
        raise PackRunError(str(e)) from None


def _done_ids(path: Path) -> set:
    done = set()
    if path.is_file():
        for line in path.read_text(encoding="utf-8").splitlines():
            try:
                done.add(json.loads(line)["id"])
            except (ValueError, KeyError, TypeError):
                continue
    return done


_STOP = object()


def gpu_slots() -> list[str]:
    """The GPUs workers are spread over: the entries of ``CUDA_VISIBLE_DEVICES`` when set,
    else ``0 .. n-1`` for the driver's ``n`` devices; one slot (``0``) on the simulated device
    or when the driver reports none."""
    if cr.simulated():
        return ["0"]
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    if env:
        return [d.strip() for d in env.split(",") if d.strip()] or ["0"]
    n, _ = cr.cuda_devices()
    return [str(i) for i in range(max(1, n))]


class _Run:
    """The driver's state of one pack run (threads: one reference thread, ``jobs`` GPU
    threads each owning one :class:`IsolatedRunner`; the main thread writes results)."""

    def __init__(self, pack: str, m: dict, refdir: str, opts: dict, *, jobs: int, per_call_s: float,
                 deadline_s: float | None, chunk: int):
        import queue  # noqa: PLC0415
        import threading  # noqa: PLC0415

        self.pack, self.m, self.refdir, self.opts = pack, m, refdir, opts
        self.jobs, self.per_call_s, self.deadline_s, self.chunk = max(1, jobs), per_call_s, deadline_s, max(1, chunk)
        self.t0 = time.perf_counter()
        self.results: "queue.Queue" = queue.Queue()
        self.work: "queue.Queue" = queue.Queue()
        self.ready: dict[str, threading.Event] = {}
        self.ref_status: dict[str, dict] = {}
        self.original_failed: dict[str, str] = {}
        self.restarts = 0
        self.retries = 0
        self.stopped = False
        self.lock = threading.Lock()
        self.threading = threading

    def left(self) -> float | None:
        return None if self.deadline_s is None else self.deadline_s - (time.perf_counter() - self.t0)

    def limit(self, n: int = 1) -> float:
        left = self.left()
        lim = self.per_call_s * n
        return lim if left is None else max(1.0, min(lim, left))

    # -- references ---------------------------------------------------------------------
    def references(self, todo) -> None:
        """Reference thread (one of ``ref_jobs``): CPU references of the programs taken from
        the queue ``todo``, in the order the GPU needs them, through one CPU worker."""
        import queue  # noqa: PLC0415

        from .node import prepare_references  # noqa: PLC0415

        runner = shared(f"gpu-ref:{threading.current_thread().name}", self.per_call_s, preload="runtime")
        try:
            while True:
                try:
                    okey = todo.get_nowait()
                except queue.Empty:
                    return
                try:
                    if self.left() is not None and self.left() <= 1.0:
                        st = {"ok": False, "reason": "deadline"}
                    else:
                        st = runner.call(prepare_references, self.pack, self.refdir, okey,
                                         timeout_s=self.limit(2), discard_on_error=True)
                except BackendError as e:
                    st = {"ok": False, "reason": f"original program failed on this CPU (exec): {e.reason}"}
                except Exception as e:  # noqa: BLE001  (a defect: that program stays unchecked, the run goes on)
                    st = {"ok": False, "reason": f"CPU references not computed ({type(e).__name__}: {e})"}
                self.ref_status[okey] = st
                self.ready[okey].set()
        finally:
            runner.close()

    # -- GPU ------------------------------------------------------------------------------
    def gpu(self, visible: str | None = None) -> None:
        """GPU thread: program groups from the queue, in chunks, through one worker (on GPU
        ``visible`` when given)."""
        # this thread's worker, pinned to GPU ``visible`` (it and every replacement of it)
        runner = shared(f"gpu-run:{threading.current_thread().name}", self.per_call_s,
                        env={"CUDA_VISIBLE_DEVICES": visible} if visible is not None else None, preload="runtime")
        try:
            while True:
                item = self.work.get()
                if item is _STOP:
                    return
                okey, entries = item
                self.ready[okey].wait()
                st = self.ref_status.get(okey) or {"ok": True}
                if not st.get("ok", True):
                    if st.get("reason") == "deadline":
                        self.stopped = True
                        continue
                    for e in entries:
                        self.results.put(self._unchecked(e, st["reason"]))
                    continue
                i = 0
                while i < len(entries):
                    if self.left() is not None and self.left() <= 1.0:
                        self.stopped = True
                        break
                    part = entries[i:i + self.chunk]
                    i += self._chunk(runner, okey, part)
        finally:
            with self.lock:
                self.restarts += runner.restarts
            runner.close()

    def _opts(self, okey: str, **kw) -> dict:
        return {**self.opts, "original_failed": self.original_failed.get(okey), **kw}

    def _call(self, runner: IsolatedRunner, okey: str, entries: list[dict], **kw) -> dict:
        from .node import run_entries  # noqa: PLC0415

        try:
            return runner.call(run_entries, self.pack, self.refdir, okey, entries, self._opts(okey, **kw),
                               timeout_s=self.limit(len(entries)), discard_on_error=True)
        except BackendError as e:  # time limit, crash: the worker is gone, the entry unknown
            return {"records": [], "fault": {"index": None, "phase": "unknown", "reason": e.reason}, "discard": False}

    def _chunk(self, runner: IsolatedRunner, okey: str, part: list[dict]) -> int:
        """Run ``part``; returns how many entries of it are finished (recorded)."""
        out = self._call(runner, okey, part)
        for r in out["records"]:
            self.results.put(self._record(part, okey, r))
        if out.get("discard"):
            runner.discard()
        f = out["fault"]
        if f is None:
            return len(part)
        done = len(out["records"])
        if f["index"] is None:  # which entry hung or crashed is unknown: one by one
            for e in part[done:]:
                self._one(runner, okey, e)
            return len(part)
        self._retry(runner, okey, part[done], f)
        return done + 1

    def _one(self, runner: IsolatedRunner, okey: str, e: dict) -> None:
        out = self._call(runner, okey, [e])
        if out.get("discard"):
            runner.discard()
        if out["records"]:
            self.results.put(self._record([e], okey, out["records"][0]))
        else:
            self._retry(runner, okey, e, out["fault"])

    def _retry(self, runner: IsolatedRunner, okey: str, e: dict, fault: dict) -> None:
        """Entry ``e`` faulted (``fault``): once more in a fresh worker; what fails again is recorded."""
        with self.lock:
            self.retries += 1
        for _ in range(2):
            out = self._call(runner, okey, [e], retry=True)
            if out.get("discard"):
                runner.discard()
            if out["records"]:
                rec = self._record([e], okey, out["records"][0])
                rec["retried"] = fault["reason"][:300]
                self.results.put(rec)
                return
            f = out["fault"]
            if f["phase"] == "original" and okey not in self.original_failed:
                self.original_failed[okey] = f["reason"]  # failed twice: the entries run without it
                continue
            break
        f = out["fault"]
        tr = {"exec": False, "equal": False, "reason": f"exec: {f['reason']}", "max_abs_err": None}
        orig = {"exec": False, "equal": False, "reason": f"exec: {self.original_failed[okey]}"} \
            if okey in self.original_failed else {}
        self.results.put(self._record([e], okey, {"id": e["id"], "original": orig, "transformed": tr,
                                                  "retried": fault["reason"][:300]}))

    def _unchecked(self, e: dict, reason: str) -> dict:
        r = {"id": e["id"], "original": {"exec": None, "equal": None, "reason": reason},
             "transformed": {"exec": None, "equal": None, "reason": f"not checked: {reason}"}, "unchecked": True}
        return self._record([e], e["program"], r)

    def _record(self, part: list[dict], okey: str, r: dict) -> dict:
        """The JSON line of a worker's answer ``r`` on an entry of ``part``
        (:class:`steptp.runner.record.EntryRecord`)."""
        e = next(x for x in part if x["id"] == r["id"])
        return entry_record(e, okey, r, self.opts["device_name"], self.opts["arch"]).to_json()


def entry_record(e: dict, okey: str, r: dict, device_name: str | None, arch: str | None) -> EntryRecord:
    """The :class:`~steptp.runner.record.EntryRecord` of manifest entry ``e`` from a worker's
    answer ``r`` (:func:`steptp.gpu.node.run_entries`: ``original``/``transformed`` verdicts,
    ``timing``, ``eager``, ``retried``, ``unchecked``, seconds)."""
    t = r.get("timing")
    timing = None
    if t is not None:
        timing = PairTiming(**{k: v for k, v in t.items() if k in PairTiming.__dataclass_fields__})
    cpu_equal = (e.get("cpu") or {}).get("equal")
    tr = Check(**{k: v for k, v in (r.get("transformed") or {}).items() if k in Check.__dataclass_fields__})
    return EntryRecord(
        id=e["id"], program=okey, strategy=e.get("strategy") or "", device="cuda", device_name=device_name, arch=arch,
        original=Check(**{k: v for k, v in (r.get("original") or {}).items() if k in Check.__dataclass_fields__}),
        transformed=tr, timing=timing, eager=r.get("eager"), cpu_equal=cpu_equal,
        agree=None if cpu_equal is None or r.get("unchecked") else bool(cpu_equal) == bool(tr.equal),
        unchecked=bool(r.get("unchecked")), retried=r.get("retried") or "",
        seconds_check=float(r.get("seconds_check") or 0.0), seconds_time=float(r.get("seconds_time") or 0.0))


def _bar(total: int, progress: bool):
    """A tqdm bar (entries/s) when tqdm imports, else a plain counter on stderr."""
    if not progress:
        return None
    try:
        from tqdm import tqdm  # noqa: PLC0415

        return tqdm(total=total, unit="entry", dynamic_ncols=True, file=sys.stderr)
    except ImportError:
        return None


def run_pack(pack: str | os.PathLike, results: str | os.PathLike, *, timing: bool = False,
             deadline_s: float | None = None, per_call_s: float = 120.0, rounds: int = 8, min_ms: float = 2.0,
             progress: bool = True, jobs: int | None = None, eager: bool = True,
             chunk: int = 16, ref_jobs: int | None = None, results_name: str = "results.jsonl",
             only: set | None = None) -> dict:
    """Run every entry of ``pack`` not yet in ``results/results.jsonl`` (module docstring)
    with ``jobs`` GPU workers (default: one per GPU, :func:`gpu_slots`; worker ``i`` sees GPU
    ``i mod n`` only), ``chunk`` entries per worker call, ``ref_jobs`` CPU workers computing
    the references (default: half the CPUs, 1 to 8); ``per_call_s``: time limit
    of one entry's work in a worker (seconds); ``results_name``: the records file in ``results``
    (``retime.jsonl`` for :func:`retime_best`'s second measurement: its summary is
    ``retime-summary.json``, ``retime-report.md``); ``only``: run these entry ids alone. Returns
    the summary (also written to ``summary.json`` and ``report.md``). Raises :class:`PackRunError` for a bad pack and for
    a machine that cannot run it (one line)."""
    import importlib.util  # noqa: PLC0415

    pack = str(Path(pack).resolve())
    m = read_manifest(pack)
    why = cr.cuda_available(need_nvcc=False, lib_dir=Path(pack) / "lib")
    if why:
        raise PackRunError(f"cannot run the pack here: {why}")
    arch = cr.device_arch()
    if arch and m["arch"] != arch:
        if (cr.arch_level(arch) or 0) < (cr.arch_level(m["arch"]) or 0):
            raise PackRunError(f"the pack was built for {m['arch']} and this GPU is {arch}: PTX runs only on its "
                               f"own architecture or newer (stp gpu pack ... --arch {arch})")
        print(f"note: the pack was built for {m['arch']}, this GPU is {arch}: the driver JIT-compiles its PTX",
              file=sys.stderr)
    out = Path(results)
    out.mkdir(parents=True, exist_ok=True)
    path = out / results_name
    prefix = "" if results_name == "results.jsonl" else Path(results_name).stem + "-"
    _repair_tail(path)
    if path.is_file():
        _records(path)  # results of another schema version: refused before anything runs (PackRunError)
    done = _done_ids(path)
    todo = [e for e in m["entries"] if e["id"] not in done and (only is None or e["id"] in only)]
    torch_progs = {e["program"] for e in todo if (m["programs"].get(e["program"]) or {}).get("torch")}
    if eager and torch_progs and importlib.util.find_spec("torch") is None:
        print(f"note: torch does not import here: PyTorch eager timings skipped ({len(torch_progs)} programs)",
              file=sys.stderr)
        eager = False
    name = "simulated (CPU builds)" if cr.simulated() else cr.device_name(0)
    opts = {"timing": timing, "rounds": rounds, "min_ms": min_ms, "eager": eager,
            "device_name": name, "arch": arch or m["arch"]}
    slots = gpu_slots()
    jobs = jobs or len(slots)
    if timing and jobs > len(slots):
        print(f"note: {jobs} workers share {len(slots)} GPU(s): timings of workers on one GPU disturb each other",
              file=sys.stderr)
    run = _Run(pack, m, str(out / "references"), opts, jobs=jobs, per_call_s=per_call_s, deadline_s=deadline_s,
               chunk=chunk)
    groups: dict[str, list[dict]] = {}
    for e in todo:
        groups.setdefault(e["program"], []).append(e)
    need = [k for k in groups if not m["programs"][k].get("data")]
    for k in groups:
        run.ready[k] = run.threading.Event()
        if k not in need:
            run.ready[k].set()
    for k, es in groups.items():
        run.work.put((k, es))
    import queue  # noqa: PLC0415

    ref_todo: "queue.Queue" = queue.Queue()
    for k in need:
        ref_todo.put(k)
    ref_jobs = max(1, min(ref_jobs or max(1, min(8, (os.cpu_count() or 2) // 2)), len(need) or 1))
    threads = [run.threading.Thread(target=run.references, args=(ref_todo,), daemon=True)
               for _ in range(ref_jobs if need else 0)]
    pin = len(slots) > 1
    threads += [run.threading.Thread(target=run.gpu, args=(slots[i % len(slots)] if pin else None,), daemon=True)
                for i in range(run.jobs)]
    for _ in range(run.jobs):
        run.work.put(_STOP)
    bar = _bar(len(todo), progress)
    ran = 0
    try:
        for t in threads:
            t.start()
        with open(path, "a", encoding="utf-8") as fh:
            gpu_threads = threads[ref_jobs if need else 0:]
            while any(t.is_alive() for t in gpu_threads) or not run.results.empty():
                try:
                    rec = run.results.get(timeout=0.2)
                except Exception:  # noqa: BLE001  (queue.Empty)
                    continue
                fh.write(json.dumps(rec) + "\n")
                fh.flush()
                ran += 1
                if bar is not None:
                    bar.update(1)
                elif progress:
                    rate = ran / max(time.perf_counter() - run.t0, 1e-9)
                    print(f"\r{ran}/{len(todo)} entries, {rate:.1f} entries/s", end="", file=sys.stderr, flush=True)
    finally:
        if bar is not None:
            bar.close()
        elif progress and todo:
            print(file=sys.stderr)
    wall = time.perf_counter() - run.t0
    man = m if only is None else {**m, "entries": [e for e in m["entries"] if e["id"] in only]}
    summary = summarize(path, man, wall=wall, ran=ran, stopped=run.stopped or ran < len(todo))
    summary["worker_restarts"] = run.restarts  # workers discarded after a CUDA error or a time-out
    summary["retried_entries"] = run.retries
    summary["jobs"] = run.jobs
    summary["reference_jobs"] = ref_jobs if need else 0
    summary["references"] = "stored" if not need else "computed on the node"
    summary["reference_seconds"] = round(sum(float(s.get("seconds", 0.0)) for s in run.ref_status.values()), 3)
    summary["reference_digest_mismatches"] = sorted(k for k, s in run.ref_status.items()
                                                    if s.get("digests_match") is False)
    summary["reference_failures"] = {k: s["reason"] for k, s in run.ref_status.items() if not s.get("ok", True)}
    summary["eager"] = "on" if eager else ("off (torch does not import)" if torch_progs else "off")
    (out / f"{prefix}summary.json").write_text(json.dumps(summary, indent=1) + "\n", encoding="utf-8")
    (out / f"{prefix}report.md").write_text(report_md(summary), encoding="utf-8")
    return summary


def best_entries(path: str | os.PathLike, k: int) -> set:
    """Ids of each program's ``k`` fastest entries in a results file (``results.jsonl``):
    Equal on the device (original and transformed), timed, ordered by the median speedup."""
    by: dict[str, list] = {}
    for r in _records(Path(path)):
        if r.status == "equal" and r.timing is not None and r.timing.speedup is not None:
            by.setdefault(r.program, []).append((-float(r.timing.speedup), r.id))
    return {i for xs in by.values() for _, i in sorted(xs)[:k]}


def retime_best(pack: str | os.PathLike, results: str | os.PathLike, k: int, **kw) -> dict | None:
    """Measure each program's ``k`` fastest entries of ``RESULTS/results.jsonl``
    (:func:`best_entries`) again, a fresh interleaved timing beside the original (and PyTorch
    eager) into ``RESULTS/retime.jsonl``, so a speedup is reported only when a second
    measurement reproduces it without another call to the node (issue 37). ``kw``: the
    options of :func:`run_pack`. Returns the re-time's summary, None when nothing was timed."""
    ids = best_entries(Path(results) / "results.jsonl", k)
    if not ids:
        return None
    return run_pack(pack, results, timing=True, results_name="retime.jsonl", only=ids, **kw)


def _per_program(recs: list[EntryRecord], names: dict, unchecked: str | None = None) -> list[dict]:
    """Per program: the original's time, the best Equal transformed entry's time (from
    ``--time``: medians of the interleaved pairs) and PyTorch eager beside the original, in µs
    (the like-with-like baselines are in ``baselines.jsonl``).

    The best is the fastest timed Equal entry that has a clean compute-sanitizer verdict, or,
    where no sanitizer can run (``unchecked``: :func:`steptp.gpu.sanitizer.unchecked_label`),
    the fastest one, labelled so (``best_sanitizer``); an entry the tool could have checked but
    did not (not run, capped, the deadline) is passed over for the next one, and a program
    with none left has ``best_us`` None and ``best_reason``. Eager: ``eager_params`` and
    ``eager_check`` (:func:`steptp.gpu.eager.program_model`); an eager that is not comparable
    has ``eager_us`` None and ``eager_reason``."""
    from .sanitizer import best_verdict, no_verdict_reason  # noqa: PLC0415

    progs: dict[str, dict] = {}
    timed: dict[str, list] = {}
    for r in recs:
        p = progs.setdefault(r.program, {"program": r.program, "name": names.get(r.program, r.program),
                                         "entries": 0, "equal": 0, "original_us": None, "best_us": None,
                                         "best_id": None, "best_sanitizer": None, "eager_us": None,
                                         "eager_params": None, "eager_check": None})
        p["entries"] += 1
        p["equal"] += bool(r.transformed.equal)
        eg = r.eager or {}
        if eg.get("eager_check") is not None:
            p["eager_params"], p["eager_check"] = eg.get("eager_params"), eg["eager_check"]
        if eg.get("eager_us") is not None:
            p["eager_us"] = eg["eager_us"]
            p["original_us"] = p["original_us"] or eg.get("original_us")
        elif eg.get("error") and p["eager_us"] is None:
            p["eager_reason"] = eg["error"]
        t = r.timing
        if t is not None and t.transformed_us is not None and r.status == "equal":
            p["original_us"] = p["original_us"] or t.original_us
            timed.setdefault(r.program, []).append(r)
    for k, rs in timed.items():
        p = progs[k]
        rs.sort(key=lambda r: r.timing.transformed_us)
        for r in rs:
            v = best_verdict(r, unchecked)
            if v is not None:
                p["best_us"], p["best_id"], p["best_sanitizer"] = r.timing.transformed_us, r.id, v
                break
        else:
            p["best_reason"] = (f"none of its {len(rs)} timed Equal entries has a clean compute-sanitizer verdict "
                                f"(the fastest, {rs[0].id}: {no_verdict_reason(rs[0])})")[:500]
        if p["eager_us"] is not None:
            p.pop("eager_reason", None)
    return list(progs.values())


def summarize(path: Path, manifest: dict, *, wall: float = 0.0, ran: int = 0, stopped: bool = False) -> dict:
    """Counts over ``results.jsonl``: Exec/Equal, agreement with the CPU verdicts (and the
    disagreeing entries), first-call latency, throughput (``entries_per_second``: entries
    finished in this run per wall second; ``verification_entries_per_second``: entries per
    second of worker time spent verifying, original and transformed on every trial, times
    the workers; ``timing_entries_per_second``: timed entries per second of worker time
    spent timing, likewise), with timings the speedup distribution per strategy (only
    entries whose transformed program was Equal on the GPU), per program the original's,
    the best transformed entry's (only with a clean compute-sanitizer verdict where the tool
    can run: :func:`_per_program`) and PyTorch eager's time (µs), and ``statuses``: entries
    per :data:`steptp.runner.record.STATUSES` value."""
    from .sanitizer import unchecked_label  # noqa: PLC0415

    recs = _records(path) if path.is_file() else []
    names = {k: v.get("name", k) for k, v in manifest["programs"].items()}
    eq = [r for r in recs if r.transformed.equal]
    first = [r.transformed.first_call_ms for r in recs if r.transformed.first_call_ms is not None]
    dis = [{"id": r.id, "strategy": r.strategy, "cpu_equal": r.cpu_equal, "gpu_equal": r.transformed.equal,
            "reason": r.transformed.reason[:300]} for r in recs if r.agree is False]
    per: dict[str, list] = {}
    for r in recs:
        if r.timing is not None and r.timing.speedup is not None:
            per.setdefault(r.strategy or "-", []).append(r.timing)
    speed = {k: {"n": len(v), "median": float(np.median([t.speedup for t in v])),
                 "faster": sum(t.verdict == "faster" for t in v), "slower": sum(t.verdict == "slower" for t in v)}
             for k, v in sorted(per.items())}
    now = recs[len(recs) - max(ran, 0):]
    check_s = sum(r.seconds_check for r in now)
    timed = [r for r in now if r.timing is not None and r.timing.speedup is not None]
    time_s = sum(r.seconds_time for r in timed)
    statuses: dict[str, int] = {}
    for r in recs:
        statuses[r.status] = statuses.get(r.status, 0) + 1
    progs = _per_program(recs, names, unchecked_label())
    return {"entries": len(manifest["entries"]), "done": len(recs), "ran_now": max(ran, 0),
            "stopped_at_deadline": stopped, "exec": sum(bool(r.transformed.exec) for r in recs),
            "equal": len(eq), "original_equal": sum(bool(r.original.equal) for r in recs),
            "unchecked": sum(r.unchecked for r in recs), "statuses": statuses,
            "cpu_gpu_disagreements": dis, "wall_seconds": round(wall, 2),
            "entries_per_second": round(max(ran, 0) / wall, 3) if wall > 0 else None,
            "verification_entries_per_second": round(max(ran, 0) / check_s, 3) if check_s > 0 else None,
            "timing_entries_per_second": round(len(timed) / time_s, 3) if time_s > 0 else None,
            "first_call_ms_median": float(np.median(first)) if first else None,
            "device_name": recs[0].device_name if recs else None, "arch": manifest["arch"],
            "eager_programs": sum(1 for p in progs if p["eager_us"] is not None),
            "speedup_by_strategy": speed, "programs": progs}


def _us(x) -> str:
    return "-" if x is None else f"{x:.1f}"


def _cell(text) -> str:
    """A markdown table cell of free text (``|`` escaped, cut at 120 characters)."""
    return "-" if not text else str(text).replace("|", "\\|").replace("\n", " ")[:120]


def _ratio(a, b) -> str:
    return "-" if a is None or b is None or b <= 0 else f"{a / b:.2f}x"


def report_md(s: dict) -> str:
    """``report.md`` of a :func:`summarize` summary (with the per-program table against
    PyTorch eager when any program was timed or has an eager time)."""
    lines = ["# GPU pack run", "",
             f"Device: {s['device_name']} ({s['arch']}). Entries: {s['done']}/{s['entries']} done"
             + (" (stopped at the deadline)" if s["stopped_at_deadline"] else "") + ".", "",
             "| Exec | Equal | original Equal | CPU/GPU disagreements | entries/s | verification entries/s "
             "| timing entries/s | first call (median ms) |",
             "|---|---|---|---|---|---|---|---|",
             f"| {s['exec']} | {s['equal']} | {s['original_equal']} | {len(s['cpu_gpu_disagreements'])} | "
             f"{s['entries_per_second']} | {s.get('verification_entries_per_second')} | "
             f"{s.get('timing_entries_per_second')} | {s['first_call_ms_median']} |", ""]
    if s["cpu_gpu_disagreements"]:
        lines += ["## CPU/GPU disagreements", "", "| id | strategy | CPU | GPU | reason |", "|---|---|---|---|---|"]
        lines += [f"| {d['id']} | {d['strategy']} | {d['cpu_equal']} | {d['gpu_equal']} | {d['reason']} |"
                  for d in s["cpu_gpu_disagreements"]]
        lines.append("")
    progs = [p for p in s.get("programs", []) if p["eager_us"] is not None or p["best_us"] is not None
             or p.get("best_reason") or p.get("eager_check")]
    if progs:
        lines += ["## Per program against PyTorch eager (µs per call)", "",
                  "Original: its time beside eager (or from `--time`); best: the fastest Equal transformed entry "
                  "(`--time`) with a clean compute-sanitizer verdict where the tool can run (sanitizer: its verdict, "
                  "or why there is no best); eager: with the program's own parameters, timed only when its output "
                  "matched the original's (eager check). A ratio above 1 means PyTorch is faster.", "",
                  "| program | entries | Equal | original | best transformed | sanitizer | eager | eager check "
                  "| original / eager | best / eager |", "|---|---|---|---|---|---|---|---|---|---|"]
        lines += [f"| {p['name']} | {p['entries']} | {p['equal']} | {_us(p['original_us'])} | {_us(p['best_us'])} | "
                  f"{_cell(p.get('best_sanitizer') or p.get('best_reason'))} | {_us(p['eager_us'])} | "
                  f"{_cell(p.get('eager_check'))} | {_ratio(p['original_us'], p['eager_us'])} | "
                  f"{_ratio(p['best_us'], p['eager_us'])} |" for p in progs]
        lines.append("")
    if s["speedup_by_strategy"]:
        lines += ["## Speedup per strategy (interleaved, median of paired ratios)", "",
                  "| strategy | n | median speedup | faster (CI > 1) | slower (CI < 1) |", "|---|---|---|---|---|"]
        lines += [f"| {k} | {v['n']} | {v['median']:.3f} | {v['faster']} | {v['slower']} |"
                  for k, v in s["speedup_by_strategy"].items()]
    return "\n".join(lines) + "\n"


def _rechoose(out: Path, m: dict, s: dict) -> None:
    """After the sanitizer checks: each program's best chosen again (:func:`_per_program`)
    in the summary ``s`` (from ``results.jsonl``, into which the checks were copied) and in
    ``retime-summary.json`` (from ``retime.jsonl``), now that the checked entries have their
    verdicts."""
    from .sanitizer import unchecked_label  # noqa: PLC0415

    names = {k: v.get("name", k) for k, v in m["programs"].items()}
    label = unchecked_label()
    s["programs"] = _per_program(_records(out / "results.jsonl"), names, label)
    rs = out / "retime-summary.json"
    if rs.is_file():
        doc = json.loads(rs.read_text(encoding="utf-8"))
        doc["programs"] = _per_program(_records(out / "retime.jsonl"), names, label)
        rs.write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")


def gate_retimed(out: Path) -> int:
    """Write each Equal re-timed record's :attr:`~steptp.runner.record.EntryRecord.sanitizer_gate`
    (:func:`steptp.gpu.sanitizer.best_verdict` under this node's :func:`unchecked_label`;
    ``none`` where it may not be a best) into ``OUT/retime.jsonl``, so the search reading the
    results reports a best only with a clean verdict where the tool exists (issue gpu-reach).
    Returns the number of records gated."""
    from ..runner.record import read_entries, write_jsonl  # noqa: PLC0415
    from .sanitizer import best_verdict, unchecked_label  # noqa: PLC0415

    rt = out / "retime.jsonl"
    recs = read_entries(rt)
    label = unchecked_label()
    n = 0
    for r in recs.values():
        if r.status == "equal":
            r.sanitizer_gate = best_verdict(r, label) or "none"
            n += 1
    if n:
        write_jsonl(rt, recs.values())
    return n


def _session(a, s: dict, t0: float) -> None:
    """The sanitizer and baseline phases of :func:`main` (:mod:`steptp.gpu.session`), under
    the run's deadline; their summaries join ``summary.json`` and ``report.md``."""
    from .session import baselines_table, check_best, measure_baselines  # noqa: PLC0415

    deadline = None if a.deadline_s is None else t0 + a.deadline_s
    m = read_manifest(a.pack)
    out = Path(a.out)
    if a.sanitizer and (out / "retime.jsonl").is_file():
        s["sanitizer"] = check_best(str(Path(a.pack).resolve()), out, m, cap_s=a.sanitizer_cap_s, deadline=deadline,
                                    jobs=a.sanitizer_jobs)
        _rechoose(out, m, s)
        (out / "report.md").write_text(report_md(s), encoding="utf-8")
    if a.baselines or a.compile or a.autotune:
        import importlib.util  # noqa: PLC0415

        modes = tuple(k for k, on in (("compile", a.compile), ("compile_autotune", a.autotune)) if on)
        done = {r.program for r in _records(out / "results.jsonl")} if (out / "results.jsonl").is_file() else set()
        recs = measure_baselines(str(Path(a.pack).resolve()), out, m, device_name=s.get("device_name") or "",
                                 rounds=a.repeat, min_ms=a.min_ms, eager_cap_s=a.baseline_cap_s,
                                 compile_cap_s=a.compile_cap_s, compile_modes=modes,
                                 torch_ok=not a.no_eager and importlib.util.find_spec("torch") is not None,
                                 deadline=deadline, programs=done)
        s["baselines"] = {"programs": len(recs), "file": "baselines.jsonl",
                          "eager": sum(b.eager_us is not None for b in recs),
                          "eager_graph": sum(b.eager_graph_us is not None for b in recs),
                          "compile": sum(b.compile_us is not None for b in recs),
                          "compile_autotune": sum(b.compile_autotune_us is not None for b in recs)}
        (out / "report.md").write_text(report_md(s) + "\n" + baselines_table(recs), encoding="utf-8")
    if "sanitizer" in s or "baselines" in s:
        (out / "summary.json").write_text(json.dumps(s, indent=1) + "\n", encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    """Command line of ``python -m steptp.gpu.run`` (and ``stp gpu run``)."""
    ap = argparse.ArgumentParser(prog="python -m steptp.gpu.run", description=__doc__.split("\n")[0])
    ap.add_argument("pack", help="pack directory written by `stp gpu pack`")
    ap.add_argument("-o", "--out", required=True, help="results directory (resumable)")
    ap.add_argument("--time", action="store_true", help="time original vs transformed, interleaved")
    ap.add_argument("--deadline-s", type=float, default=None, help="stop cleanly after this many seconds")
    ap.add_argument("--timeout", type=float, default=120.0, help="limit of one run in the worker, seconds")
    ap.add_argument("--repeat", type=int, default=8, help="timing rounds: interleaved measurements of each (--time)")
    ap.add_argument("--min-ms", type=float, default=2.0, help="length of one timing measurement, milliseconds")
    ap.add_argument("-j", "--jobs", type=int, default=None,
                    help="GPU worker processes (default: one per GPU), spread over the GPUs")
    ap.add_argument("--no-eager", action="store_true", help="do not time PyTorch eager beside the programs")
    ap.add_argument("--baselines", action="store_true",
                    help="afterwards measure each program's baselines against our best, interleaved "
                         "(RESULTS/baselines.jsonl): eager and ours from Python, eager in a CUDA graph against our "
                         "kernels")
    ap.add_argument("--compile", action="store_true",
                    help="baselines also with torch.compile (default mode); implies --baselines")
    ap.add_argument("--autotune", action="store_true",
                    help="baselines also with torch.compile mode=max-autotune-no-cudagraphs; implies --baselines")
    ap.add_argument("--baseline-cap-s", type=float, default=120.0,
                    help="cap of one program's eager/graph/kernels session, seconds")
    ap.add_argument("--compile-cap-s", type=float, default=300.0,
                    help="cap of one torch.compile compilation (+ warm-up) per program and mode, seconds")
    ap.add_argument("--sanitizer", action="store_true",
                    help="with --retime-best: run each re-timed best under compute-sanitizer (memcheck; racecheck "
                         "where it uses shared memory); a finding rejects it")
    ap.add_argument("--sanitizer-cap-s", type=float, default=120.0, help="cap of one compute-sanitizer run, seconds")
    ap.add_argument("--sanitizer-jobs", type=int, default=4, help="compute-sanitizer processes run at once")
    ap.add_argument("--entries-deadline-s", type=float, default=None,
                    help="stop the entries (verification and timing) after this many seconds and go on with the "
                         "re-time, sanitizer and baselines under --deadline-s (the rest of the entries stay for a "
                         "rerun)")
    ap.add_argument("--chunk", type=int, default=16, help="entries per worker call")
    ap.add_argument("--ref-jobs", type=int, default=None,
                    help="CPU worker processes computing the references (default: half the CPUs, 1 to 8)")
    ap.add_argument("--retime-best", type=int, default=0, metavar="K",
                    help="with --time: afterwards time each program's K fastest Equal entries again "
                         "(RESULTS/retime.jsonl), a second measurement in the same call")
    ap.add_argument("-q", "--quiet", action="store_true")
    try:
        a = ap.parse_args(argv)
    except SystemExit as e:
        return int(e.code or 0)
    for flag, v in (("--jobs", 1 if a.jobs is None else a.jobs), ("--repeat", a.repeat), ("--chunk", a.chunk),
                    ("--sanitizer-jobs", a.sanitizer_jobs),
                    ("--ref-jobs", 1 if a.ref_jobs is None else a.ref_jobs)):
        if v < 1:
            print(f"error: {flag} {v}: must be at least 1", file=sys.stderr)
            return 2
    if a.retime_best < 0 or (a.retime_best and not a.time):
        print("error: --retime-best K: K >= 0, and only with --time", file=sys.stderr)
        return 2
    if a.sanitizer and not a.retime_best:
        print("error: --sanitizer checks the re-timed best: only with --time --retime-best K", file=sys.stderr)
        return 2
    for flag, v in (("--timeout", a.timeout), ("--min-ms", a.min_ms), ("--baseline-cap-s", a.baseline_cap_s),
                    ("--compile-cap-s", a.compile_cap_s), ("--sanitizer-cap-s", a.sanitizer_cap_s),
                    ("--entries-deadline-s", 1.0 if a.entries_deadline_s is None else a.entries_deadline_s)):
        if not v > 0:
            print(f"error: {flag} {v}: must be positive", file=sys.stderr)
            return 2
    try:
        t0 = time.perf_counter()
        kw = dict(per_call_s=a.timeout, rounds=a.repeat, min_ms=a.min_ms, progress=not a.quiet, jobs=a.jobs,
                  eager=not a.no_eager, chunk=a.chunk, ref_jobs=a.ref_jobs)
        first = a.deadline_s if a.entries_deadline_s is None else min(a.entries_deadline_s, a.deadline_s or 1e30)
        s = run_pack(a.pack, a.out, timing=a.time, deadline_s=first, **kw)
        over = s.get("stopped_at_deadline") and (a.entries_deadline_s is None or (
            a.deadline_s is not None and time.perf_counter() - t0 >= a.deadline_s - 1.0))
        if a.retime_best and not over:
            left = None if a.deadline_s is None else a.deadline_s - (time.perf_counter() - t0)
            if left is None or left > 1.0:
                rs = retime_best(a.pack, a.out, a.retime_best, deadline_s=left, **kw)
                if rs is not None:
                    s["retime"] = {k: rs.get(k) for k in ("done", "exec", "equal", "stopped_at_deadline",
                                                          "wall_seconds")}
                    (Path(a.out) / "summary.json").write_text(json.dumps(s, indent=1) + "\n", encoding="utf-8")
        _session(a, s, t0)
        if (Path(a.out) / "retime.jsonl").is_file():
            gate_retimed(Path(a.out))
    except (PackRunError, SchemaError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except OSError as e:
        print(f"error: {e.filename or a.out}: {e.strerror or e}", file=sys.stderr)
        return 2
    print(json.dumps({k: v for k, v in s.items() if k not in ("speedup_by_strategy", "programs")}, indent=1))
    if s["done"] and s["exec"] == 0:
        print(f"error: every one of {s['done']} entries failed to run on the device", file=sys.stderr)
        return 1
    if not s["done"]:
        print("error: no entry finished", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
