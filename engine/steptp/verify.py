"""Numerical verification of LEIR programs (paper §3.4 "Verification"; design.md §5).

* Originals are checked against their PyTorch program (:func:`verify_against`), transformed
  programs against their original (:func:`verify_pair`).
* Every check runs ``trials`` (default 3) independent trials with seeded random inputs
  (:func:`random_inputs`) and passes only if every output of every trial matches
  (:func:`compare`, per-dtype :data:`TOLERANCES`). :func:`verify_pair` adds two ordered
  trials (:func:`ordered_inputs`: inputs increasing, then decreasing, along every axis), so
  that a step dropping one element of a max/min reduction fails for every seed, and four
  edge-case trials (:func:`edge_inputs`: exact zeros, scattered exact zeros, all negative,
  large magnitudes), so that a step giving inf/NaN where its original is finite fails
  (design.md §8: what Equal promises).
* The outcome is a :class:`VerifyResult` with the paper's progressive metrics: **Diff** (the
  canonical LEIR text changed), **Build** (lowering, LLVM build and, by default, the GPU
  preflight and TVM CUDA code generation; optionally nvcc), **Exec** (the CPU kernel ran on
  every trial), **Equal** (all outputs within tolerance), plus a ``reason`` naming the first
  failure.
* Execution is in process by default. ``isolated=True`` runs build+run in a ``spawn`` worker
  process (:class:`steptp.runner.worker.IsolatedRunner`) with a time limit ``timeout_s``, so
  a hanging or crashing kernel costs one candidate; the dataset path uses that mode.

Input distribution (:func:`random_inputs`), chosen so that sign-dependent code (relu,
abs, max/min, masks) and domain-restricted code (log, sqrt, fractional powers) are both
exercised across the three trials:

=========  ====================================  ======================================
trial % 3  floating point tensors                 integer tensors (not used as indices)
=========  ====================================  ======================================
0          uniform(-2, 2)                         uniform integers in [-8, 8] without 0
1          uniform(0.1, 2): log/sqrt finite        uniform integers in [1, 8]
2          standard normal                         uniform integers in [-8, 8] without 0
=========  ====================================  ======================================

Integer inputs used in a subscript (indirect indexing, e.g. cross-entropy targets) are drawn
uniformly from ``[0, M)`` where ``M`` is the largest bound that keeps every such subscript
in range (interval analysis over the program). Zero is excluded elsewhere so that integer
division by an input cannot trap. Booleans are fair coin flips. Draws are float64 rounded
to the tensor dtype; the generator is ``numpy.random.default_rng([seed, trial])``.
"""

from __future__ import annotations

import math
import re
import uuid
import weakref
from collections import OrderedDict
from dataclasses import asdict, dataclass
from typing import Callable, Mapping, NamedTuple

import numpy as np

from .backend.build import compile_cuda_text, nvcc_check, nvcc_path, np_dtype, run_lowered
from .backend.errors import BackendError, BuildError, ExecError, LoweringError, WorkerFailure
from .backend.hardware import DEFAULT_GPU, GpuLimits
from .backend.preflight import preflight
from .backend.tvmscript import lower_module, tvm_dtype
from .runner.device import DEVICES
from .runner.worker import IsolatedRunner
from .runner.inputs import EDGE_TRIALS, LARGE_SCALES
from .runner.program_inputs import (ORDERED_TRIALS, edge_inputs, index_bounds, ordered_inputs, random_inputs,
                                   tensor_specs)
from .leir.analysis import analyze, LeirSemanticError
from .leir.fileformat import LeirModule, Signature, parse_leir
from .leir.parser import LeirSyntaxError
from .leir.printer import format_program

# Tolerances: the one rule lives in steptp.runner.tolerance (it also runs on GPU nodes that
# have only numpy); re-exported here.
from .runner.tolerance import (TOLERANCES, _compare_float, _error_and_bound, _mismatch_detail, _rms,  # noqa: E402,F401
                               _to_numpy, compare, compare_trials, dtype_code, excess_ratio, poison_array,
                               poisoned_index)


def poisoned_elements(outputs: Mapping[str, np.ndarray], signature: Signature) -> str:
    """'' when no floating-point output holds the poison pattern of
    :data:`steptp.runner.tolerance.POISON_BITS`, else a sentence naming the first output
    and element that does: it was never written, or was computed from an element of an
    intermediate/output that was never written (outputs and intermediates start poisoned
    in verification runs). The check is :func:`steptp.runner.tolerance.poisoned_index`."""
    for t in signature.outputs:
        if t.name not in outputs:
            continue
        hit = poisoned_index(outputs[t.name], tvm_dtype(t.dtype))
        if hit is not None:
            idx, n = hit
            return (f"output {t.name} element {idx} ({n} in all) was never written or was computed "
                    f"from an element that was never written (poisoned-buffer run)")
    return ""


def poison_outputs(signature: Signature) -> dict[str, np.ndarray]:
    """Output arrays filled with the poison NaN of their dtype
    (:func:`steptp.runner.tolerance.poison_array`); outputs without one (integers, bool) are
    left out."""
    out = {}
    for t in signature.outputs:
        a = poison_array(t.shape, tvm_dtype(t.dtype))
        if a is not None:
            out[t.name] = a
    return out


#: Default resource limits of one verification (checked before anything is built).
MAX_VERIFY_BYTES = 2 << 30          # all buffers of one program (known tensors + intermediates)
MAX_VERIFY_WORK = 1 << 31           # equation instances executed per trial (sum over equations)
#: Equation instances per trial above which a GPU search (``stp search --runner pack``) does not
#: execute a program on this CPU: its candidates get :func:`static_check` here, and the GPU node
#: computes the original's references (its CPU build, on the node's cores) and verifies every
#: candidate at full size (issue 44: KernelBench-size programs run milliseconds on a GPU and
#: minutes in the CPU's poisoned verification form).
CPU_CHECK_WORK = 1 << 24
#: ... and the bytes of its buffers above which it is not executed here either (five trials of
#: inputs, references and outputs: an NLLLoss over a 760 x 333824 input reads 968 MiB).
CPU_CHECK_BYTES = 1 << 28


def too_large_to_run_here(module: LeirModule) -> str:
    """'' when ``module`` is small enough to execute on this CPU for a GPU search's checks
    (:func:`cpu_check_work` equation instances per trial, :data:`CPU_CHECK_BYTES` of buffers),
    else the reason (:func:`resource_problem`)."""
    return resource_problem(module, max_bytes=CPU_CHECK_BYTES, max_work=cpu_check_work())


def cpu_check_work() -> int:
    """:data:`CPU_CHECK_WORK`, or ``$STP_CPU_CHECK_WORK`` when set (a test makes a small program
    take the at-size path with it)."""
    import os

    try:
        return int(os.environ.get("STP_CPU_CHECK_WORK") or CPU_CHECK_WORK)
    except ValueError:
        return CPU_CHECK_WORK


def resource_problem(module: LeirModule, max_bytes: int | None = None, max_work: int | None = None) -> str:
    """'' when ``module`` fits the verification limits (default :data:`MAX_VERIFY_BYTES`,
    :data:`MAX_VERIFY_WORK`, read at call time), else the reason (buffer bytes or executed
    equation instances per trial above the limit). Semantic errors are left to the
    lowering."""
    max_bytes = MAX_VERIFY_BYTES if max_bytes is None else max_bytes
    max_work = MAX_VERIFY_WORK if max_work is None else max_work
    try:
        info = analyze(module.program, module.signature, check_bounds=False)
    except (LeirSemanticError, ValueError):
        return ""
    total = 0
    for name, shape in info.shapes.items():
        try:
            item = np_dtype(tvm_dtype(info.dtype(name))).itemsize
        except Exception:  # noqa: BLE001 - unsupported dtype: the lowering reports it
            item = 8
        total += math.prod(shape) * item
    if total > max_bytes:
        return f"the program's buffers need {total} bytes, above the verification limit of {max_bytes} bytes"
    work = sum(math.prod(l.extent for l in s.inst.loops) for s in info.equations)
    if work > max_work:
        return (f"the program executes {work} equation instances per trial, above the verification limit of "
                f"{max_work}")
    return ""


# ---------------------------------------------------------------------------
# Results
# ---------------------------------------------------------------------------


@dataclass
class VerifyResult:
    """Outcome of one verification (paper §4.2 metrics, progressive).

    * ``diff``: the canonical LEIR text differs from the original (always True for
      :func:`verify_against`, which has no LEIR baseline).
    * ``build``: lowered and built for the CPU (+ GPU preflight and TVM CUDA codegen when
      ``gpu_check``; + nvcc when requested and present).
    * ``exec``: the kernel ran on every trial. ``equal``: every output of every trial within
      :data:`TOLERANCES`.
    * ``reason``: '' when all four hold, else the first failure (stage and what failed).
    * ``max_abs_err`` / ``max_rel_err``: maxima over trials and outputs (see :func:`compare`);
      ``None`` when nothing was compared.
    * ``trials``: number of trials whose outputs were compared.
    * ``device``: where the checked program ran (``cpu``, or ``cuda`` with
      ``verify_pair(..., device="cuda")``); :meth:`to_dict` records it only when it is not
      ``cpu``, so CPU records stay as they were.
    * ``arbiter``: ``f64`` when the outputs missed the tolerance by a small factor against an
      external reference and the float64 arbiter (:func:`f64_arbiter`) called them Equal;
      '' otherwise (and then not recorded by :meth:`to_dict`).
    * ``arbiter_excess``: with ``arbiter == "f64"``, ``{"ours": r1, "reference": r2}``: the
      largest excess ratios (error / allowed bound) of our outputs and of the reference
      against the float64 truth (``r1 <= 1 < r2``); ``None`` otherwise (not recorded).
    * ``worker_failure``: Exec failed because the worker process was killed at its time
      limit, crashed or was unreachable (:class:`~steptp.backend.errors.WorkerFailure`): the
      program's fault or the machine's; :func:`confirm_failure` tells which.
    * ``infrastructure``: set by :func:`confirm_failure` when that failure did not reproduce
      in a fresh worker: the machine's fault, not the program's (never a negative, never
      scored). Both recorded by :meth:`to_dict` only when True.
    """

    diff: bool = False
    build: bool = False
    exec: bool = False
    equal: bool = False
    reason: str = ""
    max_abs_err: float | None = None
    max_rel_err: float | None = None
    trials: int = 0
    device: str = "cpu"
    arbiter: str = ""
    arbiter_excess: dict | None = None
    worker_failure: bool = False
    infrastructure: bool = False

    @property
    def ok(self) -> bool:
        return self.diff and self.build and self.exec and self.equal

    def to_dict(self) -> dict:
        """JSON-ready dict (non-finite errors become ``None``; see ``reason`` for why)."""
        d = asdict(self)
        if d["device"] == "cpu":
            del d["device"]
        if not d["arbiter"]:
            del d["arbiter"]
        if d["arbiter_excess"] is None:
            del d["arbiter_excess"]
        for k in ("worker_failure", "infrastructure"):
            if not d[k]:
                del d[k]
        for k in ("max_abs_err", "max_rel_err"):
            v = d[k]
            if v is not None and not math.isfinite(v):
                d[k] = None
        return d


# ---------------------------------------------------------------------------
# Execution strategy
# ---------------------------------------------------------------------------

def default_runner() -> IsolatedRunner:
    """The process-wide verification worker used by ``isolated=True``: the pool's
    ``"verify"`` worker (:func:`steptp.runner.pool.shared`, started lazily)."""
    from .runner.pool import shared

    return shared("verify")


def _with_poisoned_outputs(inputs: list[dict], sig: Signature) -> list[dict]:
    """Each trial's inputs plus the outputs filled with poison (:func:`poison_outputs`):
    what a verification run starts from."""
    poison = poison_outputs(sig)
    return [{**x, **poison} for x in inputs]


def _verdict(outs: list[Mapping], refs: list[Mapping], sig: Signature, slacks, labels) -> dict:
    """The verdict on a candidate's outputs per trial: ``{"reason": "exec: trial k: ..."}``
    when an output holds poison, else the comparison's fields (``equal``, ``reason``,
    ``trials``, ``max_abs_err``, ``max_rel_err``; :func:`_compare_all`). Computed in the
    verification worker (:func:`run_compared`) or in process (:func:`_check_candidate`)."""
    for k, out in enumerate(outs):
        bad = poisoned_elements(out, sig)
        if bad:
            return {"reason": f"exec: trial {k}: {bad}"}
    res = VerifyResult()
    _compare_all(res, refs, outs, sig, slacks, labels)
    return {"equal": res.equal, "reason": res.reason, "trials": res.trials,
            "max_abs_err": res.max_abs_err, "max_rel_err": res.max_rel_err}


def _execute(runner: IsolatedRunner | None, timeout_s: float, cpu_text: str, sig: Signature,
             inputs: list[dict], cuda_text: str | None) -> tuple[list[dict], str | None]:
    """Outputs per trial and the CUDA source of ``cuda_text`` (when given), computed by
    :func:`steptp.backend.build.run_lowered` here or in ``runner``."""
    inputs = _with_poisoned_outputs(inputs, sig)
    if runner is None:
        return run_lowered(cpu_text, sig, inputs, cuda_text, DEFAULT_GPU.arch)
    return runner.call(run_lowered, cpu_text, sig, inputs, cuda_text, DEFAULT_GPU.arch, timeout_s=timeout_s)


#: Worker side of :func:`_execute_compared`: the trial inputs (outputs poisoned) and references
#: of the last few originals, by their :attr:`References.token`, so that they cross the pipe
#: to a verification worker once, not with every candidate (a candidate's call then carries
#: its TVMScript text and gets back a verdict, not its outputs). Measured on 60 corpus
#: programs at ``-j 2``: the pipe's traffic was about a sixth of the run's time.
_WORKER_DATA: "OrderedDict[str, tuple[list, list]]" = OrderedDict()
_WORKER_DATA_SIZE = 4
#: tokens this process has handed to its workers (a worker that lost one, restarted, asks again)
_TOKENS_SENT: "OrderedDict[str, None]" = OrderedDict()
#: the reply of :func:`run_compared` when the worker does not hold the token's data
NEED_DATA = "need-data"


def run_compared(cpu_text: str, sig: Signature, token: str, data: tuple[list, list] | None,
                 slacks: list[Mapping] | None, labels: list[str] | None, cuda_text: str | None,
                 arch: str):
    """Worker side of a candidate's verification run: build ``cpu_text``, run it on the
    trial inputs held under ``token`` (``data`` = ``(inputs with poisoned outputs, refs)``
    stores them first; without it and not held: :data:`NEED_DATA`), then check poison and
    compare with the references exactly as :func:`_check_candidate` does in process.

    Returns ``(verdict, outputs, cuda_source)``: ``verdict`` is ``{"reason": ...}`` for a
    poisoned output, else the comparison's fields (``equal``, ``reason``, ``trials``,
    ``max_abs_err``, ``max_rel_err``); ``outputs`` (per trial) only when the candidate is
    not Equal (the float64 arbiter needs them). Raises :class:`BuildError` /
    :class:`ExecError` like :func:`steptp.backend.build.run_lowered`."""
    if data is not None:
        _WORKER_DATA[token] = data
        while len(_WORKER_DATA) > _WORKER_DATA_SIZE:
            _WORKER_DATA.popitem(last=False)
    else:
        data = _WORKER_DATA.get(token)
        if data is None:
            return NEED_DATA
        _WORKER_DATA.move_to_end(token)
    inputs, refs = data
    outs, cuda_src = run_lowered(cpu_text, sig, inputs, cuda_text, arch)
    verdict = _verdict(outs, refs, sig, slacks, labels)
    return verdict, (None if verdict.get("equal") else outs), cuda_src


def _execute_compared(runner: IsolatedRunner, timeout_s: float, cpu_text: str, sig: Signature, token: str,
                      inputs: list[dict], refs: list[Mapping], slacks, labels, cuda_text: str | None):
    """:func:`run_compared` in ``runner``, sending the trial data only when the worker may
    not hold it (first use of ``token`` here, or the worker restarted and asked)."""
    def call(with_data: bool):
        data = None
        if with_data:
            data = (_with_poisoned_outputs(inputs, sig), refs)
        return runner.call(run_compared, cpu_text, sig, token, data, slacks, labels, cuda_text, DEFAULT_GPU.arch,
                           timeout_s=timeout_s)

    reply = call(token not in _TOKENS_SENT)
    if reply == NEED_DATA:
        reply = call(True)
    _TOKENS_SENT[token] = None
    while len(_TOKENS_SENT) > 64:
        _TOKENS_SENT.popitem(last=False)
    return reply


def verify_device(device: str | None = None) -> str:
    """``device``, else ``cpu``; ``ValueError`` if unknown (not one of :data:`DEVICES`)."""
    d = device or "cpu"
    if d not in DEVICES:
        raise ValueError(f"unknown verification device {d!r}; expected one of {DEVICES}")
    return d


def _execute_cuda(runner: IsolatedRunner | None, timeout_s: float, module: LeirModule, inputs: list[dict],
                  limits: GpuLimits) -> tuple[list[dict], str]:
    """Outputs per trial of ``module``'s GPU form run on the GPU (outputs start poisoned)
    and its CUDA source: :func:`steptp.backend.perf.run_cuda_lowered`, always in a worker
    process (``runner``, else the process-wide :func:`default_runner`), which any CUDA error
    discards: a sticky error (illegal address...) costs this candidate only."""
    from .backend.perf import run_cuda_lowered

    inputs = _with_poisoned_outputs(inputs, module.signature)
    runner = runner or default_runner()
    return runner.call(run_cuda_lowered, module.text(), inputs, limits, timeout_s=timeout_s, discard_on_error=True)


_CPU_TEXTS: "OrderedDict[int, tuple[weakref.ref, str]]" = OrderedDict()


def cpu_verification_text(module: LeirModule) -> str:
    """``lower_module(module, None, "cpu", poison=True).text``, the CPU verification form,
    remembered for the last 512 module objects (by identity: a module is immutable), so a
    caller that lowered a candidate early (to build it in a batch,
    :func:`steptp.backend.build.prebuild_cpu`) does not pay for it twice. Raises what
    :func:`~steptp.backend.tvmscript.lower_module` raises."""
    hit = _CPU_TEXTS.get(id(module))
    if hit is not None and hit[0]() is module:
        return hit[1]
    text = lower_module(module, None, "cpu", poison=True).text
    _CPU_TEXTS[id(module)] = (weakref.ref(module), text)
    while len(_CPU_TEXTS) > 512:
        _CPU_TEXTS.popitem(last=False)
    return text


def _prepare(module: LeirModule, gpu_check: bool, nvcc: bool,
             limits: GpuLimits) -> tuple[str, str | None, str | None]:
    """Lower for CPU (verification form) and, with ``gpu_check``, run the GPU preflight and
    lower the GPU form; raises Lowering/Preflight/BuildError.

    Returns ``(cpu_text, cuda_text, cuda_source)``. With nvcc (``nvcc`` and on the PATH) the
    CUDA source is generated and compiled here, before anything runs (the Build pass comes
    before Exec); otherwise ``cuda_source`` is None and the runner generates it from the
    same parse as the CPU build (:func:`steptp.backend.build.run_lowered`)."""
    cpu_text = cpu_verification_text(module)
    if not gpu_check:
        return cpu_text, None, None
    preflight(module, None, limits)
    cuda_text = lower_module(module, None, "cuda").text
    if not (nvcc and nvcc_path() is not None):
        return cpu_text, cuda_text, None
    cuda_src = compile_cuda_text(cuda_text, limits.arch)
    r = nvcc_check([cuda_src], limits)[0]
    if r.ok is False:
        raise BuildError(f"{r.status}: {r.reason}")
    return cpu_text, cuda_text, cuda_src


def _diff_and_tensors(res: VerifyResult, original: LeirModule, transformed: LeirModule, require_diff: bool) -> bool:
    """The first two checks of a verification: Diff (``res.diff``; an unchanged program fails
    when ``require_diff``) and the same known tensors; False with ``res.reason`` set when one
    fails."""
    res.diff = format_program(original.program) != format_program(transformed.program)
    if not res.diff and require_diff:
        res.reason = "diff: the transformed program is identical to the original"
        return False
    mismatch = _signature_mismatch(original.signature, transformed.signature)
    if mismatch:
        res.reason = f"build: {mismatch}"
        return False
    return True


def static_check(original: LeirModule, transformed: LeirModule, limits: GpuLimits | None = None) -> VerifyResult:
    """The checks of :func:`verify_pair` that execute nothing: Diff, the same known tensors,
    the CPU lowering, the GPU preflight and TVM's CUDA code generation (``build``). ``exec``
    and ``equal`` stay False: a program too large to run on this CPU (multi-GFLOP, above
    :data:`MAX_VERIFY_WORK`) is verified where it runs, on the GPU node at full size against
    the original's CPU build there (:mod:`steptp.gpu.node`); this is what can be said of it
    here. ``limits``: the GPU's (default ``sm_90``). Never raises for a bad program (the
    reason names the stage)."""
    res = VerifyResult()
    if not _diff_and_tensors(res, original, transformed, True):
        return res
    try:
        _prepare(transformed, True, False, limits or DEFAULT_GPU)
    except BackendError as e:
        res.reason = f"{_stage_word(e)}: {e}"
        return res
    except (LeirSemanticError, ValueError) as e:
        res.reason = f"lowering: {e}"
        return res
    res.build = True
    return res


def static_check_texts(original_text: str, transformed_text: str, mem_bytes: int = 4 << 30) -> tuple[bool, str]:
    """:func:`static_check` of two ``.leir`` texts in a worker process whose address space is
    capped at ``mem_bytes`` (the GPU preflight's proofs grow with the loops of a program at
    KernelBench size): ``(build, reason)``; over the cap ``(False, "... memory ...")``."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    cap = mem_bytes if hard == resource.RLIM_INFINITY else min(mem_bytes, hard)
    if soft == resource.RLIM_INFINITY or soft > cap:
        resource.setrlimit(resource.RLIMIT_AS, (cap, hard))
    try:
        res = static_check(parse_leir(original_text), parse_leir(transformed_text))
    except MemoryError:
        return False, f"static check: over the {mem_bytes >> 30} GiB memory limit of the check"
    return bool(res.build), res.reason


_REF_CACHE: "OrderedDict[tuple, References]" = OrderedDict()
_REF_CACHE_SIZE = 4  # originals; the dataset verifies many candidates of one original in a row


def _stage_word(e: BackendError) -> str:
    return {"lower": "lowering", "preflight": "GPU preflight", "build": "build", "exec": "exec"}.get(e.stage, e.stage)


def _compare_all(res: VerifyResult, refs: list[Mapping], outs: list[Mapping], sig: Signature,
                 slacks: list[Mapping] | None = None, labels: list[str] | None = None) -> None:
    first_bad, res.max_abs_err, res.max_rel_err = compare_trials(refs, outs, [(t.name, t.dtype) for t in sig.outputs],
                                                                 slacks, labels)
    res.trials = min(len(refs), len(outs))
    res.equal = not first_bad
    res.reason = f"equal: {first_bad}" if first_bad else ""


def _signature_mismatch(a: Signature, b: Signature) -> str:
    def key(s: Signature):
        return {t.name: (t.is_output, t.dtype, tuple(t.shape)) for t in s.tensors}

    ka, kb = key(a), key(b)
    if ka == kb:
        return ""
    missing = sorted(set(ka) - set(kb))
    extra = sorted(set(kb) - set(ka))
    changed = sorted(n for n in set(ka) & set(kb) if ka[n] != kb[n])
    parts = []
    if missing:
        parts.append(f"missing {missing}")
    if extra:
        parts.append(f"extra {extra}")
    if changed:
        parts.append("changed " + ", ".join(f"{n}: {ka[n]} -> {kb[n]}" for n in changed))
    return "known tensors differ: " + "; ".join(parts)


def _runner_for(isolated: bool, runner: IsolatedRunner | None) -> IsolatedRunner | None:
    if runner is not None:
        return runner
    return default_runner() if isolated else None


def confirm_failure(res: VerifyResult, again: Callable[[], VerifyResult],
                    runner: IsolatedRunner | None = None) -> VerifyResult:
    """Tell the program's failure from the machine's (issue 34).

    ``res`` is a verification result; ``again()`` runs the same verification once more.
    When ``res`` failed because its worker was killed at the time limit, crashed or was
    unreachable (``res.worker_failure``), ``runner`` (the worker it ran in) is discarded so
    that ``again()`` runs in a fresh worker. If the failure reproduces, the second result is
    returned: the program's own failure (a hanging or crashing completion is never let off).
    If it does not, ``res`` is returned with ``infrastructure = True``: machine load or a
    flaky worker, which callers must neither score (:mod:`steptp.rewards` returns None) nor
    record as a negative (``stp dataset --negatives``). Any other ``res`` is returned as is."""
    if not res.worker_failure:
        return res
    if runner is not None:
        runner.discard()
    second = again()
    if second.worker_failure:
        return second
    res.infrastructure = True
    return res


def verify_pair(original: LeirModule, transformed: LeirModule, trials: int = 3, seed: int = 0,
                timeout_s: float = 60.0, *, isolated: bool = False, runner: IsolatedRunner | None = None,
                gpu_check: bool = True, nvcc: bool = False, require_diff: bool = True,
                input_fn: Callable[[int, int], Mapping[str, np.ndarray]] | None = None,
                limits: GpuLimits | None = None, artifacts: dict | None = None,
                device: str | None = None, ordered: bool = True, rounding: bool = True,
                edge: bool = True) -> VerifyResult:
    """Verify that ``transformed`` computes what ``original`` computes (one strategy step).

    Equal means (design.md §8): for every input on which the original's outputs are finite,
    the transformed program's outputs are finite and within the dtype's tolerance; where the
    original gives inf/NaN, the transformed program gives the same.

    * Diff: canonical program texts differ; with ``require_diff`` (default) an unchanged
      program stops here (diff False, nothing built).
    * The two modules must declare the same known tensors (names, output-ness, dtypes,
      shapes; header order may differ), else build False with the difference as reason.
    * Build: CPU lowering + LLVM build; with ``gpu_check`` (default) also the GPU preflight
      and TVM CUDA code generation; with ``nvcc`` also ``nvcc --ptx`` (skipped if absent).
    * Exec/Equal: ``trials`` seeded trials (inputs from ``input_fn(seed, trial)`` or
      :func:`random_inputs` over the original program), then, with ``ordered`` (default)
      and no ``input_fn``, the two :func:`ordered_inputs` trials (increasing, decreasing
      along every axis: every reduction element matters), then, with ``edge`` (default) and
      no ``input_fn``, the edge-case trials (:data:`~steptp.runner.inputs.EDGE_TRIALS`:
      exact zeros, scattered exact zeros, all negative, large magnitudes; a candidate with
      inf/NaN where the original is finite fails there); the original's outputs are the
      reference (cached per original text, seed and trials when ``input_fn`` is None).
      With ``rounding`` (default) each floating point output below f64 may also differ by
      the original's own rounding error on it (:func:`rounding_slack`: the original run in
      f64 on the same inputs).
    * ``isolated`` / ``runner``: run build+execution in a worker process with time limit
      ``timeout_s`` seconds (ignored in process). A crash or time-out is an Exec failure.

    * ``artifacts``: a dict that receives the transformed program's ``tir_cuda`` (GPU
      TVMScript) and ``cuda`` (CUDA C source) when they were produced (``gpu_check``), so a
      caller need not lower and generate them again. Without nvcc the CUDA source is
      generated where the CPU build runs (the runner, when isolated), from the same parse;
      a caller batching ``nvcc`` over many candidates passes ``nvcc=False`` and compiles
      the ``tir_cuda`` texts with :func:`steptp.backend.build.nvcc_check` in that same
      process (its parse memo then holds them).

    * ``device``: where ``transformed`` runs: ``cpu`` (the verification form, LLVM) or
      ``cuda`` (its GPU form exported, loaded with the TVM runtime and run on the GPU,
      outputs poisoned; :func:`steptp.backend.perf.run_cuda_lowered`); default ``cpu``.
      The reference is the original's CPU run either way; ``res.device`` records the device. Callers check
      :func:`steptp.backend.cuda_runtime.cuda_available` first (a missing GPU is an Exec
      failure here).

    If the original itself fails, every flag after Diff is False and ``reason`` starts with
    ``original program failed``. Never raises for a bad candidate; raises ``ValueError``
    for misuse (wrong reference shapes from ``input_fn`` etc.). Source: paper §3.4, §4.2.
    """
    res = VerifyResult(device=verify_device(device))
    if limits is None:  # the device's own architecture on cuda (compute capability), else sm_90
        from .runner.device import device_limits

        limits = device_limits(res.device) if res.device == "cuda" else DEFAULT_GPU
    if not _diff_and_tensors(res, original, transformed, require_diff):
        return res
    too_big = resource_problem(original)
    if too_big:
        res.reason = f"original program failed (limits): {too_big}"
        return res
    too_big = resource_problem(transformed)
    if too_big:
        res.reason = f"build: {too_big}"
        return res
    run = _runner_for(isolated, runner)

    ref = reference_data(original, trials, seed, ordered=ordered, rounding=rounding, input_fn=input_fn, runner=run,
                         timeout_s=timeout_s, edge=edge)
    if isinstance(ref, str):
        res.reason = ref
        return res

    return _check_candidate(res, transformed, ref.inputs, ref.refs, run, timeout_s, gpu_check, nvcc, limits, artifacts,
                            res.device, ref.slacks, labels=ref.labels, token=ref.token)


class References(NamedTuple):
    """What a candidate of an original is compared with (:func:`reference_data`).

    * ``inputs``: one ``{name: array}`` per trial (random, then ordered, then edge-case);
    * ``refs``: the original's outputs on them (CPU verification form, outputs poisoned);
    * ``slacks``: per trial ``{output: allowance}`` (:func:`rounding_slack`) or None;
    * ``edge``: ``[(kind, scale)]`` of the edge-case trials at the end of ``inputs``
      (:data:`~steptp.runner.inputs.EDGE_TRIALS`; the ``large`` trial's scale is the one
      chosen for this original), so a GPU node regenerates the same inputs;
    * ``labels``: a name per trial (``random``, ``ordered``, ``zeros``...) for messages;
    * ``token``: names this data in a verification worker (:func:`run_compared`), so it
      crosses the pipe once; '' sends it with every call."""

    inputs: list
    refs: list
    slacks: list | None
    edge: list
    labels: list
    token: str = ""


def _finite_outputs(out: Mapping, sig: Signature) -> bool:
    """True when every floating point output in ``out`` is finite everywhere."""
    for t in sig.outputs:
        if t.name in out and t.dtype in ("f16", "bf16", "f32", "f64"):
            with np.errstate(invalid="ignore"):
                if not np.isfinite(np.asarray(out[t.name], dtype=np.float64)).all():
                    return False
    return True


def reference_data(original: LeirModule, trials: int = 3, seed: int = 0, *, ordered: bool = True,
                   rounding: bool = True, input_fn: Callable[[int, int], Mapping[str, np.ndarray]] | None = None,
                   runner: IsolatedRunner | None = None, timeout_s: float = 60.0, edge: bool = True):
    """What a candidate of ``original`` is compared with: a :class:`References`
    ``(inputs, refs, slacks, edge, labels)``, one item per trial: ``trials`` seeded random
    input sets, then with ``ordered`` and no ``input_fn`` the :data:`ORDERED_TRIALS` sets,
    then with ``edge`` and no ``input_fn`` one set per edge-case kind
    (:data:`~steptp.runner.inputs.EDGE_TRIALS`: exact zeros, scattered exact zeros, all
    negative, large magnitudes; design.md §8). The ``large`` trial uses the first scale of
    :data:`~steptp.runner.inputs.LARGE_SCALES` at which the original's outputs are all finite
    (else the last: a candidate must then reproduce the original's inf/NaN). ``refs`` are
    the original's CPU outputs (verification form, outputs poisoned) and, with ``rounding``,
    ``slacks`` the allowance per floating point output (:func:`rounding_slack`; None when
    nothing to promote). Cached per (original text, seed, trials, ordered, rounding, edge)
    when ``input_fn`` is None. Returns a reason string starting ``original program failed``
    instead when the original does not build, run or write every output. Used by
    :func:`verify_pair` and by ``stp gpu pack`` (which stores digests, slacks and the edge
    plan so a GPU node compares with the same rule)."""
    sig = original.signature
    edge = bool(edge and input_fn is None)
    key = (original.text(), int(seed), int(trials), bool(ordered), bool(rounding), edge) if input_fn is None else None
    cached = _REF_CACHE.get(key) if key is not None else None
    if cached is not None:
        _REF_CACHE.move_to_end(key)
        return cached
    progs = [original.program]
    if input_fn is None:
        inputs = [random_inputs(sig, seed, k, progs) for k in range(trials)]
        labels = ["random"] * trials
        if ordered:
            inputs += [ordered_inputs(sig, seed, d, progs) for d in ORDERED_TRIALS]
            labels += ["ordered increasing" if d > 0 else "ordered decreasing" for d in ORDERED_TRIALS]
    else:
        inputs = [dict(input_fn(seed, k)) for k in range(trials)]
        labels = ["given"] * trials
    plan: list = []
    larges: list = []
    if edge:
        plan = [(k, 1.0) for k in EDGE_TRIALS if k != "large"]
        inputs += [edge_inputs(sig, seed, k, s, progs) for k, s in plan]
        labels += [k.replace("_", " ") for k, _ in plan]
        larges = [edge_inputs(sig, seed, "large", s, progs) for s in LARGE_SCALES]
    try:
        text, _, _ = _prepare(original, False, False, DEFAULT_GPU)
        refs, _ = _execute(runner, timeout_s, text, sig, inputs + larges, None)
    except BackendError as e:
        return f"original program failed ({_stage_word(e)}): {e.reason}"
    if larges:
        tried, refs = refs[len(inputs):], refs[: len(inputs)]
        pick = next((i for i, r in enumerate(tried) if _finite_outputs(r, sig)), len(tried) - 1)
        inputs.append(larges[pick])
        refs.append(tried[pick])
        plan.append(("large", LARGE_SCALES[pick]))
        labels.append(f"large x{LARGE_SCALES[pick]:g}")
    for k, ref in enumerate(refs):
        bad = poisoned_elements(ref, sig)
        if bad:
            return f"original program failed (exec): trial {k}: {bad}"
    slacks = _rounding_slacks(original, inputs, refs, runner, timeout_s) if rounding else None
    if slacks and larges:
        slacks = _pooled_slacks(slacks, len(slacks) - 1)
    out = References(inputs, refs, slacks, plan, labels, uuid.uuid4().hex)
    if key is not None:
        _REF_CACHE[key] = out
        while len(_REF_CACHE) > _REF_CACHE_SIZE:
            _REF_CACHE.popitem(last=False)
    return out


def promoted(module: LeirModule) -> LeirModule | None:
    """``module`` with every f16/bf16/f32 tensor (header and program) in f64, or None when
    it has none: the same program in higher precision, for :func:`rounding_slack`."""
    text = module.text()
    new = re.sub(r"\^\{(?:f16|bf16|f32),", "^{f64,", text)
    new = re.sub(r"^(%\s*(?:input|param|constant|output)\s+\w+\s*:\s*)(?:f16|bf16|f32)\[", r"\1f64[", new,
                 flags=re.M)
    return None if new == text else parse_leir(new)


def rounding_slack(ref, ref64) -> float:
    """The allowance a transformed output gets on top of :data:`TOLERANCES`: twice the
    original program's own rounding error on that output, ``2 * max|ref - ref64|`` over the
    elements finite in both, where ``ref64`` is the original computed in f64 on the same
    inputs (:func:`promoted`). The same rule for every strategy: a step may round
    differently from the original, as much as the original rounds, but no more. Zero for
    well-conditioned outputs (the original's error is then far below the tolerance); it
    matters where a computation amplifies rounding (normalisations of nearly constant rows,
    reorderings of cancelling sums)."""
    r = _to_numpy(ref).astype(np.float64)
    h = _to_numpy(ref64).astype(np.float64)
    if r.shape != h.shape or r.size == 0:
        return 0.0
    with np.errstate(invalid="ignore", over="ignore"):
        ok = np.isfinite(r) & np.isfinite(h)
        return 2.0 * float(np.abs(r - h)[ok].max()) if ok.any() else 0.0


def _pooled_slacks(slacks: list[Mapping], large: int) -> list[dict]:
    """Per output, the largest allowance of the trials at the random trials' magnitudes
    (every trial but the large-magnitude one, index ``large``) for each of them: how much the
    original rounds is a property of its computation at that scale, not of one draw (a
    reordered cancelling sum rounds up to ~1.4 times the original's error on some draws of
    nine). The large trial keeps its own (its errors scale with its inputs)."""
    names = {n for i, s in enumerate(slacks) if i != large and s for n in s}
    pooled = {n: max(float((s or {}).get(n, 0.0)) for i, s in enumerate(slacks) if i != large) for n in names}
    return [dict(s or {}) if i == large else dict(pooled) for i, s in enumerate(slacks)]


def _rounding_slacks(original: LeirModule, inputs: list[dict], refs: list[Mapping], run, timeout_s: float):
    """Per trial, per floating point output below f64: :func:`rounding_slack`; None when the
    program has nothing to promote or its f64 form fails (then no allowance)."""
    high = promoted(original)
    if high is None:
        return None
    floats = {t.name for t in original.signature.outputs if t.dtype in ("f16", "bf16", "f32")}
    try:
        text, _, _ = _prepare(high, False, False, DEFAULT_GPU)
        wide = [{k: np.asarray(v, dtype=np.float64) if np.asarray(v).dtype.kind == "f" else v for k, v in x.items()}
                for x in inputs]
        refs64, _ = _execute(run, timeout_s, text, high.signature, wide, None)
    except (BackendError, LeirSemanticError, LeirSyntaxError):
        return None
    return [{n: rounding_slack(ref[n], r64[n]) for n in floats if n in ref and n in r64}
            for ref, r64 in zip(refs, refs64)]


def _check_candidate(res: VerifyResult, module: LeirModule, inputs: list[dict], refs: list[Mapping],
                     run: IsolatedRunner | None, timeout_s: float, gpu_check: bool, nvcc: bool,
                     limits: GpuLimits, artifacts: dict | None = None, device: str = "cpu",
                     slacks: list[Mapping] | None = None,
                     truth_fn: Callable[[], list[Mapping]] | None = None,
                     labels: list[str] | None = None, token: str = "") -> VerifyResult:
    too_big = resource_problem(module)
    verdict = None
    if too_big:
        res.reason = f"build: {too_big}"
        return res
    try:
        if device == "cuda":
            # no nvcc check here: the worker compiles the PTX it runs (once; a failure is Build)
            _, cuda_text, cuda_src = _prepare(module, True, False, limits)
            outs, generated = _execute_cuda(run, timeout_s, module, inputs, limits)
        else:
            cpu_text, cuda_text, cuda_src = _prepare(module, gpu_check, nvcc, limits)
            if run is not None and token:
                verdict, outs, generated = _execute_compared(run, timeout_s, cpu_text, module.signature, token,
                                                             inputs, refs, slacks, labels,
                                                             cuda_text if cuda_src is None else None)
            else:
                outs, generated = _execute(run, timeout_s, cpu_text, module.signature, inputs,
                                           cuda_text if cuda_src is None else None)
        if artifacts is not None and cuda_text is not None:
            artifacts["tir_cuda"], artifacts["cuda"] = cuda_text, cuda_src or generated
    except (LoweringError, BuildError) as e:
        res.reason = f"build: {_stage_word(e)}: {e.reason}" if e.stage != "build" else f"build: {e.reason}"
        return res
    except ExecError as e:
        res.build = True
        res.reason = f"exec: {e.reason}"
        res.worker_failure = isinstance(e, WorkerFailure)
        return res
    res.build = True
    if verdict is None:  # not compared in the worker (run_compared)
        verdict = _verdict(outs, refs, module.signature, slacks, labels)
    if "equal" not in verdict:
        res.reason = verdict["reason"]
        return res
    res.exec = True
    for k, v in verdict.items():
        setattr(res, k, v)
    if not res.equal and truth_fn is not None and not slacks:
        try:
            truths = truth_fn()
        except Exception:  # noqa: BLE001  (a reference that cannot run in float64: no arbiter)
            truths = None
        if truths is not None:
            verdict = f64_arbiter(module, refs, outs, truths)
            if verdict.equal:
                res.equal, res.arbiter, res.reason = True, "f64", ""
                res.arbiter_excess = {"ours": verdict.ours, "reference": verdict.reference}
    return res


#: A failing comparison goes to the float64 arbiter only when no element misses its bound by
#: more than this factor (a near miss, not a wrong program).
ARBITER_FACTOR = 4.0


@dataclass(frozen=True)
class ArbiterResult:
    """The float64 arbiter's decision (:func:`f64_arbiter`).

    * ``equal``: ours is within the tolerance rule's bound of the float64 truth at every
      element of every trial and output, and the reference is not (it fails somewhere).
    * ``ours``: the largest :func:`excess_ratio` of our outputs against the truth (``<= 1``
      when every element passes; ``inf`` for a non-finite mismatch).
    * ``reference``: the same for the reference against the truth.
    * ``reason``: why it is not Equal ('' when it is).

    Truthy exactly when ``equal``, so ``if f64_arbiter(...)`` reads as before."""

    equal: bool
    ours: float = math.inf
    reference: float = math.inf
    reason: str = ""

    def __bool__(self) -> bool:
        return self.equal


def f64_arbiter(module: LeirModule, refs: list[Mapping], outs: list[Mapping], truths: list[Mapping]) -> ArbiterResult:
    """The float64 arbiter of a near miss against an external reference (PyTorch in f32).

    Inputs, per trial (same order): ``refs`` (the reference's outputs), ``outs`` (``module``'s
    outputs), ``truths`` (the same reference computed in float64 on the same inputs), each a
    mapping output name -> array of the declared shape.

    Equal (the returned :class:`ArbiterResult` is truthy) only when

    1. no element of ours misses the tolerance against the reference by more than
       :data:`ARBITER_FACTOR` (a near miss, not a wrong program);
    2. **at every element** of every floating point output of every trial, ours is within the
       tolerance rule's bound of the truth (:func:`excess_ratio` ``<= 1``, the same rule and
       bound as :func:`compare`, the bound computed from the truth, never widened); and
    3. the reference itself fails that test somewhere (it is the less accurate side).

    A per-output maximum would not do: a reference off at one large element would let
    through an output of ours that is wrong at another element where the reference is exact.
    Integer and bool outputs, a missing truth or a shape mismatch: not Equal. The truth is
    independent of the program checked. Source: issue 25 (KernelBench
    level2/30_Gemm_GroupNorm_Hardtanh: 8 elements at 1.5e-5 against 1e-5, ours exact, the LEIR
    accumulating the GroupNorm statistics in f64); per element since issue 34."""
    sig = module.signature
    ours_worst, ref_worst = 0.0, 0.0
    for trial, (ref, out, truth) in enumerate(zip(refs, outs, truths)):
        for t in sig.outputs:
            if excess_ratio(ref[t.name], out[t.name], t.dtype) > ARBITER_FACTOR:
                return ArbiterResult(False, reason=f"output {t.name} misses the reference by more than "
                                                   f"{ARBITER_FACTOR:g}x its bound (trial {trial})")
            if t.dtype not in ("f16", "bf16", "f32", "f64") or t.name not in truth:
                return ArbiterResult(False, reason=f"output {t.name}: no float64 truth to arbitrate with")
            h = _to_numpy(truth[t.name])
            if h.shape != _to_numpy(out[t.name]).shape:
                return ArbiterResult(False, reason=f"output {t.name}: the truth has another shape")
            ours_worst = max(ours_worst, excess_ratio(h, out[t.name], t.dtype))
            ref_worst = max(ref_worst, excess_ratio(h, ref[t.name], t.dtype))
    if ours_worst > 1.0:
        return ArbiterResult(False, ours_worst, ref_worst,
                             f"ours is outside the tolerance of the float64 truth ({ours_worst:.3g}x its bound)")
    if ref_worst <= 1.0:
        return ArbiterResult(False, ours_worst, ref_worst,
                             "the reference is within the tolerance of the float64 truth: it is not the inaccurate side")
    return ArbiterResult(True, ours_worst, ref_worst)


def verify_against(module: LeirModule, reference_fn: Callable[[dict[str, np.ndarray]], Mapping[str, np.ndarray]],
                   input_fn: Callable[[int, int], Mapping[str, np.ndarray]] | None = None, trials: int = 3,
                   seed: int = 0, timeout_s: float = 60.0, *, isolated: bool = False,
                   runner: IsolatedRunner | None = None, gpu_check: bool = True, nvcc: bool = False,
                   limits: GpuLimits = DEFAULT_GPU,
                   reference64_fn: Callable[[dict[str, np.ndarray]], Mapping[str, np.ndarray]] | None = None
                   ) -> VerifyResult:
    """Verify a LEIR program against a reference implementation (e.g. its PyTorch model).

    * ``reference_fn(inputs) -> {output name: array}``: called in this process with a copy
      of each trial's inputs (every non-output tensor by name: inputs, params and
      constants alike, numpy arrays of the declared dtype/shape); it returns every output
      of the signature (numpy arrays or CPU torch tensors; compared in float64 with the
      LEIR output dtype's tolerance).
    * ``input_fn(seed, trial) -> {name: array}``: custom inputs; default
      :func:`random_inputs` (``programs=[module.program]``).
    * Build/Exec/isolation as in :func:`verify_pair`; ``diff`` is always True.
    * ``reference64_fn``: the same reference computed in float64 (PyTorch with the model and
      the float inputs in double). With it, a near miss (every element within
      :data:`ARBITER_FACTOR` times its bound) goes to :func:`f64_arbiter`, and ``res.arbiter``
      records ``f64`` when it calls the program Equal: the f32 reference may be the less
      accurate side. (``verify_pair`` needs none: there the original's own rounding error is
      already allowed, :func:`rounding_slack`.)

    Exceptions raised by ``reference_fn`` or ``input_fn`` propagate (they are caller bugs);
    a reference lacking an output raises ``ValueError``. Source: paper §3.4.
    """
    res = VerifyResult(diff=True)
    sig = module.signature
    too_big = resource_problem(module)
    if too_big:
        res.reason = f"build: {too_big}"
        return res
    run = _runner_for(isolated, runner)
    if input_fn is None:
        inputs = [random_inputs(sig, seed, k, [module.program]) for k in range(trials)]
    else:
        inputs = [dict(input_fn(seed, k)) for k in range(trials)]
    refs = []
    for x in inputs:
        r = reference_fn({k: np.array(v, copy=True) for k, v in x.items()})
        refs.append({k: _to_numpy(v) for k, v in dict(r).items()})
    def truths() -> list[dict]:
        return [{k: _to_numpy(v) for k, v in dict(reference64_fn({k: np.array(v, copy=True)
                                                                   for k, v in x.items()})).items()}
                for x in inputs]

    return _check_candidate(res, module, inputs, refs, run, timeout_s, gpu_check, nvcc, limits,
                            truth_fn=truths if reference64_fn is not None else None)


def clear_reference_cache() -> None:
    """Forget cached original outputs (see :func:`verify_pair`)."""
    _REF_CACHE.clear()


__all__ = ["static_check", "static_check_texts", "CPU_CHECK_WORK", "CPU_CHECK_BYTES", "cpu_check_work",
           "too_large_to_run_here", "poisoned_elements", "poison_outputs", "resource_problem", "MAX_VERIFY_BYTES", "MAX_VERIFY_WORK",
           "TOLERANCES", "dtype_code", "compare", "index_bounds", "random_inputs", "VerifyResult", "verify_pair",
           "verify_against", "default_runner", "clear_reference_cache", "verify_device", "ordered_inputs",
           "ORDERED_TRIALS", "EDGE_TRIALS", "References", "edge_inputs", "promoted", "rounding_slack", "reference_data", "tensor_specs", "f64_arbiter",
           "ARBITER_FACTOR", "ArbiterResult", "confirm_failure"]
