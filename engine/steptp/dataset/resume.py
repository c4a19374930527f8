"""Resume state of an ``stp dataset`` output directory: what is already done, what is not.

Rules (crash safety, paper-independent engineering):

* Only complete lines count (:func:`steptp.io.read_jsonl_lines`): a torn last
  line, parseable or not, is never taken as written.
* A program is **done** only when its ``state.jsonl`` line is complete *and* every entry
  id that line lists (``ids``) is in ``dictionary.jsonl``. So a dictionary truncated after
  a finished run (a lost or torn last entry) makes its program run again and the missing
  entries are appended; entries already present (same id) are never duplicated.
* Log lines of programs that are not done (their ``state.jsonl`` line, their
  ``attempts.jsonl`` lines) are dropped by an atomic rewrite before the run continues, so
  the rerun writes them once and the report counts each attempt once.
* Every line is validated first: a valid-JSON line that is not a record of that file
  (``{}``, ``[1,2]``, an entry without ``id``) raises :class:`ResumeError` naming the file
  and line, before anything in the directory is changed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from ..io import read_jsonl_lines, write_jsonl_atomic


class ResumeError(ValueError):
    """An output file holds something that is not a record of that file."""


#: required keys and their types per output file
_SCHEMA = {
    "dictionary.jsonl": {"id": str, "strategy": dict, "difficulty": dict, "original": dict, "transformed": dict,
                         "signature": dict},
    "state.jsonl": {"key": str},
    "attempts.jsonl": {"rule": str, "outcome": str},
}


def read_records(path: Path) -> list[dict]:
    """Complete records of one output file, validated against its required keys.
    Raises :class:`ResumeError` (``FILE:LINE: ...``) for invalid JSON or a foreign record."""
    need = _SCHEMA.get(path.name, {})
    out = []
    try:
        for lineno, rec in read_jsonl_lines(path):
            if not isinstance(rec, dict):
                raise ResumeError(f"{path}:{lineno}: expected a JSON object, got {type(rec).__name__}")
            for k, t in need.items():
                if not isinstance(rec.get(k), t):
                    raise ResumeError(f"{path}:{lineno}: not a {path.stem} record (no {t.__name__} {k!r})")
            out.append(rec)
    except ResumeError:
        raise
    except ValueError as e:
        raise ResumeError(str(e)) from None
    return out


@dataclass
class ResumeState:
    """``done``: program keys to skip; ``known_ids``: entry ids present in the dictionary."""

    done: set[str] = field(default_factory=set)
    known_ids: set[str] = field(default_factory=set)
    dropped_state: int = 0
    dropped_attempts: int = 0


def load_resume_state(out: Path, validate_only: bool = False) -> ResumeState:
    """Read and validate ``out``'s dictionary, state and attempts files, decide which
    programs are done (module docstring) and, unless ``validate_only``, atomically drop
    the log lines of programs that are not. Raises :class:`ResumeError` before writing
    anything when a file holds a foreign or invalid record."""
    entries = read_records(out / "dictionary.jsonl")
    states = read_records(out / "state.jsonl")
    attempts = read_records(out / "attempts.jsonl")
    st = ResumeState(known_ids={e["id"] for e in entries})
    for s in states:
        ids = s.get("ids")
        if ids is None or (isinstance(ids, list) and all(isinstance(i, str) and i in st.known_ids for i in ids)):
            st.done.add(s["key"])
        else:
            st.done.discard(s["key"])
    if validate_only:
        return st
    keep_states = [s for s in states if s["key"] in st.done]
    source_of = {s["key"]: s.get("source") for s in keep_states}
    done_sources = set(source_of.values())
    keep_attempts = [a for a in attempts
                     if (a["key"] in st.done if "key" in a else a.get("source") in done_sources)]
    st.dropped_state = len(states) - len(keep_states)
    st.dropped_attempts = len(attempts) - len(keep_attempts)
    if st.dropped_state:
        write_jsonl_atomic(out / "state.jsonl", keep_states)
    if st.dropped_attempts:
        write_jsonl_atomic(out / "attempts.jsonl", keep_attempts)
    return st


__all__ = ["ResumeError", "ResumeState", "read_records", "load_resume_state"]
