"""Crash-safe files, for every writer of the package (the dataset, ``stp eval``, ``stp
search``, the cost model, ``stp rules test --update``).

* :class:`JsonlAppender` appends whole JSON lines and flushes + fsyncs after each batch,
  so a crash or Ctrl-C loses at most the batch being written. On open, a torn last line
  (no trailing newline) left by a crash is cut off, never parsed as data.
* :func:`write_jsonl_atomic` writes a derived file (chat sets, report) to a temporary file
  and renames it over the target, so readers never see a half-written file;
  :func:`write_text_atomic` and :func:`write_json_atomic` do the same for a text or JSON file.
* :func:`read_jsonl` reads a JSONL file, skipping (and counting) a torn last line.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Iterable, Iterator


def _repair_tail(path: Path) -> int:
    """Cut a torn (newline-less) last line; returns the number of bytes removed."""
    if not path.exists():
        return 0
    size = path.stat().st_size
    if size == 0:
        return 0
    with open(path, "rb+") as f:
        f.seek(-1, os.SEEK_END)
        if f.read(1) == b"\n":
            return 0
        # walk back to the last newline
        pos = size - 1
        chunk = 4096
        while pos > 0:
            step = min(chunk, pos)
            f.seek(pos - step)
            buf = f.read(step)
            nl = buf.rfind(b"\n")
            if nl >= 0:
                cut = pos - step + nl + 1
                f.truncate(cut)
                return size - cut
            pos -= step
        f.truncate(0)
        return size


class JsonlAppender:
    """Append-only JSONL writer that survives crashes (see module docstring)."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            if self.path.exists() and not os.access(self.path, os.W_OK):
                raise PermissionError(13, "Permission denied", str(self.path))
            self._f = open(self.path, "a", encoding="utf-8")
            self.repaired_bytes = _repair_tail(self.path)
        except OSError as e:
            raise OSError(e.errno, e.strerror or str(e), str(self.path)) from None

    def write_many(self, records: Iterable[dict]) -> int:
        """Append ``records`` (one line each), flush and fsync. An ``OSError`` (full disk,
        lost permission...) is re-raised with this file's name as ``filename``."""
        lines = [json.dumps(r, ensure_ascii=False, sort_keys=False) + "\n" for r in records]
        if lines:
            try:
                self._f.write("".join(lines))
                self._f.flush()
                os.fsync(self._f.fileno())
            except OSError as e:
                raise OSError(e.errno, e.strerror or str(e), str(self.path)) from None
        return len(lines)

    def close(self) -> None:
        self._f.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def read_jsonl(path: str | Path) -> Iterator[dict]:
    """Yield the records of a JSONL file. Only complete lines count: a last line without
    its newline (torn by a crash, whether or not it happens to parse) is ignored; any other
    line that is not valid JSON raises ``ValueError`` naming the file and line number."""
    for _lineno, rec in read_jsonl_lines(path):
        yield rec


def read_jsonl_lines(path: str | Path) -> Iterator[tuple[int, object]]:
    """``(line number, parsed JSON value)`` for every complete, non-blank line (see
    :func:`read_jsonl`; values need not be objects: callers validate them)."""
    p = Path(path)
    if not p.exists():
        return
    with open(p, "rb") as f:
        data = f.read()
    lines = data.split(b"\n")
    complete = lines[:-1]  # the part after the last newline is torn (or empty)
    for i, raw in enumerate(complete, 1):
        if not raw.strip():
            continue
        try:
            yield i, json.loads(raw.decode("utf-8"))
        except UnicodeDecodeError:
            raise ValueError(f"{p}:{i}: not UTF-8 text") from None
        except json.JSONDecodeError as e:
            raise ValueError(f"{p}:{i}: invalid JSON line ({e.msg})") from None
        except RecursionError:
            raise ValueError(f"{p}:{i}: JSON nested too deeply") from None


def write_jsonl_atomic(path: str | Path, records: Iterable[dict]) -> int:
    """Write ``records`` to ``path`` via a temporary file and an atomic rename."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_name(p.name + ".tmp")
    n = 0
    with open(tmp, "w", encoding="utf-8") as f:
        for r in records:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")
            n += 1
        f.flush()
        os.fsync(f.fileno())
    tmp.replace(p)
    return n


def write_text_atomic(path: str | Path, text: str) -> None:
    """Write ``text`` (UTF-8) to ``path`` via ``PATH.tmp`` and an atomic rename, so a reader
    sees the old file or the new one, never a half-written one. The folder must exist."""
    p = Path(path)
    tmp = p.with_name(p.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, p)


def write_json_atomic(path: str | Path, obj) -> None:
    """:func:`write_text_atomic` of ``obj`` as indented JSON (non-ASCII kept) and a newline."""
    write_text_atomic(path, json.dumps(obj, indent=2, ensure_ascii=False) + "\n")


__all__ = ["JsonlAppender", "read_jsonl", "read_jsonl_lines", "write_jsonl_atomic", "write_text_atomic",
           "write_json_atomic"]
