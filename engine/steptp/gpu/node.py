"""The worker side of a pack run (:mod:`steptp.gpu.run`): what runs inside the long-lived
worker processes on the GPU node, with the TVM runtime only (numpy, ``tvm_ffi``, the pack's
``lib/``; no TVM compiler, lark or torch at import).

Two kinds of worker call:

* :func:`prepare_references` (a CPU worker): regenerates a program's seeded inputs, checks
  them against the pack's SHA1 digests, runs the original's verification-form CPU build
  (``PACK/refs``) on every trial with its outputs poisoned, checks the outputs against the
  build side's digests and writes inputs + outputs to ``REFDIR/<program>.npz`` (uncompressed,
  renamed into place), which the GPU workers read. A pack made with ``--store-references``
  skips this: its ``data/*.npz`` are read directly and the inputs regenerated.
* :func:`run_entries` (a GPU worker): a run of entries of ONE program. The worker keeps,
  across calls, the loaded batch libraries (each loaded once per worker), the program's
  inputs and references (read once), its device tensors (allocated once, refilled with
  :func:`steptp.backend.cuda_runtime.copy_into` before every launch: a program that writes
  into an input cannot corrupt the next entry), the original's GPU verdict and its PyTorch
  eager timing. A CUDA error stops the run at that entry and is returned as a ``fault``: the
  driver discards the worker, runs that entry once more in a fresh one (``retry``: its faults
  are then recorded, not returned) and continues with the rest in a fresh one.
"""

from __future__ import annotations

import math
import os
import time
from collections import OrderedDict
from pathlib import Path

import numpy as np

from ..backend import cuda_runtime as cr
from ..runner import cuda_timing as ct
from ..backend.errors import BackendError, ExecError
from ..runner.inputs import TensorSpec, digest, trial_inputs
from ..runner.stats import paired_speedup, spread
from ..runner.tolerance import compare_trials, dtype_code, poison_array, poisoned_index

_STATE: dict = {}  # per worker process: manifests, libraries, original verdicts, eager timings
_PROGRAMS: "OrderedDict[tuple, dict]" = OrderedDict()  # program data + device tensors, LRU
_KEEP_PROGRAMS = 2  # device tensors of at most this many programs stay allocated per worker


def manifest(pack: str) -> dict:
    """``PACK/manifest.json`` (read once per worker)."""
    if ("manifest", pack) not in _STATE:
        import json  # noqa: PLC0415

        _STATE[("manifest", pack)] = json.loads((Path(pack) / "manifest.json").read_text(encoding="utf-8"))
    return _STATE[("manifest", pack)]


def _specs(prog: dict) -> list[TensorSpec]:
    return [TensorSpec(n, tuple(s), d, bool(o)) for n, s, d, o in prog["specs"]]


def _regenerate(prog: dict) -> list[dict]:
    """The program's trial inputs regenerated from the seeds, checked against the digests (a
    program whose references the node computes, ``"references": "node"``, has none)."""
    sets = trial_inputs(_specs(prog), prog["seed"], prog["trials"], prog["ordered"], prog["bounds"],
                        prog.get("edge", ()))
    for k, (x, want) in enumerate(zip(sets, prog["inputs_sha1"])):
        if want is not None and digest(x) != want:
            raise ExecError(f"trial {k}: the regenerated inputs differ from the build side's (numpy's generator "
                            f"changed? numpy {np.__version__})")
    return sets


def reference_path(refdir: str, okey: str) -> Path:
    """Where :func:`prepare_references` writes a program's inputs and references."""
    return Path(refdir) / f"{okey}.npz"


def prepare_references(pack: str, refdir: str, okey: str) -> dict:
    """Compute program ``okey``'s CPU references on this machine (module docstring) unless
    ``REFDIR/<okey>.npz`` exists. Returns ``{"ok": bool, "reason": str, "digests_match":
    bool | None, "seconds": float}``; ``ok`` False (with the reason) when the original's
    reference build fails, faults or leaves an output element unwritten (poisoned) on this
    CPU. Outputs whose SHA1 differs from the build side's are kept (the node's CPU is the
    reference) and reported with ``digests_match`` False. Raises :class:`ExecError` only for
    an unreadable pack."""
    t0 = time.perf_counter()
    prog = manifest(pack)["programs"][okey]
    path = reference_path(refdir, okey)
    specs = {s.name: s for s in _specs(prog)}
    if path.is_file():
        with np.load(path) as z:
            refs = [{n: z[f"ref{k}__{n}"] for n, s in specs.items() if s.is_output} for k in range(len(prog["inputs_sha1"]))]
        return {"ok": True, "reason": "", "digests_match": _digests_match(prog, refs),
                "seconds": round(time.perf_counter() - t0, 4), "cached": True}
    try:
        sets = _regenerate(prog)
        ref = prog["reference"]
        built = cr.read_built(Path(pack) / ref["lib"], ref["func"])
        mod = cr.load_built(built, Path(pack) / "lib")
        poison = {p.name: poison_array(p.shape, p.dtype) for p in built.params if p.is_output}
        runs = [{**x, **{k: v for k, v in poison.items() if v is not None}} for x in sets]
        refs = cr.run_module(built, runs, module=mod)
    except BackendError as e:
        return {"ok": False, "reason": f"original program failed on this CPU (exec): {e.reason}", "digests_match": None,
                "seconds": round(time.perf_counter() - t0, 4)}
    for k, out in enumerate(refs):
        for p in built.params:
            hit = poisoned_index(out[p.name], p.dtype) if p.is_output else None
            if hit is not None:
                return {"ok": False, "reason": f"original program failed on this CPU (exec): trial {k}: output "
                                               f"{p.name} element {hit[0]} was never written", "digests_match": None,
                        "seconds": round(time.perf_counter() - t0, 4)}
    arrays = {f"in{k}__{n}": np.asarray(v) for k, x in enumerate(sets) for n, v in x.items()}
    arrays.update({f"ref{k}__{n}": np.asarray(v) for k, r in enumerate(refs) for n, v in r.items()})
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.stem}.{os.getpid()}.npz")
    np.savez(tmp, **arrays)
    os.replace(tmp, path)
    return {"ok": True, "reason": "", "digests_match": _digests_match(prog, refs),
            "seconds": round(time.perf_counter() - t0, 4)}


def _digests_match(prog: dict, refs: list[dict]) -> bool | None:
    """Whether the references' SHA1 digests equal the build side's; None when the build side
    computed none (``"references": "node"``: too large to run there)."""
    if prog.get("outputs_sha1") is None:
        return None
    return [digest(r) for r in refs] == prog.get("outputs_sha1")


def _program(pack: str, refdir: str | None, okey: str) -> dict:
    """Inputs, references, allowances and specs of a program (read once per worker), with a
    slot for its device tensors; the least recently used program's tensors are dropped."""
    key = (pack, okey)
    if key in _PROGRAMS:
        _PROGRAMS.move_to_end(key)
        return _PROGRAMS[key]
    prog = manifest(pack)["programs"][okey]
    specs = {s.name: s for s in _specs(prog)}
    n = len(prog["inputs_sha1"])
    if prog.get("data"):  # stored references (--store-references, or a stp-gpu-pack/1 pack)
        sets = _regenerate(prog)
        with np.load(Path(pack) / prog["data"]) as z:
            refs = [{s.name: z[f"ref{k}__{s.name}"] for s in specs.values() if s.is_output} for k in range(n)]
    else:
        path = reference_path(refdir or "", okey)
        if not path.is_file():
            raise ExecError(f"no CPU references for program {prog.get('name')} ({path} missing)")
        with np.load(path) as z:
            names = {k.split("__", 1)[1] for k in z.files if k.startswith("in0__")}
            sets = [{nm: z[f"in{k}__{nm}"] for nm in names} for k in range(n)]
            refs = [{s.name: z[f"ref{k}__{s.name}"] for s in specs.values() if s.is_output} for k in range(n)]
    d = {"sets": sets, "refs": refs, "slacks": prog.get("slacks") or [{} for _ in sets], "specs": specs,
         "tensors": None}
    _PROGRAMS[key] = d
    while len(_PROGRAMS) > _KEEP_PROGRAMS:
        _PROGRAMS.popitem(last=False)  # its device tensors are freed with it
    return d


def _load(pack: str, where: dict):
    """The :class:`Built` of a pack function and its library, loaded once per worker."""
    bkey = ("built", pack, where["lib"], where["func"])
    if bkey not in _STATE:
        _STATE[bkey] = cr.read_built(Path(pack) / where["lib"], where["func"])
    built = _STATE[bkey]
    lkey = ("lib", pack, where["lib"])
    if lkey not in _STATE:
        _STATE[lkey] = cr.load_built(built, Path(pack) / "lib")
    return built, _STATE[lkey]


def _tensors(d: dict, built) -> list[dict]:
    """Device tensors of every trial (allocated once per program and worker), by name."""
    if d["tensors"] is None:
        out = []
        for x in d["sets"]:
            t = {}
            for p in built.params:
                a = x.get(p.name)
                if a is None:
                    a = poison_array(p.shape, p.dtype)
                if a is None:
                    a = np.zeros(p.shape, dtype=cr._np_dtype(p.dtype))
                t[p.name] = cr.to_device(np.asarray(a).astype(cr._np_dtype(p.dtype), copy=False), built.device,
                                         p.dtype)
            out.append(t)
        d["tensors"] = out
    return d["tensors"]


def _fill(d: dict, built, k: int) -> list:
    """Trial ``k``'s tensors in ``built``'s parameter order, inputs copied in afresh and
    outputs poisoned (zeros for dtypes without a poison)."""
    ts = _tensors(d, built)[k]
    args = []
    for p in built.params:
        if p.name not in ts:
            raise ExecError(f"tensor {p.name} is not in the program's signature")
        if p.is_output:
            a = poison_array(p.shape, p.dtype)
            a = np.zeros(p.shape, dtype=cr._np_dtype(p.dtype)) if a is None else a
        else:
            a = np.asarray(d["sets"][k][p.name]).astype(cr._np_dtype(p.dtype), copy=False)
            if tuple(a.shape) != p.shape:
                raise ExecError(f"tensor {p.name} has shape {list(a.shape)}, expected {list(p.shape)}")
        cr.copy_into(ts[p.name], a)
        args.append(ts[p.name])
    return args


def run_check(pack: str, refdir: str | None, okey: str, where: dict) -> dict:
    """Run one pack function on its device on every trial (outputs poisoned) and compare
    with the CPU references by :func:`steptp.runner.tolerance.compare_trials` with the original's
    rounding allowance. Returns ``{exec, equal, max_abs_err, max_rel_err, trials, reason,
    first_call_ms}`` (``first_call_ms``: library load, if not loaded yet, + first trial, in
    milliseconds); raises :class:`ExecError` for a device fault (the worker is then
    discarded)."""
    t0 = time.perf_counter()
    d = _program(pack, refdir, okey)
    built, mod = _load(pack, where)
    outs, first_ms = [], None
    for k in range(len(d["sets"])):
        args = _fill(d, built, k)
        try:
            cr.launch(built, mod, args)
        except ExecError as e:
            raise ExecError(f"trial {k}: {e.reason}") from None
        outs.append({p.name: cr.from_device(t, p.shape, cr._np_dtype(p.dtype))
                     for p, t in zip(built.params, args) if p.is_output})
        if first_ms is None:
            first_ms = (time.perf_counter() - t0) * 1e3
    res = {"exec": True, "equal": False, "max_abs_err": 0.0, "max_rel_err": 0.0, "trials": len(outs), "reason": "",
           "first_call_ms": round(first_ms or 0.0, 3)}
    for k, out in enumerate(outs):
        for p in built.params:
            hit = poisoned_index(out[p.name], p.dtype) if p.is_output else None
            if hit is not None:
                res.update(exec=False, reason=f"exec: trial {k}: output {p.name} element {hit[0]} ({hit[1]} in all) "
                                              "was never written (poisoned-buffer run)")
                return res
    names = list(d["refs"][0]) if d["refs"] else []
    bad, res["max_abs_err"], res["max_rel_err"] = compare_trials(
        d["refs"], outs, [(n, dtype_code(d["specs"][n].dtype)) for n in names], d["slacks"])
    res["equal"] = not bad
    res["reason"] = f"equal: {bad}" if bad else ""
    for f in ("max_abs_err", "max_rel_err"):
        if not math.isfinite(res[f]):
            res[f] = None
    return res


def time_pair(pack: str, refdir: str | None, okey: str, a: dict, b: dict, rounds: int = 8,
              min_ms: float = 2.0) -> dict:
    """Interleaved timing of functions ``a`` (baseline) and ``b`` on trial 0's inputs (the
    worker's tensors): 3 warm-up calls each, the calls per measurement of each calibrated so
    one measurement lasts ``min_ms`` milliseconds, then ``rounds`` rounds of one
    ``time_evaluator`` measurement each, A B, B A ... (on CUDA each from a flushed L2).
    Returns ``{original_us, transformed_us, speedup, ci, verdict, number, original_number,
    rounds, original_iqr_us, transformed_iqr_us, device}`` (microseconds per call, IQRs
    ``[q1, q3]``; ``number``/``original_number`` the calls per
    measurement of the candidate / the original;
    :func:`steptp.runner.stats.paired_speedup`). Raises :class:`ExecError` on a device fault."""
    d = _program(pack, refdir, okey)
    fa, ma = _load(pack, a)
    fb, mb = _load(pack, b)
    dev = fa.device
    ta, tb, number = ct.time_interleaved((ma, fa.func, _fill(d, fa, 0)), (mb, fb.func, _fill(d, fb, 0)), dev,
                                         rounds=rounds, warmup=3, min_repeat_ms=min_ms, max_number=100_000)
    st = paired_speedup(ta, tb)
    sa, sb = spread(ta, scale=1e6), spread(tb, scale=1e6)
    return {"original_us": st["a_median"] * 1e6, "transformed_us": st["b_median"] * 1e6, "speedup": st["speedup"],
            "ci": st["ci"], "verdict": st["verdict"], "number": number[1], "original_number": number[0],
            "rounds": rounds, "original_iqr_us": [sa["q1"], sa["q3"]], "transformed_iqr_us": [sb["q1"], sb["q3"]],
            "device": "cuda-sim" if cr.simulated() else "cuda"}


def _eager(pack: str, refdir: str | None, okey: str, where: dict, opts: dict) -> dict | None:
    """PyTorch eager of the program's ``.py``, timed interleaved with the original
    (:func:`steptp.gpu.eager.measure`), once per program and worker; None when the pack has
    no ``.py`` for it or eager timing is off. Eager runs with the program's own parameters
    and is timed only when its outputs match the original's CPU references of trial 0
    (``eager_check``; else the record says why it is not comparable). (Eager from Python
    beside the original's kernels: not like with like; the baselines of
    :mod:`steptp.gpu.baselines` are.)"""
    prog = manifest(pack)["programs"][okey]
    if not opts.get("eager") or not prog.get("torch"):
        return None
    key = ("eager", pack, okey)
    if key not in _STATE:
        from .eager import measure  # noqa: PLC0415  (imports torch)

        d = _program(pack, refdir, okey)
        built, mod = _load(pack, where)

        def ours(number: int) -> float:
            return ct.time_function(mod, built.device, _fill(d, built, 0), number=number, repeat=1, func=built.func)[0]

        _STATE[key] = measure(Path(pack) / prog["torch"]["file"], prog, d["sets"][0], ours,
                              device="cpu" if cr.simulated() else "cuda",
                              rounds=int(opts.get("rounds", 8)), min_ms=float(opts.get("min_ms", 2.0)),
                              reference=d["refs"][0] if d["refs"] else None,
                              slack=d["slacks"][0] if d["slacks"] else None)
    return _STATE[key]


def run_entries(pack: str, refdir: str | None, okey: str, entries: list[dict], opts: dict) -> dict:
    """Run ``entries`` (manifest rows, all of program ``okey``) in this worker: the original's
    GPU verdict (once per program and worker, unless ``opts["original_failed"]`` gives the
    reason it already failed twice), each transformed function's verdict, with
    ``opts["timing"]`` the interleaved timing of Equal pairs, and the PyTorch eager timing
    (``opts["eager"]``). Returns ``{"records": [...], "fault": None |
    {"index", "phase", "reason"}, "discard": bool}``: records of the entries finished before
    a CUDA error, which stops the run (``fault``; the worker must be discarded). With
    ``opts["retry"]`` (one entry, run again in a fresh worker) a fault of the transformed
    function or of its timing is recorded in the record instead (Exec failure, ``timing.error``)
    and ``discard`` says the worker must go; a fault of the original is still returned."""
    records: list[dict] = []
    retry = bool(opts.get("retry"))
    for i, e in enumerate(entries):
        t0 = time.perf_counter()
        phase = "original"
        try:
            if opts.get("original_failed"):
                orig = {"exec": False, "equal": False, "reason": f"exec: {opts['original_failed']}"}
            else:
                okey_o = ("original", pack, okey)
                if okey_o not in _STATE:
                    _STATE[okey_o] = run_check(pack, refdir, okey, e["original"])
                orig = _STATE[okey_o]
            phase = "transformed"
            t1 = time.perf_counter()
            try:
                tr = run_check(pack, refdir, okey, e["transformed"])
            except ExecError as err:
                if not retry:
                    raise
                tr = {"exec": False, "equal": False, "reason": f"exec: {err.reason}", "max_abs_err": None}
                records.append(_record(e, orig, tr, None, None, t0, t1, time.perf_counter()))
                return {"records": records, "fault": None, "discard": True}
            t2 = time.perf_counter()
            timing = None
            phase = "timing"
            if opts.get("timing") and tr.get("equal") and orig.get("equal"):
                try:
                    timing = time_pair(pack, refdir, okey, e["original"], e["transformed"], int(opts.get("rounds", 8)),
                                       float(opts.get("min_ms", 2.0)))
                except ExecError as err:
                    if not retry:
                        raise
                    records.append(_record(e, orig, tr, {"error": err.reason}, None, t0, t1, t2))
                    return {"records": records, "fault": None, "discard": True}
            t3 = time.perf_counter()
            eager = None
            if orig.get("exec") and not opts.get("original_failed"):
                phase = "eager"
                eager = _eager(pack, refdir, okey, e["original"], opts)
            records.append(_record(e, orig, tr, timing, eager, t0, t1, t2, t3))
        except ExecError as err:
            return {"records": records, "fault": {"index": i, "phase": phase, "reason": err.reason}, "discard": True}
    return {"records": records, "fault": None, "discard": False}


def _record(e: dict, orig: dict, tr: dict, timing: dict | None, eager: dict | None, t0: float, t1: float, t2: float,
            t3: float | None = None) -> dict:
    rec = {"id": e["id"], "original": orig, "transformed": tr,
           "seconds_check": round(t2 - t0, 5), "seconds_time": round((t3 or t2) - t2, 5)}
    if timing is not None:
        rec["timing"] = timing
    if eager is not None:
        rec["eager"] = eager
    return rec


__all__ = ["manifest", "prepare_references", "reference_path", "run_check", "time_pair", "run_entries"]
