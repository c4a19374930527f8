"""``stp testset``: held-out single-step test cases (paper §4.3: "constructed from 180
distinct tensor programs by varying input/output data types and shapes ... strictly held
out from training").

For each input program, up to K variants, written as ``.leir`` files:

* dtype variants: the float tensors cast to another of f16 / f32 / f64. ``.py`` programs are
  re-translated with :func:`steptp.frontend.translate_file` ``(path, dtype=...)``; ``.leir``
  programs have every float tensor (declarations and accesses) rewritten.
* shape variants, only where a program exposes its shapes: programs of ``stp corpus``
  (their header names the program type and seed) are regenerated with other seeds, so the
  corpus's seeded shape draws change (:func:`steptp.dataset.corpus.generate_program`). Other
  ``.py`` files and ``.leir`` files get dtype variants only (their extents are baked into
  the index arithmetic).

Variants that differ from the input come first; the input itself is the last resort.
Duplicates (same canonical LEIR) are dropped. With ``exclude`` (an ``stp dataset`` output
directory) no case may occur (canonical LEIR text) as the ``original.leir`` or
``transformed.leir`` of any entry of its ``dictionary.jsonl``; an overlap raises
:class:`OverlapError` before anything is written, unless ``allow_overlap``.
"""

from __future__ import annotations

import json
import tempfile
from dataclasses import dataclass
from pathlib import Path

from ..leir import ast as A
from ..leir.fileformat import LeirModule, Signature, TensorDecl
from ..leir.printer import format_program

FLOAT_DTYPES = ("f16", "f32", "f64")
_TORCH = {"f16": "float16", "f32": "float32", "f64": "float64"}


class TestsetError(RuntimeError):
    """Bad input (missing path, unreadable dataset directory): exit 2."""


class OverlapError(RuntimeError):
    """Some cases occur in the training dataset: exit 1. ``overlap`` lists them."""

    def __init__(self, message: str, overlap: list[dict]):
        super().__init__(message)
        self.overlap = overlap


@dataclass
class Variant:
    """One test case: ``module``, where it came from and how it differs (``dtype``, ``seed``)."""

    source: str
    index: int
    kind: str          # "dtype", "shape+dtype" or "as-given"
    dtype: str | None
    seed: int | None
    module: LeirModule

    @property
    def leir(self) -> str:
        return format_program(self.module.program)


def with_dtype(module: LeirModule, dtype: str) -> LeirModule:
    """``module`` with every floating-point tensor (declared and accessed) in ``dtype``
    (f16/f32/f64). Integer and boolean tensors are kept. Raises ``ValueError`` for another
    dtype."""
    if dtype not in FLOAT_DTYPES:
        raise ValueError(f"dtype {dtype!r} is not one of {FLOAT_DTYPES}")
    floats = set(FLOAT_DTYPES) | {"bf16"}

    def fn(e):
        if isinstance(e, A.Tensor) and e.dtype in floats:
            return A.Tensor(e.name, dtype, e.scope, e.indices)
        return e

    prog = A.map_program_exprs(module.program, lambda e: A.transform(e, fn))
    sig = Signature(module.signature.name, tuple(
        TensorDecl(t.name, t.role, dtype if t.dtype in floats else t.dtype, t.shape) for t in module.signature.tensors))
    return LeirModule(sig, prog)


def _float_dtype(module: LeirModule) -> str | None:
    for t in module.signature.tensors:
        if t.dtype in FLOAT_DTYPES:
            return t.dtype
    return None


def _corpus_variant(path: Path, index: int, dtype: str, tmp: Path) -> LeirModule | None:
    """A shape variant of a corpus program (its type regenerated with another seed), or None."""
    try:
        from . import corpus as C

        info = C.parse_header(path)
        if not info or "type" not in info or not isinstance(info.get("seed"), int):
            return None
        seed = C.program_seed(info["seed"], index, "testset")
        text = C.generate_program(info["type"], seed, _TORCH[dtype], info.get("budget", C.DEFAULT_BUDGET))
    except Exception:  # noqa: BLE001 - not a corpus program (or an old header): dtype variants only
        return None
    f = tmp / f"{path.stem}_v{index}.py"
    f.write_text(text)
    from ..frontend import translate_file

    return translate_file(f).module


def variants_of(src, k: int, tmp: Path) -> list[Variant]:
    """Up to ``k`` distinct variants of one source (:class:`steptp.dataset.sources.Source`)."""
    from ..leir.analysis import analyze
    from ..leir.fileformat import load_leir

    path = Path(src.path)
    if src.kind == "leir":
        base = load_leir(path)
        analyze(base.program, base.signature)
    else:
        from ..frontend import translate_file

        base = translate_file(path).module
    orig = _float_dtype(base)
    others = [d for d in FLOAT_DTYPES if d != orig] if orig else []
    out: list[Variant] = []
    seen = {format_program(base.program)}

    def add(v: Variant) -> None:
        text = v.leir
        if text not in seen and len(out) < k:
            seen.add(text)
            out.append(v)

    if src.kind == "torch":
        rot = (others + ([orig] if orig else [])) or [None]
        for j in range(1, k + 1):
            d = rot[(j - 1) % len(rot)]
            try:
                m = _corpus_variant(path, j, d or "f32", tmp)
            except Exception:  # noqa: BLE001 - this draw fails to translate: skip it
                continue
            if m is None:
                break
            add(Variant(str(path), j, "shape+dtype", d, j, m))
    for d in others:
        try:
            if src.kind == "torch":
                from ..frontend import translate_file

                m = translate_file(path, dtype=d).module
            else:
                m = with_dtype(base, d)
                analyze(m.program, m.signature)
        except Exception:  # noqa: BLE001 - the program has no form in this dtype
            continue
        add(Variant(str(path), 0, "dtype", d, None, m))
    if len(out) < k:
        seen.discard(format_program(base.program))
        add(Variant(str(path), 0, "as-given", orig, None, base))
    return out


def dataset_programs(dataset_dir: str | Path) -> set[str]:
    """Canonical LEIR texts of every ``original.leir`` and ``transformed.leir`` of
    ``DATASET_DIR/dictionary.jsonl``. Raises :class:`TestsetError` when it is missing."""
    from ..io import read_jsonl_lines

    p = Path(dataset_dir) / "dictionary.jsonl"
    if not p.is_file():
        raise TestsetError(f"{p}: no such file (--exclude needs an stp dataset output directory)")
    texts: set[str] = set()
    try:
        for _, rec in read_jsonl_lines(p):
            if isinstance(rec, dict):
                for k in ("original", "transformed"):
                    v = rec.get(k)
                    if isinstance(v, dict) and isinstance(v.get("leir"), str):
                        texts.add(v["leir"].strip())
    except ValueError as e:
        raise TestsetError(str(e)) from None
    return texts


def build_testset(inputs: list[str], outdir: str | Path, variants: int = 3, exclude: str | Path | None = None,
                  allow_overlap: bool = False, progress: bool = False) -> dict:
    """Write the held-out cases of ``inputs`` into ``outdir`` (``NAME__vK.leir`` files and
    ``testset.json``); returns the manifest. Raises :class:`TestsetError` for bad inputs and
    :class:`OverlapError` (nothing written) when cases occur in ``exclude``'s dataset."""
    from tqdm import tqdm

    from ..programs import discover
    from ..leir.fileformat import save_leir

    try:
        sources = discover(inputs)
    except (FileNotFoundError, ValueError) as e:
        raise TestsetError(str(e)) from None
    if not sources:
        raise TestsetError("no programs in the inputs")
    train = dataset_programs(exclude) if exclude is not None else set()
    cases: list[Variant] = []
    failed = []
    with tempfile.TemporaryDirectory(prefix="stp-testset-") as tmp:
        for src in tqdm(sources, desc="testset", unit="prog", disable=not progress, dynamic_ncols=True):
            try:
                cases.extend(variants_of(src, variants, Path(tmp)))
            except Exception as e:  # noqa: BLE001 - a program that cannot be loaded is reported
                failed.append({"source": str(src.path), "error": f"{type(e).__name__}: {e}"[:300]})
    overlap = [{"source": v.source, "variant": v.kind, "dtype": v.dtype} for v in cases if v.leir in train]
    if overlap and not allow_overlap:
        raise OverlapError(f"{len(overlap)} of {len(cases)} case(s) occur in {exclude}/dictionary.jsonl; "
                           "nothing written (--allow-overlap writes them anyway)", overlap)
    out = Path(outdir)
    out.mkdir(parents=True, exist_ok=True)
    rows, used = [], set()
    for v in cases:
        stem = Path(v.source).stem
        name = f"{stem}__v{len([r for r in rows if r['stem'] == stem])}"
        while name in used:
            name += "_"
        used.add(name)
        save_leir(v.module, out / f"{name}.leir")
        rows.append({"file": f"{name}.leir", "stem": stem, "source": v.source, "kind": v.kind, "dtype": v.dtype,
                     "seed": v.seed, "in_training": v.leir in train})
    manifest = {"inputs": [str(s.path) for s in sources], "variants": variants,
                "exclude": str(exclude) if exclude is not None else None, "cases": rows, "failed": failed,
                "overlap": overlap}
    (out / "testset.json").write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest


__all__ = ["FLOAT_DTYPES", "TestsetError", "OverlapError", "Variant", "with_dtype", "variants_of",
           "dataset_programs", "build_testset"]
