"""Kernel quality without a GPU: the machine code of the tiled candidates (issue gpu-reach).

    python benchmarks/sass_quality.py [--arch sm_90] [--json OUT.json]

For each program below (translated from PyTorch by the frontend, at the sizes users run),
the tiling proposal of its GEMM-like or convolution nest (``steptp.engine.macros.
tiling_report``: the steps the search proposes in round 0) is lowered to CUDA C
(``steptp.backend.cuda_source``), compiled with ``nvcc -cubin -arch=ARCH -O3 -Xptxas -v``
and disassembled (``steptp.backend.sass``) with ``cuobjdump -sass`` (PyPI: ``nvidia-cuda-cuobjdump``; install with
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
import sys
import tempfile
from pathlib import Path

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

    from steptp.backend.sass import measure  # noqa: PLC0415
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
            cuda_cores = [r for r in tiled if not r.get("tensor_core")][:1]
            tensor_cores = [r for r in tiled if r.get("tensor_core")][:1]
            for key, entry in [(name, r) for r in cuda_cores] + [(f"{name}_tensor_cores", r) for r in tensor_cores]:
                steps = entry["steps"]
                after = LeirModule(mod.signature, parse_leir(steps[-1]["leir"], "<tiled>").program)
                try:
                    fig = measure(after, a.arch, Path(tmp), key)
                except Exception as e:  # noqa: BLE001 - one program's failure is reported, the rest go on
                    results[key] = {"tiled": True, "error": str(e)}
                    print(f"{key}: {e}", flush=True)
                    continue
                fig["steps"] = [s["rule"] + (f" {json.dumps(s['params'])}" if s.get("params") else "") for s in steps]
                results[key] = {"tiled": True, **fig}
                h = fig.get("hot_loop") or {}
                print(f"{key}: {fig.get('registers')} regs, {fig.get('smem_bytes')} B smem, spills "
                      f"{fig.get('spill_stores')}/{fig.get('spill_loads')} B; hot loop {h.get('instructions')} instr, "
                      f"FMA {h.get('fma')} ({h.get('fma_share')}), LDS {h.get('lds_by_width')}, "
                      f"FMA/LDS {h.get('fma_per_shared_load')}, SEL {h.get('sel')}, HMMA {h.get('hmma')}; "
                      f"HMMA in the kernel {fig.get('hmma_total')}", flush=True)
    out = {"arch": a.arch, "note": "static figures of the machine code (nvcc -O3, cuobjdump -sass); no GPU ran",
           "programs": results}
    if a.json:
        a.json.write_text(json.dumps(out, indent=1))
    if not any("hot_loop" in r for r in results.values()):
        sys.exit(1)


if __name__ == "__main__":
    os.environ.setdefault("TVM_LOG_DEBUG", "0")
    main()
