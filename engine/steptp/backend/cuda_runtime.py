"""Load, run and time exported TVM modules with the TVM *runtime* only (no ``tvm`` compiler).

This module imports nothing but the standard library, ``ctypes``, ``numpy`` and ``tvm_ffi``
(and :mod:`steptp.backend.errors`); it never imports ``tvm``, so it also works on a GPU
machine that carries only ``libtvm_runtime.so`` / ``libtvm_runtime_cuda.so`` and the
``apache-tvm-ffi`` wheel (tvm-0.27-notes §3.5). The build side (which needs ``tvm``) is
:func:`steptp.backend.perf.export_cuda`: it writes ``kernel.so`` (host code + CUDA *source*),
``manifest.json`` and the PTX of the source into a cache directory.

Recipe (notes §3.5, seen working on an H100 with CUDA 13.0, driver 580):

1. ``ctypes.CDLL(libcudart.so.13, RTLD_GLOBAL)`` and ``libcuda.so.1`` (the driver), then
   ``libtvm_runtime.so`` and ``libtvm_runtime_cuda.so`` (both ``RTLD_GLOBAL``) from the
   installed apache-tvm package directory (``tvm/lib``) or a given directory
   (:func:`load_runtime`).
2. Register ``tvm_callback_cuda_compile(code) -> bytes`` (:func:`register_ptx_cache`): the
   exported module holds CUDA C (format ``cuda``), which the CUDA runtime compiles at load
   time through that callback; it returns the PTX cached under ``SHA1(code).ptx``
   (written at build time by ``nvcc --ptx``; compiled with nvcc on a miss). Output that
   starts with ``/`` (a PTX comment) is loaded as PTX by the driver, which JIT-compiles it
   for the device, so sm_90 PTX also runs on newer GPUs.
3. ``tvm_ffi.load_module("kernel.so")["main"](*tensors)`` with device tensors allocated by
   the runtime (``runtime.TVMTensorAllocWithScope``) and filled by
   ``runtime.TVMTensorCopyFromBytes`` (:func:`run_module`).
4. Timing: TVM's ``time_evaluator`` (``runtime.RPCTimeEvaluator``), the L2 flush before each
   measurement and the interleaved rounds live in :mod:`steptp.runner.cuda_timing` (the one
   timing loop, issue 45); this module gives it the device facts (:func:`l2_cache_bytes`),
   :func:`sync` and the simulated device's sticky error.

**Simulated device** (``STP_CUDA_SIM=1``, :func:`simulated`; tests and CI on machines without
a GPU): everything above the driver is the real code (GPU-form lowering, TVM's CUDA
codegen, nvcc/NVRTC PTX and its cache, export, manifests, packing, worker processes,
pickling, timing records); only module load + launch is replaced by running the same
program's CPU build (``sim_lib`` in the manifest, exported beside the CUDA library), and
the device facts come from ``STP_CUDA_SIM_ARCH`` (default ``sm_90``). A loaded module must
still find its PTX in the cache, as on a GPU. Fault injection
(``STP_CUDA_SIM_FAULT=sticky:TEXT`` or ``hang:TEXT``) makes a launch of a module whose CUDA
source contains ``TEXT`` fail with a *sticky* error (every later launch in that process
fails too, as after a real illegal address) or hang, so the worker restart is tested.

Faults (illegal address, launch failure, missing PTX) raise
:class:`steptp.backend.errors.ExecError` carrying the CUDA / TVM error text. After an illegal
memory access the CUDA context is unusable: run GPU work in a worker process
(:class:`steptp.runner.worker.IsolatedRunner`) so that the next call starts afresh.
"""

from __future__ import annotations

import ctypes
import functools
import glob
import hashlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np

from .errors import BuildError, ExecError

#: The CUDA runtime ``libtvm_runtime_cuda.so`` of apache-tvm 0.27 is linked against.
CUDART_SONAME = "libcudart.so.13"
#: The CUDA driver library (installed with the NVIDIA driver, never with the toolkit).
LIBCUDA_SONAME = "libcuda.so.1"
TVM_RUNTIME_LIB = "libtvm_runtime.so"
TVM_RUNTIME_CUDA_LIB = "libtvm_runtime_cuda.so"
#: ``nvcc`` flags of the cached PTX (the kernels are timed from it, hence -O3; notes §3.5).
PTX_FLAGS: tuple[str, ...] = ("-O3",)
#: Environment variables of the simulated CUDA device (module docstring).
SIM_ENV, SIM_ARCH_ENV, SIM_FAULT_ENV = "STP_CUDA_SIM", "STP_CUDA_SIM_ARCH", "STP_CUDA_SIM_FAULT"
#: L2 size of the simulated device in bytes (default :data:`SIM_L2_BYTES`: small, so that the
#: flush before each simulated measurement, run on the CPU, stays quick).
SIM_L2_ENV, SIM_L2_BYTES = "STP_CUDA_SIM_L2_BYTES", 4 << 20
#: Compute capabilities whose PTX nvcc 13 can produce (compute_75 .. compute_121, notes §3.1).
MIN_ARCH = 75

_LOCK = threading.RLock()
_LOADED: dict[str, object] = {}
_PTX_DIRS: list[Path] = []
_PTX_ARCH = ["sm_90"]
_PTX_TAG = [""]
_SIM_STICKY: list[str] = []  # the simulated sticky error of this process, once raised


def simulated() -> bool:
    """True when ``STP_CUDA_SIM=1``: the simulated CUDA device (module docstring)."""
    return os.environ.get(SIM_ENV, "") == "1"


# ---------------------------------------------------------------------------
# Locating the libraries
# ---------------------------------------------------------------------------


def tvm_lib_dir(lib_dir: str | os.PathLike | None = None) -> Path | None:
    """Directory holding ``libtvm_runtime.so``: ``lib_dir`` if given, else
    ``$STP_TVM_LIB_DIR``, else ``$TVM_LIBRARY_PATH``, else the installed apache-tvm package's
    ``tvm/lib`` (found with ``importlib.util.find_spec``, which does not import ``tvm``).
    ``None`` when none holds the library."""
    cands: list[Path] = []
    for d in (lib_dir, os.environ.get("STP_TVM_LIB_DIR"), os.environ.get("TVM_LIBRARY_PATH")):
        if d:
            cands.append(Path(d))
    try:
        spec = importlib.util.find_spec("tvm")
    except (ImportError, ValueError):
        spec = None
    if spec is not None and spec.origin:
        cands.append(Path(spec.origin).parent / "lib")
    for d in cands:
        if (d / TVM_RUNTIME_LIB).is_file():
            return d
    return None


def _cuda_roots() -> list[Path]:
    roots = [os.environ.get(v) for v in ("CUDA_HOME", "CUDA_PATH", "CUDA_ROOT")]
    out = [Path(r) for r in roots if r]
    nvcc = shutil.which("nvcc")
    if nvcc:
        out.append(Path(os.path.realpath(nvcc)).parent.parent)
    out.append(Path("/usr/local/cuda"))
    out += [Path(p) for p in sorted(glob.glob("/usr/local/cuda-13*"), reverse=True)]
    return out


def find_cudart() -> str | None:
    """Path of ``libcudart.so.13``: ``$STP_CUDART``, the CUDA toolkit (``$CUDA_HOME``,
    ``$CUDA_PATH``, nvcc's toolkit, ``/usr/local/cuda*``: ``lib64``, ``lib``,
    ``targets/*/lib``), the ``nvidia-cuda-runtime`` wheel (``nvidia/cu13/lib``,
    ``nvidia/cuda_runtime/lib``) on ``sys.path``, else the dynamic linker's search path
    (``ctypes.CDLL`` by name). ``None`` when not found."""
    env = os.environ.get("STP_CUDART")
    if env and os.path.isfile(env):
        return env
    dirs: list[Path] = []
    for r in _cuda_roots():
        dirs += [r / "lib64", r / "lib"] + [Path(p) for p in glob.glob(str(r / "targets" / "*" / "lib"))]
    for p in sys.path:
        dirs += [Path(p) / "nvidia" / "cu13" / "lib", Path(p) / "nvidia" / "cuda_runtime" / "lib"]
    for d in dirs:
        f = d / CUDART_SONAME
        if f.is_file():
            return str(f)
    try:
        ctypes.CDLL(CUDART_SONAME)
        return CUDART_SONAME
    except OSError:
        return None


def find_libcuda() -> str | None:
    """``libcuda.so.1`` when the dynamic linker can load it (the NVIDIA driver is installed),
    else ``None``."""
    try:
        ctypes.CDLL(LIBCUDA_SONAME)
        return LIBCUDA_SONAME
    except OSError:
        return None


def cuda_devices() -> tuple[int, str]:
    """``(number of CUDA devices, '' or the driver's error)`` through the driver API
    (``cuInit(0)`` + ``cuDeviceGetCount``); ``(0, reason)`` without a driver."""
    try:
        lib = ctypes.CDLL(LIBCUDA_SONAME)
    except OSError:
        return 0, f"{LIBCUDA_SONAME} not found"
    rc = lib.cuInit(0)
    if rc != 0:
        return 0, f"cuInit failed: {_cu_error(lib, rc)}"
    n = ctypes.c_int(0)
    rc = lib.cuDeviceGetCount(ctypes.byref(n))
    if rc != 0:
        return 0, f"cuDeviceGetCount failed: {_cu_error(lib, rc)}"
    return int(n.value), ""


def _cu_error(lib, rc: int) -> str:
    name = ctypes.c_char_p()
    try:
        if lib.cuGetErrorName(rc, ctypes.byref(name)) == 0 and name.value:
            return name.value.decode()
    except Exception:  # noqa: BLE001
        pass
    return f"CUresult {rc}"


def device_name(index: int = 0) -> str:
    """The driver's name of CUDA device ``index`` (``NVIDIA H100 80GB HBM3``), or ''."""
    try:
        lib = ctypes.CDLL(LIBCUDA_SONAME)
        if lib.cuInit(0) != 0:
            return ""
        dev = ctypes.c_int(0)
        if lib.cuDeviceGet(ctypes.byref(dev), index) != 0:
            return ""
        buf = ctypes.create_string_buffer(256)
        if lib.cuDeviceGetName(buf, 256, dev) != 0:
            return ""
        return buf.value.decode(errors="replace")
    except OSError:
        return ""


def nvcc_path() -> str | None:
    """``nvcc`` on PATH, or ``None``."""
    return shutil.which("nvcc")


def compute_capability(index: int = 0) -> tuple[int, int] | None:
    """``(major, minor)`` of CUDA device ``index`` from the driver
    (``cuDeviceGetAttribute``: COMPUTE_CAPABILITY_MAJOR = 75, MINOR = 76), or None without a
    driver or device. With the simulated device: parsed from ``STP_CUDA_SIM_ARCH``."""
    if simulated():
        level = arch_level(os.environ.get(SIM_ARCH_ENV, "sm_90"))
        return None if level is None else divmod(level, 10)
    return _device_attributes(index, 75, 76)


@functools.lru_cache(maxsize=None)
def _device_attributes(index: int, *attrs: int) -> tuple[int, ...] | None:
    """The driver's ``cuDeviceGetAttribute`` values ``attrs`` of CUDA device ``index`` (fixed
    for the process: cached), or None without a driver or device."""
    try:
        lib = ctypes.CDLL(LIBCUDA_SONAME)
        if lib.cuInit(0) != 0:
            return None
        dev = ctypes.c_int(0)
        if lib.cuDeviceGet(ctypes.byref(dev), index) != 0:
            return None
        out = []
        for attr in attrs:
            v = ctypes.c_int(0)
            if lib.cuDeviceGetAttribute(ctypes.byref(v), attr, dev) != 0:
                return None
            out.append(int(v.value))
        return tuple(out)
    except OSError:
        return None


def l2_cache_bytes(index: int = 0) -> int | None:
    """L2 cache size in bytes of CUDA device ``index`` (``cuDeviceGetAttribute``:
    L2_CACHE_SIZE = 38; 50 MiB on an H100), or None without a driver or device. With the
    simulated device: ``STP_CUDA_SIM_L2_BYTES`` (default :data:`SIM_L2_BYTES`)."""
    if simulated():
        v = os.environ.get(SIM_L2_ENV, "")
        return int(v) if v.isdigit() else SIM_L2_BYTES
    got = _device_attributes(index, 38)
    return None if got is None else got[0]


def arch_level(arch: str) -> int | None:
    """Compute capability of an ``sm_XY`` (or ``sm_XYa``) name as ``10*X + Y`` (``sm_90a`` ->
    90), or None when it is not one."""
    digits = arch.removeprefix("sm_").rstrip("a")
    return int(digits) if arch.startswith("sm_") and digits.isdigit() and len(digits) >= 2 else None


def device_arch(index: int = 0) -> str | None:
    """``sm_XY`` of CUDA device ``index`` from its compute capability (``sm_90`` for an
    H100 or H200, ``sm_80`` for an A100), or None when there is no device. Kernels are
    generated and compiled for this architecture, so they load on that GPU."""
    cc = compute_capability(index)
    return None if cc is None else f"sm_{cc[0]}{cc[1]}"


def driver_version() -> int | None:
    """The driver's CUDA version as ``1000*major + 10*minor`` (``cuDriverGetVersion``), or None."""
    try:
        lib = ctypes.CDLL(LIBCUDA_SONAME)
        v = ctypes.c_int(0)
        return int(v.value) if lib.cuDriverGetVersion(ctypes.byref(v)) == 0 else None
    except OSError:
        return None


@functools.lru_cache(maxsize=1)
def _preload_nvrtc() -> str | None:
    """Load the CUDA 13 ``libnvrtc`` of the ``nvidia-cuda-nvrtc`` wheel (``RTLD_GLOBAL``) from
    the first ``sys.path`` entry holding ``nvidia/cu13/lib/libnvrtc.so.13`` (and its
    ``libnvrtc-builtins``, which it opens by name when compiling); returns its path
    or None. ``cuda-bindings`` (cuda-pathfinder) searches only ``site.getsitepackages()``, so a
    venv layered over another one's packages (a ``.pth``), ``PYTHONPATH`` or ``pip install
    --target`` leave the wheel's library unfound; once loaded, cuda-bindings uses it."""
    for d in sys.path:
        for sub in ("nvidia/cu13/lib", "nvidia/cuda_nvrtc/lib"):
            f = Path(d or ".") / sub / "libnvrtc.so.13"
            if f.is_file():
                try:  # the builtins first: libnvrtc opens them by name at compile time
                    for b in sorted(f.parent.glob("libnvrtc-builtins.so.13*")):
                        if ".alt." not in b.name:
                            ctypes.CDLL(str(b), mode=ctypes.RTLD_GLOBAL)
                    ctypes.CDLL(str(f), mode=ctypes.RTLD_GLOBAL)
                    return str(f)
                except OSError:
                    continue
    return None


def cuda_compiler() -> str | None:
    """``nvcc`` when on the PATH, else ``nvrtc`` when ``cuda.bindings.nvrtc`` imports and
    finds ``libnvrtc``, else None: what :func:`compile_ptx` would use."""
    if nvcc_path() is not None:
        return "nvcc"
    _preload_nvrtc()
    try:
        from cuda.bindings import nvrtc  # noqa: PLC0415

        return "nvrtc" if nvrtc.nvrtcVersion()[0] == nvrtc.nvrtcResult.NVRTC_SUCCESS else None
    except Exception:  # noqa: BLE001  (not installed, or libnvrtc.so.13 not found)
        return None


def cuda_available(need_nvcc: bool = True, lib_dir: str | os.PathLike | None = None) -> str | None:
    """``None`` when CUDA programs can be built and run here, else ONE line naming what is
    missing, checked in this order: the driver (``libcuda.so.1``), the CUDA 13 runtime
    (``libcudart.so.13``), TVM's runtime libraries, a CUDA device, a driver at least as new
    as the CUDA runtime (13.0), a device of compute capability 7.5 or newer, and
    (``need_nvcc``) a CUDA compiler (nvcc, else NVRTC from ``cuda-bindings``), which
    compiles the kernels' CUDA C to PTX. Loads nothing into TVM; cheap (no import of
    ``tvm``). With the simulated device (``STP_CUDA_SIM=1``) only the compiler and TVM's
    runtime are required."""
    why = _sim_problem(lib_dir) if simulated() else _driver_problem(lib_dir)
    if why:
        return why
    cc = compute_capability()
    if cc is not None and cc[0] * 10 + cc[1] < MIN_ARCH:
        return f"CUDA device of compute capability {cc[0]}.{cc[1]}: CUDA 13 compiles for 7.5 and newer only"
    if need_nvcc and cuda_compiler() is None:
        return "no CUDA compiler (no nvcc on PATH and no NVRTC from cuda-bindings) to compile the kernels' CUDA C"
    return None


def _sim_problem(lib_dir) -> str | None:
    """What the simulated device lacks: TVM's runtime, or a valid ``STP_CUDA_SIM_ARCH``."""
    if tvm_lib_dir(lib_dir) is None:
        return f"no TVM runtime ({TVM_RUNTIME_LIB} not found; set STP_TVM_LIB_DIR)"
    if compute_capability() is None:
        return f"simulated CUDA device: bad {SIM_ARCH_ENV} (expected sm_XY)"
    return None


def _driver_problem(lib_dir) -> str | None:
    """What a real CUDA device lacks: driver, runtime, TVM's runtimes, a device, a new
    enough driver."""
    if find_libcuda() is None:
        return f"no CUDA driver ({LIBCUDA_SONAME} not found)"
    if find_cudart() is None:
        return f"no CUDA runtime ({CUDART_SONAME} not found; set STP_CUDART or CUDA_HOME)"
    d = tvm_lib_dir(lib_dir)
    if d is None:
        return f"no TVM runtime ({TVM_RUNTIME_LIB} not found; set STP_TVM_LIB_DIR)"
    if not (d / TVM_RUNTIME_CUDA_LIB).is_file():
        return f"no TVM CUDA runtime ({TVM_RUNTIME_CUDA_LIB} not in {d})"
    n, why = cuda_devices()
    if n == 0:
        return f"no CUDA device ({why or 'cuDeviceGetCount returned 0'})"
    drv = driver_version()
    if drv is not None and drv < 13000:
        return (f"the NVIDIA driver supports CUDA {drv // 1000}.{drv % 1000 // 10}, older than the CUDA 13.0 runtime "
                "TVM's CUDA runtime needs (update the driver)")
    return None


# ---------------------------------------------------------------------------
# Loading the runtime
# ---------------------------------------------------------------------------


def load_runtime(device: str = "cuda", lib_dir: str | os.PathLike | None = None) -> None:
    """Load TVM's runtime into this process (idempotent): for ``device="cuda"`` first
    ``libcudart.so.13`` and ``libcuda.so.1``, then ``libtvm_runtime.so`` and (cuda)
    ``libtvm_runtime_cuda.so``, all ``RTLD_GLOBAL`` (notes §3.5). When ``tvm`` is already
    imported the same files are reused. Raises :class:`ExecError` naming what is missing."""
    if device == "cuda" and simulated():
        device = "cpu"  # the simulated device runs CPU builds: no driver, no CUDA runtime
    with _LOCK:
        if device in _LOADED:
            return
        import tvm_ffi  # noqa: F401,PLC0415  (loads libtvm_ffi.so)

        d = tvm_lib_dir(lib_dir)
        if d is None:
            raise ExecError(f"no TVM runtime ({TVM_RUNTIME_LIB} not found; set STP_TVM_LIB_DIR)")
        if device == "cuda":
            cudart = find_cudart()
            if cudart is None:
                raise ExecError(f"no CUDA runtime ({CUDART_SONAME} not found; set STP_CUDART or CUDA_HOME)")
            try:
                ctypes.CDLL(cudart, mode=ctypes.RTLD_GLOBAL)
                ctypes.CDLL(LIBCUDA_SONAME, mode=ctypes.RTLD_GLOBAL)
            except OSError as e:
                raise ExecError(f"no CUDA driver: {e}") from None
        try:
            ctypes.CDLL(str(d / TVM_RUNTIME_LIB), mode=ctypes.RTLD_GLOBAL)
            if device == "cuda":
                ctypes.CDLL(str(d / TVM_RUNTIME_CUDA_LIB), mode=ctypes.RTLD_GLOBAL)
        except OSError as e:
            raise ExecError(f"cannot load TVM's runtime from {d}: {e}") from None
        _LOADED[device] = d


def _global(name: str):
    import tvm_ffi  # noqa: PLC0415

    f = tvm_ffi.get_global_func(name, allow_missing=True)
    if f is None:
        raise ExecError(f"TVM runtime function {name} is not registered (is {TVM_RUNTIME_LIB} loaded?)")
    return f


# ---------------------------------------------------------------------------
# PTX cache and the load-time compile callback
# ---------------------------------------------------------------------------


_TAGS: dict[str, str] = {}


def compiler_tag(compiler: str | None = None) -> str:
    """What produced a PTX, for its cache key: ``nvcc-13.0.48 -O3`` (nvcc's release line and
    :data:`PTX_FLAGS`) or ``nvrtc-13.0`` (NVRTC optimises by default); '' when there is no
    compiler. A PTX made by
    another compiler, version or flags is never served for this one."""
    compiler = compiler or cuda_compiler()
    if compiler is None:
        return ""
    if compiler in _TAGS:
        return _TAGS[compiler]
    tag = compiler
    if compiler == "nvcc":
        try:
            out = subprocess.run([nvcc_path(), "--version"], capture_output=True, text=True, timeout=60).stdout
            rel = [ln for ln in out.splitlines() if "release" in ln or ln.startswith("Build")]
            tag = "nvcc-" + (rel[-1].split()[-1] if rel else "unknown")
        except (OSError, subprocess.TimeoutExpired):
            tag = "nvcc-unknown"
    elif compiler == "nvrtc":
        _preload_nvrtc()
        try:
            from cuda.bindings import nvrtc  # noqa: PLC0415

            _, major, minor = nvrtc.nvrtcVersion()
            tag = f"nvrtc-{major}.{minor}"
        except Exception:  # noqa: BLE001
            tag = "nvrtc-unknown"
    if compiler == "nvcc":
        tag = f"{tag} {' '.join(PTX_FLAGS)}"
    _TAGS[compiler] = tag
    return tag


def ptx_key(cuda_source: str, arch: str = "sm_90", tag: str | None = None) -> str:
    """Cache key of a CUDA C source compiled for ``arch`` by the compiler ``tag``
    (:func:`compiler_tag`; default: this machine's): SHA1 of ``arch``, ``tag`` and the
    source's UTF-8 bytes. The same source for another architecture, compiler version or
    flags gets another key, so a stale PTX is never served."""
    tag = compiler_tag() if tag is None else tag
    h = hashlib.sha1(f"{arch}\0{tag}\0".encode("utf-8"))
    h.update(cuda_source.encode("utf-8"))
    return h.hexdigest()


def cuda_include_dirs() -> list[str]:
    """Include directories NVRTC needs for TVM's CUDA C: the toolkit's ``include`` and
    ``include/cccl`` (CUDA 13 keeps libcu++'s ``cuda/std/*`` there; notes §3.5)."""
    out = []
    for r in _cuda_roots():
        for d in (r / "include", r / "include" / "cccl"):
            if d.is_dir() and str(d) not in out:
                out.append(str(d))
    return out


def _nvrtc_ptx(cuda_source: str, arch: str) -> bytes:
    _preload_nvrtc()
    from cuda.bindings import nvrtc  # noqa: PLC0415

    def check(res, what):
        err = res[0] if isinstance(res, tuple) else res
        if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
            raise BuildError(f"NVRTC {what} failed: {err}")
        return res[1:] if isinstance(res, tuple) else ()

    (prog,) = check(nvrtc.nvrtcCreateProgram(cuda_source.encode(), b"kernel.cu", 0, [], []), "create")
    opts = [f"--gpu-architecture=compute_{arch.removeprefix('sm_').rstrip('a')}".encode(), b"-default-device"]
    opts += [f"-I{d}".encode() for d in cuda_include_dirs()]
    (res,) = nvrtc.nvrtcCompileProgram(prog, len(opts), opts)
    if res != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        (size,) = check(nvrtc.nvrtcGetProgramLogSize(prog), "log")
        log = b" " * size
        nvrtc.nvrtcGetProgramLog(prog, log)
        lines = [ln for ln in log.decode(errors="replace").splitlines() if "error" in ln.lower()]
        raise BuildError(f"NVRTC failed: {' | '.join(lines[:3]) or res}")
    (size,) = check(nvrtc.nvrtcGetPTXSize(prog), "PTX size")
    buf = b" " * size
    check(nvrtc.nvrtcGetPTX(prog, buf), "PTX")
    return buf.rstrip(b"\0 ")


def compile_ptx(cuda_source: str, cache_dir: str | os.PathLike, arch: str = "sm_90", timeout_s: float = 600.0) -> Path:
    """PTX of ``cuda_source`` for ``arch`` in ``cache_dir/<key>.ptx`` (:func:`ptx_key`; an
    existing entry is kept, a new one is renamed into place atomically): ``nvcc --ptx
    -arch=ARCH -O3``, or NVRTC (``cuda-bindings``, with the toolkit's ``include/cccl``) when
    nvcc is absent. Returns the path. Raises :class:`BuildError` with the compiler's first
    error lines, or when there is no compiler."""
    cache = Path(cache_dir)
    cache.mkdir(parents=True, exist_ok=True)
    compiler = cuda_compiler()
    out = cache / f"{ptx_key(cuda_source, arch, compiler_tag(compiler))}.ptx"
    if out.is_file():
        return out
    if compiler is None:
        raise BuildError("no CUDA compiler (no nvcc on PATH, no NVRTC): cannot compile the CUDA source to PTX")
    with tempfile.TemporaryDirectory(prefix="stp-ptx-", dir=cache) as tmp:
        src, ptx = Path(tmp) / "k.cu", Path(tmp) / "k.ptx"
        if compiler == "nvrtc":
            ptx.write_bytes(_nvrtc_ptx(cuda_source, arch))
        else:
            src.write_text(cuda_source, encoding="utf-8")
            try:
                p = subprocess.run([nvcc_path(), "--ptx", f"-arch={arch}", *PTX_FLAGS, "-o", str(ptx), str(src)],
                                   capture_output=True, text=True, timeout=timeout_s)
            except subprocess.TimeoutExpired:
                raise BuildError(f"nvcc timed out after {timeout_s:.0f} s") from None
            if p.returncode != 0:
                lines = [ln.strip() for ln in (p.stderr + p.stdout).splitlines() if ln.strip()]
                errs = [ln for ln in lines if "error" in ln.lower()] or lines
                raise BuildError(f"nvcc failed (exit {p.returncode}): {' | '.join(errs[:3])}")
        os.replace(ptx, out)
    return out


def cached_ptx(cuda_source: str, arch: str | None = None, tag: str | None = None) -> Path | None:
    """The PTX file of ``cuda_source`` in the registered cache directories, or None."""
    key = ptx_key(cuda_source, arch or _PTX_ARCH[0], _PTX_TAG[0] if tag is None else tag)
    for d in _PTX_DIRS:
        for f in (d / f"{key}.ptx", d / f"{key}.ptx.gz"):  # packs store PTX gzipped (about 10x smaller)
            if f.is_file():
                return f
    return None


def read_ptx(path: Path) -> bytes:
    """Bytes of a PTX file (``.ptx``, or ``.ptx.gz`` as packs store them)."""
    if path.suffix == ".gz":
        import gzip  # noqa: PLC0415

        return gzip.decompress(path.read_bytes())
    return path.read_bytes()


def _ptx_callback(code, *_rest) -> bytes:
    """``tvm_callback_cuda_compile``: the cached PTX of ``code`` (compiled on a miss, when
    this machine has a compiler)."""
    code = str(code)
    f = cached_ptx(code)
    if f is not None:
        return read_ptx(f)
    if not _PTX_DIRS:
        raise RuntimeError("steptp: no PTX cache directory registered")
    if cuda_compiler() is None:
        raise RuntimeError(f"steptp: no PTX for this kernel ({_PTX_ARCH[0]}, {_PTX_TAG[0]!r}) in "
                           f"{[str(d) for d in _PTX_DIRS]} and no CUDA compiler here")
    return compile_ptx(code, _PTX_DIRS[0], _PTX_ARCH[0]).read_bytes()


def register_ptx_cache(cache_dir: str | os.PathLike, arch: str = "sm_90", tag: str | None = None) -> None:
    """Register ``tvm_callback_cuda_compile`` (``override=True``) so that loading a module
    whose device code is CUDA C returns the PTX from ``cache_dir`` (searched first; several
    directories may be registered), keyed by :func:`ptx_key` with ``arch`` and the compiler
    ``tag`` (default: this machine's; a GPU node without a compiler passes the pack's); a
    miss is compiled for ``arch`` into the first directory registered. When the full
    ``tvm`` package is installed but not imported yet, it is imported first: its own
    registration of the callback (``tvm.support.nvcc``) would otherwise fail on ours."""
    import tvm_ffi  # noqa: PLC0415

    if "tvm" not in sys.modules and not simulated():
        try:
            if importlib.util.find_spec("tvm") is not None:
                import tvm  # noqa: F401,PLC0415
        except Exception:  # noqa: BLE001  (a runtime-only node: no compiler package)
            pass
    with _LOCK:
        d = Path(cache_dir).resolve()
        if d in _PTX_DIRS:
            _PTX_DIRS.remove(d)
        _PTX_DIRS.insert(0, d)
        _PTX_ARCH[0] = arch
        _PTX_TAG[0] = compiler_tag() if tag is None else tag
        tvm_ffi.register_global_func("tvm_callback_cuda_compile", _ptx_callback, override=True)


# ---------------------------------------------------------------------------
# Modules, tensors, runs
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Param:
    """One kernel parameter of an exported module (``manifest.json``): LEIR ``name``,
    ``shape`` (elements), numpy ``dtype`` name, ``role`` (input/param/constant/output)."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    role: str

    @property
    def is_output(self) -> bool:
        return self.role == "output"


@dataclass
class Built:
    """An exported module on disk (:func:`steptp.backend.perf.export_cuda` writes it):
    ``lib`` (``kernel.so``), ``ptx_dir``, ``params`` (call order), ``device``
    (``cuda``/``cpu``), ``arch``, ``cuda_sha1`` (:func:`ptx_key` of its PTX; '' for cpu),
    ``program``, ``ptx_tag`` (the compiler tag of its PTX) and ``sim_lib`` (the CPU build
    the simulated device runs instead of the CUDA library; None when not exported) and
    ``func``, the library function of this program (``main``; ``k<i>`` in a batched library
    of :func:`steptp.runner.builder.build_library`)."""

    directory: Path
    lib: Path
    ptx_dir: Path | None
    params: tuple[Param, ...]
    device: str
    arch: str = ""
    cuda_sha1: str = ""
    program: str = ""
    ptx_tag: str = ""
    sim_lib: Path | None = None
    func: str = "main"


MANIFEST = "manifest.json"


def read_built(directory: str | os.PathLike, func: str | None = None) -> Built:
    """The :class:`Built` of a directory written by ``export_cuda`` / ``export_cpu`` /
    ``build_library`` (``manifest.json`` + library); ``func`` picks a function of a batched
    library (default: its only one). Raises :class:`ExecError` when it is incomplete."""
    d = Path(directory)
    try:
        m = json.loads((d / MANIFEST).read_text(encoding="utf-8"))
        funcs = m.get("functions") or {"main": {"program": m.get("program", ""), "params": m["params"]}}
        name = func or next(iter(funcs))
        f = funcs[name]
        params = tuple(Param(p["name"], tuple(int(s) for s in p["shape"]), p["dtype"], p["role"]) for p in f["params"])
        lib = d / m["lib"]
        ptx = d / m["ptx_dir"] if m.get("ptx_dir") else None
        built = Built(d, lib, ptx, params, m["device"], m.get("arch", ""), m.get("cuda_sha1", ""), f.get("program", ""),
                      m.get("ptx_tag", ""), d / m["sim_lib"] if m.get("sim_lib") else None, name)
    except (OSError, ValueError, KeyError, TypeError, StopIteration) as e:
        raise ExecError(f"{d}: not a built module directory ({MANIFEST}: {e})") from None
    if not built.lib.is_file():
        raise ExecError(f"{d}: {built.lib.name} is missing")
    return built


def write_manifest(built: "Built | Sequence[Built]") -> None:
    """Write ``manifest.json`` of ``built`` (one Built, or the Builts of one batched library;
    paths relative to its directory)."""
    many = list(built) if isinstance(built, (list, tuple)) else [built]
    b = many[0]
    params = {x.func: {"program": x.program, "params": [{"name": p.name, "shape": list(p.shape), "dtype": p.dtype,
                                                         "role": p.role} for p in x.params]} for x in many}
    m = {"lib": os.path.relpath(b.lib, b.directory),
         "ptx_dir": (os.path.relpath(b.ptx_dir, b.directory) if b.ptx_dir else None),
         "device": b.device, "arch": b.arch, "cuda_sha1": b.cuda_sha1, "ptx_tag": b.ptx_tag,
         "sim_lib": os.path.relpath(b.sim_lib, b.directory) if b.sim_lib else None}
    if len(many) == 1 and b.func == "main":
        m.update(program=b.program, params=params["main"]["params"])
    else:
        m["functions"] = params
    (b.directory / MANIFEST).write_text(json.dumps(m, indent=1) + "\n", encoding="utf-8")


def exec_device(device: str) -> str:
    """The device a run on ``device`` really uses: ``cpu`` for ``cuda`` on the simulated
    device (``STP_CUDA_SIM=1``), else ``device``."""
    return "cpu" if device == "cuda" and simulated() else device


def _device(device: str):
    import tvm_ffi  # noqa: PLC0415

    return tvm_ffi.device(exec_device(device), 0)


def function_source(cuda_source: str, func: str) -> str:
    """The part of a library's CUDA C that belongs to function ``func``: for ``main`` the
    whole source; in a batched library the ``__global__`` kernels named ``<func>_kernel...``
    (TVM names a function's kernels after its global symbol)."""
    if func == "main":
        return cuda_source
    import re  # noqa: PLC0415

    parts = re.split(r'(?=extern "C" __global__)', cuda_source)
    return "".join(p for p in parts if re.search(rf"\b{re.escape(func)}_kernel\w*\(", p.split("{", 1)[0]))


def _sim_launch_check(built: Built) -> None:
    """Simulated device only: the injected faults of ``STP_CUDA_SIM_FAULT`` (module docstring)
    and the sticky error of an earlier fault in this process."""
    if _SIM_STICKY:
        raise ExecError(f"CUDA error: an illegal memory access was encountered (simulated sticky error, first raised "
                        f"by {_SIM_STICKY[0]}; the CUDA context of this process is unusable)")
    spec = os.environ.get(SIM_FAULT_ENV, "")
    kind, _, text = spec.partition(":")
    if not text or kind not in ("sticky", "hang"):
        return
    try:
        src = (built.directory / "kernel.cu").read_text(encoding="utf-8")
    except OSError:
        return
    if text not in function_source(src, built.func):
        return
    if kind == "hang":
        import time  # noqa: PLC0415

        time.sleep(3600)
    _SIM_STICKY.append(built.program or str(built.directory))
    raise ExecError("CUDA error: an illegal memory access was encountered (simulated fault)")


def load_built(built: Built, lib_dir: str | os.PathLike | None = None):
    """Load ``built.lib`` with ``tvm_ffi.load_module`` after :func:`load_runtime` and (cuda)
    :func:`register_ptx_cache`. The CUDA part is compiled (cached PTX) and loaded into the
    driver here. Raises :class:`ExecError` with TVM's / CUDA's text."""
    import tvm_ffi  # noqa: PLC0415

    load_runtime(built.device, lib_dir)
    if built.device == "cuda" and built.ptx_dir is not None:
        register_ptx_cache(built.ptx_dir, built.arch or "sm_90", built.ptx_tag or None)
    lib = built.lib
    if built.device == "cuda" and simulated():
        # the simulated device: the load would ask the callback for the PTX, so it must exist
        try:
            src = (built.directory / "kernel.cu").read_text(encoding="utf-8")
        except OSError as e:
            raise ExecError(f"cannot load {built.lib}: kernel.cu missing ({e})") from None
        if cached_ptx(src, built.arch or "sm_90", built.ptx_tag or None) is None:
            raise ExecError(f"cannot load {built.lib}: no PTX for its CUDA source ({built.arch}, {built.ptx_tag!r}) in "
                            f"{[str(d) for d in _PTX_DIRS]}")
        if built.sim_lib is None:
            raise ExecError(f"cannot load {built.lib} on the simulated CUDA device: no CPU build (sim_lib) exported")
        lib = built.sim_lib
    try:
        return tvm_ffi.load_module(str(lib))
    except Exception as e:  # noqa: BLE001
        raise ExecError(f"cannot load {built.lib}: {_short(e)}") from None


def _short(e: BaseException, limit: int = 400) -> str:
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
    # TVM errors end with the message after a traceback; keep the last meaningful lines
    msg = " | ".join(ln for ln in lines if not ln.startswith(("File ", "at ", "[bt]")))[-limit:]
    return f"{type(e).__name__}: {msg}" if msg else type(e).__name__


def to_device(arr: np.ndarray, device: str, dtype: str | None = None):
    """A runtime tensor on ``device`` holding a copy of ``arr`` (C order; any dtype,
    bfloat16 included: the bytes are copied with ``runtime.TVMTensorCopyFromBytes``)."""
    import tvm_ffi  # noqa: PLC0415

    a = np.require(arr, requirements="C")  # not ascontiguousarray: it makes a 0-d (scalar) output 1-d
    t = _global("runtime.TVMTensorAllocWithScope")(tvm_ffi.Shape([int(s) for s in a.shape]),
                                                    tvm_ffi.dtype(dtype or _dtype_name(a.dtype)), _device(device), None)
    _global("runtime.TVMTensorCopyFromBytes")(t, a.ctypes.data_as(ctypes.c_void_p), a.nbytes)
    return t


def from_device(t, shape: Sequence[int], dtype: np.dtype) -> np.ndarray:
    """Copy a runtime tensor back into a new numpy array of ``shape``/``dtype``."""
    out = np.empty(tuple(shape), dtype=dtype)
    _global("runtime.TVMTensorCopyToBytes")(t, out.ctypes.data_as(ctypes.c_void_p), out.nbytes)
    return out


def copy_into(t, arr: np.ndarray) -> None:
    """Copy ``arr`` into the runtime tensor ``t`` allocated by :func:`to_device` (same shape,
    dtype and byte size; no allocation: a long-lived runner refills its tensors this way)."""
    a = np.require(arr, requirements="C")
    _global("runtime.TVMTensorCopyFromBytes")(t, a.ctypes.data_as(ctypes.c_void_p), a.nbytes)


def launch(built: Built, module, args: Sequence) -> None:
    """Call ``module[built.func](*args)`` (``args``: runtime tensors in ``built.params`` order)
    and wait for the device. On the simulated device the injected faults apply first
    (:func:`_sim_launch_check`). Raises :class:`ExecError` with the CUDA / TVM error text."""
    try:
        if built.device == "cuda" and simulated():
            _sim_launch_check(built)
        module[built.func](*args)
        sync(built.device)
    except ExecError:
        raise
    except Exception as e:  # noqa: BLE001
        raise ExecError(f"kernel execution failed on {built.device}: {_short(e)}") from None


def _dtype_name(dt: np.dtype) -> str:
    return "bfloat16" if dt.name == "bfloat16" else str(dt)


def _np_dtype(name: str) -> np.dtype:
    if name == "bfloat16":
        import ml_dtypes  # noqa: PLC0415

        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(name)


def sync(device: str) -> None:
    """Wait for the device's default stream (surfaces asynchronous CUDA faults)."""
    _global("runtime.Device_StreamSync")(_device(device), 0)


def device_args(params: Sequence[Param], device: str, arrays: Mapping[str, np.ndarray]) -> list:
    """Runtime tensors on ``device`` in parameter order: every non-output from ``arrays``;
    outputs from ``arrays`` when given (e.g. poisoned), else zeros. Raises
    :class:`ExecError` for a missing input or a wrong shape."""
    args = []
    for p in params:
        want = _np_dtype(p.dtype)
        if p.name in arrays:
            a = np.asarray(arrays[p.name])
            if tuple(a.shape) != p.shape:
                raise ExecError(f"tensor {p.name} has shape {list(a.shape)}, expected {list(p.shape)}")
            a = a.astype(want, copy=False)
        elif p.is_output:
            a = np.zeros(p.shape, dtype=want)
        else:
            raise ExecError(f"missing input tensor {p.name} ({p.role}, {p.dtype}{list(p.shape)})")
        args.append(to_device(a, device, p.dtype))
    return args


def run_module(built: Built, input_sets: Sequence[Mapping[str, np.ndarray]], module=None,
               lib_dir: str | os.PathLike | None = None) -> list[dict[str, np.ndarray]]:
    """Run an exported module once per input set on its device; returns the outputs of each
    run by name (numpy). Outputs start from the arrays given under their names (the
    verification passes poisoned outputs), else zeros. A kernel fault (illegal address,
    launch failure...) raises :class:`ExecError` with the CUDA error text."""
    mod = module if module is not None else load_built(built, lib_dir)
    sim = built.device == "cuda" and simulated()
    outs = []
    for k, arrays in enumerate(input_sets):
        args = device_args(built.params, built.device, arrays)
        try:
            if sim:
                _sim_launch_check(built)
            mod[built.func](*args)
            sync(built.device)
        except Exception as e:  # noqa: BLE001
            raise ExecError(f"trial {k}: kernel execution failed on {built.device}: {_short(e)}") from None
        res = {}
        for p, t in zip(built.params, args):
            if p.is_output:
                try:
                    res[p.name] = from_device(t, p.shape, _np_dtype(p.dtype))
                except Exception as e:  # noqa: BLE001
                    raise ExecError(f"trial {k}: copying {p.name} back failed: {_short(e)}") from None
        outs.append(res)
    return outs


__all__ = ["CUDART_SONAME", "LIBCUDA_SONAME", "PTX_FLAGS", "tvm_lib_dir", "find_cudart", "find_libcuda",
           "cuda_devices", "device_name", "nvcc_path", "cuda_available", "simulated", "compute_capability",
           "device_arch", "arch_level", "l2_cache_bytes", "SIM_L2_ENV", "SIM_L2_BYTES", "driver_version", "cuda_compiler", "compiler_tag", "cached_ptx", "read_ptx", "exec_device", "load_runtime", "ptx_key", "compile_ptx",
           "register_ptx_cache", "Param", "Built", "MANIFEST", "read_built", "write_manifest", "load_built",
           "to_device", "from_device", "copy_into", "launch", "sync", "device_args", "run_module"]
