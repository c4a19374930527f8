"""Programs: one way to find and load the programs a command works on.

Every command that takes programs (``stp dataset``, ``eval``, ``search``, ``testset``,
``rules coverage`` / ``lint``, ``gpu pack``) finds them with :func:`discover` and loads them
with :func:`load`, so ``stp search corpus`` and ``stp dataset corpus`` see the same programs.

Rules of :func:`discover`:

* a file given explicitly is taken when it is a ``.py`` or ``.leir`` file of an allowed kind
  (``ValueError`` otherwise; ``FileNotFoundError`` when missing);
* a directory is searched recursively (sorted paths); names starting with ``_`` or ``.``
  (``__init__.py``, ``__pycache__``, hidden folders) are skipped; a ``.py`` counts only if it
  defines ``class Model`` (the KernelBench convention), a ``.leir`` always;
* when a folder holds both ``x.py`` and ``x.leir`` and both kinds are allowed, the PyTorch
  program wins (its translation is checked against PyTorch);
* each :class:`Source` carries a content key (SHA256 of the bytes, 16 hex digits) that keys
  resume state and seeds, so renaming a file does not change the data.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

KINDS = ("torch", "leir")
_SUFFIX = {".py": "torch", ".leir": "leir"}


@dataclass(frozen=True)
class Source:
    """One input program: ``kind`` is ``"torch"`` (a KernelBench-style ``.py``) or ``"leir"``;
    ``key``: SHA256 of the file's bytes, 16 hex digits."""

    path: Path
    kind: str
    key: str


def _key(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()[:16]


def _hidden(path: Path, root: Path) -> bool:
    return any(part.startswith(("_", ".")) for part in path.relative_to(root).parts)


def discover(inputs: Sequence[str | Path], kinds: Sequence[str] = KINDS) -> list[Source]:
    """The programs of ``inputs`` (files and directories) of the given ``kinds``, sorted by
    path, by the rules of the module docstring. Raises ``FileNotFoundError`` for a missing
    path and ``ValueError`` for a file of another type given explicitly."""
    found: dict[Path, str] = {}
    for item in inputs:
        p = Path(item)
        if not p.exists():
            raise FileNotFoundError(f"input not found: {p}")
        if p.is_dir():
            for f in sorted(p.rglob("*")):
                kind = _SUFFIX.get(f.suffix)
                if kind not in kinds or not f.is_file() or _hidden(f, p):
                    continue
                if kind == "torch" and "class Model" not in f.read_text(errors="replace"):
                    continue
                found.setdefault(f, kind)
        elif _SUFFIX.get(p.suffix) in kinds:
            found[p] = _SUFFIX[p.suffix]
        else:
            want = " or ".join({"torch": "a .py model file", "leir": "a .leir file"}[k] for k in kinds)
            raise ValueError(f"{p}: expected {want} or a directory")
    stems = {(f.parent, f.stem) for f, k in found.items() if k == "torch"}
    return [Source(f, kind, _key(f)) for f, kind in sorted(found.items())
            if not (kind == "leir" and (f.parent, f.stem) in stems)]


def load(path: str | Path, *, analyze: bool = True, meta: bool = False):
    """``(LeirModule, Translation or None)`` of a program file: a ``.leir`` file parsed
    (and, with ``analyze``, checked by :func:`steptp.leir.analysis.analyze`), or a PyTorch
    ``.py`` translated by :func:`steptp.frontend.translate_file` (not verified against
    PyTorch: ``Translation.verify`` does that). Raises what the parser, the analysis or the
    translator raises (``LeirSyntaxError`` with file, line and column, ``LeirSemanticError``,
    ``TranslationError``, ``OSError``); callers turn them into their own one-line errors."""
    p = Path(path)
    if p.suffix == ".py":
        from .frontend import translate_file  # noqa: PLC0415

        tr = translate_file(p, meta=meta)
        return tr.module, tr
    from .leir.fileformat import load_leir  # noqa: PLC0415

    m = load_leir(p)
    if analyze:
        from .leir.analysis import analyze as check  # noqa: PLC0415

        check(m.program, m.signature)
    return m, None


__all__ = ["KINDS", "Source", "discover", "load"]
