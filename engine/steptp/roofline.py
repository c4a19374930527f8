"""The speed of light of a LEIR program on a GPU: exact FLOPs by dtype, compulsory DRAM bytes
and the roofline time ``sol_us`` from a datasheet table (design.md §7, issue 44).

``sol_us = max(compute_us, memory_us)`` where

* ``compute_us`` is the sum over (dtype, unit) of ``FLOPs / peak(dtype, unit)``: the FLOPs of
  every equation, computed exactly (below), each divided by the peak of the unit that may run
  it (tensor cores or the SIMT FP pipes, :func:`peak_flops`); mixed-dtype programs add the
  per-dtype times (the units are not assumed to overlap);
* ``memory_us`` is the compulsory traffic ``bytes / DRAM bandwidth``: every known input,
  parameter and constant of the signature read once, every output written once, nothing for
  intermediates (a fully fused kernel's minimum; the roofline model of Williams, Waterman and
  Patterson, CACM 2009).

Launch overhead is *not* part of ``sol_us``; the device table gives it as a fact
(:attr:`GpuSpec.launch_us`, :attr:`GpuSpec.graph_node_us`) for readers of a µs-scale figure.

Counting FLOPs (the convention, documented once here)
-----------------------------------------------------
An equation executes once per iteration of its enclosing loops (all nests around it, nested
nests included): its FLOPs are the FLOPs of one evaluation of its right-hand side times the
product of the loop extents. Within an evaluation, each operator node that computes a
*floating-point* value is one FLOP:

* ``+ - * /``, ``//`` and ``%`` on floats (floor-division forms), ``**``: 1 each; a
  multiply-add (``X = X + A*B``) is therefore 2 FLOPs, the field's convention for GEMM and
  convolution (``2*M*N*K``);
* ``exp log sqrt tanh erf``: 1 each (one instruction of the special-function unit or a short
  sequence; counting 1 keeps ``sol_us`` a lower bound: the SFU's throughput is a quarter of the
  FP32 pipe's, so the real cost is higher, never lower);
* ``max min abs`` and comparisons of floats (``x > 0`` in a select): 1 each (FMNMX / FSETP on
  the FP pipe);
* negation (a free operand modifier of FADD/FMUL/FFMA), ``if_then_else`` (a select, SEL),
  the boolean ``& | !``, literals, casts (an assignment between dtypes) and all index
  arithmetic (subscripts, and any subexpression that reads no tensor and no float literal,
  such as a guard ``d-1<0``: integer pipe, not FLOPs): 0;
* arithmetic on integer or boolean values read from tensors (an ``argmax``'s comparisons of
  index candidates) is counted apart as :attr:`Roofline.int_ops` and does not
  enter ``sol_us``.

The dtype of an operation is the one the backend computes it in, by the typing rules of
:mod:`steptp.backend.tvmscript` (``infer`` / ``resolve``: a float16 and a float32 operand
compute in float32, a float literal adopts the type its context asks for, a weak float with no
float context computes in float64), written again here on LEIR codes because this module
imports nothing above :mod:`steptp.leir`.

Guards: an ``if_then_else`` evaluates one branch (TVM's ``if_then_else`` is lazy). When its
condition reads no tensor (an index-only guard such as padding ``1<=a & a<7``), the operations
of each branch are counted over exactly the iterations that select it, by evaluating the
guards on the loop ranges (numpy, at most :data:`MAX_GUARD_POINTS` points; beyond that the
branch is counted as always taken and :attr:`Roofline.exact` is False). A data-dependent
condition (``x > 0``) counts both branches: a GPU evaluates such a select branch-free, so the
count is what the generated code executes.

Which peak applies (:func:`peak_flops`)
----------------------------------------
* A *GEMM-like* equation (a sum accumulation ``X = X + P`` over at least one reduction axis
  whose added term ``P`` is a product of two tensor reads: matmul, convolution, attention
  scores) in float16/bfloat16/float64 may run on tensor cores (HMMA with float16 or float32
  accumulate, DMMA for float64; cuBLAS and cuDNN use them): its FLOPs (the multiply and the
  add) are charged to the operand dtype (``A_f16*B_f16`` accumulated into f32 is an f16 GEMM)
  at the tensor-core peak.
* Everything else, and every float32 equation, runs at the SIMT (non-tensor) peak of its dtype.
  float32 never uses the TF32 tensor-core peak: our programs compute in IEEE float32 and PyTorch
  eager does not use TF32 for matmul by default (``torch.backends.cuda.matmul.allow_tf32`` is
  False since 1.12). cuDNN convolutions *do* default to TF32
  (``torch.backends.cudnn.allow_tf32 = True``), so eager's float32 convolutions may beat this
  float32 speed of light (a ``fraction_of_sol_eager_graph`` above 1 on a float32 convolution
  says so, not a bug). The TF32 peak is in the table for that comparison.

Sources of the device table (dense figures, no 2:4 sparsity):

* H200 SXM: NVIDIA H200 Tensor Core GPU product page and datasheet
  (https://www.nvidia.com/en-us/data-center/h200/): FP64 34, FP64 Tensor Core 67, FP32 67,
  TF32 / BF16 / FP16 Tensor Core 989 / 1,979 / 1,979 TFLOPS *with sparsity* (halved here),
  4.8 TB/s HBM3e. Same GH100 die, SM count (132) and clocks as the H100 SXM, so the non-tensor
  FP16/BF16 rate (2x FP32) is the H100 whitepaper's.
* Streaming multiprocessors (``sms``): 132 on the H100 SXM5 (Hopper whitepaper, "H100 SXM5
  ... 132 SMs"), and so on the H200 (same die); 108 on the A100 (Ampere GA100 whitepaper).
* H100 SXM5: NVIDIA H100 Tensor Core GPU datasheet (https://www.nvidia.com/en-us/data-center/h100/)
  and the NVIDIA H100 Tensor Core GPU Architecture whitepaper, table "Comparison of NVIDIA
  Data Center GPUs" (https://resources.nvidia.com/en-us-tensor-core/gtc22-whitepaper-hopper):
  FP32 66.9, FP64 33.5, FP64 Tensor 66.9, FP16/BF16 non-tensor 133.8, FP16/BF16 Tensor 989.4,
  TF32 Tensor 494.7 TFLOPS; 3.35 TB/s HBM3 (datasheet).
* A100 SXM4 80GB: NVIDIA A100 datasheet
  (https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/a100/pdf/nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf):
  FP64 9.7, FP64 Tensor 19.5, FP32 19.5, TF32 156, BF16/FP16 Tensor 312 TFLOPS, 2,039 GB/s
  HBM2e; non-tensor FP16 78 and BF16 39 TFLOPS from the NVIDIA Ampere GA100 whitepaper
  (https://images.nvidia.com/aem-dam/en-zz/Solutions/data-center/nvidia-ampere-architecture-whitepaper.pdf).
* Launch facts (design.md §7): a kernel launch costs about 3 µs of host and driver time, a
  node of a replayed CUDA graph under 1 µs.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field

import numpy as np

from .leir import ast as A
from .leir.analysis import reduction_axes, self_reference_kind
from .leir.fileformat import LeirModule, Signature

#: the floating-point LEIR dtypes (FLOPs are counted in these)
FLOAT_DTYPES = ("f16", "bf16", "f32", "f64")
#: dtypes whose GEMM-like equations may run on tensor cores (HMMA / DMMA)
TENSOR_CORE_DTYPES = ("f16", "bf16", "f64")
#: guards are evaluated exactly on at most this many points of their loop indices
MAX_GUARD_POINTS = 1 << 24

_WEAK_INT, _WEAK_FLOAT = "~int", "~float"
_FLOAT_BITS = {"f16": 16, "bf16": 16, "f32": 32, "f64": 64}
_TRANSCENDENTAL = ("exp", "log", "sqrt", "erf", "tanh")


class RooflineError(ValueError):
    """Bad input to the roofline: an unknown GPU model."""


# ---------------------------------------------------------------------------
# device table
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class GpuSpec:
    """One GPU's datasheet figures. Peaks in FLOP/s (dense), ``dram_bytes_per_s`` in bytes/s,
    ``sms`` streaming multiprocessors, launch facts in µs; ``sources``: the documents every figure comes from."""

    key: str
    name: str
    fp64: float
    fp64_tensor: float
    fp32: float
    tf32_tensor: float
    fp16: float
    fp16_tensor: float
    bf16: float
    bf16_tensor: float
    dram_bytes_per_s: float
    memory: str
    sms: int = 0
    launch_us: float = 3.0
    graph_node_us: float = 1.0
    sources: tuple[str, ...] = ()

    def to_json(self) -> dict:
        """The figures as plain JSON (TFLOPS and TB/s for readability, plus the sources)."""
        tf = lambda v: round(v / 1e12, 3)  # noqa: E731
        return {"key": self.key, "name": self.name, "memory": self.memory,
                "dram_tb_per_s": round(self.dram_bytes_per_s / 1e12, 3),
                "tflops": {"fp64": tf(self.fp64), "fp64_tensor": tf(self.fp64_tensor), "fp32": tf(self.fp32),
                           "tf32_tensor": tf(self.tf32_tensor), "fp16": tf(self.fp16),
                           "fp16_tensor": tf(self.fp16_tensor), "bf16": tf(self.bf16),
                           "bf16_tensor": tf(self.bf16_tensor)},
                "sms": self.sms, "launch_us": self.launch_us, "graph_node_us": self.graph_node_us, "sources": list(self.sources)}


_T = 1e12
_HOPPER_WP = "https://resources.nvidia.com/en-us-tensor-core/gtc22-whitepaper-hopper"
_LAUNCH = "design.md §7: launch ~3 us, CUDA-graph node < 1 us"

#: the device table (module docstring for the sources); keys are ``--gpu-model`` values
GPUS: dict[str, GpuSpec] = {
    "h200": GpuSpec("h200", "NVIDIA H200 SXM 141GB", fp64=33.5 * _T, fp64_tensor=66.9 * _T, fp32=66.9 * _T,
                    tf32_tensor=494.7 * _T, fp16=133.8 * _T, fp16_tensor=989.4 * _T, bf16=133.8 * _T,
                    bf16_tensor=989.4 * _T, dram_bytes_per_s=4.8e12, memory="141 GB HBM3e", sms=132,
                    sources=("https://www.nvidia.com/en-us/data-center/h200/ (datasheet: FP32 67, FP16/BF16 "
                             "Tensor 1,979 sparse = 989 dense TFLOPS, 4.8 TB/s)",
                             _HOPPER_WP + " (same GH100 die and clocks: FP16/BF16 non-tensor 133.8)", _LAUNCH)),
    "h100": GpuSpec("h100", "NVIDIA H100 SXM5 80GB", fp64=33.5 * _T, fp64_tensor=66.9 * _T, fp32=66.9 * _T,
                    tf32_tensor=494.7 * _T, fp16=133.8 * _T, fp16_tensor=989.4 * _T, bf16=133.8 * _T,
                    bf16_tensor=989.4 * _T, dram_bytes_per_s=3.35e12, memory="80 GB HBM3", sms=132,
                    sources=("https://www.nvidia.com/en-us/data-center/h100/ (datasheet: 3.35 TB/s, FP32 67 TFLOPS)",
                             _HOPPER_WP + " (whitepaper table: FP32 66.9, FP16/BF16 133.8 non-tensor, 989.4 tensor)",
                             _LAUNCH)),
    "a100": GpuSpec("a100", "NVIDIA A100 SXM4 80GB", fp64=9.7 * _T, fp64_tensor=19.5 * _T, fp32=19.5 * _T,
                    tf32_tensor=156 * _T, fp16=78 * _T, fp16_tensor=312 * _T, bf16=39 * _T, bf16_tensor=312 * _T,
                    dram_bytes_per_s=2.039e12, memory="80 GB HBM2e", sms=108,
                    sources=("https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/a100/pdf/"
                             "nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf (FP32 19.5, FP16 Tensor 312 TFLOPS, "
                             "2,039 GB/s)",
                             "https://images.nvidia.com/aem-dam/en-zz/Solutions/data-center/"
                             "nvidia-ampere-architecture-whitepaper.pdf (FP16 78, BF16 39 TFLOPS non-tensor)",
                             _LAUNCH)),
}


def gpu_spec(gpu_model: str) -> GpuSpec:
    """The table entry of ``gpu_model`` (``h200``, ``h100``, ``a100``; case-insensitive).
    Raises :class:`RooflineError` for another name."""
    spec = GPUS.get(str(gpu_model).lower())
    if spec is None:
        raise RooflineError(f"unknown GPU model {gpu_model!r} (known: {', '.join(GPUS)})")
    return spec


def gpu_model_for(device_name: str) -> str | None:
    """The table key of the GPU a node reports (``cuDeviceGetName``): ``NVIDIA H200`` -> ``h200``,
    ``NVIDIA H100 80GB HBM3`` -> ``h100``, ``NVIDIA A100-SXM4-80GB`` -> ``a100``; the simulated
    device (``simulated (CPU builds)``, :mod:`steptp.gpu.run`) counts as an H200. Other parts
    (H100 PCIe / NVL, H200 NVL, GH200, A100 40GB or PCIe) have other clocks or bandwidths than the
    table's SXM parts: None, as for an unknown name."""
    n = (device_name or "").strip().lower()
    if n.startswith("simulated"):
        return "h200"
    if not n or "gh200" in n or "gh100" in n or "pcie" in n or "nvl" in n:
        return None
    if "h200" in n:
        return "h200"
    if "h100" in n and ("hbm3" in n or "sxm" in n):
        return "h100"
    if "a100" in n and "sxm" in n and "80gb" in n:
        return "a100"
    return None


def peak_flops(spec: GpuSpec, dtype: str, tensor_core: bool) -> float:
    """Peak FLOP/s of ``spec`` for LEIR float ``dtype`` on tensor cores (``tensor_core``) or the
    SIMT pipes. float32 always gets the SIMT FP32 peak (module docstring: no TF32). Raises
    :class:`RooflineError` for a non-float dtype."""
    if dtype == "f32":
        return spec.fp32
    if dtype == "f64":
        return spec.fp64_tensor if tensor_core else spec.fp64
    if dtype == "f16":
        return spec.fp16_tensor if tensor_core else spec.fp16
    if dtype == "bf16":
        return spec.bf16_tensor if tensor_core else spec.bf16
    raise RooflineError(f"no FLOP peak for dtype {dtype!r}")


# ---------------------------------------------------------------------------
# typing (steptp.backend.tvmscript's infer/resolve, on LEIR codes)
# ---------------------------------------------------------------------------


def _promote(a: str, b: str) -> str:
    if a == b:
        return a
    for x, y in ((a, b), (b, a)):
        if x == _WEAK_INT:
            return y
    for x, y in ((a, b), (b, a)):
        if x == _WEAK_FLOAT:
            return y if y in _FLOAT_BITS else _WEAK_FLOAT
    if a in _FLOAT_BITS and b in _FLOAT_BITS:
        if _FLOAT_BITS[a] == _FLOAT_BITS[b]:
            return "f32"  # float16 with bfloat16
        return a if _FLOAT_BITS[a] > _FLOAT_BITS[b] else b
    if a in _FLOAT_BITS:
        return a
    if b in _FLOAT_BITS:
        return b
    return "int"  # integer/bool combinations: the exact integer type does not matter here


def _infer(e: A.Expr) -> str:
    if isinstance(e, (A.Int, A.Index)):
        return _WEAK_INT
    if isinstance(e, A.Float):
        return _WEAK_FLOAT
    if isinstance(e, A.Tensor):
        return e.dtype
    if isinstance(e, A.Neg):
        return _infer(e.operand)
    if isinstance(e, A.BinOp):
        t = _promote(_infer(e.lhs), _infer(e.rhs))
        if e.op in ("/", "**") and t not in _FLOAT_BITS:
            return _WEAK_FLOAT
        return t
    if isinstance(e, A.Call):
        if e.func in _TRANSCENDENTAL:
            t = _infer(e.args[0])
            return t if t in _FLOAT_BITS else _WEAK_FLOAT
        if e.func == "abs":
            return _infer(e.args[0])
        if e.func in ("max", "min"):
            return _promote(_infer(e.args[0]), _infer(e.args[1]))
        if e.func == "if_then_else":
            return _promote(_infer(e.args[1]), _infer(e.args[2]))
    return "bool"  # Compare, BoolOp, Not


def _resolve(t: str, want: str) -> str:
    if t == _WEAK_INT:
        return want if want in _FLOAT_BITS else "int"
    if t == _WEAK_FLOAT:
        return want if want in _FLOAT_BITS else "f64"
    return t


# ---------------------------------------------------------------------------
# counting
# ---------------------------------------------------------------------------

_Guard = tuple[A.Expr, bool]  # (index-only condition, the polarity under which the op runs)


def _reads_no_tensor(e: A.Expr) -> bool:
    return not any(isinstance(x, (A.Tensor, A.Float)) for x in A.walk(e))


def _ops(e: A.Expr, want: str, guards: tuple[_Guard, ...], out: Counter) -> None:
    """Add the operations of one evaluation of ``e`` (computed in the context type ``want``)
    to ``out``, keyed ``(dtype, guards)``; integer/boolean arithmetic under dtype ``int``."""
    if isinstance(e, (A.Int, A.Float, A.Index, A.Tensor)) or _reads_no_tensor(e):
        return  # literals, reads (subscripts are index arithmetic) and index-only arithmetic: not counted
    if isinstance(e, A.Neg):
        _ops(e.operand, _resolve(_infer(e), want), guards, out)
        return
    if isinstance(e, A.Compare):
        ct = _resolve(_promote(_infer(e.lhs), _infer(e.rhs)), _WEAK_INT)
        if ct in _FLOAT_BITS:
            out[(ct, guards)] += 1
        _ops(e.lhs, ct, guards, out)
        _ops(e.rhs, ct, guards, out)
        return
    if isinstance(e, (A.BoolOp, A.Not)):
        for c in A.children(e):
            _ops(c, "bool", guards, out)
        return
    r = _resolve(_infer(e), want)
    if isinstance(e, A.Call) and e.func == "if_then_else":
        cond, a, b = e.args
        _ops(cond, "bool", guards, out)  # nothing for an index-only guard
        if _reads_no_tensor(cond):
            _ops(a, r, guards + ((cond, True),), out)
            _ops(b, r, guards + ((cond, False),), out)
        else:  # data-dependent: both sides (a branch-free select)
            _ops(a, r, guards, out)
            _ops(b, r, guards, out)
        return
    if isinstance(e, (A.BinOp, A.Call)):
        out[(r if r in _FLOAT_BITS else "int", guards)] += 1
        for c in A.children(e):
            _ops(c, r, guards, out)


def _eval_index(e: A.Expr, env: dict[str, np.ndarray]):
    """Vectorised value of an index-only expression over broadcast loop-index grids (floor
    semantics for ``//`` and ``%``, as TVM's floordiv/floormod)."""
    if isinstance(e, A.Int):
        return e.value
    if isinstance(e, A.Index):
        return env[e.name]
    if isinstance(e, A.Neg):
        return -_eval_index(e.operand, env)
    if isinstance(e, A.Not):
        return np.logical_not(_eval_index(e.operand, env))
    if isinstance(e, (A.BinOp, A.Compare, A.BoolOp)):
        a, b = _eval_index(e.lhs, env), _eval_index(e.rhs, env)
        return {"+": np.add, "-": np.subtract, "*": np.multiply, "//": np.floor_divide, "%": np.mod,
                "/": np.true_divide, "**": np.power, "<": np.less, "<=": np.less_equal, ">": np.greater,
                ">=": np.greater_equal, "==": np.equal, "!=": np.not_equal, "and": np.logical_and,
                "or": np.logical_or}[e.op](a, b)
    if isinstance(e, A.Call):
        args = [_eval_index(x, env) for x in e.args]
        if e.func == "if_then_else":
            return np.where(args[0], args[1], args[2])
        if e.func in ("max", "min"):
            return (np.maximum if e.func == "max" else np.minimum)(args[0], args[1])
        if e.func == "abs":
            return np.abs(args[0])
    raise ValueError(f"not an index expression: {e!r}")


def _iterations(loops: tuple[A.Loop, ...], guards: tuple[_Guard, ...]) -> tuple[int, bool]:
    """How many iterations of ``loops`` satisfy every guard, and whether that is exact."""
    total = math.prod(l.extent for l in loops)
    if not guards or total == 0:
        return total, True
    names = set()
    for g, _pol in guards:
        names |= {x.name for x in A.walk(g) if isinstance(x, A.Index)}
    # the innermost loop of a name is the one in scope
    extent = {l.var: l.extent for l in loops}
    used = [v for v in extent if v in names]
    points = math.prod(extent[v] for v in used)
    if points > MAX_GUARD_POINTS or any(n not in extent for n in names):
        return total, False
    env = {}
    for i, v in enumerate(used):
        shape = [1] * len(used)
        shape[i] = extent[v]
        env[v] = np.arange(extent[v], dtype=np.int64).reshape(shape)
    mask = np.ones([extent[v] for v in used], dtype=bool)
    for g, pol in guards:
        val = np.broadcast_to(np.asarray(_eval_index(g, env)).astype(bool), mask.shape)
        mask &= val if pol else ~val
    return int(mask.sum()) * (total // points), True


def _gemm_like(loops: tuple[A.Loop, ...], eq: A.Assign) -> A.Expr | None:
    """The product term ``P`` of a multiply-accumulate ``X = X + P`` over a reduction axis,
    ``P`` a product of two tensor reads (matmul, convolution); None for other equations."""
    if self_reference_kind(eq) != "sum" or not reduction_axes(loops, eq):
        return None
    v, t = eq.value, eq.target
    if not (isinstance(v, A.BinOp) and v.op == "+"):
        return None
    term = v.rhs if v.lhs == t else v.lhs if v.rhs == t else None
    if not (isinstance(term, A.BinOp) and term.op == "*"):
        return None
    reads = lambda x: any(isinstance(y, A.Tensor) and y.name != t.name for y in A.walk(x))  # noqa: E731
    return term if reads(term.lhs) and reads(term.rhs) else None


@dataclass(frozen=True)
class FlopCount:
    """FLOPs of a program (module docstring for the convention). ``by_dtype``: float dtype ->
    FLOPs; ``tensor_core``: the part of ``by_dtype`` in GEMM-like equations that may run on
    tensor cores; ``int_ops``: integer/boolean arithmetic (not FLOPs); ``exact``: False when a
    guard was too large to evaluate and its branch was counted as always taken."""

    by_dtype: dict[str, int]
    tensor_core: dict[str, int]
    int_ops: int
    exact: bool

    @property
    def total(self) -> int:
        return sum(self.by_dtype.values())


def count_flops(prog: A.Program) -> FlopCount:
    """Exact FLOPs of ``prog`` by dtype (module docstring). Pure: no analysis, no TVM."""
    by_dtype: Counter = Counter()
    tensor: Counter = Counter()
    int_ops, exact = 0, True
    for loops, eq in prog.equations():
        ops: Counter = Counter()
        _ops(eq.value, eq.target.dtype, (), ops)
        gemm = _gemm_like(loops, eq)
        mac_dtype = _resolve(_infer(gemm), eq.target.dtype) if gemm is not None else None
        for (dt, guards), n in ops.items():
            it, ok = _iterations(loops, guards)
            exact &= ok
            if dt not in _FLOAT_BITS:
                int_ops += n * it
            elif mac_dtype in _FLOAT_BITS:  # the whole MAC is the operands' GEMM
                by_dtype[mac_dtype] += n * it
                if mac_dtype in TENSOR_CORE_DTYPES:
                    tensor[mac_dtype] += n * it
            else:
                by_dtype[dt] += n * it
    return FlopCount(dict(sorted(by_dtype.items())), dict(sorted(tensor.items())), int_ops, exact)


def compulsory_bytes(sig: Signature) -> tuple[int, int]:
    """``(bytes read, bytes written)``: every input, parameter and constant of ``sig`` read
    once, every output written once (elements x :data:`steptp.leir.ast.DTYPE_BYTES`)."""
    read = written = 0
    for t in sig.tensors:
        n = math.prod(t.shape) * A.DTYPE_BYTES[t.dtype]
        if t.is_output:
            written += n
        else:
            read += n
    return read, written


# ---------------------------------------------------------------------------
# the roofline
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Roofline:
    """The speed of light of one program on one GPU (times in µs, bytes in bytes).

    ``flops`` (total float FLOPs), ``flops_by_dtype``, ``tensor_core_flops`` (by dtype, part of
    ``flops_by_dtype``), ``bytes`` = ``bytes_read + bytes_written``, ``compute_us`` (sum over
    dtype and unit), ``memory_us``, ``sol_us = max(compute_us, memory_us)``, ``bound``
    (``compute`` or ``memory``), ``gpu_model`` (a :data:`GPUS` key), ``exact`` (FlopCount)."""

    flops: int
    flops_by_dtype: dict[str, int]
    tensor_core_flops: dict[str, int]
    int_ops: int
    bytes: int
    bytes_read: int
    bytes_written: int
    compute_us: float
    memory_us: float
    sol_us: float
    bound: str
    gpu_model: str
    exact: bool = True
    compute_us_by_dtype: dict[str, float] = field(default_factory=dict)

    @property
    def arithmetic_intensity(self) -> float:
        """FLOPs per compulsory DRAM byte (0 when no byte moves)."""
        return self.flops / self.bytes if self.bytes else 0.0

    def to_json(self) -> dict:
        """Plain JSON: every field plus ``arithmetic_intensity``."""
        return {"gpu_model": self.gpu_model, "flops": self.flops, "flops_by_dtype": dict(self.flops_by_dtype),
                "tensor_core_flops": dict(self.tensor_core_flops), "int_ops": self.int_ops, "bytes": self.bytes,
                "bytes_read": self.bytes_read, "bytes_written": self.bytes_written,
                "compute_us": self.compute_us, "compute_us_by_dtype": dict(self.compute_us_by_dtype),
                "memory_us": self.memory_us, "sol_us": self.sol_us, "bound": self.bound,
                "arithmetic_intensity": self.arithmetic_intensity, "exact": self.exact}


def roofline(module: LeirModule, gpu_model: str = "h200") -> Roofline:
    """The :class:`Roofline` of a LEIR module (program and signature, e.g. from
    :func:`steptp.programs.load`) on ``gpu_model`` (a :data:`GPUS` key). Raises
    :class:`RooflineError` for an unknown model."""
    spec = gpu_spec(gpu_model)
    fc = count_flops(module.program)
    read, written = compulsory_bytes(module.signature)
    by_dt: dict[str, float] = {}
    for dt, n in fc.by_dtype.items():
        tc = fc.tensor_core.get(dt, 0)
        s = tc / peak_flops(spec, dt, True) + (n - tc) / peak_flops(spec, dt, False)
        by_dt[dt] = s * 1e6
    compute = sum(by_dt.values())
    memory = (read + written) / spec.dram_bytes_per_s * 1e6
    return Roofline(flops=fc.total, flops_by_dtype=fc.by_dtype, tensor_core_flops=fc.tensor_core,
                    int_ops=fc.int_ops, bytes=read + written, bytes_read=read, bytes_written=written,
                    compute_us=compute, memory_us=memory, sol_us=max(compute, memory),
                    bound="compute" if compute >= memory else "memory", gpu_model=spec.key, exact=fc.exact,
                    compute_us_by_dtype=by_dt)


def sol_fields(roof: Roofline, *, best_us: float | None = None, original_us: float | None = None,
               eager_graph_us: float | None = None, compile_us: float | None = None) -> dict:
    """The speed-of-light fields of a search summary (issue 44): ``sol_us``, ``fraction_of_sol``
    (``sol_us / best_us``), ``fraction_of_sol_original``, ``fraction_of_sol_eager_graph``,
    ``fraction_of_sol_compile`` (each ``sol_us`` over that time in µs; None when the time is
    missing or not positive), plus ``flops``, ``bytes`` and ``sol_gpu_model``."""

    def frac(t: float | None) -> float | None:
        return roof.sol_us / t if t is not None and t > 0 and math.isfinite(t) else None

    return {"sol_us": roof.sol_us, "sol_gpu_model": roof.gpu_model, "flops": roof.flops, "bytes": roof.bytes,
            "fraction_of_sol": frac(best_us), "fraction_of_sol_original": frac(original_us),
            "fraction_of_sol_eager_graph": frac(eager_graph_us), "fraction_of_sol_compile": frac(compile_us)}


def format_roofline(roof: Roofline, name: str = "") -> str:
    """A small human-readable table of ``roof`` with the device's figures and sources."""
    spec = GPUS[roof.gpu_model]
    rows: list[tuple[str, str]] = []
    if name:
        rows.append(("program", name))
    rows.append(("gpu", f"{spec.name} ({spec.key})"))
    for dt, n in roof.flops_by_dtype.items():
        tc = roof.tensor_core_flops.get(dt, 0)
        extra = f" ({tc:,} on tensor cores)" if tc else ""
        rows.append((f"FLOPs {dt}", f"{n:,}{extra}"))
    rows.append(("FLOPs total", f"{roof.flops:,}" + ("" if roof.exact else " (upper bound: a large guard)")))
    if roof.int_ops:
        rows.append(("integer ops", f"{roof.int_ops:,} (not in sol)"))
    rows.append(("bytes", f"{roof.bytes:,} (read {roof.bytes_read:,}, written {roof.bytes_written:,})"))
    rows.append(("arithmetic intensity", f"{roof.arithmetic_intensity:.3f} FLOP/byte"))
    rows.append(("compute us", f"{roof.compute_us:.4g}"))
    rows.append(("memory us", f"{roof.memory_us:.4g}"))
    rows.append(("sol us", f"{roof.sol_us:.4g} ({roof.bound}-bound; launch ~{spec.launch_us:g} us, "
                           f"graph node <{spec.graph_node_us:g} us, not included)"))
    j = spec.to_json()["tflops"]
    rows.append(("device TFLOPS", ", ".join(f"{k} {v:g}" for k, v in j.items())))
    rows.append(("device DRAM", f"{spec.dram_bytes_per_s / 1e12:g} TB/s {spec.memory}"))
    width = max(len(k) for k, _ in rows)
    lines = [f"{k:<{width}}  {v}" for k, v in rows]
    lines += [f"{'source' if i == 0 else '':<{width}}  {s}" for i, s in enumerate(spec.sources)]
    return "\n".join(lines)


__all__ = ["FLOAT_DTYPES", "TENSOR_CORE_DTYPES", "MAX_GUARD_POINTS", "GPUS", "GpuSpec", "RooflineError",
           "FlopCount", "Roofline", "gpu_spec", "gpu_model_for", "peak_flops", "count_flops", "compulsory_bytes",
           "roofline", "sol_fields", "format_roofline"]
