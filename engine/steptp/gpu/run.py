"""Run a GPU pack (``stp gpu pack``) with the TVM runtime only: ``python -m steptp.gpu.run PACK -o RESULTS``.

Needs numpy, ``apache-tvm-ffi`` and what the pack carries (``PACK/lib``: TVM's runtime
libraries; ``PACK/python``: this module and the few it imports), a CUDA 13 driver and
runtime (``libcudart.so.13``) and Python 3.11-3.13; no TVM compiler, LLVM, lark, egglog,
sympy or torch. Recipe on a GPU node::

    pip install --no-index --no-deps --target /tmp/site apache_tvm_ffi-*.whl   # if missing
    PYTHONPATH=PACK/python:/tmp/site python -m steptp.gpu.run PACK -o RESULTS --time

For every entry the original and the transformed GPU functions run in a worker process
(:class:`steptp.runner.worker.IsolatedRunner`) on the pack's seeded inputs (regenerated
with :mod:`steptp.runner.inputs` and checked against the pack's digests), outputs poisoned,
and are compared with the CPU references by the one tolerance rule
(:mod:`steptp.runner.tolerance`, with the original's rounding allowance). Any CUDA error
discards the worker (the entry is an Exec failure with the CUDA error text; the next entry
gets a fresh process and context). ``--time`` times the original and the transformed
function **interleaved** in one worker (A, B, B, A ... rounds of ``time_evaluator``
measurements on the same inputs) and reports the median of the paired ratios with a
bootstrap 95 % interval (:func:`steptp.runner.stats.paired_speedup`).

Outputs: ``RESULTS/results.jsonl`` (one line per entry, appended as it finishes: a rerun
resumes), ``summary.json`` and ``report.md``. ``--deadline-s`` stops cleanly before the
deadline, keeping what finished. Exit 0 when entries ran, 1 when every entry failed to run
(or the deadline left none done), 2 for a bad pack or a machine without what the pack needs.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path

import numpy as np

from ..backend import cuda_runtime as cr
from ..backend.errors import BackendError, ExecError
from ..runner.inputs import TensorSpec, digest, trial_inputs
from ..runner.stats import paired_speedup
from ..runner.tolerance import _mismatch_detail, compare, dtype_code, poison_array, poisoned_index
from ..runner.worker import IsolatedRunner

_WORKER: dict = {}  # per worker process: manifests, loaded libraries, inputs


class PackRunError(ValueError):
    """A pack that cannot be run (missing, wrong format, unreadable)."""


def read_manifest(pack: str | os.PathLike) -> dict:
    """``PACK/manifest.json``; :class:`PackRunError` when absent or not a pack."""
    p = Path(pack) / "manifest.json"
    try:
        m = json.loads(p.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise PackRunError(f"{p}: cannot read the pack manifest ({e})") from None
    if not isinstance(m, dict) or m.get("format") != "stp-gpu-pack/1":
        raise PackRunError(f"{p}: not an stp GPU pack (format {m.get('format') if isinstance(m, dict) else None!r})")
    return m


# ---------------------------------------------------------------------------
# Worker side
# ---------------------------------------------------------------------------


def _manifest(pack: str) -> dict:
    if pack not in _WORKER:
        _WORKER[pack] = read_manifest(pack)
    return _WORKER[pack]


def _program_inputs(pack: str, okey: str) -> tuple[list[dict], list[dict], list, dict]:
    key = ("inputs", pack, okey)
    if key not in _WORKER:
        prog = _manifest(pack)["programs"][okey]
        specs = [TensorSpec(n, tuple(s), d, bool(o)) for n, s, d, o in prog["specs"]]
        sets = trial_inputs(specs, prog["seed"], prog["trials"], prog["ordered"], prog["bounds"])
        for k, (x, want) in enumerate(zip(sets, prog["inputs_sha1"])):
            if digest(x) != want:
                raise ExecError(f"trial {k}: the regenerated inputs differ from the build side's (numpy's generator "
                                f"changed? numpy {np.__version__})")
        data = np.load(Path(pack) / prog["data"])
        refs = [{s.name: data[f"ref{k}__{s.name}"] for s in specs if s.is_output} for k in range(len(sets))]
        _WORKER[key] = (sets, refs, prog.get("slacks") or [{} for _ in sets], {s.name: s for s in specs})
    return _WORKER[key]


def _load(pack: str, where: dict):
    key = ("lib", pack, where["lib"])
    built = cr.read_built(Path(pack) / where["lib"], where["func"])
    if key not in _WORKER:
        _WORKER[key] = cr.load_built(built, Path(pack) / "lib")
    return built, _WORKER[key]


def run_check(pack: str, okey: str, where: dict) -> dict:
    """Run one function of the pack on its device on every trial (outputs poisoned) and
    compare with the CPU references. Returns ``{exec, equal, max_abs_err, max_rel_err,
    trials, reason, first_call_ms}``; raises :class:`ExecError` for a device fault (the
    caller's worker is then discarded)."""
    t0 = time.perf_counter()
    sets, refs, slacks, specs = _program_inputs(pack, okey)
    built, mod = _load(pack, where)
    poison = {p.name: poison_array(p.shape, p.dtype) for p in built.params if p.is_output}
    runs = [{**x, **{k: v for k, v in poison.items() if v is not None}} for x in sets]
    outs, first_ms = [], None
    for k, x in enumerate(runs):
        outs += cr.run_module(built, [x], module=mod)
        if first_ms is None:
            first_ms = (time.perf_counter() - t0) * 1e3
    res = {"exec": True, "equal": False, "max_abs_err": 0.0, "max_rel_err": 0.0, "trials": len(outs), "reason": "",
           "first_call_ms": round(first_ms or 0.0, 3)}
    for k, out in enumerate(outs):
        for p in built.params:
            if not p.is_output:
                continue
            hit = poisoned_index(out[p.name], p.dtype)
            if hit is not None:
                res.update(exec=False, reason=f"exec: trial {k}: output {p.name} element {hit[0]} ({hit[1]} in all) "
                                              "was never written (poisoned-buffer run)")
                return res
    bad = ""
    for k, (ref, out) in enumerate(zip(refs, outs)):
        for name, r in ref.items():
            code = dtype_code(specs[name].dtype)
            slack = float((slacks[k] or {}).get(name, 0.0)) if k < len(slacks) else 0.0
            ok, a, rel = compare(r, out[name], code, slack=slack)
            res["max_abs_err"] = max(res["max_abs_err"], a)
            res["max_rel_err"] = max(res["max_rel_err"], rel)
            if not ok and not bad:
                bad = _mismatch_detail(name, k, r, out[name], code, slack)
    res["equal"] = not bad
    res["reason"] = f"equal: {bad}" if bad else ""
    for f in ("max_abs_err", "max_rel_err"):
        if not math.isfinite(res[f]):
            res[f] = None
    return res


def time_pair(pack: str, okey: str, a: dict, b: dict, rounds: int = 8, min_ms: float = 2.0) -> dict:
    """Interleaved timing of functions ``a`` (baseline) and ``b`` on trial 0's inputs: 3
    warm-up calls each, ``number`` calibrated so one measurement lasts ``min_ms``
    milliseconds, then ``rounds`` rounds of one ``time_evaluator`` measurement each, in the
    order A B, B A, A B ... Returns ``{original_us, transformed_us, speedup, ci, verdict,
    number, rounds, device}`` (microseconds per call; :func:`steptp.runner.stats.paired_speedup`).
    Raises :class:`ExecError` on a device fault."""
    sets, _, _, _ = _program_inputs(pack, okey)
    fa, ma = _load(pack, a)
    fb, mb = _load(pack, b)
    dev = fa.device
    ta, tb, number = cr.time_interleaved((ma, fa.func, cr.device_args(fa.params, dev, sets[0])),
                                         (mb, fb.func, cr.device_args(fb.params, dev, sets[0])), dev,
                                         rounds=rounds, warmup=3, min_repeat_ms=min_ms, max_number=100_000)
    st = paired_speedup(ta, tb)
    return {"original_us": st["a_median"] * 1e6, "transformed_us": st["b_median"] * 1e6, "speedup": st["speedup"],
            "ci": st["ci"], "verdict": st["verdict"], "number": number, "rounds": rounds,
            "device": "cuda-sim" if cr.simulated() else "cuda"}


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


def _records(path: Path) -> list[dict]:
    out = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            continue
    return out


def _done_ids(path: Path) -> set:
    done = set()
    if path.is_file():
        for line in path.read_text(encoding="utf-8").splitlines():
            try:
                done.add(json.loads(line)["id"])
            except (ValueError, KeyError, TypeError):
                continue
    return done


def _call(runner: IsolatedRunner, fn, *args, limit: float) -> tuple[dict | None, str]:
    if fn.__module__ == "__main__":  # run as ``python -m``: send the importable module's function
        import importlib  # noqa: PLC0415

        fn = getattr(importlib.import_module("steptp.gpu.run"), fn.__name__)
    try:
        return runner.call(fn, *args, timeout_s=max(1.0, limit), discard_on_error=True), ""
    except BackendError as e:
        return None, e.reason


def run_pack(pack: str | os.PathLike, results: str | os.PathLike, *, timing: bool = False,
             deadline_s: float | None = None, per_call_s: float = 120.0, rounds: int = 8, min_ms: float = 2.0,
             progress: bool = True) -> dict:
    """Run every entry of ``pack`` not yet in ``results/results.jsonl`` (module docstring);
    returns the summary (also written to ``summary.json`` and ``report.md``). Raises
    :class:`PackRunError` for a bad pack and for a machine that cannot run it (one line)."""
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
    path = out / "results.jsonl"
    _repair_tail(path)
    done = _done_ids(path)
    todo = [e for e in m["entries"] if e["id"] not in done]
    t0 = time.perf_counter()
    stopped, ran = False, 0
    orig_cache: dict[str, tuple[dict | None, str]] = {}
    runner = IsolatedRunner(timeout_s=per_call_s)
    name = "simulated (CPU builds)" if cr.simulated() else cr.device_name(0)
    try:
        with open(path, "a", encoding="utf-8") as fh:
            for e in todo:
                left = None if deadline_s is None else deadline_s - (time.perf_counter() - t0)
                if left is not None and left <= 1.0:
                    stopped = True
                    break
                limit = per_call_s if left is None else min(per_call_s, left)
                s0 = time.perf_counter()
                if e["program"] not in orig_cache:
                    orig_cache[e["program"]] = _call(runner, run_check, pack, e["program"], e["original"], limit=limit)
                orig, orig_err = orig_cache[e["program"]]
                tr, tr_err = _call(runner, run_check, pack, e["program"], e["transformed"], limit=limit)
                if tr is None:
                    tr = {"exec": False, "equal": False, "reason": f"exec: {tr_err}", "max_abs_err": None}
                rec = {"id": e["id"], "strategy": e["strategy"], "program": e["program"], "device": "cuda",
                       "device_name": name, "arch": arch or m["arch"], "transformed": tr,
                       "original": orig if orig is not None else {"exec": False, "equal": False,
                                                                   "reason": f"exec: {orig_err}"},
                       "cpu_equal": (e.get("cpu") or {}).get("equal")}
                rec["agree"] = None if rec["cpu_equal"] is None else bool(rec["cpu_equal"]) == bool(tr.get("equal"))
                if timing and tr.get("equal") and orig is not None and orig.get("equal"):
                    t, t_err = _call(runner, time_pair, pack, e["program"], e["original"], e["transformed"], rounds,
                                     min_ms, limit=limit)
                    rec["timing"] = t if t is not None else {"error": t_err}
                rec["seconds"] = round(time.perf_counter() - s0, 4)
                fh.write(json.dumps(rec) + "\n")
                fh.flush()
                ran += 1
                if progress:
                    print(f"\r{ran}/{len(todo)} entries", end="", file=sys.stderr, flush=True)
    finally:
        restarts = runner.restarts
        runner.close()
        if progress and todo:
            print(file=sys.stderr)
    wall = time.perf_counter() - t0
    summary = summarize(path, m, wall=wall, ran=ran, stopped=stopped)
    summary["worker_restarts"] = restarts  # workers discarded after a CUDA error or a time-out
    (out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n", encoding="utf-8")
    (out / "report.md").write_text(report_md(summary), encoding="utf-8")
    return summary


def summarize(path: Path, manifest: dict, *, wall: float = 0.0, ran: int = 0, stopped: bool = False) -> dict:
    """Counts over ``results.jsonl``: Exec/Equal, agreement with the CPU verdicts (and the
    disagreeing entries), first-call latency, and with timings the speedup distribution per
    strategy (only entries whose transformed program was Equal on the GPU)."""
    recs = _records(path) if path.is_file() else []
    eq = [r for r in recs if r["transformed"].get("equal")]
    first = [r["transformed"]["first_call_ms"] for r in recs if r["transformed"].get("first_call_ms") is not None]
    dis = [{"id": r["id"], "strategy": r["strategy"], "cpu_equal": r["cpu_equal"],
            "gpu_equal": r["transformed"].get("equal"), "reason": r["transformed"].get("reason", "")[:300]}
           for r in recs if r.get("agree") is False]
    per: dict[str, list] = {}
    for r in recs:
        t = r.get("timing") or {}
        if "speedup" in t:
            per.setdefault(r["strategy"] or "-", []).append(t)
    speed = {k: {"n": len(v), "median": float(np.median([t["speedup"] for t in v])),
                 "faster": sum(t["verdict"] == "faster" for t in v), "slower": sum(t["verdict"] == "slower" for t in v)}
             for k, v in sorted(per.items())}
    return {"entries": len(manifest["entries"]), "done": len(recs), "ran_now": max(ran, 0),
            "stopped_at_deadline": stopped, "exec": sum(bool(r["transformed"].get("exec")) for r in recs),
            "equal": len(eq), "original_equal": sum(bool(r["original"].get("equal")) for r in recs),
            "cpu_gpu_disagreements": dis, "wall_seconds": round(wall, 2),
            "entries_per_second": round(max(ran, 0) / wall, 3) if wall > 0 else None,
            "first_call_ms_median": float(np.median(first)) if first else None,
            "device_name": recs[0]["device_name"] if recs else None, "arch": manifest["arch"],
            "speedup_by_strategy": speed}


def report_md(s: dict) -> str:
    """``report.md`` of a :func:`summarize` summary."""
    lines = ["# GPU pack run", "",
             f"Device: {s['device_name']} ({s['arch']}). Entries: {s['done']}/{s['entries']} done"
             + (" (stopped at the deadline)" if s["stopped_at_deadline"] else "") + ".", "",
             "| Exec | Equal | original Equal | CPU/GPU disagreements | entries/s | first call (median ms) |",
             "|---|---|---|---|---|---|",
             f"| {s['exec']} | {s['equal']} | {s['original_equal']} | {len(s['cpu_gpu_disagreements'])} | "
             f"{s['entries_per_second']} | {s['first_call_ms_median']} |", ""]
    if s["cpu_gpu_disagreements"]:
        lines += ["## CPU/GPU disagreements", "", "| id | strategy | CPU | GPU | reason |", "|---|---|---|---|---|"]
        lines += [f"| {d['id']} | {d['strategy']} | {d['cpu_equal']} | {d['gpu_equal']} | {d['reason']} |"
                  for d in s["cpu_gpu_disagreements"]]
        lines.append("")
    if s["speedup_by_strategy"]:
        lines += ["## Speedup per strategy (interleaved, median of paired ratios)", "",
                  "| strategy | n | median speedup | faster (CI > 1) | slower (CI < 1) |", "|---|---|---|---|---|"]
        lines += [f"| {k} | {v['n']} | {v['median']:.3f} | {v['faster']} | {v['slower']} |"
                  for k, v in s["speedup_by_strategy"].items()]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    """Command line of ``python -m steptp.gpu.run`` (and ``stp gpu run``)."""
    ap = argparse.ArgumentParser(prog="python -m steptp.gpu.run", description=__doc__.split("\n")[0])
    ap.add_argument("pack", help="pack directory written by `stp gpu pack`")
    ap.add_argument("-o", "--out", required=True, help="results directory (resumable)")
    ap.add_argument("--time", action="store_true", help="time original vs transformed, interleaved")
    ap.add_argument("--deadline-s", type=float, default=None, help="stop cleanly after this many seconds")
    ap.add_argument("--timeout", type=float, default=120.0, help="limit of one run in the worker, seconds")
    ap.add_argument("--rounds", type=int, default=8, help="interleaved timing rounds (--time)")
    ap.add_argument("--min-ms", type=float, default=2.0, help="length of one timing measurement, milliseconds")
    ap.add_argument("-q", "--quiet", action="store_true")
    a = ap.parse_args(argv)
    try:
        s = run_pack(a.pack, a.out, timing=a.time, deadline_s=a.deadline_s, per_call_s=a.timeout,
                     rounds=a.rounds, min_ms=a.min_ms, progress=not a.quiet)
    except PackRunError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except OSError as e:
        print(f"error: {e.filename or a.out}: {e.strerror or e}", file=sys.stderr)
        return 2
    print(json.dumps({k: v for k, v in s.items() if k not in ("speedup_by_strategy",)}, indent=1))
    if s["done"] and s["exec"] == 0:
        print(f"error: every one of {s['done']} entries failed to run on the device", file=sys.stderr)
        return 1
    if not s["done"]:
        print("error: no entry finished", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
