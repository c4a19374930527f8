"""PyTorch eager (and ``torch.compile``) beside a pack's programs, on the GPU node.

Imported only inside a worker, and only where ``torch`` imports: the rest of the runner
never imports torch. The program's KernelBench-style file (``Model``, ``get_inputs``,
``get_init_inputs``) carried by the pack is loaded, the model built (``torch.manual_seed(0)``
first) and called on the SAME inputs as our functions: trial 0's input tensors, matched to
the tensor arguments of ``get_inputs()`` in order (the LEIR ``input`` tensors in header order,
which the frontend names after ``forward``'s arguments; shapes must agree). Floating point
parameters of the model take the inputs' dtype when it differs.

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
    the yardsticks do too (PyTorch's default lets cuDNN convolutions run in TF32). Returns the
    settings as recorded in each summary: ``{"matmul": False, "cudnn": False}``."""
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    return {"matmul": bool(torch.backends.cuda.matmul.allow_tf32), "cudnn": bool(torch.backends.cudnn.allow_tf32)}


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
        a = np.ascontiguousarray(inputs[n])
        t = torch.from_numpy(a.view(np.uint16)).view(torch.bfloat16) if a.dtype.name == "bfloat16" else \
            torch.from_numpy(a.copy())
        args.append(t.to(device))
    return args


def measure(path: Path, prog: dict, inputs: dict, ours: Callable[[int], float], *, device: str,
            compile_: bool = False, rounds: int = 8, min_ms: float = 2.0) -> dict:
    """Time PyTorch eager (and with ``compile_`` ``torch.compile``) of the file ``path`` on
    ``inputs`` (trial 0's arrays by LEIR name; ``prog``: the pack manifest's program entry)
    interleaved with ``ours(number) -> seconds per call`` (the original's measurement), on
    ``device`` (``cuda``, or ``cpu`` for the simulated device), by the one timing loop
    (:func:`steptp.runner.cuda_timing.time_rounds` with :func:`steptp.runner.baseline.torch_timer`):
    after 3 warm-up calls, ``rounds`` interleaved rounds of one measurement each, ``number``
    calls per measurement calibrated so that one of the fastest lasts ``min_ms`` milliseconds. Returns ``{"eager_us", "compile_us" (with ``compile_``),
    "original_us", "rounds", "device", "allow_tf32"}`` in microseconds per call (medians), or ``{"error":
    text}`` when the file cannot be loaded, its inputs do not match the program, or a call
    fails (never raises for the program's own errors)."""
    try:
        import torch  # noqa: PLC0415
    except Exception as e:  # noqa: BLE001
        return {"error": f"torch does not import: {e}"}
    threads = torch.get_num_threads()
    try:
        if device == "cpu":
            torch.set_num_threads(1)
        tf32 = pin_tf32(torch)
        model, example = _load_model(path, device)
        args = _arguments(example, prog, inputs, device)
        floats = {a.dtype for a in args if isinstance(a, torch.Tensor) and a.is_floating_point()}
        model = model.to(device)
        if len(floats) == 1:
            model = model.to(next(iter(floats)))
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
    return {**out, "rounds": rounds, "device": device, "allow_tf32": tf32}


__all__ = ["measure"]
