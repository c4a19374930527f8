"""What lets every search algorithm run with a runner that answers in rounds: the caches a
search is replayed from (:mod:`steptp.search.run`).

A search whose batch is pending (:class:`steptp.runner.base.Pending`) stops; when the runner has
the results, the same search runs again *from the start*: the algorithm is deterministic for its
seed, so it makes the same calls, and each is answered from a cache instead of being done again:

* :class:`CachedPolicy`: the policy's answers, call by call (the n-th ``propose`` of the search
  gets the n-th recorded answer; an LLM's answers, which a second request would not reproduce,
  included). The wrapped policy is told about every replayed call (``replayed``, when it has
  one) so that its own state (what it proposed where) matches a search that never stopped.
* the evaluator's verification verdicts by program text (:attr:`steptp.search.evaluate.Measure.verified`);
* the runner's measurements (its own files, e.g. ``OUT/rounds/<k>/results``).

:class:`SearchCache` keeps the first two in ``OUT/<program>/.search/cache.json`` (written
atomically when a search stops for a pending batch; it stays after the search ends, the record
of what was proposed and how it was checked; a cache written with other settings is ignored).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ..leir import LeirModule, format_program, parse_program
from ..policy import Proposal
from ..policy.steps import steps_of_records, steps_to_records

FORMAT = "stp-search-cache/1"


def proposal_record(p: Proposal) -> dict:
    """A JSON-ready record of one proposal (``leir``: canonical program text, None when the
    answer could not be read). A multi-step proposal's steps are written as records in
    ``info["steps"]`` (after ``info["rule"]``), where caches have always held them."""
    from ..engine.jsonify import plain  # noqa: PLC0415

    info = dict(p.info)
    if p.steps:
        head = {"rule": info.pop("rule")} if "rule" in info else {}
        info = {**head, "steps": steps_to_records(p.steps), **info}
    return {"leir": format_program(p.module.program) if p.module is not None else None, "strategy": p.strategy,
            "site": p.site, "params": plain(p.params), "cot": p.cot, "answer": p.answer, "error": p.error,
            "info": plain(info)}


def proposal_of(rec: dict, signature) -> Proposal:
    """The :class:`Proposal` of a :func:`proposal_record` (the program with ``signature``; the
    step records of ``info["steps"]`` become its typed :attr:`~Proposal.steps`)."""
    mod = LeirModule(signature, parse_program(rec["leir"])) if rec.get("leir") is not None else None
    info = dict(rec.get("info") or {})
    steps = steps_of_records(info.pop("steps", None) or (), signature)
    return Proposal(mod, rec["strategy"], rec.get("site"), dict(rec.get("params") or {}), rec.get("cot") or "",
                    rec.get("answer"), rec.get("error"), info, steps)


class CachedPolicy:
    """The wrapped policy's answers recorded call by call (module docstring). ``calls``: the
    recorded answers (a list of lists of :func:`proposal_record`; extended in place);
    ``make``: ``fn() -> policy``, called on the first call not in the cache (a replayed search
    that never goes further never starts the engine); ``signature``: the programs' signature."""

    def __init__(self, make, calls: list, signature):
        self._make, self.calls, self.signature = make, calls, signature
        self.inner = None
        self._n = 0
        self._replayed: list[tuple[Any, list[Proposal]]] = []

    def _policy(self):
        if self.inner is None:
            self.inner = self._make()
            hook = getattr(self.inner, "replayed", None)
            if hook is not None:
                for program, props in self._replayed:
                    hook(program, props)
            self._replayed = []
        return self.inner

    def propose(self, program, history, k: int) -> list[Proposal]:
        """The n-th call's recorded answer, else the wrapped policy's (recorded)."""
        n = self._n
        self._n += 1
        if n < len(self.calls):
            props = [proposal_of(r, self.signature) for r in self.calls[n]]
            if self.inner is None:
                self._replayed.append((program, props))
            else:
                hook = getattr(self.inner, "replayed", None)
                if hook is not None:
                    hook(program, props)
            return props
        props = list(self._policy().propose(program, history, k))
        self.calls.append([proposal_record(p) for p in props])
        return props

    def close(self) -> None:
        close = getattr(self.inner, "close", None)
        if close is not None:
            close()

    def __getattr__(self, name):  # skipped / log / replayed of the wrapped policy
        if name in ("skipped", "log"):
            return getattr(self._policy(), name)
        raise AttributeError(name)


class SearchCache:
    """``OUT/<program>/.search/cache.json``: ``proposals`` (:class:`CachedPolicy` calls) and
    ``verified`` (text -> verdict), and ``key`` (the search's settings: a cache written by a
    search with other settings is not used)."""

    def __init__(self, outdir: str | Path, key: dict):
        self.path = Path(outdir) / ".search" / "cache.json"
        self.key = key
        self.proposals: list = []
        self.verified: dict = {}
        try:
            doc = json.loads(self.path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return
        if doc.get("format") == FORMAT and doc.get("key") == key:
            self.proposals, self.verified = doc.get("proposals") or [], doc.get("verified") or {}

    def save(self) -> None:
        from ..io import write_json_atomic  # noqa: PLC0415

        self.path.parent.mkdir(parents=True, exist_ok=True)
        write_json_atomic(self.path, {"format": FORMAT, "key": self.key, "proposals": self.proposals,
                                      "verified": self.verified})


__all__ = ["CachedPolicy", "SearchCache", "proposal_record", "proposal_of"]
