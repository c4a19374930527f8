"""The Builder role: LEIR programs -> exported libraries a Runner loads with TVM's runtime only.

:func:`build_library` builds a **batch** of programs into ONE library: every program's GPU
form (after the GPU preflight) becomes one function ``k<i>`` of one IRModule, compiled by one
``tvm.compile`` for ``Target({"kind": "cuda", "arch": ARCH}, host="llvm")`` and exported once
with ``export_library`` (one host link instead of one per program; notes §5: 6.7-7.9 ms per
function batched against 14-17 ms one by one); the library's CUDA C is compiled once to PTX
(nvcc, or NVRTC) into a cache keyed by (source, arch, compiler and version, flags)
(:func:`steptp.backend.cuda_runtime.compile_ptx`). When the batch does not compile, it is
bisected until the failing programs are isolated, so one bad program costs itself only. With
``sim`` the programs' CPU forms (no poison, LLVM opt-level 0) are exported the same way
(``sim/kernel.so``) for the simulated device.

The library directory holds ``kernel.so``, ``kernel.cu``, ``sim/kernel.so`` and
``manifest.json`` (:func:`steptp.backend.cuda_runtime.write_manifest` with one entry per
function), so :func:`steptp.backend.cuda_runtime.read_built` gives each program's
:class:`~steptp.backend.cuda_runtime.Built` (``func`` = ``k<i>``).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Sequence

from ..backend.errors import BackendError, BuildError, short_tvm_error
from ..backend.hardware import DEFAULT_GPU, GpuLimits
from ..leir.fileformat import LeirModule


def _funcs(modules: Sequence[LeirModule], target: str, limits: GpuLimits, first: int = 0):
    """(index, PrimFunc named k<index>) of every program that lowers (and, for cuda, passes
    the preflight); failures as {index: BackendError}."""
    from ..backend.build import parse_tvmscript  # noqa: PLC0415
    from ..backend.preflight import preflight  # noqa: PLC0415
    from ..backend.tvmscript import lower_module  # noqa: PLC0415

    ok, bad = [], {}
    for i, m in enumerate(modules):
        try:
            if target == "cuda":
                preflight(m, None, limits)
            func = parse_tvmscript(lower_module(m, None, target).text)
            ok.append((i, func.with_attr("global_symbol", f"k{first + i}")))
        except BackendError as e:
            bad[i] = e
    return ok, bad


def _compile(funcs, target, bad: dict, bisect: bool = True):
    """``tvm.compile`` of the IRModule of ``funcs``; on failure bisect, recording the failing
    functions' errors in ``bad``, then compile the survivors together once more. Returns
    (executable or None, the functions it holds)."""
    import tvm  # noqa: PLC0415

    if not funcs:
        return None, []
    try:
        return tvm.compile(tvm.IRModule({f.attrs["global_symbol"]: f for _, f in funcs}), target=target), funcs
    except Exception as e:  # noqa: BLE001
        if len(funcs) == 1 or not bisect:
            for i, _ in funcs:
                bad[i] = BuildError(f"tvm.compile failed: {short_tvm_error(e)}")
            return None, []
    mid = len(funcs) // 2
    survivors = _isolate(funcs[:mid], target, bad) + _isolate(funcs[mid:], target, bad)
    return _compile(survivors, target, bad, bisect=False)


def _isolate(funcs, target, bad: dict) -> list:
    """The functions of ``funcs`` that compile within their half (bisection)."""
    import tvm  # noqa: PLC0415

    try:
        tvm.compile(tvm.IRModule({f.attrs["global_symbol"]: f for _, f in funcs}), target=target)
        return list(funcs)
    except Exception as e:  # noqa: BLE001
        if len(funcs) == 1:
            bad[funcs[0][0]] = BuildError(f"tvm.compile failed: {short_tvm_error(e)}")
            return []
    mid = len(funcs) // 2
    return _isolate(funcs[:mid], target, bad) + _isolate(funcs[mid:], target, bad)


def build_library(modules: Sequence[LeirModule], outdir: str | os.PathLike, *, limits: GpuLimits = DEFAULT_GPU,
                  ptx_cache: str | os.PathLike | None = None, sim: bool = True, first: int = 0) -> tuple[dict, dict]:
    """Build ``modules`` (LEIR programs) into one CUDA library in ``outdir`` (module
    docstring). Returns ``{index: Built}`` for the programs built and ``{index: reason}``
    for the others, as ``(built, failed)``; program ``i`` is function ``k<first + i>`` (a
    pack numbers its programs across libraries, so names are unique). PTX goes to ``ptx_cache`` (default
    ``outdir/ptx``). Raises :class:`BuildError` only when nothing in the batch builds
    because of the toolchain (export or the CUDA compiler failed for the whole library)."""
    from ..backend.build import CPU_TARGET, _device_source, cuda_target  # noqa: PLC0415
    from ..backend.cuda_runtime import Built, compile_ptx, compiler_tag, ptx_key, write_manifest  # noqa: PLC0415
    from ..backend.perf import _params  # noqa: PLC0415

    import tvm  # noqa: PLC0415

    out = Path(outdir)
    out.mkdir(parents=True, exist_ok=True)
    funcs, bad = _funcs(modules, "cuda", limits, first)
    ex, held = _compile(funcs, cuda_target(limits.arch, host="llvm"), bad)
    if ex is None:
        return {}, {i: str(e) for i, e in bad.items()}
    src = _device_source(ex)
    (out / "kernel.cu").write_text(src, encoding="utf-8")
    try:
        ex.export_library(str(out / "kernel.so"))
    except Exception as e:  # noqa: BLE001
        raise BuildError(f"export_library failed: {short_tvm_error(e)}") from None
    cache = Path(ptx_cache) if ptx_cache else out / "ptx"
    compile_ptx(src, cache, limits.arch)
    sim_lib = None
    idx = [i for i, _ in held]
    if sim:
        cpu_funcs, cpu_bad = _funcs([modules[i] for i in idx], "cpu", limits, first)
        cpu_funcs = [(idx[j], f.with_attr("global_symbol", f"k{first + idx[j]}")) for j, f in cpu_funcs]
        # LLVM opt-level 0 (the verification build's level): the simulated device needs the values,
        # not the speed, and opt-level 3 of 32 unrolled corpus programs in one module took minutes
        cpu_ex, cpu_held = _compile(cpu_funcs, tvm.target.Target(CPU_TARGET), cpu_bad)
        if len(cpu_held) != len(held) or cpu_ex is None:
            raise BuildError("the CPU builds of the simulated device failed: "
                             + "; ".join(str(e) for e in cpu_bad.values())[:300])
        (out / "sim").mkdir(exist_ok=True)
        sim_lib = out / "sim" / "kernel.so"
        try:
            cpu_ex.export_library(str(sim_lib))
        except Exception as e:  # noqa: BLE001
            raise BuildError(f"export_library (sim) failed: {short_tvm_error(e)}") from None
    tag = compiler_tag()
    key = ptx_key(src, limits.arch, tag)
    built = {i: Built(out, out / "kernel.so", cache, _params(modules[i]), "cuda", limits.arch, key,
                      modules[i].signature.name, tag, sim_lib, f"k{first + i}") for i in idx}
    write_manifest(list(built.values()))
    return built, {i: str(e) for i, e in bad.items()}


__all__ = ["build_library"]
