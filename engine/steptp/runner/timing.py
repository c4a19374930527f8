"""Run time of a LEIR program: :func:`measure` -> :class:`Timing` (microseconds), :func:`speedup`.

Methodology (paper App. C.2, "Multi-step Transformation": TVM's built-in ``time_evaluator``,
three warm-up runs, three measurement repetitions; the paper reports the mean, and its
speedup is ``Runtime_original / Runtime_transformed``):

1. Build the program's **performance form**: on ``cpu`` the LLVM build at opt-level 3 of
   the plain CPU lowering that keeps ``P`` loops parallel and ``V`` loops vectorized (bound
   ``B`` loops serial; :mod:`steptp.backend.perf` explains why), not the poisoned opt-level-0
   verification form; on ``cuda`` the GPU form exported and loaded with the TVM runtime
   (:func:`steptp.backend.perf.export_cuda`, :mod:`steptp.backend.cuda_runtime`).
2. Inputs: fixed seeded values, ``steptp.runner.program_inputs.random_inputs(signature, seed, 0, [program])``
   (trial 0: floats uniform(-2, 2)); outputs start at zero. Same seed, same inputs, so two
   programs with one signature are timed on identical data.
3. ``warmup`` calls (default 3, as in the paper), then ``number`` calibration: unless given,
   ``number`` is chosen so that one measurement lasts at least ``min_repeat_ms``
   (``ceil(min_repeat_ms / per-call time)``, the effect of ``time_evaluator``'s
   ``min_repeat_ms``, but known exactly), since single calls of small kernels are below the
   timer's resolution.
4. TVM ``time_evaluator`` (``tvm.runtime.Module.time_evaluator``; the runtime function
   ``runtime.RPCTimeEvaluator``, notes §4): one more warm-up call, then ``repeat``
   measurements, each the mean of ``number`` consecutive calls.
5. Statistics over the ``repeat`` per-call times: median (the reported figure: robust to a
   preempted repeat on a shared machine), min, mean, interquartile range (numpy linear
   percentiles 75 - 25) and coefficient of variation (sample standard deviation / mean, a
   fraction). ``repeat`` defaults to 10 rather than the paper's 3 so that IQR and CV mean
   something; ``repeat=3`` reproduces the paper's protocol.

Threads: TVM's CPU thread pool reads ``TVM_NUM_THREADS`` once, when it starts. Unless the
variable is already set, :func:`measure` sets it to ``1`` before TVM first runs anything in
the process, so CPU timings are deterministic and comparable across machines (``P`` loops
then run on one thread; set ``TVM_NUM_THREADS=N`` before the first measurement to time the
parallel form). ``Timing.threads`` records the pool size in effect.

Results are cached for the process by (program text, device, settings, threads), since a
search times the same program many times: a repeated call returns the *same*
:class:`Timing` object without running anything (:func:`cache_info`).

CPU measurements run in the calling process (no time limit); CUDA measurements run in a
worker process discarded after any CUDA error. Time verified programs only.
"""

from __future__ import annotations

import math
import os
import threading
from collections import OrderedDict
from dataclasses import asdict, dataclass
from typing import Sequence

import numpy as np

from ..leir.fileformat import LeirModule
from .device import DEVICES

#: Calls made before anything is measured (paper App. C.2: three warm-up runs).
DEFAULT_WARMUP = 3
#: Measurements per program (the paper uses 3; 10 gives a meaningful IQR / CV).
DEFAULT_REPEAT = 10
#: Minimum length of one measurement, milliseconds (``time_evaluator``'s ``min_repeat_ms``).
DEFAULT_MIN_REPEAT_MS = 10.0
#: Coefficient of variation above which a timing is flagged as noisy (5 %).
NOISY_CV = 0.05
#: Upper bound of the calibrated ``number`` (calls per measurement).
MAX_NUMBER = 1_000_000


@dataclass(frozen=True)
class Timing:
    """Run time of one program; every time in **microseconds** per call.

    * ``median_us``, ``min_us``, ``mean_us``: over the ``repeats`` measurements, each the
      mean of ``number`` consecutive calls (TVM ``time_evaluator``).
    * ``iqr_us``: interquartile range (75th - 25th percentile, linear interpolation).
    * ``cv``: coefficient of variation, sample standard deviation / mean (a fraction;
      0.05 = 5 %); 0 with one measurement.
    * ``device``: ``cpu`` or ``cuda``; ``threads``: TVM CPU thread-pool size in effect.
    * ``results_us``: the ``repeats`` per-call times themselves.
    """

    median_us: float
    min_us: float
    iqr_us: float
    cv: float
    mean_us: float
    repeats: int
    number: int
    device: str
    threads: int = 1
    results_us: tuple[float, ...] = ()

    @property
    def noisy(self) -> bool:
        """``cv`` above :data:`NOISY_CV` (5 %)."""
        return self.cv > NOISY_CV

    def as_dict(self) -> dict:
        """JSON-ready dict of every field (times in microseconds, ``results_us`` a list)."""
        d = asdict(self)
        d["results_us"] = list(self.results_us)
        return d


def summarize(seconds: Sequence[float], number: int, device: str, threads: int = 1) -> Timing:
    """:class:`Timing` of per-call times given in **seconds** (one per measurement)."""
    us = np.asarray([float(s) * 1e6 for s in seconds], dtype=np.float64)
    if us.size == 0:
        raise ValueError("no measurement to summarise")
    mean = float(us.mean())
    std = float(us.std(ddof=1)) if us.size > 1 else 0.0
    q75, q25 = np.percentile(us, [75, 25])
    return Timing(median_us=float(np.median(us)), min_us=float(us.min()), iqr_us=float(q75 - q25),
                  cv=std / mean if mean > 0 else 0.0, mean_us=mean, repeats=int(us.size), number=int(number),
                  device=device, threads=int(threads), results_us=tuple(float(x) for x in us))


def speedup(base: Timing, new: Timing) -> float:
    """``base.median_us / new.median_us``: how many times faster ``new`` runs (paper App. C.2:
    Runtime_original / Runtime_transformed, with medians). ``inf`` when ``new`` took 0."""
    if new.median_us <= 0:
        return math.inf
    return base.median_us / new.median_us


# ---------------------------------------------------------------------------
# Cache
# ---------------------------------------------------------------------------

_CACHE: "OrderedDict[tuple, Timing]" = OrderedDict()
_CACHE_SIZE = 4096
_LOCK = threading.Lock()
_STATS = {"hits": 0, "misses": 0, "runs": 0}


def cache_info() -> dict:
    """``{"hits", "misses", "runs", "size"}`` of the process-level timing cache (``runs``:
    programs actually timed)."""
    with _LOCK:
        return {**_STATS, "size": len(_CACHE)}


def clear_cache() -> None:
    """Forget every cached timing (counters included)."""
    with _LOCK:
        _CACHE.clear()
        for k in _STATS:
            _STATS[k] = 0


# ---------------------------------------------------------------------------
# Measuring
# ---------------------------------------------------------------------------


def tvm_threads() -> int:
    """Size of TVM's CPU thread pool (``runtime.NumThreads``), after defaulting
    ``TVM_NUM_THREADS`` to 1 (see the module docstring)."""
    os.environ.setdefault("TVM_NUM_THREADS", "1")
    import tvm  # noqa: F401,PLC0415  (loads libtvm_runtime)
    import tvm_ffi  # noqa: PLC0415

    return int(tvm_ffi.get_global_func("runtime.NumThreads")())


def measure(module: LeirModule, device: str = "cpu", *, number: int | None = None, repeat: int = DEFAULT_REPEAT,
            warmup: int = DEFAULT_WARMUP, min_repeat_ms: float = DEFAULT_MIN_REPEAT_MS, seed: int = 0) -> Timing:
    """Time ``module`` (a :class:`~steptp.leir.fileformat.LeirModule`) on ``device``.

    * ``number``: calls per measurement; ``None`` calibrates it to ``min_repeat_ms``
      milliseconds (a given ``number`` is raised to that too when ``min_repeat_ms`` > 0).
    * ``repeat``: measurements (>= 1); ``warmup``: calls before measuring (>= 0);
      ``seed``: of the inputs (:func:`steptp.runner.program_inputs.random_inputs`, trial 0).

    Returns a :class:`Timing` in microseconds per call (module docstring: methodology,
    threads, cache). Raises ``ValueError`` for bad settings or device,
    :class:`~steptp.backend.errors.LoweringError` / ``BuildError`` / ``ExecError`` when the
    program does not lower, build or run (``ExecError`` also when ``cuda`` is unavailable,
    naming what is missing). Sources: paper App. C.2; TVM ``Module.time_evaluator``.
    """
    if device not in DEVICES:
        raise ValueError(f"unknown device {device!r}; expected one of {DEVICES}")
    if repeat < 1 or warmup < 0 or (number is not None and number < 1) or min_repeat_ms < 0:
        raise ValueError("measure: need repeat >= 1, warmup >= 0, number >= 1, min_repeat_ms >= 0")
    threads = tvm_threads() if device == "cpu" else 1
    key = (module.text(), device, number, int(repeat), int(warmup), float(min_repeat_ms), int(seed), threads)
    with _LOCK:
        hit = _CACHE.get(key)
        if hit is not None:
            _CACHE.move_to_end(key)
            _STATS["hits"] += 1
            return hit
        _STATS["misses"] += 1
    if device == "cpu":
        t = _measure_cpu(module, number, repeat, warmup, min_repeat_ms, seed, threads)
    else:
        t = _measure_cuda(module, number, repeat, warmup, min_repeat_ms, seed)
    with _LOCK:
        _STATS["runs"] += 1
        _CACHE[key] = t
        while len(_CACHE) > _CACHE_SIZE:
            _CACHE.popitem(last=False)
    return t


def _inputs(module: LeirModule, seed: int) -> dict:
    from .program_inputs import random_inputs  # noqa: PLC0415

    return random_inputs(module.signature, seed, 0, [module.program])


def _params(module: LeirModule):
    from ..backend.perf import _params as params  # noqa: PLC0415

    return params(module)


def _run_protocol(mod, device: str, args: list, number: int | None, repeat: int, warmup: int,
                  min_repeat_ms: float) -> tuple[list[float], int]:
    """One program through the one timing loop (:func:`steptp.runner.cuda_timing.time_rounds`):
    warm-up calls, ``number`` calibration, ``repeat`` measurements; returns (seconds per call
    per measurement, number)."""
    from .cuda_timing import time_rounds  # noqa: PLC0415

    (secs,), (number,) = time_rounds([(mod, "main", args)], device, rounds=repeat, warmup=warmup,
                                     min_repeat_ms=min_repeat_ms, max_number=MAX_NUMBER, number=number)
    return secs, number


_FORM_CHECKED: "OrderedDict[tuple, str]" = OrderedDict()


def check_performance_form(module: LeirModule, seed: int = 0, kernel=None) -> None:
    """Check the program that is timed against the program that was verified (issue 34).

    The CPU performance form (:func:`steptp.backend.perf.build_perf_cpu`: opt-level 3,
    ``-mcpu``, polynomial ``exp``, vector splits with tails) runs once on seeded inputs
    (trial 0 of :func:`steptp.verify.random_inputs`, the timing's own inputs) beside the
    verification form (:func:`steptp.backend.tvmscript.lower_module` with poisoned
    intermediates, the build ``stp verify`` runs); every output must pass the one tolerance
    rule (:func:`steptp.runner.tolerance.compare`). ``kernel``: the performance build when the
    caller has it. Raises :class:`~steptp.backend.errors.FormMismatch` (with both TVMScript
    texts) on a mismatch, so no speedup is reported for a miscompiled timed form; Lowering/
    Build/ExecError as the builds do. Cached per program text and seed."""
    from ..backend.build import build_cpu  # noqa: PLC0415
    from ..backend.errors import FormMismatch  # noqa: PLC0415
    from ..backend.perf import build_perf_cpu, perf_cpu_text  # noqa: PLC0415
    from ..backend.tvmscript import lower_module  # noqa: PLC0415
    from .tolerance import compare_trials  # noqa: PLC0415

    key = (module.text(), int(seed))
    with _LOCK:
        if key in _FORM_CHECKED:
            return
    x = _inputs(module, seed)
    verification_text = lower_module(module, None, "cpu", poison=True).text
    ref = build_cpu(verification_text, module.signature)({k: v.copy() for k, v in x.items()})
    perf = kernel if kernel is not None else build_perf_cpu(module)
    got = perf({k: v.copy() for k, v in x.items()})
    detail, _, _ = compare_trials([ref], [got], [(t.name, t.dtype) for t in module.signature.outputs])
    if detail:
        raise FormMismatch(f"the CPU performance form disagrees with the verification form of program "
                           f"'{module.signature.name}' ({detail}); its timing is not reported",
                           verification_text, perf_cpu_text(module))
    with _LOCK:
        _FORM_CHECKED[key] = ""
        while len(_FORM_CHECKED) > _CACHE_SIZE:
            _FORM_CHECKED.popitem(last=False)


def _measure_cpu(module: LeirModule, number, repeat, warmup, min_repeat_ms, seed, threads) -> Timing:
    from ..backend.cuda_runtime import device_args  # noqa: PLC0415
    from ..backend.perf import build_perf_cpu  # noqa: PLC0415

    kernel = build_perf_cpu(module)
    check_performance_form(module, seed, kernel)
    args = device_args(_params(module), "cpu", _inputs(module, seed))
    secs, n = _run_protocol(kernel.executable.mod, "cpu", args, number, repeat, warmup, min_repeat_ms)
    return summarize(secs, n, "cpu", threads)


def _measure_cuda(module: LeirModule, number, repeat, warmup, min_repeat_ms, seed) -> Timing:
    """CUDA timing in a worker process (the verification runner, discarded after any CUDA
    error, so a fault while timing costs this program only)."""
    from ..backend.errors import ExecError  # noqa: PLC0415
    from .device import device_limits, device_problem  # noqa: PLC0415

    why = device_problem("cuda")
    if why:
        raise ExecError(why)
    secs, n = _cuda_runner().call(measure_cuda_here, module.text(), device_limits("cuda"), number, repeat, warmup,
                          min_repeat_ms, seed, discard_on_error=True)
    return summarize(secs, n, "cuda", 1)




def measure_cuda_here(module_text: str, limits, number, repeat, warmup, min_repeat_ms, seed) -> tuple[list[float], int]:
    """Export ``module_text`` (LEIR) for CUDA, load it with the runtime and run the timing
    protocol in this process; returns (seconds per call per measurement, number). The unit
    of work of :func:`measure` on ``cuda`` in a worker. Raises Build/ExecError."""
    import tempfile  # noqa: PLC0415

    from ..backend.cuda_runtime import device_args, load_built  # noqa: PLC0415
    from ..backend.perf import export_cuda_cached  # noqa: PLC0415
    from ..leir import parse_leir  # noqa: PLC0415

    module = parse_leir(module_text)
    with tempfile.TemporaryDirectory(prefix="stp-time-") as tmp:
        built, _ = export_cuda_cached(module, tmp, limits=limits)
        mod = load_built(built)
        args = device_args(built.params, "cuda", _inputs(module, seed))
        return _run_protocol(mod, "cuda", args, number, repeat, warmup, min_repeat_ms)


# ---------------------------------------------------------------------------
# Interleaved comparison (the one method for speedups: stp time, dataset --time, search)
# ---------------------------------------------------------------------------

#: Interleaved rounds of :func:`compare` (each round: one measurement of each program).
DEFAULT_ROUNDS = 10


@dataclass(frozen=True)
class Comparison:
    """Speedup of ``candidate`` over ``baseline`` from interleaved measurements (microseconds
    per call): ``baseline_us`` / ``candidate_us`` are the medians of their ``rounds``
    measurements; ``speedup`` is the median of the paired ratios baseline/candidate with a
    bootstrap ``ci`` (95 %); ``verdict`` is ``faster`` / ``slower`` only when the interval
    excludes 1, else ``same`` (:func:`steptp.runner.stats.paired_speedup`). ``number``: calls
    per measurement of the candidate, ``baseline_number`` of the baseline (each calibrated to
    ``min_repeat_ms``), ``device``, ``threads``."""

    baseline_us: float
    candidate_us: float
    speedup: float
    ci: tuple[float, float]
    verdict: str
    rounds: int
    number: int
    device: str
    threads: int = 1
    baseline_number: int | None = None

    def as_dict(self) -> dict:
        """JSON-ready dict (``ci`` a list)."""
        d = asdict(self)
        d["ci"] = list(self.ci)
        return d


def compare(baseline: LeirModule, candidate: LeirModule, device: str = "cpu", *, rounds: int = DEFAULT_ROUNDS,
            warmup: int = DEFAULT_WARMUP, min_repeat_ms: float = DEFAULT_MIN_REPEAT_MS, seed: int = 0) -> Comparison:
    """Time ``baseline`` and ``candidate`` (same signature) **interleaved** in one process on
    the same seeded inputs: ``warmup`` calls of each, the calls per measurement of each
    calibrated so that one measurement lasts ``min_repeat_ms``, then ``rounds`` rounds of one
    ``time_evaluator`` measurement each, in the order AB, BA, AB ... (drift and a warm or cold
    machine hit both alike). Returns a :class:`Comparison`. On ``cuda`` it runs in a worker
    process discarded after any CUDA error. Raises ``ValueError`` (bad settings, different
    signatures), Lowering/Build/ExecError. Sources: TVM ``Module.time_evaluator``; paired
    ratios with a bootstrap interval (Efron & Tibshirani 1993); issue 26."""
    if device not in DEVICES:
        raise ValueError(f"unknown device {device!r}; expected one of {DEVICES}")
    if rounds < 1 or warmup < 0 or min_repeat_ms < 0:
        raise ValueError("compare: need rounds >= 1, warmup >= 0, min_repeat_ms >= 0")
    if _sig_key(baseline) != _sig_key(candidate):
        raise ValueError("compare: the two programs have different signatures (not the same inputs)")
    if device == "cpu":
        threads = tvm_threads()
        ta, tb, n = compare_here(baseline.text(), candidate.text(), "cpu", None, rounds, warmup, min_repeat_ms, seed)
    else:
        from ..backend.errors import ExecError  # noqa: PLC0415
        from .device import device_limits, device_problem  # noqa: PLC0415

        why = device_problem("cuda")
        if why:
            raise ExecError(why)
        threads = 1
        ta, tb, n = _cuda_runner().call(compare_here, baseline.text(), candidate.text(), "cuda", device_limits("cuda"),
                                        rounds, warmup, min_repeat_ms, seed, discard_on_error=True)
    from .stats import paired_speedup  # noqa: PLC0415

    st = paired_speedup(ta, tb, seed=seed)
    return Comparison(baseline_us=st["a_median"] * 1e6, candidate_us=st["b_median"] * 1e6, speedup=st["speedup"],
                      ci=(st["ci"][0], st["ci"][1]), verdict=st["verdict"], rounds=rounds, number=n[1], device=device,
                      threads=threads, baseline_number=n[0])


def _sig_key(m: LeirModule):
    return sorted((t.name, t.is_output, t.dtype, tuple(t.shape)) for t in m.signature.tensors)


def compare_here(text_a: str, text_b: str, device: str, limits, rounds: int, warmup: int, min_repeat_ms: float,
                 seed: int) -> tuple[list[float], list[float], list[int]]:
    """The measurements of :func:`compare` in this process: (seconds per call of A per
    round, of B per round, [calls per measurement of A, of B])."""
    import tempfile  # noqa: PLC0415

    from ..backend.cuda_runtime import device_args, load_built  # noqa: PLC0415
    from .cuda_timing import time_interleaved  # noqa: PLC0415
    from ..leir import parse_leir  # noqa: PLC0415

    a, b = parse_leir(text_a), parse_leir(text_b)
    inputs = _inputs(a, seed)
    with tempfile.TemporaryDirectory(prefix="stp-compare-") as tmp:
        fns = []
        for k, m in enumerate((a, b)):
            if device == "cpu":
                from ..backend.perf import build_perf_cpu  # noqa: PLC0415

                kernel = build_perf_cpu(m)
                check_performance_form(m, seed, kernel)  # the timed form computes what was verified
                fns.append((kernel.executable.mod, "main", device_args(_params(m), "cpu", inputs)))
            else:
                from ..backend.perf import export_cuda_cached  # noqa: PLC0415

                built, _ = export_cuda_cached(m, f"{tmp}/{k}", limits=limits)
                fns.append((load_built(built), built.func, device_args(built.params, "cuda", inputs)))
        return time_interleaved(fns[0], fns[1], device, rounds=rounds, warmup=warmup, min_repeat_ms=min_repeat_ms,
                                max_number=MAX_NUMBER)


def _cuda_runner():
    """The pool's ``"cuda"`` worker (:func:`steptp.runner.pool.shared`), 600 s per call."""
    from .pool import shared  # noqa: PLC0415

    return shared("cuda", 600.0)


__all__ = ["check_performance_form", "Timing", "measure", "speedup", "Comparison", "compare", "DEFAULT_ROUNDS", "summarize", "cache_info", "clear_cache", "tvm_threads",
           "DEFAULT_WARMUP", "DEFAULT_REPEAT", "DEFAULT_MIN_REPEAT_MS", "NOISY_CV"]
