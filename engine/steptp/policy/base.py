"""The policy protocol: ``Policy.propose(program, history, k) -> list[Proposal]``, the
:class:`Proposal`, and the keys every policy uses for a program."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any, Protocol

from ..leir.fileformat import LeirModule


@dataclass
class Proposal:
    """One candidate next program.

    ``module``: the program (the input's signature), None when an answer could not be read;
    ``steps``: a multi-step proposal's steps (:class:`~steptp.policy.steps.Step`, the last one
    reaching ``module``), empty for a single step;
    ``strategy``: a rule id, or the claimed strategy in rule-id spelling (``+`` between
    several); ``site``: text or None; ``params``: JSON-ready values; ``cot``: the chain of
    thought ('' if none); ``answer``: the raw answer text the proposal was read from (a
    model's or a file's), None for engine proposals; ``error``: why no answer could be
    obtained (``"request: ..."``), else None; ``info``: JSON-ready extras (rule id, tokens,
    finish reason)."""

    module: LeirModule | None
    strategy: str
    site: str | None = None
    params: dict = field(default_factory=dict)
    cot: str = ""
    answer: str | None = None
    error: str | None = None
    info: dict = field(default_factory=dict)
    steps: tuple = ()


class Policy(Protocol):
    """Anything that proposes at most ``k`` next programs for ``program`` given ``history``."""

    def propose(self, program: Any, history: list, k: int) -> list[Proposal]: ...


def module_of(program: Any) -> LeirModule:
    """The :class:`~steptp.leir.LeirModule` of a policy's ``program`` argument (itself, or its
    ``.module``). Raises ``TypeError`` for anything else."""
    if isinstance(program, LeirModule):
        return program
    mod = getattr(program, "module", None)
    if not isinstance(mod, LeirModule):
        raise TypeError(f"expected a LeirModule or an object with one in .module, got {type(program).__name__}")
    return mod


def program_key(program: Any) -> str:
    """The canonical program text (printer output, no header) of ``program``: the key of
    every per-program cache and draw (a search node's ``text`` when it has one)."""
    text = getattr(program, "text", None)
    if isinstance(text, str):
        return text
    from ..leir.printer import format_program

    return format_program(module_of(program).program)


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


__all__ = ["Proposal", "Policy", "module_of", "program_key"]
