"""Kernel quality without a GPU: the machine code of the tiled candidates (issue gpu-reach).

    python benchmarks/sass_quality.py [--arch sm_90] [--json OUT.json]

For each program below (translated from PyTorch by the frontend, at the sizes users run),
the tiling proposal of its GEMM-like or convolution nest (``steptp.engine.macros.
tiling_report``: the steps the search proposes in round 0) is lowered to CUDA C
(``steptp.backend.cuda_source``), compiled with ``nvcc -cubin -arch=ARCH -O3 -Xptxas -v``
and disassembled with ``cuobjdump -sass`` (PyPI: ``nvidia-cuda-cuobjdump``; install with
``pip install 'steptp[sass]'``). Printed per program, for the kernel with the most
multiply-adds:

* ``ptxas -v``: registers per thread, shared memory per block, spill stores/loads;
* the hot loop: the backward branch whose body holds the most multiply-adds (``FFMA``,
  ``DFMA``, ``HFMA2``, ``HMMA``): its instruction count, the multiply-add share, shared-memory
  loads by width (``LDS``, ``LDS.64``, ``LDS.128``), multiply-adds per shared load, and the
  selects/branches left inside it (``SEL``/``FSEL``: the reduction's initialisation when it
  stays in the loop; TVM's ``decompose_reduction`` moves it out).

These are static figures of the code, not timings; nothing here runs on a GPU. Exit 1 when
no program could be measured."""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

FMA = ("FFMA", "DFMA", "HFMA2", "HMMA", "FFMA2")


def _tool(name: str) -> str | None:
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
    """Compile ``module``'s CUDA C for ``arch`` and read its hot loop (see the module doc)."""
    from steptp.backend import cuda_source  # noqa: PLC0415

    nvcc, cuobjdump = _tool("nvcc"), _tool("cuobjdump")
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
    name = max(funcs, key=lambda f: sum(1 for _, o, _ in funcs[f] if o.split(".")[0] in FMA))
    return {"kernel": name, "kernels": len(funcs), **regs.get(name, {}), "hot_loop": hot_loop(funcs[name])}


def programs():
    """``(name, module factory, input shapes, dtype)`` of the measured programs."""
    import torch  # noqa: PLC0415

    class MatMul(torch.nn.Module):
        def forward(self, a, b):
            return torch.matmul(a, b)

    return [
        ("matmul_1024_f32", MatMul, [(1024, 1024), (1024, 1024)], torch.float32),
        ("matmul_1024_f16", MatMul, [(1024, 1024), (1024, 1024)], torch.float16),
        ("linear_bias_4000x1000x1000_f32", lambda: torch.nn.Linear(1000, 1000), [(4000, 1000)], torch.float32),
        ("bmm_8x1000x1000x512_f32", MatMul, [(8, 1000, 512), (8, 512, 1000)], torch.float32),
        ("conv1d_16x256x4096_k3_f32", lambda: torch.nn.Conv1d(256, 256, 3), [(16, 256, 4096)], torch.float32),
        ("conv2d_8x64x56x56_k3_f32", lambda: torch.nn.Conv2d(64, 64, 3), [(8, 64, 58, 58)], torch.float32),
    ]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--arch", default="sm_90")
    ap.add_argument("--json", type=Path, default=None, help="also write the figures here")
    a = ap.parse_args()
    import torch  # noqa: PLC0415

    from steptp.engine.macros import tiling_report  # noqa: PLC0415
    from steptp.frontend.translate import translate_model  # noqa: PLC0415
    from steptp.leir import LeirModule, parse_leir  # noqa: PLC0415
    from steptp.rules import load_rules  # noqa: PLC0415

    rules = {r.id: r for r in load_rules()}
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, make, shapes, dtype in programs():
            torch.manual_seed(0)
            model = make().to(dtype)
            mod = translate_model(model, [torch.randn(*s, dtype=dtype) for s in shapes], name=name).module
            rep = tiling_report(rules, mod)
            tiled = [r for r in rep if "steps" in r]
            if not tiled:
                results[name] = {"tiled": False, "reasons": [r.get("reason") for r in rep]}
                print(f"{name}: no tiled candidate: {results[name]['reasons']}", flush=True)
                continue
            steps = tiled[0]["steps"]
            after = LeirModule(mod.signature, parse_leir(steps[-1]["leir"], "<tiled>").program)
            try:
                fig = measure(after, a.arch, Path(tmp), name)
            except Exception as e:  # noqa: BLE001 - one program's failure is reported, the rest go on
                results[name] = {"tiled": True, "error": str(e)}
                print(f"{name}: {e}", flush=True)
                continue
            fig["steps"] = [s["rule"] + (f" {json.dumps(s['params'])}" if s.get("params") else "") for s in steps]
            results[name] = {"tiled": True, **fig}
            h = fig.get("hot_loop") or {}
            print(f"{name}: {fig.get('registers')} regs, {fig.get('smem_bytes')} B smem, spills "
                  f"{fig.get('spill_stores')}/{fig.get('spill_loads')} B; hot loop {h.get('instructions')} instr, "
                  f"FMA {h.get('fma')} ({h.get('fma_share')}), LDS {h.get('lds_by_width')}, "
                  f"FMA/LDS {h.get('fma_per_shared_load')}, SEL {h.get('sel')}, HMMA {h.get('hmma')}", flush=True)
    out = {"arch": a.arch, "note": "static figures of the machine code (nvcc -O3, cuobjdump -sass); no GPU ran",
           "programs": results}
    if a.json:
        a.json.write_text(json.dumps(out, indent=1))
    if not any("hot_loop" in r for r in results.values()):
        sys.exit(1)


if __name__ == "__main__":
    os.environ.setdefault("TVM_LOG_DEBUG", "0")
    main()
