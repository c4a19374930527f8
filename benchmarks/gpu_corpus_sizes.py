"""How long the GPU benchmark set (``stp corpus --count 40 --seed 5 --gpu``) would take in PyTorch
eager on an H200, estimated without a GPU, next to each program's speed of light (issue 44).

The field's target is 0.1-15 ms per program in PyTorch eager on an H100/H200 (KernelBench
resized its level 1-2 problems to that range because µs-scale tasks measure launch overhead).

For each program: the translation's exact FLOPs and compulsory bytes and ``sol_us`` on the
H200 (:mod:`steptp.roofline`), its element counts (inputs and parameters, outputs), and an
*estimate* of eager's time. The estimate is a model, not a measurement:

* the program's ``forward`` runs on PyTorch's ``meta`` device (shapes only, no data) under a
  dispatch mode that records every ATen op PyTorch eager would launch, with its tensors; view
  ops (results that alias an input without writing it: ``view``, ``permute``, ``expand``...)
  and ``empty`` launch nothing;
* each remaining op is one kernel of ``max(KERNEL_MIN_US, FLOPs / (EFF_COMPUTE x peak),
  bytes / (EFF_MEMORY x DRAM bandwidth))``: FLOPs of ``mm``/``bmm``/``addmm``/``convolution``/
  attention from :data:`torch.utils.flop_counter.flop_registry` (2 per multiply-add), other ops
  one FLOP per element of their largest tensor; bytes = every tensor argument read once (an
  expanded, stride-0 argument counts its distinct elements) plus every output written once;
  the peak is the tensor-core one for f16/bf16/f64 GEMMs and convolutions, TF32 for float32
  convolutions (``torch.backends.cudnn.allow_tf32`` defaults to True), FP32 SIMT for float32
  matmuls (``allow_tf32`` is False for matmul), the SIMT peak of the dtype for the rest;
* eager = ``max(ops x HOST_US_PER_OP, sum of kernel times)``: PyTorch's host side (Python,
  dispatcher, launch: at least 5 µs per op on the H200 of issue 44) runs ahead of the GPU
  asynchronously, so the slower of the two streams sets the time.

EFF_COMPUTE = 0.5: cuBLAS/cuDNN reach 70-80 % of peak on large square problems, much less on
the skinny and few-channel shapes a generated corpus has. EFF_MEMORY = 0.7: PyTorch's
vectorised elementwise kernels reach 80-90 % of DRAM bandwidth on large tensors, reductions
and strided/broadcast reads less. Both are stated guesses; the estimate is good to a factor of
about 2-3, enough to say whether a program is µs-scale or in the ms range, not more.

    python benchmarks/gpu_corpus_sizes.py [--dir DIR] [--count 40] [--seed 5] [--budget N] [--json FILE]

Without ``--dir`` the set is generated into a temporary directory with the ``--gpu`` budget
(:data:`steptp.dataset.corpus.GPU_BUDGET`) or ``--budget``. A program that cannot be translated
or traced is skipped with one line.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import statistics
import sys
import tempfile
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import flop_registry

from steptp.dataset.corpus import GPU_BUDGET, generate_corpus, parse_header
from steptp.programs import load
from steptp.roofline import GPUS, roofline

HOST_US_PER_OP = 5.0    # PyTorch eager's host cost per op from Python (issue 44: >= 5 us per op on an H200)
KERNEL_MIN_US = 2.0     # the shortest kernel (launch latency and a wave's ramp)
EFF_COMPUTE = 0.5
EFF_MEMORY = 0.7
TARGET_US = (100.0, 15000.0)

_CONV = {torch.ops.aten.convolution, torch.ops.aten._convolution}
_NO_KERNEL = {torch.ops.aten.empty, torch.ops.aten.empty_strided, torch.ops.aten.empty_like}


def _tensors(x):
    if isinstance(x, torch.Tensor):
        yield x
    elif isinstance(x, (list, tuple)):
        for y in x:
            yield from _tensors(y)
    elif isinstance(x, dict):
        for y in x.values():
            yield from _tensors(y)


def _distinct_bytes(t: torch.Tensor) -> int:
    n = 1
    for size, stride in zip(t.shape, t.stride()):
        if stride != 0:
            n *= size
    return n * t.element_size()


class _Record(TorchDispatchMode):
    """Records (op, FLOPs, bytes, dtype, unit) of every ATen op that launches a kernel."""

    def __init__(self):
        super().__init__()
        self.ops: list[dict] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        packet = func.overloadpacket
        rets = func._schema.returns
        view = bool(rets) and all(r.alias_info is not None and not r.alias_info.is_write for r in rets)
        if view or packet in _NO_KERNEL:
            return out
        ins = list(_tensors((args, kwargs)))
        outs = list(_tensors(out))
        floats = [t for t in ins + outs if t.is_floating_point()]
        dtype = floats[0].dtype if floats else torch.float32
        if packet in flop_registry:
            flops = int(flop_registry[packet](*args, **kwargs, out_val=out))
            unit = "tensor" if dtype in (torch.float16, torch.bfloat16, torch.float64) else (
                "tf32" if packet in _CONV else "simt")
        else:
            flops = max([t.numel() for t in ins + outs] or [0])
            unit = "simt"
        nbytes = sum(_distinct_bytes(t) for t in ins) + sum(t.numel() * t.element_size() for t in outs)
        self.ops.append({"op": str(packet).removeprefix("aten."), "flops": flops, "bytes": nbytes,
                         "dtype": str(dtype).removeprefix("torch."), "unit": unit})
        return out


def _peak(spec, dtype: str, unit: str) -> float:
    if unit == "tf32":
        return spec.tf32_tensor
    table = {"float16": (spec.fp16, spec.fp16_tensor), "bfloat16": (spec.bf16, spec.bf16_tensor),
             "float32": (spec.fp32, spec.fp32), "float64": (spec.fp64, spec.fp64_tensor)}
    simt, tensor = table.get(dtype, (spec.fp32, spec.fp32))
    return tensor if unit == "tensor" else simt


def trace_ops(path: Path) -> list[dict]:
    """The kernel-launching ATen ops of one program's ``forward`` (meta device: no data)."""
    spec = importlib.util.spec_from_file_location(f"_corpus_{path.stem}", path)
    mod = importlib.util.module_from_spec(spec)
    with torch.device("meta"):
        spec.loader.exec_module(mod)
        model = mod.Model(*mod.get_init_inputs())
        inputs = mod.get_inputs()
        rec = _Record()
        with torch.no_grad(), rec:
            model(*inputs)
    return rec.ops


def eager_estimate_us(ops: list[dict], gpu_model: str = "h200") -> tuple[float, float, float]:
    """``(eager_us, host_us, kernels_us)`` of the model in the module docstring."""
    spec = GPUS[gpu_model]
    kernels = sum(max(KERNEL_MIN_US, o["flops"] / (EFF_COMPUTE * _peak(spec, o["dtype"], o["unit"])) * 1e6,
                      o["bytes"] / (EFF_MEMORY * spec.dram_bytes_per_s) * 1e6) for o in ops)
    host = HOST_US_PER_OP * len(ops)
    return max(host, kernels), host, kernels


def measure(path: Path) -> dict:
    """One program's row (raises on a translation or tracing failure)."""
    head = parse_header(path)
    module, _ = load(path)
    r = roofline(module, "h200")
    ops = trace_ops(path)
    eager, host, kernels = eager_estimate_us(ops)
    sig = module.signature
    return {"program": path.stem, "dtype": head.get("dtype"), "work": head.get("work"),
            "input_elements": sum(math.prod(t.shape) for t in sig.inputs),
            "output_elements": sum(math.prod(t.shape) for t in sig.outputs),
            "flops": r.flops, "bytes": r.bytes, "sol_us": r.sol_us, "bound": r.bound,
            "ops": len(ops), "eager_us": eager, "eager_host_us": host, "eager_kernels_us": kernels}


def _fmt(v: float) -> str:
    return f"{v:.3g}" if v < 1e4 else f"{v:.3e}"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", type=Path, help="an existing corpus directory (default: generate one)")
    ap.add_argument("--count", type=int, default=40)
    ap.add_argument("--seed", type=int, default=5)
    ap.add_argument("--budget", type=int, default=None, help=f"work budget (default the --gpu one, {GPU_BUDGET})")
    ap.add_argument("--json", type=Path, help="write the rows and the summary here")
    a = ap.parse_args(argv)
    tmp = None
    if a.dir is None:
        tmp = tempfile.TemporaryDirectory(prefix="gpu_corpus_")
        a.dir = Path(tmp.name)
        generate_corpus(a.dir, a.count, seed=a.seed, budget=a.budget or GPU_BUDGET)
    rows = []
    cols = ("program", "dtype", "in_elems", "out_elems", "flops", "bytes", "sol_us", "ops", "eager_us")
    print("  ".join(f"{c:>12}" if i else f"{c:<44}" for i, c in enumerate(cols)))
    for p in sorted(a.dir.glob("*.py")):
        try:
            row = measure(p)
        except Exception as e:  # noqa: BLE001 - skipped with one line, never the whole run
            print(f"skip {p.name}: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
            continue
        rows.append(row)
        vals = (row["program"][:44], row["dtype"], row["input_elements"], row["output_elements"], row["flops"],
                row["bytes"], row["sol_us"], row["ops"], row["eager_us"])
        print("  ".join(f"{v:<44}" if i == 0 else f"{v:>12}" if isinstance(v, str) else f"{_fmt(v):>12}"
                        for i, v in enumerate(vals)))
    summary = {}
    if rows:
        eager = [r["eager_us"] for r in rows]
        sol = [r["sol_us"] for r in rows]
        lo, hi = TARGET_US
        summary = {"programs": len(rows), "eager_us_median": statistics.median(eager), "eager_us_min": min(eager),
                   "eager_us_max": max(eager), "sol_us_median": statistics.median(sol), "sol_us_min": min(sol),
                   "sol_us_max": max(sol), "below_0.1ms": sum(e < lo for e in eager),
                   "in_0.1_15ms": sum(lo <= e <= hi for e in eager), "above_15ms": sum(e > hi for e in eager),
                   "input_elements_max": max(r["input_elements"] for r in rows)}
        print(f"\nestimated eager (H200): median {_fmt(summary['eager_us_median'])} us, range "
              f"{_fmt(summary['eager_us_min'])} .. {_fmt(summary['eager_us_max'])} us; "
              f"{summary['below_0.1ms']} below 0.1 ms, {summary['in_0.1_15ms']} in 0.1-15 ms, "
              f"{summary['above_15ms']} above 15 ms (of {len(rows)})")
        print(f"sol_us (H200): median {_fmt(summary['sol_us_median'])}, range {_fmt(summary['sol_us_min'])} .. "
              f"{_fmt(summary['sol_us_max'])}")
    if a.json:
        a.json.write_text(json.dumps({"rows": rows, "summary": summary}, indent=1) + "\n")
    if tmp is not None:
        tmp.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())
