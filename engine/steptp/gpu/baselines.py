"""Baselines that compare like with like (issue 44), per program, in the node's session,
interleaved with our best (A B, B A ... rounds of the one timing loop,
:func:`steptp.runner.cuda_timing.time_rounds`), each ratio with its 95 % interval
(:func:`steptp.runner.stats.paired_speedup`):

* **from Python**: PyTorch eager ``model(*args)`` against our best called from Python the way
  a user calls it (the TVM runtime function on device tensors, then a device sync), both by
  :func:`steptp.runner.cuda_timing.python_timer` (wall clock, the device drained, the L2
  flushed first): ``eager_us`` / ``best_py_us``;
* **kernels only**: eager captured in a CUDA graph (``torch.cuda.CUDAGraph``, replays timed
  with CUDA events after an L2 flush) against our kernels in TVM's ``time_evaluator`` loop:
  ``eager_graph_us`` / ``best_us``; the original's kernels in the same rounds: ``original_us``;
* ``torch.compile`` with the default mode and with ``mode="max-autotune-no-cudagraphs"``,
  compiled and warmed up in a worker call of its own under the compile cap (``compile_s``,
  ``compile_autotune_s``; a call over the cap is killed: the figure is None, "over the N s
  cap"), then timed from Python against our best from Python.

On the simulated device (CPU builds) no GPU baseline exists: ``eager_graph_us`` and the
``torch.compile`` figures are None with a reason naming it; eager and our function from
Python run on the CPU (one intra-op thread) and are labelled ``cuda-sim``; with ``compile``
the compile path still runs on the CPU under its cap and lands in ``cpu_figures`` only.

Worker functions (:func:`measure_eager`, :func:`compile_model`, :func:`time_compiled`) run
in the GPU worker (:mod:`steptp.gpu.node`'s state: inputs, device tensors, libraries);
:func:`run_baselines` drives them from :mod:`steptp.gpu.run` and writes
``RESULTS/baselines.jsonl`` (:class:`steptp.runner.record.ProgramBaselines`). torch is
imported only inside the worker functions.
"""

from __future__ import annotations

import time
from pathlib import Path

from ..backend import cuda_runtime as cr
from ..backend.errors import BackendError
from ..runner.cuda_timing import python_timer, time_rounds
from ..runner.record import ProgramBaselines, Ratio, write_jsonl
from ..runner.stats import paired_speedup, spread
from . import node
from .eager import comparable, not_comparable_reason

#: ``torch.compile`` modes timed, by the field they fill.
COMPILE_MODES = {"compile": "default", "compile_autotune": "max-autotune-no-cudagraphs"}


def _sim_reason() -> str:
    return "the simulated CUDA device (CPU builds): no GPU to run it on"


def _short(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0] if text else ''}"[:300]


def _torch_setup(pack: str, refdir: str | None, okey: str, device: str) -> dict:
    """The program's PyTorch model and arguments on ``device`` (trial 0's inputs), loaded
    once per worker with the program's own parameters and its outputs cross-checked against
    our original's trial-0 references (:func:`steptp.gpu.eager.program_model`): ``{"model",
    "args", "dtype", "torch", "allow_tf32", "info"}`` (``info``: ``eager_params``,
    ``eager_check``, ``eager_mode``). TF32 is pinned off before the check runs."""
    key = ("torch-model", pack, okey, device)
    if key not in node._STATE:
        import torch  # noqa: PLC0415

        from .eager import pin_tf32, program_model  # noqa: PLC0415

        prog = node.manifest(pack)["programs"][okey]
        d = node._program(pack, refdir, okey)
        tf32 = pin_tf32(torch)
        model, args, info = program_model(Path(pack) / prog["torch"]["file"], prog, d["sets"][0], device,
                                          d["refs"][0] if d["refs"] else None,
                                          d["slacks"][0] if d["slacks"] else None)
        floats = {a.dtype for a in args if isinstance(a, torch.Tensor) and a.is_floating_point()}
        node._STATE[key] = {"model": model, "args": args, "torch": torch, "allow_tf32": tf32, "info": info,
                            "dtype": str(next(iter(floats))).replace("torch.", "") if len(floats) == 1 else None}
    return node._STATE[key]


def _flush(torch, device: str):
    """A function overwriting twice the L2 on ``cuda`` (the flush our kernels get before
    each measurement, :func:`steptp.runner.cuda_timing.l2_flush_bytes`), None on the CPU."""
    if device != "cuda":
        return None
    from ..runner.cuda_timing import l2_flush_bytes  # noqa: PLC0415

    buf = torch.empty(max(1, l2_flush_bytes("cuda") // 4), dtype=torch.float32, device="cuda")
    return buf.zero_


def _ours(pack: str, refdir: str | None, okey: str, where: dict):
    """Our function ``where`` on trial 0's inputs: ``(module, func, args)`` for the kernels-
    only loop and ``call()`` for a Python call."""
    d = node._program(pack, refdir, okey)
    built, mod = node._load(pack, where)
    args = node._fill(d, built, 0)
    f = mod[built.func]
    return (mod, built.func, args), (lambda: f(*args)), built


def _graph_timer(torch, model, args, flush):
    """A timer replaying ``model(*args)`` captured in a CUDA graph (PyTorch's recipe: warm-up
    on a side stream, capture, replay), timed with CUDA events: kernels only."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.no_grad(), torch.cuda.stream(s):
        for _ in range(3):
            model(*args)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.no_grad(), torch.cuda.graph(g):
        model(*args)
    torch.cuda.synchronize()

    def measure(number: int) -> float:
        if flush is not None:
            flush()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(number):
            g.replay()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) * 1e-3 / number

    measure.graph = g  # kept alive with the timer
    return measure


def _ratio(base: list[float], ours: list[float]) -> Ratio:
    st = paired_speedup(base, ours)
    return Ratio(speedup=st["speedup"], ci=st["ci"], verdict=st["verdict"], rounds=st["rounds"])


def measure_eager(pack: str, refdir: str | None, okey: str, best: dict, original: dict, opts: dict) -> dict:
    """Worker: one interleaved session of our best's kernels, the original's kernels, our
    best from Python, PyTorch eager from Python and (on a GPU) eager in a CUDA graph, on
    trial 0's inputs. ``opts``: ``rounds``, ``min_ms``, ``torch`` (False: no PyTorch
    baselines). Returns the fields of :class:`ProgramBaselines` it measured (``*_us``,
    ``iqr_us``, ``ratios`` as dicts, ``reasons``, ``dtypes``, ``torch_dtype``,
    ``torch_version``, ``allow_tf32`` (:func:`steptp.gpu.eager.pin_tf32`), ``rounds``,
    ``eager_params``/``eager_check``/``eager_mode`` (:func:`steptp.gpu.eager.program_model`:
    eager runs with the program's own parameters; when its output is not our original's it
    is not timed and ``eager_us``'s reason says it is not comparable)). Raises
    :class:`steptp.backend.errors.ExecError` for a fault of our functions (the driver records
    it as the reason)."""
    sim = cr.simulated()
    ours_k, ours_call, built = _ours(pack, refdir, okey, best)
    orig_k = _ours(pack, refdir, okey, original)[0] if original != best else None
    prog = node.manifest(pack)["programs"][okey]
    out: dict = {"reasons": {}, "iqr_us": {}, "ratios": {}, "dtypes": {s[0]: s[2] for s in prog["specs"]}}
    tdev = "cpu" if sim else "cuda"
    timers: dict = {"best_us": ours_k}
    if orig_k is not None:
        timers["original_us"] = orig_k
    torch = None
    if opts.get("torch", True) and prog.get("torch"):
        try:
            t = _torch_setup(pack, refdir, okey, tdev)
            out["torch_version"], out["torch_dtype"] = t["torch"].__version__, t["dtype"]
            out["allow_tf32"] = t["allow_tf32"]
            out.update(t["info"])
            if comparable(t["info"]):
                torch = t["torch"]
            else:  # eager computes something else than our program: not timed, no ratio
                out["reasons"]["eager_us"] = not_comparable_reason(t["info"])
        except Exception as e:  # noqa: BLE001  (the program's file, a missing op, no torch)
            out["reasons"]["eager_us"] = f"PyTorch model not loaded: {_short(e)}"
    elif not prog.get("torch"):
        out["reasons"]["eager_us"] = "the program did not come from a PyTorch .py file"
    else:
        out["reasons"]["eager_us"] = "torch does not import on this node"
    threads = torch.get_num_threads() if torch is not None else None
    try:
        if torch is not None and sim:
            torch.set_num_threads(1)
        flush = _flush(torch, tdev) if torch is not None else None
        sync = (lambda: cr.sync(built.device))
        timers["best_py_us"] = python_timer(ours_call, sync, flush)
        if torch is not None:
            model, args = t["model"], t["args"]
            tsync = torch.cuda.synchronize if tdev == "cuda" else (lambda: None)

            torch.set_grad_enabled(False)  # inference, as a user times it (no per-call context manager)
            timers["eager_us"] = python_timer(lambda: model(*args), tsync, flush)
            if not sim:
                try:
                    timers["eager_graph_us"] = _graph_timer(torch, model, args, flush)
                except Exception as e:  # noqa: BLE001  (an op that cannot be captured)
                    out["reasons"]["eager_graph_us"] = f"CUDA graph capture failed: {_short(e)}"
        if sim:
            out["reasons"]["eager_graph_us"] = _sim_reason()
        secs, _ = time_rounds(list(timers.values()), built.device, rounds=int(opts.get("rounds", 8)), warmup=3,
                              min_repeat_ms=float(opts.get("min_ms", 2.0)), max_number=100_000)
    finally:
        if threads is not None:
            torch.set_num_threads(threads)
            torch.set_grad_enabled(True)
    series = dict(zip(timers, secs))
    for k, v in series.items():
        s = spread(v, scale=1e6)
        out[k] = s["median"]
        out["iqr_us"][k] = [s["q1"], s["q3"]]
    if orig_k is None:
        series["original_us"] = series["best_us"]
        out["original_us"], out["iqr_us"]["original_us"] = out["best_us"], out["iqr_us"]["best_us"]
    out["ratios"]["speedup_vs_original"] = _ratio(series["original_us"], series["best_us"]).__dict__
    if "eager_us" in series:
        out["ratios"]["speedup_vs_eager"] = _ratio(series["eager_us"], series["best_py_us"]).__dict__
    if "eager_graph_us" in series:
        out["ratios"]["speedup_vs_eager_graph"] = _ratio(series["eager_graph_us"], series["best_us"]).__dict__
    out["rounds"] = int(opts.get("rounds", 8))
    return out


def compile_model(pack: str, refdir: str | None, okey: str, mode: str) -> dict:
    """Worker: ``torch.compile(model, mode=mode)`` and 3 warm-up calls (the compilation),
    kept in the worker for :func:`time_compiled`. Returns ``{"compile_s"}`` (seconds of
    compile + warm-up) or ``{"error"}``. The driver's time limit on this call is the cap."""
    tdev = "cpu" if cr.simulated() else "cuda"
    try:
        t = _torch_setup(pack, refdir, okey, tdev)
        torch = t["torch"]
        if tdev == "cpu":
            torch.set_num_threads(1)
        torch._dynamo.reset()  # no compiled frame of another mode is reused (dynamo caches per code object)
        t0 = time.perf_counter()
        fn = torch.compile(t["model"], mode=None if mode == "default" else mode)
        with torch.no_grad():
            for _ in range(3):
                fn(*t["args"])
        if tdev == "cuda":
            torch.cuda.synchronize()
        secs = time.perf_counter() - t0
    except Exception as e:  # noqa: BLE001
        return {"error": f"torch.compile (mode {mode}) failed: {_short(e)}"}
    node._STATE[("compiled", pack, okey, mode)] = fn
    return {"compile_s": secs}


def time_compiled(pack: str, refdir: str | None, okey: str, best: dict, mode: str, opts: dict) -> dict:
    """Worker: the model compiled by :func:`compile_model` (same worker) from Python against
    our best from Python, interleaved. Returns ``{"us", "iqr_us", "ratio", "best_py_us"}``
    or ``{"error"}``."""
    fn = node._STATE.get(("compiled", pack, okey, mode))
    if fn is None:
        return {"error": "the compiled model is not in this worker (it was restarted)"}
    sim = cr.simulated()
    tdev = "cpu" if sim else "cuda"
    t = _torch_setup(pack, refdir, okey, tdev)
    torch, args = t["torch"], t["args"]
    _, ours_call, built = _ours(pack, refdir, okey, best)
    flush = _flush(torch, tdev)
    tsync = torch.cuda.synchronize if tdev == "cuda" else (lambda: None)

    try:
        torch.set_grad_enabled(False)
        (ours, comp), _ = time_rounds([python_timer(ours_call, lambda: cr.sync(built.device), flush),
                                       python_timer(lambda: fn(*args), tsync, flush)], built.device,
                                      rounds=int(opts.get("rounds", 8)), warmup=3,
                                      min_repeat_ms=float(opts.get("min_ms", 2.0)), max_number=100_000)
    except Exception as e:  # noqa: BLE001
        return {"error": f"timing the compiled model failed: {_short(e)}"}
    finally:
        torch.set_grad_enabled(True)
    s, so = spread(comp, scale=1e6), spread(ours, scale=1e6)
    return {"us": s["median"], "iqr_us": [s["q1"], s["q3"]], "ratio": _ratio(comp, ours).__dict__,
            "best_py_us": so["median"]}


# ---------------------------------------------------------------------------
# Driver
# ---------------------------------------------------------------------------


def _left(deadline: float | None) -> float | None:
    return None if deadline is None else deadline - time.perf_counter()


def run_baselines(pack: str, refdir: str, programs: dict, best: dict, *, device_name: str, rounds: int = 8,
                  min_ms: float = 2.0, eager_cap_s: float = 120.0, compile_cap_s: float = 300.0,
                  compile_modes: tuple = (), torch_ok: bool = True, deadline: float | None = None,
                  runner=None, checkpoint=None, previous: dict | None = None,
                  verdicts: dict | None = None) -> list[ProgramBaselines]:
    """Measure the baselines of every program of ``programs`` (manifest key -> manifest
    program) with one GPU worker ``runner`` (an :class:`steptp.runner.worker.IsolatedRunner`
    from :func:`steptp.runner.pool.shared`): ``best[okey]`` is ``(manifest entry,
    transformed)``: the entry whose transformed function is our best (``transformed`` True)
    or any entry of the program when the original is our best (False); a program without
    one is absent. Phases, each over all programs before the next, so a deadline
    (``time.perf_counter()`` value) cuts the slowest last: eager + graph + kernels
    (``eager_cap_s`` per program), then each ``torch.compile`` mode of ``compile_modes``
    (``"compile"``, ``"compile_autotune"``: compilation capped at ``compile_cap_s``, then its
    timing). ``checkpoint(records)``, when given, is called after each phase (the node writes
    ``baselines.jsonl`` then, so a run killed later keeps what finished). ``previous``: the
    records of an earlier call (``baselines.jsonl``) by program: a program whose best is the
    same keeps its measured figures and only what is missing (a phase the deadline cut, a
    mode not requested then, a compilation over the cap) is measured again, so a second call
    of the node can spend its time on ``torch.compile``. ``verdicts``: per program the
    best's compute-sanitizer verdict (:func:`steptp.gpu.session.choose_best`), recorded as
    ``best_sanitizer``. Returns one :class:`ProgramBaselines` per program, every None figure
    with its reason."""
    sim = cr.simulated()
    out: dict[str, ProgramBaselines] = {}
    kept: set[str] = set()
    for okey, prog in programs.items():
        b = ProgramBaselines(program=okey, name=prog.get("name") or okey, device="cuda-sim" if sim else "cuda",
                             device_name=device_name, dtypes={s[0]: s[2] for s in prog["specs"]})
        e, transformed = best.get(okey) or (None, False)
        b.best_id = e["id"] if e is not None and transformed else None
        old = (previous or {}).get(okey)
        if old is not None and old.best_id == b.best_id and old.device == b.device and old.best_us is not None:
            b = ProgramBaselines.from_json(old.to_json())
            kept.add(okey)
        b.best_sanitizer = (verdicts or {}).get(okey)
        out[okey] = b
    # phase 1: kernels, from Python, eager, eager graph
    for okey, b in out.items():
        t0 = time.perf_counter()
        e = (best.get(okey) or (None, False))[0]
        if okey in kept:
            continue
        if e is None:
            _absent(b, "no Equal entry of this program on the device to time")
            continue
        left = _left(deadline)
        if left is not None and left < 2.0:
            _absent(b, "deadline: the node's time ran out before this program's baselines")
            continue
        where = e["transformed"] if b.best_id else e["original"]
        try:
            got = runner.call(measure_eager, pack, refdir, okey, where, e["original"],
                              {"rounds": rounds, "min_ms": min_ms, "torch": torch_ok},
                              timeout_s=eager_cap_s if left is None else max(1.0, min(eager_cap_s, left)),
                              discard_on_error=True)
        except BackendError as err:
            why = err.reason if "time limit" not in err.reason else f"over the {eager_cap_s:g} s cap ({err.reason})"
            _absent(b, f"baseline session failed: {why}")
            continue
        _apply(b, got)
        b.seconds += time.perf_counter() - t0
    for okey, b in out.items():  # until the compile phases fill them
        for field_ in COMPILE_MODES:
            for f in (f"{field_}_us", f"{field_}_s"):
                b.set_reason(f, "deadline: the node's time ran out before this program's torch.compile")
    if checkpoint is not None:
        checkpoint(list(out.values()))
    # phase 2: torch.compile, each mode
    for field_, mode in COMPILE_MODES.items():
        for okey, b in out.items():
            us, cs = f"{field_}_us", f"{field_}_s"
            if okey in kept and (getattr(b, us) is not None or us in b.cpu_figures):
                continue  # measured by the earlier call
            if field_ not in compile_modes:
                flag = "--compile" if field_ == "compile" else "--autotune"
                b.set_reason_now(us, f"not requested (python -m steptp.gpu.run {flag})")
                b.set_reason_now(cs, f"not requested (python -m steptp.gpu.run {flag})")
                continue
            if b.best_py_us is None or b.torch_version is None or b.eager_check != "equal":
                why = b.reasons.get("eager_us") or b.reasons.get("best_py_us") or "no PyTorch model"
                b.set_reason_now(us, why)
                b.set_reason_now(cs, why)
                continue
            _compile(b, okey, best[okey][0], field_, mode, pack, refdir, runner, rounds, min_ms, compile_cap_s,
                     deadline, sim)
        if checkpoint is not None:
            checkpoint(list(out.values()))
    return list(out.values())


def _absent(b: ProgramBaselines, why: str) -> None:
    for f in ("best_us", "best_py_us", "original_us", "eager_us", "eager_graph_us"):
        if getattr(b, f) is None:
            b.set_reason(f, why)


def _apply(b: ProgramBaselines, got: dict) -> None:
    for f in ("best_us", "best_py_us", "original_us", "eager_us", "eager_graph_us"):
        if got.get(f) is not None:
            setattr(b, f, float(got[f]))
    b.iqr_us.update(got.get("iqr_us") or {})
    b.ratios.update({k: Ratio(**v) for k, v in (got.get("ratios") or {}).items()})
    for k, v in (got.get("reasons") or {}).items():
        b.set_reason(k, v)
    b.torch_version, b.torch_dtype, b.rounds = got.get("torch_version"), got.get("torch_dtype"), got.get("rounds", 0)
    b.allow_tf32 = got.get("allow_tf32")
    b.eager_params, b.eager_check, b.eager_mode = got.get("eager_params"), got.get("eager_check"), got.get("eager_mode")
    b.dtypes = got.get("dtypes") or b.dtypes
    if b.eager_us is None:
        b.set_reason("eager_us", "not measured")
    if b.eager_graph_us is None:
        b.set_reason("eager_graph_us", b.reasons.get("eager_us") or "not measured")


def _compile(b: ProgramBaselines, okey: str, e: dict, field_: str, mode: str, pack: str, refdir: str, runner,
             rounds: int, min_ms: float, cap: float, deadline: float | None, sim: bool) -> None:
    """One ``torch.compile`` mode of one program: compile under the cap, then time."""
    us, cs = f"{field_}_us", f"{field_}_s"
    left = _left(deadline)
    if left is not None and left < 5.0:
        b.set_reason_now(us, "deadline: the node's time ran out before this program's torch.compile")
        b.set_reason_now(cs, b.reasons[us])
        return
    limit = cap if left is None else min(cap, left)
    try:
        got = runner.call(compile_model, pack, refdir, okey, mode, timeout_s=max(1.0, limit), discard_on_error=True)
    except BackendError as err:
        got = {"error": f"over the {limit:g} s cap" + (" (the node's deadline)" if limit < cap else "")
               if "time limit" in err.reason else f"torch.compile failed: {err.reason}"}
    if "error" in got:
        why = f"{_sim_reason()}; torch.compile on the CPU instead: {got['error']}" if sim else got["error"]
        b.set_reason_now(us, why)
        b.set_reason_now(cs, why)
        return
    secs = float(got["compile_s"])
    if sim:
        b.cpu_figures[cs] = secs
    else:
        setattr(b, cs, secs)
        b.reasons.pop(cs, None)
    left = _left(deadline)
    try:
        tm = runner.call(time_compiled, pack, refdir, okey, e["transformed"] if b.best_id else e["original"], mode,
                         {"rounds": rounds, "min_ms": min_ms},
                         timeout_s=max(1.0, 120.0 if left is None else min(120.0, left)), discard_on_error=True)
    except BackendError as err:
        tm = {"error": f"timing the compiled model: {err.reason}"}
    if "error" in tm:
        b.set_reason_now(us, tm["error"])
    elif sim:
        b.cpu_figures[us] = tm["us"]
        b.cpu_figures[f"speedup_vs_{field_}"] = tm["ratio"]
    else:
        setattr(b, us, tm["us"])
        b.reasons.pop(us, None)
        b.iqr_us[us] = tm["iqr_us"]
        b.ratios[f"speedup_vs_{field_}"] = Ratio(**tm["ratio"])
    if sim:
        why = (f"{_sim_reason()}; torch.compile ran on the CPU instead (cpu_figures: compiled in {secs:.1f} s), "
               "not a GPU figure")
        b.set_reason_now(us, why)
        b.set_reason_now(cs, why)


def write_baselines(path: str | Path, records: list[ProgramBaselines]) -> None:
    """``baselines.jsonl``: one line per program (:meth:`ProgramBaselines.to_json`), written
    atomically (:func:`steptp.runner.record.write_jsonl`)."""
    write_jsonl(path, records)


__all__ = ["COMPILE_MODES", "measure_eager", "compile_model", "time_compiled", "run_baselines", "write_baselines"]
