"""The scheduler of a run over many programs (:func:`search_many`): each program's search
(:func:`steptp.search.driver.search_program`) in this process or in worker processes, resumed
from its summary; with a runner that answers in rounds, the pending batches of every program
sent as one round; ``report.md``, ``run_summary.json`` and the runner's own run files."""

from __future__ import annotations

import json
from pathlib import Path

from ..io import write_text_atomic as _write_atomic
from .config import SIGNALLED, SearchConfig, SearchInputError
from .driver import search_program
from .inputs import collect_programs
from .report import write_report


def _unique_names(paths: list[Path]) -> list[str]:
    names, seen = [], {}
    for p in paths:
        base = p.stem
        k = seen.get(base, 0)
        seen[base] = k + 1
        names.append(base if k == 0 else f"{base}_{k}")
    return names


def search_many(inputs: list, outdir: str | Path, cfg: SearchConfig, *, client=None, single_dir: bool | None = None,
                on_error=None, run_info: dict | None = None, write_pack=None, workers: int = 1, builder=None,
                runner=None) -> list[dict]:
    """Search every program of ``inputs`` (see :func:`collect_programs`); each one's files
    go to ``OUTDIR/<program stem>/`` (or ``OUTDIR`` itself when there is one program file
    and ``single_dir`` is not False). Programs whose ``summary.json`` exists are skipped
    (resume), except one cut short by a signal. A search stopped by its time limit
    (``cfg.time_limit_s``) or a signal (SIGINT, SIGTERM) still writes its summary
    (``stopped``: the reason; after a signal its best sample is kept unconfirmed and the run
    stops, ``run_summary.json`` saying so). Writes ``OUTDIR/report.md`` and ``OUTDIR/run_summary.json``
    (:func:`run_summary`). ``on_error(path, message)`` is called for a program that fails
    (default: raise); a single program that is bad input (:class:`SearchInputError`) and an
    unavailable device (:class:`TargetUnavailable`) raise anyway. ``run_info``: a dict to
    update with the run summary.

    ``runner``: a :class:`steptp.runner.base.Runner` (default: the kind the configuration's ``runner`` names,
    :mod:`steptp.runner`'s registry, ``kinds.for_search``, for ``OUTDIR`` with ``builder``, the
    :class:`steptp.runner.base.Builder` of a remote kind; ``write_pack``: its former form, a
    function ``fn(round_dir, pack_dir)``). With a runner that answers in rounds (``pack``)
    every program's search runs until its next batch is pending; the pending batches of all
    programs are sent as one round (``OUTDIR/rounds/<k>/``) and ``run_info["waiting"]`` says
    where (the CLI exits 3); the same call again, with the node's results in place, replays and
    goes on. ``workers``: programs searched in parallel processes (only where the runner allows
    it, :attr:`~steptp.runner.base.Runner.parallel_programs`: timing on this machine in
    parallel would measure the contention). The runner's own files
    (:meth:`~steptp.runner.base.Runner.run_files`, e.g. ``gpu_summary.json``) are written once
    nothing is pending."""
    from tqdm import tqdm

    from ..rules import load_rules
    from ..runner import kinds
    from .evaluate import TargetUnavailable

    paths = collect_programs(inputs)
    out = Path(outdir)
    if runner is None:
        runner = kinds.for_search(cfg, out, builder=builder if builder is not None else write_pack)
    if single_dir is None:
        single_dir = len(paths) == 1 and Path(inputs[0]).is_file() and not runner.per_program_dirs
    rules = load_rules()
    summaries = []
    failed: list[dict] = []
    pending: list[str] = []
    pending_paths: set[str] = set()
    stopped = ""
    names = _unique_names(paths)
    todo = []
    for path, nm in zip(paths, names):
        d = out if single_dir else out / nm
        done = d / "summary.json"
        if done.exists():
            try:
                prev = json.loads(done.read_text(encoding="utf-8"))
                if not str(prev.get("stopped", "")).startswith(SIGNALLED):
                    summaries.append(prev)
                    continue
            except (OSError, json.JSONDecodeError):
                pass  # an unreadable summary, or one cut short by a signal: search again
        todo.append((path, nm, d))

    def outcome(path, res) -> bool:
        nonlocal stopped
        if isinstance(res, BaseException):
            if isinstance(res, TargetUnavailable):
                raise res  # the machine, not the program: every other program would fail the same way
            bad_input = isinstance(res, SearchInputError)
            if on_error is None or (bad_input and len(paths) == 1):
                raise res
            msg = str(res) if bad_input else f"{path}: {type(res).__name__}: {' '.join(str(res).split())[:300]}"
            failed.append({"program": str(path), "error": msg, "internal": not bad_input})
            on_error(path, msg)
            return True
        if res.get("status") == "pending":
            pending.append(res["program"])
            pending_paths.add(str(path))
            return True
        summaries.append(res)
        if str(res.get("stopped", "")).startswith(SIGNALLED):
            stopped = res["stopped"]
            return False  # a signal stops the run, not only this program: report what there is
        return True

    waiting = None
    for _attempt in range(64):  # a round whose every entry the pack builder left out needs no node
        _advance(todo, runner, cfg, client, rules, workers, len(paths), outcome)
        if stopped:
            break
        waiting = runner.submit() if pending else None
        if not waiting or waiting.get("entries"):
            break
        again = set(pending_paths)
        pending.clear()
        pending_paths.clear()
        todo = [t for t in todo if str(t[0]) in again]
        runner = runner.reopen()
    info = run_summary(len(paths), len(summaries), failed)
    if stopped:
        info["stopped"] = stopped
    if pending:
        info["pending"] = sorted(pending)
        info["waiting"] = waiting
    write_report(out, info)
    if not pending:
        for fname, doc in runner.run_files(summaries, out).items():
            _write_atomic(out / fname, json.dumps(doc, indent=1) + "\n")
    _write_atomic(out / "run_summary.json", json.dumps(info, indent=1) + "\n")
    if run_info is not None:
        run_info.update(info)
    return summaries


def _advance(todo: list, runner, cfg: SearchConfig, client, rules, workers: int, n_paths: int, outcome) -> None:
    """Run (or resume) every program of ``todo`` (``(path, name, directory)``) once with
    ``runner``, in this process or over ``workers`` processes (where the runner allows it), each
    result handed to ``outcome(path, summary | {"status": "pending"} | exception)`` (False:
    stop the run)."""
    from tqdm import tqdm

    if workers > 1 and runner.parallel_programs and len(todo) > 1:
        import multiprocessing as mp
        from concurrent.futures import ProcessPoolExecutor

        with ProcessPoolExecutor(max_workers=min(workers, len(todo)), mp_context=mp.get_context("spawn")) as pool:
            futs = [(path, pool.submit(_advance_remote, str(path), str(d), cfg, runner.worker_spec())) for path, _, d in todo]
            for path, f in tqdm(futs, desc="programs", unit="program", disable=not cfg.progress):
                try:
                    res, entries = f.result()
                except Exception as e:  # noqa: BLE001 - one program's failure must not stop the others
                    res, entries = e, {}
                runner.add_pending(entries)
                outcome(path, res)
    else:
        for path, nm, d in tqdm(todo, desc="programs", unit="program", disable=not cfg.progress or n_paths == 1):
            try:
                res = search_program(path, d, cfg, client=client, rules=rules, runner=runner)
            except Exception as e:  # noqa: BLE001 - one program's failure must not stop the others
                res = e
            if not outcome(path, res):
                break


def _advance_remote(path: str, outdir: str, cfg: SearchConfig, spec: tuple) -> tuple:
    """One program's search in a worker process of :func:`search_many` with a runner rebuilt
    from ``spec`` (:meth:`steptp.runner.base.Runner.worker_spec`): ``(summary or {"status":
    "pending"} or the exception, the pending entries)``."""
    from ..runner import kinds

    kind, options = spec
    runner = kinds.create(kind, **options)
    try:
        res = search_program(path, outdir, cfg, runner=runner)
    except Exception as e:  # noqa: BLE001 - handed to the parent, which reports it
        res = e
    return res, runner.pending()


def run_summary(programs: int, searched: int, failed: list[dict]) -> dict:
    """``run_summary.json`` of :func:`search_many`: ``programs`` of the run, how many have a
    search (``searched``, resumed ones included), the ``failed`` ones (``{program, error,
    internal}``) and their counts: ``internal_errors`` (an unexpected exception: a bug or a
    crash) apart from ``input_errors`` (a bad program or option). Rejected candidates are
    neither (they are nodes of a search: ``counts`` in its ``summary.json``)."""
    internal = sum(1 for f in failed if f["internal"])
    return {"programs": programs, "searched": searched, "internal_errors": internal,
            "input_errors": len(failed) - internal, "failed": failed}


