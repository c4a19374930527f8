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
    PACK/refs/libN/           the originals' verification-form CPU builds (the x86-64 objects
                              ``stp verify`` runs: LLVM opt-level 0, intermediates poisoned),
                              batched like the GPU libraries: the node computes the references
    PACK/py/<sha1>.py         the PyTorch file of every original that came from a ``.py``
                              (the node times PyTorch eager on the same inputs when torch imports,
                              with the program's own parameters: ``programs[k]["torch"]["params"]``
                              maps each LEIR param/constant to the module's state_dict key,
                              :func:`torch_param_map`)
    PACK/data/<program>.npz   only with ``--store-references``: the CPU reference outputs, per
                              trial (for a node whose CPU cannot run x86-64 code)
    PACK/lib/                 libtvm_runtime.so, libtvm_runtime_cuda.so (from the apache-tvm wheel)
    PACK/python/steptp/       the runtime-only modules (gpu.run and what it imports,
                              backend.{cuda_runtime,poison}, runner.{inputs,tolerance,worker,stats,
                              cuda_timing,record}: RUNTIME_FILES); nothing else

Neither inputs nor outputs are stored by default: the node regenerates the inputs from the
seeds with :mod:`steptp.runner.inputs`, checks them against the stored SHA1 digests, runs the
original's reference build on its CPU and checks those outputs against the SHA1 digests of the
build side's (:func:`steptp.verify.reference_data`: the same trials, 3 random + 2 ordered +
the edge-case ones, whose plan ``edge`` records the large trial's scale; a program whose
references the node computes, too large to run here, has no edge-case trials).
The rounding allowances (a few floats per output) are stored; the comparison is the one rule
of :mod:`steptp.runner.tolerance`, as in CPU verification.
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

FORMAT = "stp-gpu-pack/2"  # /1: references stored (data/*.npz) only; the runner reads both

#: Files of the package copied into a pack (runtime-only closure of :mod:`steptp.gpu.run`).
RUNTIME_FILES = ("__init__.py", "backend/__init__.py", "backend/errors.py", "backend/cuda_runtime.py", "backend/poison.py",
                 "runner/__init__.py", "runner/inputs.py", "runner/tolerance.py", "runner/worker.py", "runner/pool.py", "runner/baseline.py",
                 "runner/stats.py", "runner/cuda_timing.py", "runner/record.py", "gpu/__init__.py", "gpu/run.py",
                 "gpu/node.py", "gpu/eager.py", "gpu/baselines.py", "gpu/sanitizer.py", "gpu/session.py")


class PackError(ValueError):
    """Bad input for a pack (no entries, unreadable dataset, mismatched signatures)."""


def _module_text(signature: dict, program: str) -> str:
    """The ``.leir`` text of a dataset entry's program: its signature dict as the header."""
    from ..leir.signatures import signature_of  # noqa: PLC0415

    return signature_of(signature).header() + "\n" + program.strip() + "\n"


def collect(inputs: Sequence[str | os.PathLike]) -> list[dict]:
    """Entries to pack: every line of ``INPUT/dictionary.jsonl`` for a dataset directory;
    for ``.leir`` files the first is the original and every other one a candidate of it
    (as in ``stp time``). Each entry: ``id``, ``strategy``, ``original`` and ``transformed``
    (full LEIR module texts), ``seed``, ``source`` (the ``.py`` file the program came from,
    when it still exists, else None), ``cpu`` (the CPU verdict, or None). Raises
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
                                "seed": int(e.get("seed", 0)), "source": _py_source(e.get("source")),
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
                        "transformed": m.text(), "seed": 0, "source": None, "cpu": None})
    if not out:
        raise PackError("nothing to pack: no entries in the inputs")
    return out


def _py_source(path) -> str | None:
    """``path`` when it names an existing PyTorch ``.py`` file, else None."""
    if not isinstance(path, str) or not path.endswith(".py"):
        return None
    return path if Path(path).is_file() else None


def build_reference_library(modules: Sequence, outdir: str | os.PathLike, first: int = 0) -> tuple[dict, dict]:
    """The verification-form CPU builds of ``modules`` (LEIR originals) in ONE exported
    library ``outdir/kernel.so`` + ``manifest.json`` (device ``cpu``; function ``r<first+i>``
    for program ``i``): the same lowering (``lower_module(..., "cpu", poison=True)``: every
    intermediate starts as the poison NaN), target (LLVM opt-level 0), pipeline and pass
    configuration as :func:`steptp.backend.build.build_cpu` with its default target, i.e. the
    object ``stp verify`` runs, loadable with the TVM runtime only
    (:func:`steptp.backend.cuda_runtime.run_module`). Returns ``({index: Built}, {index:
    reason})``; a program that does not build alone is left out (the others still build)."""
    import tvm  # noqa: PLC0415

    from ..backend.build import CPU_TARGET, VERIFY_PASS_CONFIG, _register_verify_pipeline, parse_tvmscript  # noqa: PLC0415
    from ..backend.cuda_runtime import Built, write_manifest  # noqa: PLC0415
    from ..backend.errors import BackendError, short_tvm_error  # noqa: PLC0415
    from ..backend.perf import _params  # noqa: PLC0415
    from ..backend.tvmscript import lower_module  # noqa: PLC0415

    funcs, bad = [], {}
    for i, m in enumerate(modules):
        try:
            f = parse_tvmscript(lower_module(m, None, "cpu", poison=True).text)
            funcs.append((i, f.with_attr("global_symbol", f"r{first + i}")))
        except BackendError as e:
            bad[i] = f"{e.stage}: {e.reason}"

    def compile_(fs):
        with tvm.transform.PassContext(config=VERIFY_PASS_CONFIG):
            return tvm.compile(tvm.IRModule({f.attrs["global_symbol"]: f for _, f in fs}),
                               target=tvm.target.Target(CPU_TARGET), tir_pipeline=_register_verify_pipeline())

    held, ex = list(funcs), None
    try:
        ex = compile_(held) if held else None
    except Exception:  # noqa: BLE001  one by one, to leave out the one that fails
        held = []
        for x in funcs:
            try:
                compile_([x])
                held.append(x)
            except Exception as e:  # noqa: BLE001
                bad[x[0]] = f"build: tvm.compile(llvm) failed: {short_tvm_error(e)}"
        ex = compile_(held) if held else None
    if ex is None:
        return {}, bad
    out = Path(outdir)
    out.mkdir(parents=True, exist_ok=True)
    try:
        ex.export_library(str(out / "kernel.so"))
    except Exception as e:  # noqa: BLE001
        return {}, {**bad, **{i: f"build: export_library failed: {short_tvm_error(e)}" for i, _ in held}}
    built = {i: Built(out, out / "kernel.so", None, _params(modules[i]), "cpu", "", "", modules[i].signature.name,
                      "", None, f"r{first + i}") for i, _ in held}
    write_manifest(list(built.values()))
    return built, bad


def torch_param_map(source: str | os.PathLike, module, cache: dict | None = None) -> dict:
    """Which module tensor each LEIR ``param``/``constant`` tensor of ``module`` (an original
    translated from the PyTorch file ``source``) is, so the node can run eager with the
    program's own parameter values (:func:`steptp.gpu.eager.load_program_params`): the file
    is translated again on PyTorch's meta device (:func:`steptp.frontend.translate_file`,
    ``meta=True``: shapes only, no data) and its
    :attr:`~steptp.frontend.translate.Translation.param_targets` (LEIR name -> ``state_dict``
    key, or the lifted constant's name) are taken when every param/constant of ``module``
    appears there with the same role and shape (the translator declares a parameter with its
    own shape: no transpose or reshape to undo). Returns ``{"params": {name: key}}`` (empty
    for a program without parameters, without translating) or ``{"params_error": why}``;
    never raises. ``cache``: translations by resolved path, shared over one pack."""
    sig = module.signature
    names = [t for t in sig.tensors if t.role in ("param", "constant")]
    if not names:
        return {"params": {}}
    key = str(Path(source).resolve())
    cache = {} if cache is None else cache
    if key not in cache:
        try:
            from ..frontend import translate_file  # noqa: PLC0415

            tr = translate_file(source, meta=True)
            cache[key] = (tr.module.signature, dict(tr.param_targets))
        except Exception as e:  # noqa: BLE001  (TranslationError, an import error of the file)
            cache[key] = f"{Path(source).name} does not translate again: {type(e).__name__}: {e}"[:300]
    got = cache[key]
    if isinstance(got, str):
        return {"params_error": got}
    theirs, targets = got
    for t in names:
        o = theirs.get(t.name)
        if o is None or o.role != t.role or tuple(o.shape) != tuple(t.shape) or t.name not in targets:
            want = f"{t.role} {t.name} {list(t.shape)}"
            have = "nothing" if o is None else f"{o.role} {o.name} {list(o.shape)}"
            return {"params_error": f"the program's {want} is {have} in {Path(source).name}'s translation"}
    return {"params": {t.name: targets[t.name] for t in names}}


def _key(text: str) -> str:
    return hashlib.sha1(text.encode("utf-8")).hexdigest()[:16]


def build_pack(inputs: Sequence[str | os.PathLike], outdir: str | os.PathLike, *, arch: str = "sm_90",
               trials: int = 3, batch: int = 32, limit: int | None = None, sim: bool = True,
               store_references: bool = False, progress: Callable[[str, int, int], None] | None = None) -> dict:
    """Write a pack (module docstring) for the entries of ``inputs`` (:func:`collect`; the
    first ``limit`` when given) into ``outdir``, for GPUs of architecture ``arch``
    (``sm_XY``). ``batch``: programs per library; ``sim``: also the CPU builds the simulated
    device runs (not needed on a real GPU node); the originals' reference builds are always
    packed. ``store_references``: also store the CPU reference outputs (``data/*.npz``, the
    bulk of a pack: for a node that cannot run x86-64 code). ``progress(stage, done, total)``
    is called as work completes. Returns the summary written to ``manifest.json``
    (``build_seconds``, ``bytes``, ``entries``, ``skipped``: entries whose original or
    transformed program did not build, with the reason). Raises :class:`PackError` for bad input, ``BuildError`` when the
    toolchain fails (no CUDA compiler...)."""
    from ..backend.cuda_runtime import TVM_RUNTIME_CUDA_LIB, TVM_RUNTIME_LIB, compiler_tag, tvm_lib_dir  # noqa: PLC0415
    from ..leir.fileformat import parse_leir  # noqa: PLC0415
    from ..runner.builder import build_library  # noqa: PLC0415
    from ..runner.device import device_limits  # noqa: PLC0415
    from ..runner.inputs import digest  # noqa: PLC0415
    from ..verify import (ORDERED_TRIALS, too_large_to_run_here, default_runner, index_bounds, reference_data,  # noqa: PLC0415
                          tensor_specs)

    t0 = time.perf_counter()
    entries = collect(inputs)[: limit or None]
    out = Path(outdir)
    if out.exists() and any(out.iterdir()):
        raise PackError(f"{out}: exists and is not empty (a pack is written into a new directory)")
    for d in ("modules", "ptx", "refs", "lib", "python") + (("data",) if store_references else ()):
        (out / d).mkdir(parents=True, exist_ok=True)
    limits = device_limits("cuda", arch)
    runner = default_runner()

    # references per original: digests (and allowances) here, the outputs on the node
    programs: dict[str, dict] = {}
    originals: dict[str, tuple[str, int, str | None]] = {}
    for e in entries:
        originals.setdefault(_key(e["original"]), (e["original"], e["seed"], e.get("source")))
    failed: dict[str, str] = {}
    sources: dict[str, str] = {}
    translations: dict = {}  # torch_param_map's, by .py file
    for n, (okey, (text, seed, source)) in enumerate(originals.items()):
        m = parse_leir(text)
        if too_large_to_run_here(m) and not store_references:
            # too large to run here (KernelBench size): the node computes the references from
            # the original's CPU build on its cores, with no digests to compare (issue 44)
            programs[okey] = {
                "name": m.signature.name, "seed": seed, "trials": trials, "ordered": list(ORDERED_TRIALS),
                "specs": [list(s) for s in tensor_specs(m.signature)],
                "roles": [t.role for t in m.signature.tensors],
                "bounds": index_bounds(m.signature, [m.program]),
                "inputs_sha1": [None] * (trials + len(ORDERED_TRIALS)), "outputs_sha1": None, "slacks": None,
                "edge": [], "references": "node"}
            ref = None
        else:
            ref = reference_data(m, trials, seed, runner=runner, timeout_s=300.0)
        if ref is None:
            pass
        elif isinstance(ref, str):
            failed[okey] = ref
        else:
            inputs_, refs, slacks = ref.inputs, ref.refs, ref.slacks
            programs[okey] = {
                "name": m.signature.name, "seed": seed, "trials": trials, "ordered": list(ORDERED_TRIALS),
                "specs": [list(s) for s in tensor_specs(m.signature)],
                "roles": [t.role for t in m.signature.tensors],
                "bounds": index_bounds(m.signature, [m.program]),
                "inputs_sha1": [digest(x) for x in inputs_],
                "outputs_sha1": [digest(r) for r in refs],
                "slacks": [dict(s) for s in slacks] if slacks else None,
                "edge": [[k, sc] for k, sc in ref.edge]}
            if store_references:
                arrays = {f"ref{k}__{name}": np.asarray(v) for k, r in enumerate(refs) for name, v in r.items()}
                np.savez_compressed(out / "data" / f"{okey}.npz", **arrays)
                programs[okey]["data"] = f"data/{okey}.npz"
        if source and okey in programs:  # at size too ("references": "node"): eager is timed on the node
            data = Path(source).read_bytes()
            name = f"py/{hashlib.sha1(data).hexdigest()[:16]}.py"
            if name not in sources.values():
                (out / "py").mkdir(exist_ok=True)
                (out / name).write_bytes(data)
            sources[okey] = name
            programs[okey]["torch"] = {"file": name, "from": Path(source).name,
                                       **torch_param_map(source, m, translations)}
        if progress:
            progress("references", n + 1, len(originals))

    # the originals' reference builds (verification form, CPU), batched
    okeys = list(programs)
    for b in range(0, len(okeys), batch):
        chunk = okeys[b:b + batch]
        rdir = f"refs/lib{b // batch}"
        built, bad = build_reference_library([parse_leir(originals[k][0]) for k in chunk], out / rdir, first=b)
        for i, k in enumerate(chunk):
            if i in built:
                programs[k]["reference"] = {"lib": rdir, "func": built[i].func}
            elif not store_references:
                failed[k] = f"original program failed ({bad.get(i, 'reference build')})"
                del programs[k]

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
                "bytes": size, "libraries": len(range(0, len(keys), batch)), "modules": len(where),
                "references": "stored" if store_references else "computed on the node", "sim": sim,
                "torch_programs": len(sources)}
    text = json.dumps(manifest, indent=1) + "\n"
    manifest["bytes"] = size + len(text.encode("utf-8"))
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n", encoding="utf-8")
    return {k: manifest[k] for k in ("arch", "ptx_tag", "build_seconds", "bytes", "libraries", "modules", "references",
                                     "torch_programs")} | {"entries": len(rows), "skipped": len(skipped)}


class PackBuilder:
    """The Builder role of the ``pack`` runner (:class:`steptp.runner.base.Builder`): a search
    round's entries (``round_dir/dictionary.jsonl``) -> a pack in ``pack_dir``
    (:func:`build_pack` for ``arch``; ``sim``: with the simulated device's CPU builds)."""

    def __init__(self, arch: str = "sm_90", sim: bool = True):
        self.arch, self.sim = arch, sim

    def build(self, round_dir: Path, pack_dir: Path) -> dict:
        """Build the pack of one round; returns its manifest summary (:func:`build_pack`)."""
        return build_pack([str(round_dir)], pack_dir, arch=self.arch, sim=self.sim)

    def __call__(self, round_dir: Path, pack_dir: Path) -> dict:
        return self.build(round_dir, pack_dir)


__all__ = ["FORMAT", "RUNTIME_FILES", "PackError", "PackBuilder", "collect", "build_pack", "build_reference_library", "torch_param_map"]
