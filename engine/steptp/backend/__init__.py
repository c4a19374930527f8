"""Backend: LEIR -> TVMScript (TVM 0.27 S-TIR) -> LLVM build/run, CUDA source, nvcc, GPU preflight.

Public API::

    lower(module_or_program, signature=None, target="cpu"|"cuda") -> str      # tvmscript.py
    lower_module(...) -> Lowered                                               # text + param map
    build_cpu(text_or_module, signature=None) -> CpuKernel                     # build.py
    run_cpu(module, arrays: dict[str, ndarray], signature=None) -> dict[str, ndarray]
    cuda_source(module, signature=None) -> str
    nvcc_check(sources: list) -> list[NvccResult]
    preflight(module, signature=None) ; gpu_problems(...) ; loop_hazards(...)  # preflight.py
    BackendError > LoweringError, BuildError > PreflightError, ExecError        # errors.py
    GpuLimits, H100, DEFAULT_GPU, THREAD_LIMITS, MAX_THREADS_PER_BLOCK         # hardware.py

Importing this package imports nothing (names load on first use); the first build imports TVM.
"""

import importlib
import importlib.util

#: Public name -> defining submodule (loaded on first access, PEP 562), so that importing
#: ``steptp.backend.errors`` or ``steptp.backend.cuda_runtime`` on a runtime-only machine
#: (no lark, no TVM compiler) does not pull in the lowering and build modules.
_EXPORTS = {
    **dict.fromkeys(["CpuKernel", "NvccResult", "ParamSpec", "build_cpu", "compile_cuda_text", "cuda_source",
                     "cuda_target", "np_dtype", "nvcc_check", "nvcc_path", "parse_tvmscript", "run_cpu",
                     "run_lowered"], "build"),
    **dict.fromkeys(["BackendError", "BuildError", "ExecError", "LoweringError", "PreflightError"], "errors"),
    **dict.fromkeys(["DEFAULT_GPU", "H100", "MAX_THREADS_PER_BLOCK", "THREAD_LIMITS", "GpuLimits"], "hardware"),
    **dict.fromkeys(["gpu_problems", "loop_hazards", "preflight"], "preflight"),
    **dict.fromkeys(["TARGETS", "Lowered", "lower", "lower_module", "tvm_dtype"], "tvmscript"),
}


# ``preflight`` is both a submodule and a function: once anything imports the submodule, the
# import system binds the package attribute to the module, so the function is bound eagerly
# (when the module exists: the runtime-only copy a GPU pack carries has no compiler side).
if importlib.util.find_spec(f"{__name__}.preflight") is not None:
    from .preflight import preflight  # noqa: E402


def __getattr__(name: str):
    mod = _EXPORTS.get(name)
    if mod is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    m = importlib.import_module(mod if "." in mod else f"{__name__}.{mod}")
    value = getattr(m, name)
    globals()[name] = value
    return value


__all__ = [
    "lower", "lower_module", "Lowered", "TARGETS", "tvm_dtype",
    "build_cpu", "run_cpu", "run_lowered", "CpuKernel", "ParamSpec", "parse_tvmscript",
    "cuda_source", "compile_cuda_text", "cuda_target", "nvcc_check", "nvcc_path", "NvccResult", "np_dtype",
    "preflight", "gpu_problems", "loop_hazards",
    "BackendError", "LoweringError", "BuildError", "PreflightError", "ExecError",
    "GpuLimits", "H100", "DEFAULT_GPU", "THREAD_LIMITS", "MAX_THREADS_PER_BLOCK",
]
