"""PyTorch eager (and ``torch.compile``) beside a pack's programs, on the GPU node.

Imported only inside a worker, and only where ``torch`` imports: the rest of the runner
never imports torch. The program's KernelBench-style file (``Model``, ``get_inputs``,
``get_init_inputs``) carried by the pack is loaded, the model built (``torch.manual_seed(0)``
first) and called on the SAME inputs as our functions: trial 0's input tensors, matched to
the tensor arguments of ``get_inputs()`` in order (the LEIR ``input`` tensors in header order,
which the frontend names after ``forward``'s arguments; shapes must agree). Floating point
parameters of the model take the inputs' dtype when it differs.

**The program's own parameters** (issue 52, level yardsticks): our functions get their
``param`` tensors from trial 0's seeded arrays, not from the model's initialisation, so
before anything is timed the model's parameters and buffers are overwritten with those
arrays (:func:`load_program_params`), by the map from LEIR name to the module's
``state_dict`` key that the pack carries (``programs[k]["torch"]["params"]``, from
:attr:`steptp.frontend.translate.Translation.param_targets`; the translator declares a
parameter with its own shape, no transpose or reshape, so each array is copied as it is).
Then eager runs once and its outputs are compared with our original function's outputs on
the same inputs (trial 0's CPU references) by the one tolerance rule
(:func:`steptp.runner.tolerance.compare_trials`, with the original's rounding allowance):
``eager_check`` is ``"equal"`` or ``"mismatch: <detail>"``. The model runs in the mode it
is built in (training, as the translator reads it by default); when that mismatches, eval
mode is tried once (a program translated with ``--eval``): ``eager_mode`` says which
matched. A mismatch makes eager **not comparable**: it is not timed and no ratio against it
is reported (the reason is recorded instead).

Timing is interleaved with the original's measurement (A eager [compiled] A eager ...): on
CUDA each eager measurement is bracketed by CUDA events after a flush of the L2 cache (a
device buffer of :func:`steptp.runner.cuda_timing.l2_flush_bytes` bytes zeroed, not timed),
as TVM's ``time_evaluator`` flushes before ours; on the simulated device eager runs on the
CPU with one intra-op thread, timed with ``perf_counter``. ``torch.compile`` is warmed up
(compiled) outside the timing.
"""

from __future__ import annotations

import importlib.util
import statistics
import sys
from pathlib import Path
from typing import Callable

import numpy as np

_TORCH_DTYPES = {"f16": "float16", "bf16": "bfloat16", "f32": "float32", "f64": "float64"}


def pin_tf32(torch) -> dict:
    """Turn TF32 off for cuBLAS matmuls and cuDNN convolutions (``torch.backends.cuda.matmul.
    allow_tf32``, ``torch.backends.cudnn.allow_tf32``): our f32 kernels compute in IEEE f32, so
    the yardsticks do too (PyTorch's default lets cuDNN convolutions run in TF32). cuBLAS's
    reduced-precision f16 reductions (``allow_fp16_reduced_precision_reduction``) are turned off
    too: our f16 GEMMs accumulate in f32, and eager's output is checked against ours before any
    timing. Returns the settings as recorded in each summary:
    ``{"matmul": False, "cudnn": False, "fp16_reduced_reduction": False}``."""
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction = False
    return {"matmul": bool(torch.backends.cuda.matmul.allow_tf32), "cudnn": bool(torch.backends.cudnn.allow_tf32),
            "fp16_reduced_reduction": bool(torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction)}


def _load_model(path: Path, device: str):
    import torch  # noqa: PLC0415

    name = f"_stp_eager_{abs(hash(str(path)))}"
    spec = importlib.util.spec_from_file_location(name, str(path))
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    torch.manual_seed(0)
    init = mod.get_init_inputs() if hasattr(mod, "get_init_inputs") else []
    model = mod.Model(*init)
    return model, list(mod.get_inputs())


def _arguments(example: list, prog: dict, inputs: dict, device: str):
    """``forward`` arguments: our trial-0 arrays in place of the tensor arguments."""
    import torch  # noqa: PLC0415

    names = [s[0] for s, role in zip(prog["specs"], prog.get("roles") or []) if role == "input"]
    shapes = {s[0]: tuple(s[1]) for s in prog["specs"]}
    tensors = [x for x in example if isinstance(x, torch.Tensor)]
    if len(tensors) != len(names):
        raise ValueError(f"get_inputs() gives {len(tensors)} tensors, the program has {len(names)} inputs")
    it = iter(names)
    args = []
    for x in example:
        if not isinstance(x, torch.Tensor):
            args.append(x)
            continue
        n = next(it)
        if tuple(x.shape) != shapes[n]:
            raise ValueError(f"input {n}: get_inputs() shape {list(x.shape)}, program {list(shapes[n])}")
        args.append(_tensor(torch, inputs[n]).to(device))
    return args


def _tensor(torch, a: np.ndarray):
    """A CPU torch tensor holding a copy of ``a`` (bfloat16 through its bits)."""
    a = np.ascontiguousarray(a)
    if a.dtype.name == "bfloat16":
        return torch.from_numpy(a.view(np.uint16).copy()).view(torch.bfloat16)
    return torch.from_numpy(a.copy())


def load_program_params(model, prog: dict, inputs: dict) -> int:
    """Overwrite ``model``'s parameters and buffers with the program's own values: for every
    LEIR ``param``/``constant`` tensor of ``prog`` (the pack manifest's program entry: specs,
    roles, ``torch.params`` = ``{LEIR name: state_dict key}``) the array ``inputs[name]``
    (trial 0's, by LEIR name; the dtype of the program's declaration) is copied into the
    module tensor of that key (``named_parameters``/``named_buffers``, non-persistent buffers
    included), on its device and in its dtype. Returns how many tensors were set (0 for a
    program without parameters).

    Raises ``ValueError`` (nothing is half-set only when the first tensor fails) when the pack
    carries no map (``torch.params_error`` gives why), when the map misses one of the
    program's parameters, when a key names no tensor of the module (a tensor constant made
    inside ``forward``: it cannot be set from outside) or when a shape differs (the
    translator declares parameters with their own shapes, so none should)."""
    import torch  # noqa: PLC0415

    roles = prog.get("roles") or []
    names = [sp[0] for sp, role in zip(prog["specs"], roles) if role in ("param", "constant")]
    if not names:
        return 0
    meta = prog.get("torch") or {}
    targets = meta.get("params")
    if targets is None:
        raise ValueError("no map from the program's parameters to the module's "
                         f"({meta.get('params_error') or 'the pack carries none'})")
    tensors = dict(model.named_parameters(remove_duplicate=False))
    tensors.update(dict(model.named_buffers(remove_duplicate=False)))
    plan = []
    for n in names:
        key = targets.get(n)
        if key is None:
            raise ValueError(f"the parameter map does not name the program's tensor {n}")
        t = tensors.get(key)
        if t is None:
            raise ValueError(f"tensor {n} ({key}) is not a parameter or buffer of the module "
                             "(a tensor constant made inside forward cannot be set)")
        a = np.asarray(inputs[n])
        if tuple(t.shape) != tuple(a.shape):
            raise ValueError(f"tensor {n} ({key}): module shape {list(t.shape)}, program {list(a.shape)}")
        plan.append((t, a))
    with torch.no_grad():
        for t, a in plan:
            t.copy_(_tensor(torch, a).to(device=t.device, dtype=t.dtype))
    return len(plan)


def cross_check(model, args: list, prog: dict, reference: dict, slack: dict | None = None) -> str:
    """Run ``model(*args)`` once (on clones of the tensor arguments, without grad) and compare
    its outputs, in ``forward``'s return order (flattened), with ``reference`` (our original
    function's outputs on the same inputs, by LEIR output name in header order) by
    :func:`steptp.runner.tolerance.compare_trials` with ``slack`` (the original's rounding
    allowance per output). Returns ``"equal"`` or ``"mismatch: <the first difference>"``;
    raises what the model raises."""
    import torch  # noqa: PLC0415

    from ..runner.tolerance import compare_trials  # noqa: PLC0415

    outs = [(sp[0], sp[2]) for sp, role in zip(prog["specs"], prog.get("roles") or []) if role == "output"]
    with torch.no_grad():
        got = model(*[a.clone() if isinstance(a, torch.Tensor) else a for a in args])
    flat, _ = torch.utils._pytree.tree_flatten(got)
    tensors = [t for t in flat if isinstance(t, torch.Tensor)]
    if len(tensors) != len(outs):
        return f"mismatch: the model returns {len(tensors)} tensors, the program has {len(outs)} outputs"
    first, _, _ = compare_trials([reference], [{n: t for (n, _), t in zip(outs, tensors)}], outs, [slack or {}])
    return "equal" if not first else f"mismatch: {first}"[:400]


def program_model(path: Path, prog: dict, inputs: dict, device: str, reference: dict | None,
                  slack: dict | None = None):
    """The program's PyTorch model on ``device`` with the program's own parameters, its
    ``forward`` arguments (trial 0's ``inputs``, by LEIR name) and the cross-check of its
    outputs against ``reference`` (trial 0's outputs of our original, by LEIR name; None:
    not checked). Returns ``(model, args, info)`` with ``info``: ``eager_params``
    (``"program"``: the program's values were loaded, or ``"own seeded: <why not>"``),
    ``eager_check`` (``"equal"``, ``"mismatch: ..."`` or ``"not checked: ..."``) and
    ``eager_mode`` (``"train"``/``"eval"``: the mode that was checked; eval is tried only
    when training mode mismatches). Eager is comparable with our functions only when
    ``eager_check == "equal"`` (:func:`comparable`). Raises what loading the file or the
    model raises (the callers record it)."""
    import torch  # noqa: PLC0415

    model, example = _load_model(path, device)
    args = _arguments(example, prog, inputs, device)
    floats = {a.dtype for a in args if isinstance(a, torch.Tensor) and a.is_floating_point()}
    model = model.to(device)
    if len(floats) == 1:
        model = model.to(next(iter(floats)))
    info = {"eager_params": "program", "eager_check": "not checked: no reference outputs",
            "eager_mode": "train" if model.training else "eval"}

    def load() -> None:
        try:
            n = load_program_params(model, prog, inputs)
            info["eager_params"] = "program" if n else "program (no parameters)"
        except ValueError as e:
            info["eager_params"] = f"own seeded: {e}"[:300]

    load()
    if reference is not None:
        check = cross_check(model, args, prog, reference, slack)
        if check != "equal" and model.training:
            model.eval()  # a program translated in eval mode (stp translate --eval)
            load()  # a training-mode call updated buffers in place (batch norm's running statistics)
            again = cross_check(model, args, prog, reference, slack)
            if again == "equal":
                check, info["eager_mode"] = again, "eval"
            else:
                model.train()
        info["eager_check"] = check
    return model, args, info


def comparable(info: dict) -> bool:
    """Whether eager may stand beside our functions: its outputs matched our original's
    (``info["eager_check"] == "equal"``, :func:`program_model`)."""
    return info.get("eager_check") == "equal"


def not_comparable_reason(info: dict) -> str:
    """The recorded reason of an eager baseline that is not comparable (:func:`comparable`)."""
    return (f"not comparable: PyTorch eager's output is not our original's ({info.get('eager_check')}; "
            f"parameters: {info.get('eager_params')})")[:500]


def measure(path: Path, prog: dict, inputs: dict, ours: Callable[[int], float], *, device: str,
            compile_: bool = False, rounds: int = 8, min_ms: float = 2.0, reference: dict | None = None,
            slack: dict | None = None) -> dict:
    """Time PyTorch eager (and with ``compile_`` ``torch.compile``) of the file ``path`` on
    ``inputs`` (trial 0's arrays by LEIR name; ``prog``: the pack manifest's program entry)
    interleaved with ``ours(number) -> seconds per call`` (the original's measurement), on
    ``device`` (``cuda``, or ``cpu`` for the simulated device), by the one timing loop
    (:func:`steptp.runner.cuda_timing.time_rounds` with :func:`steptp.runner.baseline.torch_timer`):
    after 3 warm-up calls, ``rounds`` interleaved rounds of one measurement each, ``number``
    calls per measurement calibrated so that one of the fastest lasts ``min_ms`` milliseconds.
    Before any timing the model gets the program's own parameters and its outputs are checked
    against ``reference`` (our original's trial-0 outputs by LEIR name, ``slack`` its rounding
    allowance; :func:`program_model`). Returns ``{"eager_us", "compile_us" (with ``compile_``),
    "original_us", "rounds", "device", "allow_tf32", "eager_params", "eager_check",
    "eager_mode"}`` in microseconds per call (medians); ``{"error": "not comparable: ...",
    "eager_params", "eager_check", ...}`` (nothing timed) when eager's output is not our
    original's; ``{"error": text}`` when the file cannot be loaded, its inputs do not match
    the program, or a call fails (never raises for the program's own errors)."""
    try:
        import torch  # noqa: PLC0415
    except Exception as e:  # noqa: BLE001
        return {"error": f"torch does not import: {e}"}
    threads = torch.get_num_threads()
    try:
        if device == "cpu":
            torch.set_num_threads(1)
        tf32 = pin_tf32(torch)
        model, args, info = program_model(path, prog, inputs, device, reference, slack)
        if not comparable(info):
            return {"error": not_comparable_reason(info), **info, "device": device, "allow_tf32": tf32}
        fns = {"eager_us": model}
        with torch.no_grad():
            if compile_:
                fns["compile_us"] = torch.compile(model)
            for fn in fns.values():
                for _ in range(3):  # warm-up (and torch.compile's compilation) outside the timing
                    fn(*args)
        from ..runner.cuda_timing import l2_flush_bytes, time_rounds  # noqa: PLC0415
        from ..runner.baseline import torch_timer  # noqa: PLC0415

        flush = l2_flush_bytes(device) if device == "cuda" else 0
        timers = {"original_us": ours, **{k: torch_timer(fn, args, device, flush) for k, fn in fns.items()}}
        # the one timing loop: interleaved rounds, calls per measurement calibrated for each
        secs, _ = time_rounds(list(timers.values()), device, rounds=rounds, warmup=0, min_repeat_ms=min_ms,
                              max_number=100_000)
        times = dict(zip(timers, secs))
    except Exception as e:  # noqa: BLE001  (the program's own errors, a missing op...)
        return {"error": f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:300]}
    finally:
        torch.set_num_threads(threads)
    out = {k: statistics.median(v) * 1e6 for k, v in times.items()}
    return {**out, "rounds": rounds, "device": device, "allow_tf32": tf32, **info}


__all__ = ["pin_tf32", "load_program_params", "cross_check", "program_model", "comparable", "not_comparable_reason",
           "measure"]
