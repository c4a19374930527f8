"""Prompts for models trained on ``stp dataset`` output (paper §3.3, §4.3).

The prompts are exactly those of the chat sets: :func:`steptp.llm.format.single_prompt`
and :func:`~steptp.llm.format.multi_prompt` render ``templates/prompt_single.j2`` /
``prompt_multi.j2`` from the program name, its canonical LEIR text and its signature, so a
model evaluated here sees what it was trained on (one source of truth).
"""

from __future__ import annotations

from ..leir.fileformat import LeirModule
from ..leir.printer import format_program
from ..leir.signatures import signature_dict


def single_prompt(module: LeirModule) -> str:
    """The single-answer prompt for ``module`` (identical to the chat set's user turn)."""
    from .format import single_prompt as render_single

    return render_single(module.signature.name, format_program(module.program), signature_dict(module))


def multi_prompt(module: LeirModule, count: int) -> str:
    """The multi-answer prompt asking for ``count`` transformations of ``module``."""
    from .format import multi_prompt as render_multi

    return render_multi(module.signature.name, format_program(module.program), signature_dict(module), count)


def user_messages(prompt: str, system: str | None = None) -> list[dict]:
    """OpenAI chat messages for one user turn (optionally after a system message)."""
    msgs = [{"role": "system", "content": system}] if system else []
    return msgs + [{"role": "user", "content": prompt}]


def single_label(cot: str, transformed: LeirModule | str, strategy_name: str) -> str:
    """The single-answer label (``<think>…</think><answer>{JSON}</answer>``) as the dataset
    writes it; ``transformed`` is a module or canonical LEIR text."""
    from .format import single_label as render_label

    text = transformed if isinstance(transformed, str) else format_program(transformed.program)
    return render_label(cot, text, strategy_name)


__all__ = ["signature_dict", "single_prompt", "multi_prompt", "user_messages", "single_label"]
