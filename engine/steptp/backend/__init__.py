"""Backend: LEIR -> TVMScript (TVM 0.27 S-TIR) -> LLVM build/run, CUDA source, nvcc, GPU preflight.

Public API::

    lower(module_or_program, signature=None, target="cpu"|"cuda") -> str      # tvmscript.py
    lower_module(...) -> Lowered                                               # text + param map
    build_cpu(text_or_module, signature=None) -> CpuKernel                     # build.py
    run_cpu(module, arrays: dict[str, ndarray], signature=None) -> dict[str, ndarray]
    cuda_source(module, signature=None) -> str
    nvcc_check(sources: list) -> list[NvccResult]
    IsolatedRunner(timeout_s).call(fn, *args)                                  # spawn worker
    preflight(module, signature=None) ; gpu_problems(...) ; loop_hazards(...)  # preflight.py
    BackendError > LoweringError, BuildError > PreflightError, ExecError        # errors.py
    GpuLimits, H100, DEFAULT_GPU, THREAD_LIMITS, MAX_THREADS_PER_BLOCK         # hardware.py

Importing this package does not import TVM; the first build does.
"""

from .build import (CpuKernel, IsolatedRunner, NvccResult, ParamSpec, build_cpu, compile_cuda_text, cuda_source,
                    cuda_target, np_dtype, nvcc_check, nvcc_path, parse_tvmscript, run_cpu, run_lowered)
from .errors import BackendError, BuildError, ExecError, LoweringError, PreflightError
from .hardware import DEFAULT_GPU, H100, MAX_THREADS_PER_BLOCK, THREAD_LIMITS, GpuLimits
from .preflight import gpu_problems, loop_hazards, preflight
from .tvmscript import TARGETS, Lowered, lower, lower_module, tvm_dtype

__all__ = [
    "lower", "lower_module", "Lowered", "TARGETS", "tvm_dtype",
    "build_cpu", "run_cpu", "run_lowered", "CpuKernel", "ParamSpec", "parse_tvmscript",
    "cuda_source", "compile_cuda_text", "cuda_target", "nvcc_check", "nvcc_path", "NvccResult", "np_dtype",
    "IsolatedRunner",
    "preflight", "gpu_problems", "loop_hazards",
    "BackendError", "LoweringError", "BuildError", "PreflightError", "ExecError",
    "GpuLimits", "H100", "DEFAULT_GPU", "THREAD_LIMITS", "MAX_THREADS_PER_BLOCK",
]
