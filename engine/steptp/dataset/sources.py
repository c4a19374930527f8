"""Input discovery for ``stp dataset``: PyTorch model files, ``.leir`` files and directories."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Source:
    """One input program: ``kind`` is ``"torch"`` (a KernelBench-style ``.py``) or ``"leir"``.

    ``key`` identifies the program's content (sha256 of the file bytes, 16 hex digits):
    it keys resume state and seeds, so renaming a file does not change the data."""

    path: Path
    kind: str
    key: str


def _key(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()[:16]


def discover(inputs: list[str | Path]) -> list[Source]:
    """Expand files and directories (recursively, sorted) into sources.

    A ``.py`` file counts only if it defines ``class Model`` (KernelBench convention).
    When a directory holds both ``x.py`` and ``x.leir``, the PyTorch program wins (its
    translation is verified against PyTorch). Raises ``FileNotFoundError`` for a missing
    path and ``ValueError`` for a file of another type given explicitly.
    """
    found: dict[Path, str] = {}
    for item in inputs:
        p = Path(item)
        if not p.exists():
            raise FileNotFoundError(f"input not found: {p}")
        if p.is_dir():
            for f in sorted(p.rglob("*")):
                if f.suffix == ".leir" and f.is_file():
                    found.setdefault(f, "leir")
                elif f.suffix == ".py" and f.is_file() and "class Model" in f.read_text(errors="replace"):
                    found.setdefault(f, "torch")
        elif p.suffix == ".leir":
            found[p] = "leir"
        elif p.suffix == ".py":
            found[p] = "torch"
        else:
            raise ValueError(f"{p}: expected a .py model file, a .leir file or a directory")
    stems = {(f.parent, f.stem) for f, k in found.items() if k == "torch"}
    out = []
    for f, kind in sorted(found.items()):
        if kind == "leir" and (f.parent, f.stem) in stems:
            continue
        out.append(Source(f, kind, _key(f)))
    return out


__all__ = ["Source", "discover"]
