"""``stp gpu pack``: build here everything a GPU node needs to check and time a dataset.

A pack is a directory a GPU machine without a compiler, package index or full TVM can run
with :mod:`steptp.gpu.run` (numpy, ``apache-tvm-ffi`` and the two TVM runtime libraries the
pack carries)::

    PACK/manifest.json        format, arch, compiler tag, programs (tensor specs, index bounds,
                              seeds, input digests, rounding allowances), entries (original and
                              transformed function, strategy, the CPU verdict)
    PACK/modules/libN/        batched libraries (steptp.runner.builder.build_library):
                              kernel.so (host code + CUDA C), kernel.cu, manifest.json and, unless
                              --no-sim, sim/kernel.so (the CPU builds the simulated device runs)
    PACK/ptx/<key>.ptx.gz     PTX of every library (gzipped), keyed by (source, arch, compiler, flags)
    PACK/data/<program>.npz   the CPU reference outputs of each original, per trial
    PACK/lib/                 libtvm_runtime.so, libtvm_runtime_cuda.so (from the apache-tvm wheel)
    PACK/python/steptp/       the runtime-only modules (gpu.run, backend.cuda_runtime,
                              runner.{inputs,tolerance,worker,stats}); nothing else

Inputs are not stored: the node regenerates them from the seeds with
:mod:`steptp.runner.inputs` and checks them against the stored SHA1 digests. References and
allowances come from :func:`steptp.verify.reference_data`: the same trials (3 random + 2
ordered), the same rule (:mod:`steptp.runner.tolerance`) as CPU verification.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

FORMAT = "stp-gpu-pack/1"

#: Files of the package copied into a pack (runtime-only closure of :mod:`steptp.gpu.run`).
RUNTIME_FILES = ("__init__.py", "backend/__init__.py", "backend/errors.py", "backend/cuda_runtime.py",
                 "runner/__init__.py", "runner/inputs.py", "runner/tolerance.py", "runner/worker.py",
                 "runner/stats.py", "gpu/__init__.py", "gpu/run.py")


class PackError(ValueError):
    """Bad input for a pack (no entries, unreadable dataset, mismatched signatures)."""


def _module_text(signature: dict, program: str) -> str:
    """The ``.leir`` text of a dataset entry's program: its signature dict as the header."""
    from ..dataset.chat import signature_of  # noqa: PLC0415

    return signature_of(signature).header() + "\n" + program.strip() + "\n"


def collect(inputs: Sequence[str | os.PathLike]) -> list[dict]:
    """Entries to pack: every line of ``INPUT/dictionary.jsonl`` for a dataset directory;
    for ``.leir`` files the first is the original and every other one a candidate of it
    (as in ``stp time``). Each entry: ``id``, ``strategy``, ``original`` and ``transformed``
    (full LEIR module texts), ``seed``, ``cpu`` (the CPU verdict, or None). Raises
    :class:`PackError` naming the file for unreadable input."""
    from ..leir.fileformat import load_leir  # noqa: PLC0415

    out: list[dict] = []
    leirs = [Path(p) for p in inputs if Path(p).suffix == ".leir"]
    for p in inputs:
        p = Path(p)
        if p.suffix == ".leir":
            continue
        f = p / "dictionary.jsonl" if p.is_dir() else p
        if not f.is_file():
            raise PackError(f"{p}: not a dataset directory (no dictionary.jsonl) nor a .leir file")
        with open(f, encoding="utf-8") as fh:
            for n, line in enumerate(fh, 1):
                if not line.strip():
                    continue
                try:
                    e = json.loads(line)
                    sig = e["signature"]
                    v = e.get("verification") or {}
                    out.append({"id": e["id"], "strategy": e["strategy"]["id"],
                                "original": _module_text(sig, e["original"]["leir"]),
                                "transformed": _module_text(sig, e["transformed"]["leir"]),
                                "seed": int(e.get("seed", 0)),
                                "cpu": {k: v.get(k) for k in ("equal", "max_abs_err", "reason")}})
                except (ValueError, KeyError, TypeError) as err:
                    raise PackError(f"{f}:{n}: not a dataset entry ({type(err).__name__}: {err})") from None
    if leirs:
        try:
            mods = [load_leir(p) for p in leirs]
        except Exception as err:  # noqa: BLE001  (LeirSyntaxError / SemanticError / OSError)
            raise PackError(str(err)) from None
        base = mods[0]
        for p, m in zip(leirs[1:] or leirs[:1], mods[1:] or mods[:1]):
            out.append({"id": f"{leirs[0].stem}->{p.stem}", "strategy": "", "original": base.text(),
                        "transformed": m.text(), "seed": 0, "cpu": None})
    if not out:
        raise PackError("nothing to pack: no entries in the inputs")
    return out


def _key(text: str) -> str:
    return hashlib.sha1(text.encode("utf-8")).hexdigest()[:16]


def build_pack(inputs: Sequence[str | os.PathLike], outdir: str | os.PathLike, *, arch: str = "sm_90",
               trials: int = 3, batch: int = 32, limit: int | None = None, sim: bool = True,
               progress: Callable[[str, int, int], None] | None = None) -> dict:
    """Write a pack (module docstring) for the entries of ``inputs`` (:func:`collect`; the
    first ``limit`` when given) into ``outdir``, for GPUs of architecture ``arch``
    (``sm_XY``). ``batch``: programs per library; ``sim``: also the CPU builds the simulated
    device runs (not needed on a real GPU node; about half the pack). ``progress(stage, done, total)`` is called
    as work completes. Returns the summary written to ``manifest.json`` (``build_seconds``,
    ``bytes``, ``entries``, ``failed``: entries whose original or transformed program did not
    build, with the reason). Raises :class:`PackError` for bad input, ``BuildError`` when the
    toolchain fails (no CUDA compiler...)."""
    from ..backend.cuda_runtime import TVM_RUNTIME_CUDA_LIB, TVM_RUNTIME_LIB, compiler_tag, tvm_lib_dir  # noqa: PLC0415
    from ..leir.fileformat import parse_leir  # noqa: PLC0415
    from ..runner.builder import build_library  # noqa: PLC0415
    from ..runner.device import device_limits  # noqa: PLC0415
    from ..runner.inputs import digest  # noqa: PLC0415
    from ..verify import ORDERED_TRIALS, default_runner, index_bounds, reference_data, tensor_specs  # noqa: PLC0415

    t0 = time.perf_counter()
    entries = collect(inputs)[: limit or None]
    out = Path(outdir)
    if out.exists() and any(out.iterdir()):
        raise PackError(f"{out}: exists and is not empty (a pack is written into a new directory)")
    for d in ("modules", "ptx", "data", "lib", "python"):
        (out / d).mkdir(parents=True, exist_ok=True)
    limits = device_limits("cuda", arch)
    runner = default_runner()

    # references per original
    programs: dict[str, dict] = {}
    originals = {}
    for e in entries:
        originals.setdefault(_key(e["original"]), (e["original"], e["seed"]))
    failed: dict[str, str] = {}
    for n, (okey, (text, seed)) in enumerate(originals.items()):
        m = parse_leir(text)
        ref = reference_data(m, trials, seed, runner=runner, timeout_s=300.0)
        if isinstance(ref, str):
            failed[okey] = ref
        else:
            inputs_, refs, slacks = ref
            arrays = {f"ref{k}__{name}": np.asarray(v) for k, r in enumerate(refs) for name, v in r.items()}
            np.savez_compressed(out / "data" / f"{okey}.npz", **arrays)
            programs[okey] = {
                "name": m.signature.name, "seed": seed, "trials": trials, "ordered": list(ORDERED_TRIALS),
                "specs": [list(s) for s in tensor_specs(m.signature)],
                "bounds": index_bounds(m.signature, [m.program]),
                "inputs_sha1": [digest(x) for x in inputs_],
                "slacks": [dict(s) for s in slacks] if slacks else None,
                "data": f"data/{okey}.npz"}
        if progress:
            progress("references", n + 1, len(originals))

    # modules: every distinct program text, in batched libraries
    texts: dict[str, str] = {}
    for e in entries:
        for side in ("original", "transformed"):
            texts.setdefault(_key(e[side]), e[side])
    keys = list(texts)
    where: dict[str, dict] = {}
    for b in range(0, len(keys), batch):
        chunk = keys[b:b + batch]
        libdir = out / "modules" / f"lib{b // batch}"
        built, bad = build_library([parse_leir(texts[k]) for k in chunk], libdir, limits=limits,
                                   ptx_cache=out / "ptx", sim=sim, first=b)
        for i, k in enumerate(chunk):
            if i in built:
                where[k] = {"lib": f"modules/lib{b // batch}", "func": built[i].func}
            else:
                failed[k] = bad.get(i, "not built")
        if progress:
            progress("build", min(b + batch, len(keys)), len(keys))

    # PTX gzipped: text that compresses about 10x (steptp.backend.cuda_runtime.read_ptx)
    import gzip  # noqa: PLC0415

    for f in (out / "ptx").glob("*.ptx"):
        (out / "ptx" / (f.name + ".gz")).write_bytes(gzip.compress(f.read_bytes(), 9))
        f.unlink()

    # runtime libraries and the runtime-only python modules
    libd = tvm_lib_dir()
    if libd is None:
        raise PackError(f"no TVM runtime ({TVM_RUNTIME_LIB}) found to copy into the pack")
    for name in (TVM_RUNTIME_LIB, TVM_RUNTIME_CUDA_LIB):
        shutil.copy2(libd / name, out / "lib" / name)
    pkg = Path(__file__).resolve().parent.parent
    for rel in RUNTIME_FILES:
        dst = out / "python" / "steptp" / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(pkg / rel, dst)

    rows, skipped = [], []
    for e in entries:
        ok_, tk = _key(e["original"]), _key(e["transformed"])
        why = failed.get(ok_) or failed.get(tk)
        if why or ok_ not in programs or ok_ not in where or tk not in where:
            skipped.append({"id": e["id"], "strategy": e["strategy"], "reason": why or "not built"})
            continue
        rows.append({"id": e["id"], "strategy": e["strategy"], "program": ok_, "original": where[ok_],
                     "transformed": where[tk], "cpu": e["cpu"]})
    size = sum(f.stat().st_size for f in out.rglob("*") if f.is_file())
    manifest = {"format": FORMAT, "arch": limits.arch, "ptx_tag": compiler_tag(), "device": "cuda",
                "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "programs": programs,
                "entries": rows, "skipped": skipped, "build_seconds": round(time.perf_counter() - t0, 2),
                "bytes": size, "libraries": len(range(0, len(keys), batch)), "modules": len(where)}
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n", encoding="utf-8")
    return {k: manifest[k] for k in ("arch", "ptx_tag", "build_seconds", "bytes", "libraries", "modules")} | {
        "entries": len(rows), "skipped": len(skipped)}


__all__ = ["FORMAT", "RUNTIME_FILES", "PackError", "collect", "build_pack"]
