"""One step, one label (issue 50; design.md §8).

Two strategies can produce the same step: ``expand_powsimp`` and ``factorization`` rewrite
``exp(a)*exp(b)`` to the same program, ``apart`` and ``collect`` a fraction to the same sum.
A data set that holds the pair twice, under two names, teaches a model that the name is
arbitrary. And a step of a derived program (round 2 and later) that gives back the program
it was derived from (``operator_fission`` undoing the ``operator_fusion`` that made its
source) is no optimisation step; the paper's own prompt forbids reverting to the parent.

* :func:`step_key`: the canonical identity of a step, ``(source, target)`` up to renaming
  loop variables and intermediate tensors (:func:`steptp.leir.alpha.alpha_normal`).
* :func:`one_label_per_step`: keeps one entry per step key, by :func:`label_precedence`,
  and records the other strategies in the kept entry's ``also_strategies``.
* :func:`program_key`: the canonical text a derived program's candidates are compared with
  (``reverts_parent``).

**Precedence** (documented in docs/dataset.md): the strategy of the lowest difficulty score
(paper Eq. 1, :func:`steptp.rules.loader.difficulty_score`) names the step: the simplest
strategy that explains a change is its most specific name. Ties, which include every pair of sympy normal forms (all score the
same), fall to the strategy id in alphabetical order: a fixed, reproducible choice, not a
judgement; the kept entry lists the other names in ``also_strategies``, so a trainer can
see every strategy that gives the step.
"""

from __future__ import annotations

import hashlib
from functools import lru_cache
from typing import Iterable

from ..leir.alpha import alpha_normal
from ..leir.parser import parse_program
from ..leir.printer import format_program


def program_key(text: str, known: Iterable[str] = ()) -> str:
    """Canonical LEIR text of program ``text`` up to renaming loop variables and
    intermediate tensors (``known``: the signature's tensor names, kept). Raises
    :class:`~steptp.leir.parser.LeirSyntaxError` for text that does not parse. Memoised by
    (text, known): parsing is ~6 ms a program, and one original heads many entries."""
    return _program_key(text, frozenset(known))


@lru_cache(maxsize=4096)
def _program_key(text: str, known: frozenset) -> str:
    return format_program(alpha_normal(parse_program(text), known))


def module_key(module) -> str:
    """:func:`program_key` of a :class:`~steptp.leir.fileformat.LeirModule` (its signature's
    tensor names kept), from its parsed program."""
    return format_program(alpha_normal(module.program, frozenset(t.name for t in module.signature.tensors)))


def known_names(entry: dict) -> frozenset:
    """The tensor names of a dictionary entry's signature (never renamed by :func:`program_key`)."""
    return frozenset(t["name"] for t in entry.get("signature", {}).get("tensors", ()))


def step_key(entry: dict) -> tuple[str, str]:
    """``(source, target)`` of a dictionary entry, each :func:`program_key` (alpha-normal
    canonical LEIR)."""
    known = known_names(entry)
    return program_key(entry["original"]["leir"], known), program_key(entry["transformed"]["leir"], known)


def step_digest(source_key: str, target_key: str) -> str:
    """The ``step_key`` field of a dictionary entry: SHA1 (16 hex digits) of the alpha-normal
    source and target texts (:func:`program_key` / :func:`module_key`), so that a data set's
    steps are compared without parsing their programs again."""
    return hashlib.sha1(f"{source_key}\n{target_key}".encode()).hexdigest()[:16]


def entry_step_digest(entry: dict) -> str:
    """An entry's ``step_key`` field, or, for an entry written without it, the same digest of
    its :func:`step_key` (its programs parsed)."""
    return entry.get("step_key") or step_digest(*step_key(entry))


def label_precedence(entry: dict) -> tuple:
    """Sort key of an entry's label: lower wins (the lowest difficulty score, then the
    strategy id; module docstring)."""
    return float(entry.get("difficulty", {}).get("score", 0.0)), str(entry["strategy"]["id"])


def one_label_per_step(entries: list[dict]) -> tuple[list[dict], list[dict]]:
    """``(kept, dropped)``: ``entries`` with one entry per step (:func:`entry_step_digest`: the
    ``step_key`` written at generation, else :func:`step_key`), in their order.
    The kept entry of a step is the one of highest precedence (:func:`label_precedence`);
    when other strategies gave the same step, it carries ``also_strategies`` (their ids,
    sorted) and each dropped entry is returned in ``dropped`` with ``duplicate_of`` (the kept
    entry's strategy id). Entries are not mutated; kept ones with others are copied."""
    groups: dict[tuple, list[int]] = {}
    for i, e in enumerate(entries):
        groups.setdefault(entry_step_digest(e), []).append(i)
    winner: dict[int, list[str]] = {}
    dropped: list[dict] = []
    for idx in groups.values():
        best = min(idx, key=lambda i: label_precedence(entries[i]))
        others = sorted({entries[i]["strategy"]["id"] for i in idx if i != best} - {entries[best]["strategy"]["id"]})
        winner[best] = others
        for i in idx:
            if i != best:
                dropped.append({**entries[i], "duplicate_of": entries[best]["strategy"]["id"]})
    kept = []
    for i, e in enumerate(entries):
        if i in winner:
            kept.append({**e, "also_strategies": winner[i]} if winner[i] else e)
    return kept, dropped


__all__ = ["program_key", "module_key", "known_names", "step_key", "step_digest", "entry_step_digest", "label_precedence",
           "one_label_per_step"]
