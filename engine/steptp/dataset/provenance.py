"""Where a dataset entry comes from: its program type and program id (issue 51).

``program_type`` is the corpus type of an ``stp corpus`` program (its ``# type:`` header), else
the program's name; ``program_id`` is the content key of the source file (SHA256 of its bytes,
16 hex digits, as :class:`steptp.programs.Source`), shared by every round of one program. A
leaf module: :mod:`steptp.dataset.generate` (entries), :mod:`steptp.dataset.chat` (record
``meta``) and :mod:`steptp.dataset.split` use it.
"""

from __future__ import annotations

import functools
import hashlib
from pathlib import Path


@functools.lru_cache(maxsize=8192)
def _corpus_type(path: str, key: str | None) -> str | None:
    """The ``# type:`` of an ``stp corpus`` program's header, or None (another program, an
    unreadable file). ``key`` (the file's content key) keys the cache."""
    from .corpus import parse_header

    p = Path(path)
    if p.suffix != ".py":
        return None
    try:
        info = parse_header(p)
    except (OSError, UnicodeDecodeError, ValueError):
        return None
    t = info.get("type")
    return (t.strip() or None) if isinstance(t, str) else None


def program_type(path, name: str, key: str | None = None) -> str:
    """The program type of the source program at ``path`` named ``name`` (its signature name):
    the corpus type of its header (``# type: ...``) when it is an ``stp corpus`` program, else
    ``name``. ``key``: the file's content key, when known (it keys the cache)."""
    t = _corpus_type(str(path), key) if path is not None else None
    return t or name


@functools.lru_cache(maxsize=8192)
def _key_of(path: str, mtime_ns: int, size: int) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()[:16]


def file_key(path) -> str | None:
    """The content key of the file at ``path`` (SHA256 of its bytes, 16 hex digits, as
    :class:`steptp.programs.Source`), or None when it cannot be read."""
    if path is None:
        return None
    p = Path(path)
    try:
        st = p.stat()
        return _key_of(str(p), st.st_mtime_ns, st.st_size) if p.is_file() else None
    except OSError:
        return None


def provenance(entry: dict) -> tuple[str | None, str | None]:
    """``(program_type, program_id)`` of a dictionary entry: its own fields; for an entry
    written before they existed, its source file's (corpus header and content key, when the
    file is still there), else its program name and None."""
    ptype, pid = entry.get("program_type"), entry.get("program_id")
    if ptype is not None and pid is not None:
        return ptype, pid
    src = entry.get("source")
    key = file_key(src) if src else None
    return (ptype if ptype is not None else program_type(src, entry.get("program"), key)), (pid or key)


__all__ = ["program_type", "file_key", "provenance"]
