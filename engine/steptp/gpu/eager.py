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
device buffer of :func:`steptp.backend.cuda_runtime.l2_flush_bytes` bytes zeroed, not timed),
as TVM's ``time_evaluator`` flushes before ours; on the simulated device eager runs on the
CPU with one intra-op thread, timed with ``perf_counter``. ``torch.compile`` is warmed up
(compiled) outside the timing.
"""

from __future__ import annotations

import importlib.util
import statistics
import sys
import time
from pathlib import Path
from typing import Callable

import numpy as np

_TORCH_DTYPES = {"f16": "float16", "bf16": "bfloat16", "f32": "float32", "f64": "float64"}


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


def _timer(fn: Callable, args: list, device: str, flush) -> Callable[[int], float]:
    """Seconds per call of ``fn(*args)`` over ``number`` calls (one measurement)."""
    import torch  # noqa: PLC0415

    if device == "cuda":
        def measure(number: int) -> float:
            flush.zero_()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(number):
                fn(*args)
            end.record()
            end.synchronize()
            return start.elapsed_time(end) * 1e-3 / number
    else:
        def measure(number: int) -> float:
            t0 = time.perf_counter()
            for _ in range(number):
                fn(*args)
            return (time.perf_counter() - t0) / number
    return measure


def measure(path: Path, prog: dict, inputs: dict, ours: Callable[[int], float], *, device: str,
            compile_: bool = False, rounds: int = 8, min_ms: float = 2.0) -> dict:
    """Time PyTorch eager (and with ``compile_`` ``torch.compile``) of the file ``path`` on
    ``inputs`` (trial 0's arrays by LEIR name; ``prog``: the pack manifest's program entry)
    interleaved with ``ours(number) -> seconds per call`` (the original's measurement), on
    ``device`` (``cuda``, or ``cpu`` for the simulated device). Each measurement runs
    ``number`` calls, calibrated so that one lasts ``min_ms`` milliseconds, after 3 warm-up
    calls; ``rounds`` rounds. Returns ``{"eager_us", "compile_us" (with ``compile_``),
    "original_us", "rounds", "device"}`` in microseconds per call (medians), or ``{"error":
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
            flush = None
            if device == "cuda":
                from ..backend.cuda_runtime import l2_flush_bytes  # noqa: PLC0415

                flush = torch.empty(max(1, l2_flush_bytes("cuda") // 4), dtype=torch.float32, device="cuda")
            timers = {}
            for k, fn in fns.items():
                for _ in range(3):  # warm-up (and torch.compile's compilation) outside the timing
                    fn(*args)
                timers[k] = _timer(fn, args, device, flush)
            if device == "cuda":
                torch.cuda.synchronize()
            probe = min(min(t(1) for _ in range(3)) for t in timers.values())
            number = max(1, min(100_000, int(np.ceil(min_ms * 1e-3 / max(probe, 1e-9)))))
            probe_ours = min(ours(1) for _ in range(3))
            number_ours = max(1, min(100_000, int(np.ceil(min_ms * 1e-3 / max(probe_ours, 1e-9)))))
            times: dict[str, list[float]] = {k: [] for k in ("original_us", *timers)}
            for r in range(rounds):
                order = [("original_us", lambda: ours(number_ours))] + [(k, (lambda t=t: t(number)))
                                                                        for k, t in timers.items()]
                for k, f in (order if r % 2 == 0 else order[::-1]):
                    times[k].append(f())
    except Exception as e:  # noqa: BLE001  (the program's own errors, a missing op...)
        return {"error": f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:300]}
    finally:
        torch.set_num_threads(threads)
    out = {k: statistics.median(v) * 1e6 for k, v in times.items()}
    return {**out, "rounds": rounds, "device": device}


__all__ = ["measure"]
