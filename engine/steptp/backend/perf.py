"""Performance builds of LEIR programs (what :mod:`steptp.runner.timing` times), and the
build side of the GPU runtime path (:mod:`steptp.backend.cuda_runtime` runs the result).

**CPU performance form** (:func:`perf_cpu_text`, :func:`build_perf_cpu`). The verification
form (``lower_module(..., "cpu", poison=True)``) fills intermediates with NaN, marks bound
loops and is compiled at LLVM ``opt-level`` 0: right for checking, wrong for timing. The
performance form is ``lower_module(module, target="cpu")`` without poison, compiled with
LLVM at its default optimisation level (``{"kind": "llvm"}``, opt-level 3; notes §5: the
opt-level-0 matmul runs about 3x slower), and keeps the LEIR loop kinds:

==========  ==============================================================================
LEIR loop   CPU performance form
==========  ==============================================================================
``L``       serial ``range``
``P``       ``T.parallel``: TVM's thread pool, ``TVM_NUM_THREADS`` threads (see timing.py)
``V``       ``T.vectorized``: LLVM vector instructions. A ``V`` loop whose extent is a
            multiple of the machine's float32 vector width ``w`` (:func:`host_cpu`) is a
            serial loop over ``T.vectorized(w)``, and a float32 ``exp`` inside it the
            Cephes polynomial of TVM's ``topi.fast_exp`` (relative error <= 3e-7): LLVM
            has no vector ``expf`` and would call libm once per lane
``U``       ``T.unroll``
``B``       serial ``range``. A bound loop is GPU structure (a grid or block dimension).
            Making it ``T.parallel`` would build a *nested* parallel loop, which TVM
            rejects (notes §2: "Nested parallel loop is not supported"), for every program
            whose kernels contain a ``P`` loop (the loop-parallelization rule only
            parallelises loops inside a binding), and would race on reductions bound to
            ``threadIdx``. So the program's own ``P``/``V`` loops are its CPU parallelism.
==========  ==============================================================================

The two forms compute the same values (tested on seeded inputs: equal, or within 1e-6
relative where a ``V`` loop computes ``exp``). Builds target this machine's CPU
(:func:`perf_cpu_target`; TVM's plain ``llvm`` target is SSE2 without FMA).

**GPU export** (:func:`export_cuda`): the GPU form (``lower_module(..., "cuda")``) compiled by
``tvm.compile`` with ``Target({"kind": "cuda", "arch": arch}, host="llvm")``, exported with
``export_library`` as ``kernel.so`` (host code + the CUDA C source, format ``cuda``), the
source's PTX (``nvcc --ptx -arch=ARCH -O3``) cached under ``SHA1(source).ptx`` and a
``manifest.json`` naming the parameters. The CUDA C in the library is byte-identical to
:func:`steptp.backend.build.cuda_source` (tested). Needs ``tvm`` (this module imports it
lazily); running needs only the runtime (notes §3.5).
"""

from __future__ import annotations

import os
from pathlib import Path

from ..leir.fileformat import LeirModule
from .build import CpuKernel, _device_source, _tvm, build_cpu, cuda_target, parse_tvmscript
from .errors import BuildError, short_tvm_error
from .hardware import DEFAULT_GPU, GpuLimits
from .preflight import preflight
from .tvmscript import lower_module

_HOST: dict = {}


def host_cpu() -> dict:
    """``{"mcpu": LLVM's name of this machine's CPU (e.g. "znver5"), "vector_bits": 512, 256
    or 128, "vector_registers": 32 with AVX-512, else 16}``
    (``tvm.target.codegen.llvm_get_system_cpu`` / ``llvm_cpu_has_features``).
    Without ``mcpu`` TVM's ``llvm`` target is generic x86-64: SSE2, no FMA, 4 float lanes.
    Cached per process; ``STP_PERF_MCPU`` overrides the CPU name (e.g. ``generic``)."""
    if not _HOST:
        tvm = _tvm()
        cg = tvm.target.codegen
        cpu = os.environ.get("STP_PERF_MCPU") or cg.llvm_get_system_cpu()
        target = tvm.target.Target({"kind": "llvm", "mcpu": cpu})
        bits = 128
        for feature, b in (("avx512f", 512), ("avx2", 256), ("avx", 256)):
            try:
                if cg.llvm_cpu_has_features(feature, target):
                    bits = b
                    break
            except Exception:  # noqa: BLE001 - a non-x86 host: keep 128
                break
        _HOST.update(mcpu=cpu, vector_bits=bits, vector_registers=32 if bits == 512 else 16)
    return dict(_HOST)


def perf_cpu_target() -> dict:
    """LLVM target of performance builds: TVM's default optimisation level (opt-level 3),
    this machine's CPU (:func:`host_cpu`: its vector width and FMA). Kernels are built and
    timed on the same machine (a Ray worker builds its own)."""
    return {"kind": "llvm", "mcpu": host_cpu()["mcpu"]}


def perf_cpu_text(module: LeirModule) -> str:
    """TVMScript of the CPU performance form (see the module docstring): no poison, bound
    loops serial, ``P``/``U`` kept, ``V`` loops longer than the vector register file holds
    (float32 lanes x registers: 512 with AVX-512) split to the machine's float32 vector width,
    and their float32 ``exp`` computed by a vectorisable polynomial
    (:func:`steptp.backend.tvmscript.lower_module`'s ``fast_exp``/``vector_lanes``/
    ``split_above``). Shorter ``V`` loops stay one vector: LLVM's straight-line code over
    the registers beat the split loop by 10-15 % from 32 to 512 float32 lanes on Zen 5; the
    split won from 700 lanes (7 % at 1,000, 4.4x at 4,661). Raises :class:`LoweringError`."""
    cpu = host_cpu()
    lanes = cpu["vector_bits"] // 32
    return lower_module(module, None, "cpu", fast_exp=True, vector_lanes=lanes,
                        split_above=lanes * cpu["vector_registers"]).text


def build_perf_cpu(module: LeirModule, target: dict | None = None) -> CpuKernel:
    """LLVM build (:func:`perf_cpu_target`, opt-level 3) of :func:`perf_cpu_text`. Call the
    result with ``{name: array}`` like any :class:`CpuKernel`. Raises Lowering/BuildError."""
    return build_cpu(perf_cpu_text(module), module.signature, target=target or perf_cpu_target())


def _params(module: LeirModule):
    from .cuda_runtime import Param  # noqa: PLC0415
    from .tvmscript import tvm_dtype  # noqa: PLC0415

    return tuple(Param(t.name, tuple(int(s) for s in t.shape), tvm_dtype(t.dtype), t.role)
                 for t in module.signature.tensors)


def default_ptx_cache() -> Path:
    """``$STP_PTX_CACHE`` or ``~/.cache/steptp/ptx``: PTX shared by every build."""
    env = os.environ.get("STP_PTX_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "steptp" / "ptx"


def export_cuda(module: LeirModule, outdir: str | os.PathLike, *, limits: GpuLimits = DEFAULT_GPU,
                ptx: bool = True, sim: bool | None = None):
    """Build ``module``'s GPU form into ``outdir`` for :mod:`steptp.backend.cuda_runtime`:
    ``kernel.so``, ``ptx/<sha1>.ptx`` (with ``ptx``; nvcc required) and ``manifest.json``.
    Returns ``(Built, cuda_source)``. GPU preflight first (:class:`PreflightError`); TVM or
    nvcc failures raise :class:`BuildError`. Cost: one ``tvm.compile`` (15-35 ms), the
    export (a host-code link, about 0.2 s) and one nvcc run (0.3-1 s). With ``sim`` (default:
    the simulated device is on, ``STP_CUDA_SIM=1``) the CPU performance build is exported too
    (``sim/kernel.so``, the manifest's ``sim_lib``), which the simulated device runs in
    place of the CUDA library."""
    from .cuda_runtime import Built, compile_ptx, compiler_tag, ptx_key, simulated, write_manifest  # noqa: PLC0415

    preflight(module, None, limits)
    func = parse_tvmscript(lower_module(module, None, "cuda").text)
    tvm = _tvm()
    try:
        ex = tvm.compile(func, target=cuda_target(limits.arch, host="llvm"))
    except Exception as e:  # noqa: BLE001
        raise BuildError(f"tvm.compile(cuda) failed: {short_tvm_error(e)}") from None
    src = _device_source(ex)
    out = Path(outdir)
    out.mkdir(parents=True, exist_ok=True)
    lib = out / "kernel.so"
    try:
        ex.export_library(str(lib))
    except Exception as e:  # noqa: BLE001
        raise BuildError(f"export_library failed: {short_tvm_error(e)}") from None
    (out / "kernel.cu").write_text(src, encoding="utf-8")
    ptx_dir = out / "ptx"
    if ptx:
        compile_ptx(src, ptx_dir, limits.arch)
    tag = compiler_tag()
    sim_lib = export_cpu(module, out / "sim", manifest=False).lib if (simulated() if sim is None else sim) else None
    built = Built(out, lib, ptx_dir, _params(module), "cuda", limits.arch, ptx_key(src, limits.arch, tag),
                  module.signature.name, tag, sim_lib)
    write_manifest(built)
    return built, src


def export_cuda_cached(module: LeirModule, outdir: str | os.PathLike, *, limits: GpuLimits = DEFAULT_GPU,
                       ptx_cache: str | os.PathLike | None = None):
    """:func:`export_cuda` for running here: the source's PTX compiled into the shared cache
    ``ptx_cache`` (default :func:`default_ptx_cache`; a hit costs nothing) and the load-time
    callback ``tvm_callback_cuda_compile`` registered to serve it. Returns ``(Built, source)``
    ready for :func:`steptp.backend.cuda_runtime.load_built`. Raises as :func:`export_cuda`."""
    from .cuda_runtime import compile_ptx, register_ptx_cache  # noqa: PLC0415

    built, src = export_cuda(module, outdir, limits=limits, ptx=False, sim=None)
    cache = Path(ptx_cache) if ptx_cache else default_ptx_cache()
    compile_ptx(src, cache, limits.arch)
    built.ptx_dir = cache
    register_ptx_cache(cache, limits.arch)
    return built, src


def export_cpu(module: LeirModule, outdir: str | os.PathLike, target: dict | None = None, manifest: bool = True):
    """The CPU performance form exported as ``kernel.so`` + ``manifest.json`` in ``outdir``
    (loadable with the runtime only, like :func:`export_cuda`'s output; the tests run the
    runtime-only path through it on machines without a GPU). Returns the ``Built``."""
    from .cuda_runtime import Built, write_manifest  # noqa: PLC0415

    k = build_perf_cpu(module, target or {"kind": "llvm"})  # portable: it may run on another machine
    out = Path(outdir)
    out.mkdir(parents=True, exist_ok=True)
    lib = out / "kernel.so"
    try:
        k.executable.export_library(str(lib))
    except Exception as e:  # noqa: BLE001
        raise BuildError(f"export_library failed: {short_tvm_error(e)}") from None
    built = Built(out, lib, None, _params(module), "cpu", "", "", module.signature.name)
    if manifest:
        write_manifest(built)
    return built


def run_cuda_lowered(module_text: str, input_sets: list, limits: GpuLimits = DEFAULT_GPU,
                     ptx_cache: str | None = None) -> tuple[list[dict], str]:
    """Export ``module_text`` (LEIR) for CUDA into a temporary directory (PTX shared in
    ``ptx_cache``, default :func:`default_ptx_cache`), run it on the GPU once per input set
    and return ``(outputs per set, CUDA source)``. The unit of work of GPU verification in
    an :class:`~steptp.runner.worker.IsolatedRunner` worker (a CUDA fault kills at most the
    worker's context). Raises Lowering/Preflight/Build/ExecError."""
    import tempfile  # noqa: PLC0415

    from ..leir import parse_leir  # noqa: PLC0415
    from .cuda_runtime import run_module  # noqa: PLC0415

    with tempfile.TemporaryDirectory(prefix="stp-cuda-") as tmp:
        built, src = export_cuda_cached(parse_leir(module_text), tmp, limits=limits, ptx_cache=ptx_cache)
        return run_module(built, input_sets), src


__all__ = ["host_cpu", "perf_cpu_target", "perf_cpu_text", "build_perf_cpu", "export_cuda", "export_cuda_cached", "export_cpu",
           "default_ptx_cache", "run_cuda_lowered"]
