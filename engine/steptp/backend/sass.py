"""Kernel quality from machine code, without a GPU: compile a LEIR program's CUDA C for an
architecture (``nvcc -cubin -O3 -Xptxas -v``), disassemble it (``cuobjdump -sass``, from the
PATH or the ``nvidia-cuda-cuobjdump`` wheel: ``pip install 'steptp[sass]'``) and read its
hot loop: the backward branch whose body holds the most multiply-adds, with its instruction
mix (multiply-add share, shared-memory loads by width, selects, branches, tensor-core
``HMMA``), and ``ptxas -v``'s registers, shared memory and spills. Used by
``benchmarks/sass_quality.py`` (issue gpu-reach) and its tests. Static figures of the code,
not timings.

Sources: NVIDIA CUDA Binary Utilities (``cuobjdump -sass``, the SASS instruction set
reference for sm_90: ``FFMA``, ``LDS.128``, ``SEL``, ``BRA``, ``HMMA``); ``ptxas -v``.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

#: SASS opcodes counted as multiply-adds (f32, f64, packed f16, tensor-core MMA)
FMA = ("FFMA", "DFMA", "HFMA2", "HMMA", "FFMA2")


def tool(name: str) -> str | None:
    """``name`` on the PATH or in the ``nvidia-cuda-*`` wheel's ``bin/`` beside Python."""
    hit = shutil.which(name)
    if hit:
        return hit
    try:
        import nvidia  # noqa: PLC0415

        for base in getattr(nvidia, "__path__", []):
            for cand in Path(base).glob(f"*/bin/{name}"):
                return str(cand)
    except ImportError:
        pass
    return None


def parse_sass(text: str) -> dict[str, list[tuple[int, str, str]]]:
    """``cuobjdump -sass`` text -> ``{function: [(address, opcode, operands), ...]}``
    (the predicate dropped; the opcode with its modifiers, e.g. ``LDS.128``)."""
    out: dict[str, list] = {}
    cur = None
    for line in text.splitlines():
        m = re.match(r"\s*Function : (\S+)", line)
        if m:
            cur = out.setdefault(m.group(1), [])
            continue
        m = re.match(r"\s*/\*([0-9a-f]{4,})\*/\s+(@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)\s*([^;]*);", line)
        if m and cur is not None:
            cur.append((int(m.group(1), 16), m.group(3), m.group(4).strip()))
    return out


def hot_loop(instrs: list[tuple[int, str, str]]) -> dict | None:
    """The backward branch (``BRA`` to a lower address) whose body holds the most
    multiply-adds (ties: the shortest body), with its instruction mix; None without a loop."""
    best = None
    for addr, op, args in instrs:
        if not op.startswith("BRA"):
            continue
        m = re.search(r"0x([0-9a-f]+)", args)
        if not m or int(m.group(1), 16) >= addr:
            continue
        lo = int(m.group(1), 16)
        body = [(a, o) for a, o, _ in instrs if lo <= a <= addr]
        fma = sum(1 for _, o in body if o.split(".")[0] in FMA)
        key = (fma, -len(body))
        if best is None or key > best[0]:
            best = (key, body)
    if best is None:
        return None
    body = best[1]
    ops = [o for _, o in body]
    lds = {}
    for o in ops:
        if o.split(".")[0] == "LDS":
            w = o.split(".", 1)[1] if "." in o else "32"
            lds[w] = lds.get(w, 0) + 1
    fma = sum(1 for o in ops if o.split(".")[0] in FMA)
    n_lds = sum(lds.values())
    return {"instructions": len(ops), "fma": fma, "fma_share": round(fma / len(ops), 3) if ops else 0.0,
            "lds_by_width": lds, "fma_per_shared_load": round(fma / n_lds, 2) if n_lds else None,
            "sel": sum(1 for o in ops if o.split(".")[0] in ("SEL", "FSEL")),
            "branches": sum(1 for o in ops if o.startswith("BRA")),
            "global_loads": sum(1 for o in ops if o.startswith("LDG")),
            "hmma": sum(1 for o in ops if o.startswith("HMMA"))}


def parse_ptxas(stderr: str) -> dict[str, dict]:
    """``ptxas -v`` output -> ``{function: {registers, smem_bytes, spill_stores, spill_loads}}``."""
    out: dict[str, dict] = {}
    cur = None
    for line in stderr.splitlines():
        m = re.search(r"Compiling entry function '(\S+)'", line) or re.search(r"Function properties for (\S+)", line)
        if m:
            cur = out.setdefault(m.group(1), {})
            continue
        if cur is None:
            continue
        m = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", line)
        if m:
            cur["spill_stores"], cur["spill_loads"] = int(m.group(1)), int(m.group(2))
        m = re.search(r"Used (\d+) registers", line)
        if m:
            cur["registers"] = int(m.group(1))
            s = re.search(r"(\d+) bytes smem", line)
            cur["smem_bytes"] = int(s.group(1)) if s else 0
    return out


def measure(module, arch: str, workdir: Path, tag: str) -> dict:
    """Compile ``module``'s CUDA C (:func:`steptp.backend.cuda_source`) for ``arch`` (e.g.
    ``sm_90``) in ``workdir`` and read the kernel with the most multiply-adds among those that
    use shared memory (all kernels when none does): ``{"kernel",
    "kernels", "registers", "smem_bytes" (per block), "spill_stores", "spill_loads" (bytes),
    "hot_loop": :func:`hot_loop`, "hmma_total": tensor-core instructions anywhere in the kernel}``. Raises ``RuntimeError`` when nvcc or cuobjdump is missing
    or fails."""
    from . import cuda_source  # noqa: PLC0415

    nvcc, cuobjdump = tool("nvcc"), tool("cuobjdump")
    if nvcc is None or cuobjdump is None:
        raise RuntimeError("needs nvcc and cuobjdump (pip install nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm)")
    src = workdir / f"{tag}.cu"
    src.write_text(cuda_source(module))
    cubin = workdir / f"{tag}.cubin"
    p = subprocess.run([nvcc, "-cubin", f"-arch={arch}", "-O3", "-Xptxas", "-v", "-o", str(cubin), str(src)],
                       capture_output=True, text=True, timeout=600)
    if p.returncode != 0:
        raise RuntimeError(f"nvcc failed: {(p.stderr or p.stdout).strip()[:400]}")
    regs = parse_ptxas(p.stderr + p.stdout)
    d = subprocess.run([cuobjdump, "-sass", str(cubin)], capture_output=True, text=True, timeout=300)
    if d.returncode != 0:
        raise RuntimeError(f"cuobjdump failed: {d.stderr.strip()[:400]}")
    funcs = parse_sass(d.stdout)
    # the tiled kernel: among kernels that use shared memory (if any), the most multiply-adds;
    # an untiled tail kernel (loop_partition's rest) may hold more unrolled ones
    tiled = [f for f in funcs if regs.get(f, {}).get("smem_bytes", 0) > 0] or list(funcs)
    name = max(tiled, key=lambda f: sum(1 for _, o, _ in funcs[f] if o.split(".")[0] in FMA))
    return {"kernel": name, "kernels": len(funcs), **regs.get(name, {}), "hot_loop": hot_loop(funcs[name]),
            "hmma_total": sum(1 for _, o, _ in funcs[name] if o.startswith("HMMA"))}



__all__ = ["FMA", "tool", "parse_sass", "hot_loop", "parse_ptxas", "measure"]
