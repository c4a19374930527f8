"""Proposals read from a JSONL file (:class:`ReplayPolicy`): search records and eval answer
records (formats in :mod:`steptp.policy`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ..leir.fileformat import LeirModule
from .base import Proposal, _sha, module_of, program_key


class ReplayError(ValueError):
    """A replay or answers file that cannot be read (path, line, what is wrong)."""


def _case_keys(program: Any) -> list[tuple[str, str]]:
    """The keys a record may name ``program`` by, most specific first."""
    keys = []
    if isinstance(getattr(program, "text", None), str):
        keys.append(("parent", program.text))
    for attr, kind in (("id", "case"), ("source", "source"), ("prompt", "prompt"), ("program", "program")):
        v = getattr(program, attr, None)
        if isinstance(v, str) and not isinstance(program, LeirModule):
            keys.append((kind, _sha(v) if kind == "prompt" else v))
    if not keys:
        keys.append(("parent", program_key(program)))
    return keys


class ReplayPolicy:
    """Proposals read from a JSONL file, one record per line (format in the module docstring).

    A record names the programs it is for by ``parent`` (canonical LEIR; null or absent:
    any program), ``case``, ``source``, ``program`` or ``prompt`` (eval cases), and holds
    either ``leir`` (a program, with or without ``%`` header; the program's signature is
    used: ``signature`` when given, else the proposing program's) or ``answer`` (a raw
    model output, parsed tolerantly, :func:`steptp.llm.parse_single`).

    :meth:`propose` without ``draw`` gives each record at most once, in file order (search);
    with ``draw=(sample,)`` it gives the record of that sample for the first key of the
    program that has records (eval: ``sample`` 0-based, else the record's position among
    those of its key). Raises :class:`ReplayError` for an unreadable file or line."""

    def __init__(self, path: str | Path, signature=None):
        self.path = Path(path)
        self.signature = signature
        self.records: list[dict] = []
        self.table: dict[tuple, dict[int, int]] = {}
        self._used: set[int] = set()
        try:
            lines = self.path.read_text(encoding="utf-8").splitlines()
        except OSError as e:
            raise ReplayError(f"{self.path}: cannot read: {e.strerror or e}") from None
        except UnicodeDecodeError:
            raise ReplayError(f"{self.path}: not UTF-8 text") from None
        for n, line in enumerate(lines, 1):
            if line.strip():
                self._add(n, line)

    def _add(self, n: int, line: str) -> None:
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as e:
            raise ReplayError(f"{self.path}:{n}: not JSON: {e.msg}") from None
        if not isinstance(rec, dict) or not (isinstance(rec.get("leir"), str) or isinstance(rec.get("answer"), str)):
            raise ReplayError(f"{self.path}:{n}: expected an object with a string 'leir' or 'answer'")
        keys = [(k, str(rec[k])) for k in ("case", "source", "program") if k in rec]
        if isinstance(rec.get("prompt"), str):
            keys.append(("prompt", _sha(rec["prompt"])))
        try:
            if isinstance(rec.get("leir"), str):
                self._parse(rec["leir"])  # a bad program is an error of the file, found now
            if isinstance(rec.get("parent"), str):
                keys.append(("parent", program_key(self._parse(rec["parent"]))))
        except Exception as e:  # noqa: BLE001 - LeirSyntaxError and friends, one line each
            raise ReplayError(f"{self.path}:{n}: {str(e).splitlines()[0]}") from None
        i = len(self.records)
        self.records.append({"leir": rec.get("leir"), "answer": rec.get("answer"), "keyed": bool(keys),
                             "strategy": str(rec.get("strategy") or "replay"), "site": rec.get("site"),
                             "params": rec.get("params") if isinstance(rec.get("params"), dict) else {}})
        sample = rec.get("sample")
        for key in keys or [("any", "")]:
            slot = self.table.setdefault(key, {})
            slot[sample if isinstance(sample, int) and sample >= 0 else len(slot)] = i

    def _parse(self, text: str, signature=None) -> LeirModule:
        from ..leir import parse_leir

        m = parse_leir(text, str(self.path))
        sig = signature or self.signature
        return m if sig is None else LeirModule(sig, m.program)

    def _proposal(self, i: int, program: Any) -> Proposal:
        r = self.records[i]
        sig = self.signature or module_of(program).signature
        if r["leir"] is not None:
            site = None if r["site"] is None else str(r["site"])
            return Proposal(self._parse(r["leir"], sig), r["strategy"], site, dict(r["params"]), info={"record": i})
        from ..llm import parse_single

        cand = parse_single(r["answer"], sig)
        return Proposal(cand.module if cand.ok else None, r["strategy"], answer=r["answer"], info={"record": i})

    def propose(self, program: Any, history: list, k: int, *, draw: tuple | None = None) -> list[Proposal]:
        """At most ``k`` recorded proposals for ``program`` (see the class docstring)."""
        keys = _case_keys(program)
        if draw is not None:
            for key in keys + [("any", "")]:
                slot = self.table.get(key)
                if slot:
                    i = slot.get(draw[0])
                    return [] if i is None else [self._proposal(i, program)]
            return []
        mine = {i for key in keys for i in self.table.get(key, {}).values()}
        out = []
        for i, r in enumerate(self.records):
            if len(out) >= k:
                break
            if i in self._used or (r["keyed"] and i not in mine):
                continue
            self._used.add(i)
            out.append(self._proposal(i, program))
        return out


__all__ = ["ReplayError", "ReplayPolicy"]
