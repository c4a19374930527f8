"""Build and run lowered LEIR: LLVM (CPU) execution, CUDA source, nvcc build check, isolation.

* :func:`build_cpu` / :func:`run_cpu`: ``tvm.script.from_source`` + ``tvm.compile(target=llvm)``
  and a call with numpy arrays (DLPack, in place). The CPU path is the verifier on every
  machine (design.md §5; tvm-0.27-notes §1.2, §2.1, §6).
* :func:`cuda_source`: GPU preflight, lowering with thread bindings, and
  ``tvm.compile(target={"kind": "cuda", "arch": "sm_90"})``; TVM emits CUDA C only and does
  not call nvcc (notes §3.2-3.3).
* :func:`nvcc_check`: the Build pass: many kernels batched into one IRModule, hence one
  ``.cu`` file and one ``nvcc --ptx -arch=sm_90`` run (notes §3.3, t35: 50 kernels in
  0.6 s); failing batches are bisected to name the culprits.
* Isolation (a ``spawn``-context worker with a per-call time limit) is not here: it is
  :mod:`steptp.runner.worker`, reached through :func:`steptp.runner.pool.shared`.

``tvm`` is imported lazily (about 1 s), so ``import steptp.backend`` stays cheap.
"""

from __future__ import annotations

import atexit
import collections
import hashlib
import os
import re
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np

from ..leir.fileformat import Signature
from .errors import BuildError, ExecError, LoweringError, PreflightError, short_tvm_error
from .hardware import DEFAULT_GPU, GpuLimits
from .preflight import preflight
from .tvmscript import lower_module

#: LLVM target used for CPU execution (TVM 0.27 wants the dict form, notes §3.1).
#: ``opt-level`` 0: the kernels are checked for correctness on small inputs, not timed, and
#: LLVM's optimisation (and the JIT of the optimised code at the first call) cost 10x more
#: than the run itself (about 1.6 s vs 0.14 s for a small MLP on 2 vCPUs). No fast-math
#: either way, so results are IEEE.
CPU_TARGET: dict = {"kind": "llvm", "opt-level": 0}

#: PassContext of the verification build (``build_cpu`` with the default target):
#: ``tirx.disable_assert`` drops the packed-API argument checks (rank, shape, dtype, device
#: and alignment of every parameter), which :func:`_call` already makes in Python before
#: every call. They were about 40 % of each kernel's LLVM IR, and LLVM's JIT at the first
#: call scales with the IR: on 40 corpus kernels the JIT fell from 32 to 19 ms per kernel
#: (the build itself from 16.7 to 15.5 ms). The lowering emits no assertions of its own.
VERIFY_PASS_CONFIG: dict = {"tirx.disable_assert": True}

#: Name of the verification build's TIR pipeline (:func:`_verify_pipeline`), registered in
#: ``tvm.tirx.compilation_pipeline.PIPELINE_MAP`` at the first verification build.
VERIFY_PIPELINE = "stp_verify"


#: the passes of :func:`_verify_pipeline`, in order: (namespace, ``transform`` pass, arguments)
_VERIFY_PASSES = (
    ("s_tir", "CanonicalizeLoop"), ("s_tir", "LowerCrossThreadReduction"), ("s_tir", "LowerInitBlock"),
    ("s_tir", "PlanAndUpdateBufferAllocationLocation"), ("s_tir", "ConvertBlocksToOpaque"),
    ("s_tir", "LowerMatchBuffer"), ("s_tir", "StmtSimplify"), ("s_tir", "LowerOpaqueBlock"),
    ("tirx", "FlattenBuffer"), ("tirx", "BF16ComputeLegalize"), ("tirx", "NarrowDataType", 32),
    ("tirx", "VectorizeLoop", True), ("tirx", "StorageRewrite"), ("tirx", "UnrollLoop"), ("tirx", "StmtSimplify"),
    ("tirx", "RemoveNoOp"), ("s_tir", "RewriteUnsafeSelect"), ("tirx", "FP8ComputeLegalize"),
    ("tirx", "VerifyMemory"), ("tirx", "AnnotateEntryFunc"), ("tirx", "SplitHostDevice"), ("tirx", "MakePackedAPI"),
    ("tirx", "FP8StorageLegalize"), ("tirx", "BF16StorageLegalize"),
)


def _verify_pipeline():
    """TVM's default ``s_tir`` pipeline (``tvm.s_tir.pipeline.default_s_tir_pipeline``) less
    the passes that only optimise or only concern GPU storage scopes, for the CPU
    verification build. The CPU verification form binds no thread (its ``B`` loops are
    serial), so thread-binding, shared-memory, warp, tensor-core, VTCM and double-buffer
    passes have nothing to do; ``HoistIfThenElse``, ``CompactBufferAllocation``,
    ``RenormalizeSplitPattern``, ``CommonSubexprElim`` and ``InjectSoftwarePipeline`` only
    make the code faster or smaller. None of the removed passes changes a floating-point
    operation, so outputs are bit-identical (tested against the default pipeline + JIT on
    examples; the examples' dataset is byte-identical). On 30 corpus
    kernels ``tvm.compile`` fell from about 25 to 17 ms per kernel.
    Source: ``tvm/s_tir/pipeline.py`` (TVM 0.27)."""
    tvm = _tvm()
    from tvm import s_tir, tirx  # noqa: PLC0415
    from tvm.s_tir import pipeline as default  # noqa: PLC0415

    @tvm.transform.module_pass(opt_level=0)
    def _pipeline(mod, _ctx):
        passes = [getattr({"s_tir": s_tir, "tirx": tirx}[ns].transform, name)(*args)
                  for ns, name, *args in _VERIFY_PASSES]
        return tvm.ir.transform.Sequential(passes)(mod)

    return _pipeline, default.finalize_host_passes, default.finalize_device_passes


def _register_verify_pipeline() -> str:
    from tvm.tirx import compilation_pipeline  # noqa: PLC0415

    compilation_pipeline.PIPELINE_MAP.setdefault(VERIFY_PIPELINE, _verify_pipeline)
    return VERIFY_PIPELINE


_SCRATCH: dict[int, str] = {}
_LOADED = 0


def _load_linked(executable, name: str | None = "main"):
    """The ``name`` function (None: the loaded module) of a CPU ``tvm.compile`` result, loaded through an object file
    linked with ``ld -shared`` and ``tvm.runtime.load_module`` instead of TVM's LLVM JIT.

    Measured on 30 corpus kernels (2 shared vCPUs): writing the object
    (``Module.write_to_file``) 14 ms + ``ld`` 8-11 ms, against 35-40 ms for TVM's LLVM JIT
    at the first call (whose time did not follow the target's ``opt-level``). The files live in a per-process scratch directory and are
    removed once loaded. Returns ``None`` (the caller keeps the JIT) when ``ld`` is missing
    or any step fails."""
    global _LOADED
    ld = shutil.which("ld")
    if ld is None:
        return None
    pid = os.getpid()
    d = _SCRATCH.get(pid)
    if d is None or not os.path.isdir(d):
        d = _SCRATCH[pid] = tempfile.mkdtemp(prefix="stp-obj-")
        atexit.register(shutil.rmtree, d, True)
    _LOADED += 1
    base = os.path.join(d, f"k{_LOADED}")
    try:
        executable.mod.write_to_file(base + ".o")
        # close_fds=False lets subprocess use posix_spawn: no fork of this (large) process
        r = subprocess.run([ld, "-shared", "-o", base + ".so", base + ".o"], capture_output=True, timeout=60,
                           close_fds=False)
        if r.returncode != 0:
            return None
        lib = _tvm().runtime.load_module(base + ".so")
        return lib if name is None else lib[name]
    except Exception:  # noqa: BLE001 - any failure falls back to the JIT
        return None
    finally:
        for ext in (".o", ".so"):
            try:
                os.unlink(base + ext)
            except OSError:
                pass


def _tvm():
    import tvm  # noqa: PLC0415  (lazy: importing tvm costs about a second)

    return tvm


def cuda_target(arch: str = DEFAULT_GPU.arch, host: str = "c"):
    """``tvm.target.Target({"kind": "cuda", "arch": arch}, host=host)`` (never the sm_50
    default, notes §3.1).

    The host side defaults to TVM's C code generator: here ``tvm.compile`` only produces the
    device CUDA C (the host module is never run), the device source is byte-identical with
    an ``llvm`` host, and the C host costs 14 ms per kernel against 33 ms for LLVM (tested;
    measured on three example programs). Pass ``host="llvm"`` for a module that a GPU
    machine will load and launch. Every CUDA compilation takes its target from here, so this
    also registers the ``-inf``/``inf`` max/min reducers (:func:`register_inf_reducers`)."""
    from tvm.target import Target  # noqa: PLC0415

    register_inf_reducers()
    return Target({"kind": "cuda", "arch": arch}, host=host)


def np_dtype(dtype: str) -> np.dtype:
    """numpy dtype for a TVM dtype name (``bfloat16`` needs ``ml_dtypes``)."""
    if dtype == "bfloat16":
        import ml_dtypes  # noqa: PLC0415

        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(dtype)


def is_tvmscript(text: str) -> bool:
    """Heuristic: TVMScript text (``@T.prim_func``/``@I.ir_module``) rather than LEIR or CUDA."""
    return "@T.prim_func" in text or "@I.ir_module" in text


# ---------------------------------------------------------------------------
# Parsing and CPU kernels
# ---------------------------------------------------------------------------


_PARSED: "collections.OrderedDict[str, Any]" = collections.OrderedDict()
_PARSED_SIZE = 512  # CPU and GPU forms of the candidates pending a batched nvcc run (8 programs x 43 rules)


def parse_tvmscript(text: str):
    """``tvm.script.from_source(text)`` -> the ``main`` PrimFunc (or the only one).

    Text of our lowering is built directly with TVM's IRBuilder
    (:func:`steptp.backend.tirtext.build_primfunc`, structurally equal, about 2-3 ms per
    corpus kernel); anything else goes through ``from_source`` (15-150 ms). The last 512
    results are memoised by text (PrimFuncs are immutable; ``with_attr`` returns a copy). Raises :class:`BuildError` with TVM's
    diagnostic line when the text does not parse or fails TVM's well-formedness check."""
    hit = _PARSED.get(text)
    if hit is not None:
        _PARSED.move_to_end(text)
        return hit
    func = _parse_tvmscript(text)
    _remember(text, func)
    return func


def _remember(text: str, func) -> None:
    _PARSED[text] = func
    _PARSED.move_to_end(text)
    while len(_PARSED) > _PARSED_SIZE:
        _PARSED.popitem(last=False)


class _DialectProxy:
    """The ``T`` of TVMScript, except that ``T.prim_func(...)`` in a decorator is cheap.

    The parser evaluates a function's decorator only for its ``dispatch_token`` (the
    ``s_tir``/``private`` keywords are read from the syntax tree, tvm/tirx/script/parser/
    parser.py ``find_decorator_annotation``), but the real ``T.prim_func(s_tir=True)`` calls
    ``inspect.stack()``, which walks every frame and ``sys.modules``: half of a parse, and
    more in deep call stacks (measured 50-65 ms -> 25 ms on a 48-line kernel). The result
    is structurally identical (``tvm.ir.assert_structural_equal``; tested)."""

    def __init__(self, real):
        self._real = real

    def __getattr__(self, name):
        return getattr(self._real, name)

    @staticmethod
    def prim_func(*_args, **_kwargs):
        def decorator(_func):  # never called: the parser only reads the token
            raise TypeError("T.prim_func: decorator stub of the TVMScript text parser")

        decorator.dispatch_token = "tirx"
        return decorator


_PARSE_GLOBALS: dict | None = None


def _parse_globals() -> dict:
    """``tvm.script``'s default parser globals with ``T``/``tir`` as :class:`_DialectProxy`."""
    global _PARSE_GLOBALS
    if _PARSE_GLOBALS is None:
        from tvm.script.parser.core.entry import _default_globals  # noqa: PLC0415

        g = dict(_default_globals())
        g["T"] = g["tir"] = _DialectProxy(g["T"])
        _PARSE_GLOBALS = g
    return dict(_PARSE_GLOBALS)


def _parse_tvmscript(text: str):
    # Fast path: our lowering's subset built directly with the IRBuilder (structurally equal,
    # about 2 ms instead of 15-40 ms); anything else, and any error, goes to the TVM parser.
    from .tirtext import Unsupported, build_primfunc  # noqa: PLC0415

    try:
        return build_primfunc(text)
    except Unsupported:
        pass
    tvm = _tvm()
    try:
        obj = tvm.script.from_source(text, extra_vars=_parse_globals())
    except Exception as e:  # DiagnosticError, SyntaxError, ValueError ...
        raise BuildError(f"TVMScript does not parse: {short_tvm_error(e)}") from None
    if isinstance(obj, tvm.IRModule):
        names = [gv.name_hint for gv in obj.functions.keys()]
        name = "main" if "main" in names else (names[0] if len(names) == 1 else None)
        if name is None:
            raise BuildError(f"TVMScript module has several functions {sorted(names)} and no 'main'")
        return obj[name]
    return obj


@dataclass(frozen=True)
class ParamSpec:
    """One kernel parameter: ``name`` (LEIR name when a signature is known, else the TIR
    name), ``tir_name``, ``shape`` (elements), ``dtype`` (TVM/numpy name), ``role``
    (``input``/``param``/``constant``/``output``; ``None`` without a signature)."""

    name: str
    tir_name: str
    shape: tuple[int, ...]
    dtype: str
    role: str | None = None

    @property
    def is_output(self) -> bool:
        return self.role == "output"


def _param_specs(func, signature: Signature | None):
    specs = []
    params = list(func.params)
    if signature is not None and len(signature.tensors) != len(params):
        raise BuildError(f"the TIR function has {len(params)} parameters but the signature declares "
                         f"{len(signature.tensors)} tensors")
    for i, p in enumerate(params):
        try:
            shape = tuple(int(s) for s in p.shape)
            dtype = str(p.ty.dtype)
        except Exception as e:  # non-buffer parameter or symbolic shape
            raise BuildError(f"parameter #{i} ({p}) is not a buffer with a static shape: {e}") from None
        if signature is not None:
            t = signature.tensors[i]
            from .tvmscript import tvm_dtype  # noqa: PLC0415

            if tuple(t.shape) != shape or tvm_dtype(t.dtype) != dtype:
                raise BuildError(f"parameter #{i} {p.name}: TIR has {dtype}{list(shape)} but the signature declares "
                                 f"{t.name}: {t.dtype}{list(t.shape)}")
            specs.append(ParamSpec(t.name, str(p.name), shape, dtype, t.role))
        else:
            specs.append(ParamSpec(str(p.name), str(p.name), shape, dtype, None))
    return tuple(specs)


@dataclass
class CpuKernel:
    """A compiled LLVM kernel. Call it with ``{name: array}``; it returns the outputs.

    ``params`` follow the function's parameter order. With a signature, outputs are the
    ``output`` tensors; without one, every parameter missing from the call is an output.
    """

    text: str
    executable: Any
    params: tuple[ParamSpec, ...]
    has_signature: bool = True
    compile_s: float = 0.0
    #: the loaded ``main`` (verification builds: :func:`_load_linked`); None: the JIT's
    entry: Any = None

    @property
    def main(self):
        """The callable kernel: the linked object's ``main`` or the JIT's."""
        return self.entry if self.entry is not None else self.executable["main"]

    def __call__(self, arrays: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        return _call(self, arrays)


def build_cpu(text_or_module, signature: Signature | None = None, target: dict | None = None) -> CpuKernel:
    """Compile a kernel for the CPU with LLVM.

    * ``text_or_module``: TVMScript text (from :func:`steptp.backend.tvmscript.lower`), or a
      :class:`LeirModule` / ``.leir`` text / Program (+``signature``), lowered first with
      ``target="cpu"``.
    * ``signature``: names parameters by their LEIR names and fixes the outputs; checked
      against the TIR parameter shapes/dtypes.

    Cost: parse about 2 ms (:func:`parse_tvmscript`), ``tvm.compile`` 15-40 ms for small
    kernels (notes §5; about 17 ms with the verification pipeline :data:`VERIFY_PIPELINE`)
    and the load (:func:`_load_linked`, about 25 ms; the LLVM JIT at the first call when
    that fails or for another ``target``).
    Raises :class:`LoweringError` (LEIR input) or :class:`BuildError` (parse/compile,
    with TVM's message). Source: ``tvm.script.from_source``, ``tvm.compile(..., target=llvm)``.
    """
    if isinstance(text_or_module, str) and is_tvmscript(text_or_module):
        text = text_or_module
    else:
        low = lower_module(text_or_module, signature, "cpu")
        text, signature = low.text, low.signature
    func = parse_tvmscript(text)
    specs = _param_specs(func, signature)
    tvm = _tvm()
    t0 = time.perf_counter()
    try:
        if target is None:
            with tvm.transform.PassContext(config=VERIFY_PASS_CONFIG):
                ex = tvm.compile(func, target=tvm.target.Target(CPU_TARGET), tir_pipeline=_register_verify_pipeline())
        else:
            with tvm.transform.PassContext(config={}):
                ex = tvm.compile(func, target=tvm.target.Target(target))
    except Exception as e:
        raise BuildError(f"tvm.compile(llvm) failed: {short_tvm_error(e)}") from None
    entry = _load_linked(ex) if target is None else None
    return CpuKernel(text, ex, specs, signature is not None, time.perf_counter() - t0, entry)


#: byte alignment of the arrays handed to kernels (TVM's ``kAllocAlignment``): code built
#: for a wide-vector CPU may use aligned vector loads, which fault on numpy's 16-byte default
ARRAY_ALIGNMENT = 64


def _aligned(shape: tuple, dtype) -> np.ndarray:
    """An uninitialised C-ordered array of ``shape``/``dtype`` at an :data:`ARRAY_ALIGNMENT`-
    byte aligned address."""
    dtype = np.dtype(dtype)
    n = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    raw = np.empty(n + ARRAY_ALIGNMENT, dtype=np.uint8)
    off = (-raw.ctypes.data) % ARRAY_ALIGNMENT
    return raw[off:off + n].view(dtype).reshape(shape)


def _call(k: CpuKernel, arrays: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    known = {p.name for p in k.params}
    unknown = sorted(set(arrays) - known)
    if unknown:
        raise ExecError(f"unknown tensor name(s) {unknown}; the kernel takes {[p.name for p in k.params]}")
    args, outs = [], []
    for p in k.params:
        want = np_dtype(p.dtype)
        if p.name in arrays:
            x = np.asarray(arrays[p.name])
            if tuple(x.shape) != p.shape:
                raise ExecError(f"tensor {p.name} has shape {list(x.shape)}, expected {list(p.shape)}")
            if x.dtype != want:
                kinds = {x.dtype.kind, want.kind}
                if len(kinds) > 1 and not (kinds <= {"i", "u"} or kinds <= {"f", "V"}):
                    raise ExecError(f"tensor {p.name} has dtype {x.dtype}, expected {want}")
            arr = _aligned(p.shape, want)
            arr[...] = x
            if p.is_output:
                outs.append((p.name, arr))
        else:
            if k.has_signature and not p.is_output:
                raise ExecError(f"missing input tensor {p.name} ({p.role}, {p.dtype}{list(p.shape)})")
            arr = _aligned(p.shape, want)
            arr[...] = 0
            outs.append((p.name, arr))
        args.append(arr)
    # numpy has no DLPack for ml_dtypes.bfloat16: pass those through tvm.runtime.tensor copies
    wrapped = {}
    for i, (p, a) in enumerate(zip(k.params, args)):
        if p.dtype == "bfloat16":
            wrapped[i] = _tvm().runtime.tensor(a)
    call_args = [wrapped.get(i, a) for i, a in enumerate(args)]
    try:
        k.main(*call_args)
    except Exception as e:
        raise ExecError(f"kernel execution failed: {short_tvm_error(e)}") from None
    result = {}
    for name, arr in outs:
        i = next(j for j, p in enumerate(k.params) if p.name == name)
        result[name] = wrapped[i].numpy() if i in wrapped else arr
    return result


def run_cpu(module, arrays: Mapping[str, np.ndarray], signature: Signature | None = None) -> dict[str, np.ndarray]:
    """Run a kernel on the CPU and return its outputs by name.

    * ``module``: a :class:`CpuKernel`, TVMScript text, or LEIR (:class:`LeirModule`,
      ``.leir`` text, Program + ``signature``), built with :func:`build_cpu` first.
    * ``arrays``: inputs (inputs, params, constants) by LEIR name, numpy arrays of the
      declared shape; dtypes are converted within a kind (float/float, int/int), a kind
      mismatch raises. Inputs are copied, never written.
    * Outputs start zero-initialised (or from ``arrays[name]`` if given) and are returned
      as new arrays ``{name: np.ndarray}`` with the declared shape and dtype.

    Raises :class:`LoweringError` / :class:`BuildError` (building), :class:`ExecError`
    (missing/unknown/wrong-shaped array, runtime error). No time limit in process: use
    a worker (:func:`steptp.runner.pool.shared`) for that.
    """
    k = module if isinstance(module, CpuKernel) else build_cpu(module, signature)
    return k(arrays)


#: CPU kernels of verification-form texts built ahead together (:func:`prebuild_cpu`),
#: taken by :func:`run_lowered`
_PREBUILT: dict[str, CpuKernel] = {}


def prebuild_cpu(items: Sequence[tuple[str, Signature]]) -> int:
    """Build the verification-form kernels of ``items`` (``(TVMScript text, signature)``)
    in one ``tvm.compile`` of one IRModule (one LLVM object, one ``ld``, one load) and keep
    them for :func:`run_lowered`, which would otherwise build each on its own. The same
    passes and target as :func:`build_cpu`, so a kernel computes the same bits; measured
    on 24 corpus kernels: 22 ms per kernel one by one, 10.4 ms together (notes §5: one
    IRModule compiles about 2x faster). Forgets what an earlier call built. Returns how
    many were built: 0 when fewer than two differ or anything fails (then each is built on
    its own when it runs, and a bad one reports its own error). Source: ``tvm.compile`` of
    an ``IRModule`` (TVM 0.27)."""
    _PREBUILT.clear()
    todo = list(dict(items).items())
    if len(todo) < 2:
        return 0
    tvm = _tvm()
    t0 = time.perf_counter()
    try:
        funcs, specs = {}, []
        for i, (text, sig) in enumerate(todo):
            func = parse_tvmscript(text)
            specs.append(_param_specs(func, sig))
            funcs[f"k{i}"] = func.with_attr("global_symbol", f"k{i}")
        with tvm.transform.PassContext(config=VERIFY_PASS_CONFIG):
            ex = tvm.compile(tvm.IRModule(funcs), target=tvm.target.Target(CPU_TARGET),
                             tir_pipeline=_register_verify_pipeline())
        lib = _load_linked(ex, None)
        if lib is None:
            return 0
        share = (time.perf_counter() - t0) / len(todo)
        for i, (text, sig) in enumerate(todo):
            _PREBUILT[text] = CpuKernel(text, ex, specs[i], sig is not None, share, lib[f"k{i}"])
    except Exception:  # noqa: BLE001 - built one by one instead, each with its own error
        _PREBUILT.clear()
        return 0
    return len(todo)


def run_lowered(cpu_text: str, signature: Signature, input_sets: Sequence[Mapping[str, np.ndarray]],
                cuda_text: str | None = None, arch: str = DEFAULT_GPU.arch
                ) -> tuple[list[dict[str, np.ndarray]], str | None]:
    """Build ``cpu_text`` and run the CPU kernel once per input set; with ``cuda_text``
    (the GPU form of the same lowering) first generate its CUDA C source. Returns
    ``(outputs per input set, CUDA source or None)``. The unit of work of
    the verification worker in :mod:`steptp.verify`.

    When ``cpu_text`` is a verification form (``lower_module(..., poison=True)``) the GPU
    form is derived from its parse (:func:`gpu_form`) and memoised under ``cuda_text``, so
    one TVMScript parse serves the CPU build, the CUDA code generation and a later batched
    :func:`nvcc_check` of ``cuda_text`` in the same process. Raises :class:`BuildError` /
    :class:`ExecError`."""
    cuda_src = None
    if cuda_text is not None:
        adopt_gpu_form(cpu_text, cuda_text)
        cuda_src = compile_cuda_text(cuda_text, arch)
    k = _PREBUILT.pop(cpu_text, None) or build_cpu(cpu_text, signature)
    outs = []
    for i, x in enumerate(input_sets):
        try:
            outs.append(k(x))
        except ExecError as e:
            raise ExecError(f"trial {i}: {e.reason}") from None
    return outs, cuda_src


def gpu_form(func):
    """The GPU-form PrimFunc of a parsed verification-form one: poison fill blocks (marked
    :data:`~steptp.backend.tvmscript.POISON_MARK`) removed and serial loops marked
    :data:`~steptp.backend.tvmscript.THREAD_MARK` bound to their thread
    (``ForKind.THREAD_BINDING`` with an ``IterVar(None, Var("iter"), ThreadIndex, tag)``, as
    ``T.thread_binding`` parses). For a program lowered both ways the result is
    structurally equal to parsing ``lower_module(..., "cuda").text`` (tested over the
    examples and the rules' self-tests). Source: ``tvm_ffi.structural_map`` (notes §2.1,
    the reverse of its ``unbind_threads``)."""
    import tvm_ffi  # noqa: PLC0415
    from tvm import tirx  # noqa: PLC0415

    from .tvmscript import POISON_MARK, THREAD_MARK  # noqa: PLC0415

    def bind(loop):
        tag = loop.annotations.get(THREAD_MARK)
        if tag is None:
            return loop
        ann = {k: v for k, v in loop.annotations.items() if k != THREAD_MARK}
        iv = tirx.IterVar(None, tirx.Var("iter", loop.loop_var.ty), tirx.IterVar.ThreadIndex, str(tag))
        return tirx.For(loop.loop_var, loop.min, loop.extent, tirx.ForKind.THREAD_BINDING, loop.body, iv, ann,
                        loop.step, loop.span)

    def is_poison(stmt) -> bool:
        while isinstance(stmt, tirx.For):
            stmt = stmt.body
        block = getattr(stmt, "block", None)
        return block is not None and POISON_MARK in block.annotations

    def unpoison(seq):
        keep = [x for x in seq.seq if not is_poison(x)]
        if len(keep) == len(seq.seq):
            return seq
        return keep[0] if len(keep) == 1 else tirx.SeqStmt(keep)

    return tvm_ffi.structural_map(func, [(tirx.For, bind), (tirx.SeqStmt, unpoison)])


def adopt_gpu_form(cpu_text: str, cuda_text: str) -> bool:
    """Memoise :func:`gpu_form` of ``cpu_text``'s parse as the parse of ``cuda_text`` (no
    second parse). Only for a ``cpu_text`` that carries the verification marks; returns
    whether it did (otherwise ``cuda_text`` is parsed when first needed)."""
    from .tvmscript import THREAD_MARK  # noqa: PLC0415

    if cuda_text in _PARSED:
        return True
    if THREAD_MARK not in cpu_text or "wmma." in cuda_text:
        return False  # tensor-core fragments: the GPU form differs beyond the thread bindings
    _remember(cuda_text, gpu_form(parse_tvmscript(cpu_text)))
    return True


# ---------------------------------------------------------------------------
# CUDA source and nvcc
# ---------------------------------------------------------------------------


_INF_REDUCERS: list = []


def register_inf_reducers() -> None:
    """Teach TVM's reducer matching the float ``max``/``min`` reductions with the identities
    ``-inf``/``+inf`` that LEIR's implicit initialisation uses (idempotent).

    TVM 0.27 recognises a cross-thread reduction (a reduction axis bound to ``threadIdx``,
    lowered by ``LowerCrossThreadReduction`` to a warp-shuffle / shared-memory all-reduce)
    only when the block's init equals the identity of a registered reducer; its built-in
    ``max`` reducer has the identity ``min_value(dtype)`` (-3.4e38 for float32), so
    ``with T.init(): D[v] = T.float32("-inf")`` fails with "No matched reducer". Registering
    ``max(x, y)`` with ``-inf`` (and ``min`` with ``+inf``) for float dtypes keeps the exact
    LEIR semantics on both targets (integer dtypes keep ``min_value``/``max_value``).
    Source: TVM ``s_tir.schedule.RegisterReducer`` (global function, no Python wrapper).
    The two getters are deliberately leaked (one extra Python reference each): the registry
    is a C++ static that would otherwise release Python callables after the interpreter
    has finalised (abort on exit, "double free or corruption")."""
    if _INF_REDUCERS:
        return
    import ctypes  # noqa: PLC0415
    import math as _m  # noqa: PLC0415

    import tvm_ffi  # noqa: PLC0415

    tirx = _tvm().tirx
    register = tvm_ffi.get_global_func("s_tir.schedule.RegisterReducer", allow_missing=True)
    if register is None:
        _INF_REDUCERS.append(None)
        return

    def identity(inf: float, fallback):
        def get(values):
            dt = str(values[0].ty)
            return [tirx.FloatImm(dt, inf) if "float" in dt else fallback(dt)]
        return get

    pairs = [(lambda x, y: [tirx.max(x[0], y[0])], identity(-_m.inf, tirx.min_value)),
             (lambda x, y: [tirx.min(x[0], y[0])], identity(_m.inf, tirx.max_value))]
    for combiner, ident in pairs:
        fs = [tvm_ffi.convert(combiner), tvm_ffi.convert(ident)]
        for f in fs:
            ctypes.pythonapi.Py_IncRef(ctypes.py_object(f))
        register(1, fs[0], fs[1])
        _INF_REDUCERS.extend(fs)


def compile_cuda_text(text: str, arch: str = DEFAULT_GPU.arch) -> str:
    """CUDA C source of TVMScript ``text`` (``tvm.compile`` with the CUDA target; no nvcc).
    A reduction axis bound to ``threadIdx`` becomes TVM's cross-thread all-reduce (warp
    shuffles, shared memory beyond one warp); float max/min reductions with ``-inf``/``inf``
    identities are matched through :func:`register_inf_reducers`.
    Raises :class:`BuildError` when TVM fails or produces no device code."""
    tvm = _tvm()
    func = parse_tvmscript(text)
    try:
        return _device_only_source(func, cuda_target(arch))
    except BuildError:
        raise
    except Exception as e:
        raise BuildError(f"tvm.compile(cuda) failed: {short_tvm_error(e)}") from None


def _device_only_source(func, target) -> str:
    """The CUDA C that ``tvm.compile(func, target)`` puts in its device module, without the
    host side: the same steps as ``tvm.tirx.build`` (bind the target, the default pipeline,
    host/device split, the device finalisation passes, ``target.build.cuda``) less the host
    finalisation and host code generation, which nothing here runs (byte-identical source on
    30 corpus kernels; 9.0 instead of 10.8 ms per kernel). Source: tvm/tirx/build.py (0.27).
    Raises :class:`BuildError` when there is no device code."""
    import importlib  # noqa: PLC0415

    tvm = _tvm()
    tb = importlib.import_module("tvm.tirx.build")  # the module (tvm.tirx.build is also a function)
    mod = tvm.tirx.transform.BindTarget(target)(tvm.IRModule.from_expr(func))
    pipeline, _finalize_host, finalize_device = tvm.tirx.get_default_tir_pipeline(target)
    _host, devices = tb.split_host_device_mods(pipeline(mod))
    for dev_target, dev_mod in devices.items():
        dev_mod = finalize_device()(dev_mod)
        if len(dev_mod.functions):
            return tb.codegen_build(dev_mod, dev_target).inspect_source()
    raise BuildError("tvm.compile(cuda) produced no device code (no loop is bound to a thread)")


def _device_source(ex) -> str:
    imports = list(ex.mod.imports)
    if not imports:
        raise BuildError("tvm.compile(cuda) produced no device code (no loop is bound to a thread)")
    return imports[0].inspect_source()


def cuda_source(module, signature: Signature | None = None, limits: GpuLimits = DEFAULT_GPU) -> str:
    """CUDA C source (``extern "C" __global__`` kernels) of a LEIR program or TVMScript text.

    LEIR input runs :func:`steptp.backend.preflight.preflight` first (:class:`PreflightError`),
    then :func:`lower` with ``target="cuda"``; TVMScript text is compiled as is. Uses
    ``Target({"kind": "cuda", "arch": limits.arch})`` (sm_90 by default). Cost 15-25 ms per
    kernel. Raises :class:`LoweringError` / :class:`PreflightError` / :class:`BuildError`.
    Source: ``tvm.compile`` + ``Executable.mod.imports[0].inspect_source()`` (notes §3.3).
    """
    if isinstance(module, str) and is_tvmscript(module):
        return compile_cuda_text(module, limits.arch)
    preflight(module, signature, limits)
    return compile_cuda_text(lower_module(module, signature, "cuda").text, limits.arch)


def nvcc_path() -> str | None:
    """Path of ``nvcc`` on PATH, or ``None``."""
    return shutil.which("nvcc")


@dataclass
class NvccResult:
    """Outcome of one source in :func:`nvcc_check`.

    ``ok``: True (nvcc produced PTX), False (failed), None (skipped: nvcc absent).
    ``status``: ``ok`` | ``skipped`` | ``lowering`` | ``preflight`` | ``tvm`` | ``nvcc``.
    ``reason``: '' when ok, else the first error line(s). ``batch``: how many sources shared
    the nvcc run that decided this result.
    """

    ok: bool | None
    status: str
    reason: str = ""
    batch: int = 1

    def to_dict(self) -> dict:
        return {"ok": self.ok, "status": self.status, "reason": self.reason, "batch": self.batch}


#: Extra ``nvcc`` flags of the Build pass. ``-Xcicc -O0`` turns off the device front end's
#: optimiser: the pass asks whether the CUDA C compiles to PTX for the target (paper §4,
#: "Build pass"), which the EDG front end and ``ptxas`` (still run, at its default level)
#: decide; the kernels are never timed from this PTX. Measured here: 27 example kernels in
#: one ``.cu`` take 0.36 s instead of 1.19 s, one kernel 0.28 s instead of 0.38 s.
NVCC_FLAGS: tuple[str, ...] = ("-Xcicc", "-O0")


def _nvcc_errors(stderr: str, limit: int = 600) -> str:
    lines = [ln.strip() for ln in stderr.splitlines() if ln.strip()]
    errs = [ln for ln in lines if "error" in ln.lower()]
    text = " | ".join(errs[:3] or lines[:3])
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _run_nvcc(cu: str, arch: str, workdir: str, tag: str, timeout_s: float) -> str | None:
    """Compile CUDA C ``cu`` to PTX; ``None`` on success, else the error summary."""
    src = os.path.join(workdir, f"{tag}.cu")
    with open(src, "w") as f:
        f.write(cu)
    cmd = [nvcc_path() or "nvcc", "--ptx", f"-arch={arch}", *NVCC_FLAGS, "-o", os.path.join(workdir, f"{tag}.ptx"),
           src]
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return f"nvcc timed out after {timeout_s:.0f} s"
    if p.returncode != 0:
        return f"nvcc failed (exit {p.returncode}): {_nvcc_errors(p.stderr + p.stdout)}"
    return None


def _bisect(group: list[int], check, results: list, skipped: str | None = None) -> None:
    """Run ``check(group)`` (None: every member passed, else ``(status, reason)``) and
    split a failing group in halves until each failure is pinned on one source; the
    verdicts go into ``results``. ``skipped``: the members passed without nvcc (reason)."""
    err = check(group)
    if err is None:
        for i in group:
            results[i] = (NvccResult(True, "ok", "", len(group)) if skipped is None else
                          NvccResult(None, "skipped", skipped, len(group)))
        return
    if len(group) == 1:
        results[group[0]] = NvccResult(False, err[0], err[1], 1)
        return
    mid = len(group) // 2
    _bisect(group[:mid], check, results, skipped)
    _bisect(group[mid:], check, results, skipped)


_KERNEL_START = 'extern "C" __global__'
_KERNEL_NAME = re.compile(r'extern "C" __global__ void (?:__launch_bounds__\(\d+\) )?(\w+)\(')


def _split_cuda(cu: str) -> tuple[str, str]:
    """``(preamble, kernels)`` of TVM's CUDA C: the includes and helpers before the first
    ``extern "C" __global__``, and the rest."""
    i = cu.find(_KERNEL_START)
    return (cu, "") if i < 0 else (cu[:i], cu[i:])


def _is_include(line: str) -> bool:
    return line.lstrip().startswith("#include <") and line.rstrip().endswith(">")


#: Kernels that ``nvcc --ptx`` compiled in this process, by :func:`_kernel_units` key: a
#: candidate's CUDA C repeats the kernels of every loop nest its step left alone, so of the
#: 11,454 kernels of 60 corpus programs' steps 4,398 differ. Bounded (oldest forgotten).
_NVCC_OK: "collections.OrderedDict[str, None]" = collections.OrderedDict()
_NVCC_OK_SIZE = 200_000


def _kernel_units(cu: str, arch: str) -> tuple[str, list[tuple[str, str]]]:
    """``(preamble, [(key, definition)])`` of TVM's CUDA C: each ``extern "C" __global__``
    definition (up to the next one) with a key that names it apart from its kernel name
    (sha1 of the architecture, the source's own preamble and the definition with the name
    blanked); declarations (``...);``) are dropped: kernels never call each other. A
    source with no kernel is one unit (itself)."""
    pre, body = _split_cuda(cu)
    if not body:
        return pre, [(hashlib.sha1(f"{arch}\0{cu}".encode()).hexdigest(), "")]
    units = []
    head = hashlib.sha1(f"{arch}\0{pre}".encode()).hexdigest()
    for chunk in body.split(_KERNEL_START)[1:]:
        chunk = _KERNEL_START + chunk
        if "{" not in chunk and chunk.rstrip().endswith(";"):
            continue
        m = _KERNEL_NAME.match(chunk)
        blank = chunk if m is None else chunk[: m.start(1)] + "K" + chunk[m.end(1):]
        units.append((hashlib.sha1(f"{head}\0{blank}".encode()).hexdigest(), chunk))
    return pre, units


def cuda_groups(sources: Mapping[int, str]) -> list[list[int]]:
    """Sources (index -> CUDA C from TVM) grouped so that each group compiles as one file:
    a source joins the first group (largest preamble first) whose preamble contains every
    line of its own preamble other than ``#include <...>`` lines (which
    :func:`joined_cuda` puts first). TVM's preambles differ only by what they add (fp16
    helpers, ``#include <math_constants.h>``): the 6,272 kernels of the 200-program corpus
    dataset have 4 preambles, each contained in the largest, and one file per batch."""
    order = sorted(sources, key=lambda i: (-len(_split_cuda(sources[i])[0]), i))
    groups: list[tuple[set[str], list[int]]] = []
    for i in order:
        lines = {ln for ln in _split_cuda(sources[i])[0].splitlines() if not _is_include(ln)}
        for have, members in groups:
            if lines <= have:
                members.append(i)
                break
        else:
            groups.append((lines, [i]))
    return [sorted(members) for _, members in groups]


def joined_cuda(sources: Sequence[str]) -> str:
    """One CUDA C file of several TVM sources: the ``#include <...>`` lines of the other
    preambles that the largest lacks, the largest preamble once (see :func:`cuda_groups`),
    then each source's kernels with their names prefixed ``s<k>_`` (TVM names every kernel
    ``main_kernel...``)."""
    parts = [_split_cuda(cu) for cu in sources]
    preamble = max((p for p, _ in parts), key=len)
    have = set(preamble.splitlines())
    extra = list(dict.fromkeys(ln for p, _ in parts for ln in p.splitlines() if _is_include(ln) and ln not in have))
    out = extra + [preamble]
    for k, (_, body) in enumerate(parts):
        for name in sorted(set(_KERNEL_NAME.findall(body)), key=len, reverse=True):
            body = re.sub(rf"\b{re.escape(name)}\b", f"s{k}_{name}", body)
        out.append(body)
    return "\n".join(out)


def nvcc_check(sources: Sequence, limits: GpuLimits = DEFAULT_GPU, batch: bool = True,
               timeout_s: float = 600.0, keep_dir: str | None = None) -> list[NvccResult]:
    """Build pass for many kernels: TVM CUDA codegen + ``nvcc --ptx -arch=sm_90``.

    * ``sources``: each a :class:`LeirModule` (preflight + CUDA lowering first), TVMScript
      text (CUDA path, from ``lower(..., target="cuda")``), or CUDA C text (contains
      ``__global__``; with ``batch``, joined into one file per :func:`cuda_groups` group
      with renamed kernels, :func:`joined_cuda`; else one by one).
    * ``batch``: put every TVMScript kernel into one IRModule (function ``k<i>``), so one
      ``tvm.compile`` and one nvcc run cover them all; a failing batch is split in halves
      recursively until each failure is pinned on its source (cost: O(failures * log n)
      extra runs).
    * nvcc absent: every source that got that far is ``NvccResult(None, "skipped", ...)``.

    Returns one :class:`NvccResult` per source, in order. Never raises for a bad source.
    Timing (2 vCPU): one nvcc run 0.3-0.4 s; 50 kernels in one .cu about 0.6 s.
    """
    results: list[NvccResult | None] = [None] * len(sources)
    funcs: dict[int, Any] = {}
    raw: dict[int, str] = {}
    for i, s in enumerate(sources):
        try:
            if isinstance(s, str) and "__global__" in s and not is_tvmscript(s):
                raw[i] = s
                continue
            if isinstance(s, str) and is_tvmscript(s):
                text = s
            else:
                preflight(s, None, limits)
                text = lower_module(s, None, "cuda").text
            funcs[i] = parse_tvmscript(text)
        except PreflightError as e:
            results[i] = NvccResult(False, "preflight", e.reason)
        except LoweringError as e:
            results[i] = NvccResult(False, "lowering", e.reason)
        except BuildError as e:
            results[i] = NvccResult(False, "tvm", e.reason)
    have_nvcc = nvcc_path() is not None
    tvm = _tvm()
    tgt = cuda_target(limits.arch)
    workdir = keep_dir or tempfile.mkdtemp(prefix="stp-nvcc-")
    os.makedirs(workdir, exist_ok=True)
    counter = [0]

    def check(group: list[int]) -> tuple[str, str] | None:
        mod = tvm.IRModule({f"k{i}": funcs[i].with_attr("global_symbol", f"k{i}") for i in group})
        try:
            ex = tvm.compile(mod, target=tgt)
            cu = _device_source(ex)
        except BuildError as e:
            return ("tvm", e.reason)
        except Exception as e:
            return ("tvm", f"tvm.compile(cuda) failed: {short_tvm_error(e)}")
        if not have_nvcc:
            return None
        counter[0] += 1
        err = _run_nvcc(cu, limits.arch, workdir, f"batch{counter[0]}", timeout_s)
        return None if err is None else ("nvcc", err)

    def solve(group: list[int]) -> None:
        _bisect(group, check, results, None if have_nvcc else "nvcc not found on PATH (TVM CUDA codegen passed)")

    try:
        order = sorted(funcs)
        if order:
            if batch:
                solve(order)
            else:
                for i in order:
                    solve([i])
        if raw and not have_nvcc:
            for i in raw:
                results[i] = NvccResult(None, "skipped", "nvcc not found on PATH")
        elif raw:
            units = {i: _kernel_units(raw[i], limits.arch) for i in raw}

            def check_raw(group: list[int]) -> tuple[str, str] | None:
                # only kernels not yet compiled here, each once (a source compiles when each of
                # its kernels does under its preamble); a failing group is bisected by source
                new: dict[str, str] = {}
                for i in group:
                    pre, us = units[i]
                    for key, chunk in us:
                        if key not in _NVCC_OK and key not in new:
                            new[key] = pre + chunk if chunk else raw[i]
                if not new:
                    return None
                counter[0] += 1
                err = _run_nvcc(joined_cuda(list(new.values())), limits.arch, workdir, f"src{counter[0]}",
                                timeout_s)
                if err is not None:
                    return ("nvcc", err)
                for key in new:
                    _NVCC_OK[key] = None
                while len(_NVCC_OK) > _NVCC_OK_SIZE:
                    _NVCC_OK.popitem(last=False)
                return None

            for group in (cuda_groups(raw) if batch else [[i] for i in sorted(raw)]):
                _bisect(group, check_raw, results)
    finally:
        if keep_dir is None:
            shutil.rmtree(workdir, ignore_errors=True)
    return [r if r is not None else NvccResult(False, "tvm", "not processed") for r in results]




__all__ = ["CPU_TARGET", "cuda_target", "np_dtype", "is_tvmscript", "parse_tvmscript", "ParamSpec", "CpuKernel",
           "build_cpu", "prebuild_cpu", "run_cpu", "run_lowered", "gpu_form", "adopt_gpu_form", "compile_cuda_text", "cuda_source",
           "register_inf_reducers", "nvcc_path", "NvccResult", "NVCC_FLAGS", "nvcc_check"]
