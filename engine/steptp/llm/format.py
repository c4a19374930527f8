"""The chat format shared by the training sets and the models that answer them (paper §3.3).

Prompts and the single-answer label are rendered from the Jinja templates
``templates/prompt_single.j2``, ``prompt_multi.j2`` and ``answer_single.j2``. Labels are
``<think>CoT</think><answer>JSON</answer>``; the JSON uses the key ``applied_strategy``
in both the prompt and the label. JSON is always double-quoted (``json.dumps``).

:func:`parse_answer` reads a model's answer back and raises :class:`AnswerError` with a
precise reason for garbage.

It sits below both users (issue 53): :mod:`steptp.dataset.chat` writes the chat sets with it
(and re-exports every name), :mod:`steptp.llm.prompts` and :mod:`steptp.llm.answers` prompt
models and read their answers with it, so the LLM layer needs nothing from ``dataset/``.
"""

from __future__ import annotations

import json
import re

from ..leir.ast import DTYPES
from ..leir.signatures import signature_of
from ..resources import render


class AnswerError(ValueError):
    """A model answer that cannot be read (no <answer> block, invalid JSON, missing keys)."""


def _tensor_rows(signature: dict) -> list[dict]:
    return [
        {"name": t["name"], "role": t["role"], "torch_dtype": "torch." + DTYPES[t["dtype"]], "shape": list(t["shape"])}
        for t in signature["tensors"]
    ]


def single_prompt(name: str, leir: str, signature: dict) -> str:
    """The single-answer user prompt (``prompt_single.j2``) for program ``name`` with canonical
    LEIR text ``leir`` and ``signature`` (a dictionary entry's ``signature`` dict). The one
    source of the prompt: :func:`steptp.dataset.chat.single_messages` and ``stp eval`` both use it."""
    return render("prompt_single.j2", name=name, leir=leir, tensors=_tensor_rows(signature))


def single_label(cot: str, transformed_leir: str, strategy_name: str) -> str:
    """The single-answer assistant label ``<think>cot</think><answer>{JSON}</answer>``."""
    answer = json.dumps({"transformed_IR": transformed_leir, "applied_strategy": strategy_name}, ensure_ascii=False)
    return render("answer_single.j2", cot=cot, answer_json=answer)


def multi_prompt(name: str, leir: str, signature: dict, count: int) -> str:
    """The multi-answer user prompt (``prompt_multi.j2``) asking for ``count`` transformations."""
    return render("prompt_multi.j2", name=name, leir=leir, tensors=_tensor_rows(signature), count=count)


#: Largest model output :func:`parse_answer` reads (characters); longer text is refused.
MAX_ANSWER_CHARS = 2_000_000
_CLOSE_RE = re.compile(r"<[ \t\r\n]*[\\/]answer[ \t\r\n]*>")


def _find_close(body: str) -> tuple[int, int] | None:
    """Span of the first ``</answer>`` (or ``<\\answer>``, spaces allowed) in linear time:
    the regex is only tried at each ``<``, and a whitespace run is skipped once."""
    i = body.find("<")
    while i >= 0:
        m = _CLOSE_RE.match(body, i)
        if m:
            return m.start(), m.end()
        j = i + 1
        while j < len(body) and body[j] in " \t\r\n":
            j += 1
        i = body.find("<", j)
    return None


def _strip_fence(body: str) -> str:
    """Drop a leading ```json / ``` fence and a trailing ``` (no backtracking regex)."""
    body = body.strip()
    if body.startswith("```"):
        body = body[3:]
        if body.startswith("json"):
            body = body[4:]
        body = body.lstrip()
    if body.endswith("```"):
        body = body[:-3].rstrip()
    return body


def _check_ir(i: int, text: str, signature) -> None:
    """The transformed IR must be LEIR; with a signature it must also be a valid program
    over exactly those known tensors (a header, when present, must match it)."""
    from ..leir.analysis import LeirSemanticError, analyze
    from ..leir.fileformat import parse_leir
    from ..leir.parser import LeirSyntaxError

    try:
        m = parse_leir(text, f"answer item {i} transformed_IR")
    except LeirSyntaxError as e:
        raise AnswerError(f"answer item {i}: transformed_IR is not LEIR: {e}") from None
    if signature is None:
        return
    if m.signature.tensors:
        want = {t.name: (t.role == "output", t.dtype, tuple(t.shape)) for t in signature.tensors}
        got = {t.name: (t.role == "output", t.dtype, tuple(t.shape)) for t in m.signature.tensors}
        if want != got:
            raise AnswerError(f"answer item {i}: transformed_IR declares other tensors than the prompt "
                              f"({sorted(set(got) ^ set(want)) or 'changed shapes/dtypes'})")
    try:
        analyze(m.program, signature)
    except LeirSemanticError as e:
        raise AnswerError(f"answer item {i}: transformed_IR does not fit the prompt's signature: {e}") from None


def parse_answer(text: str, signature=None, check_ir: bool = True) -> list[dict]:
    """Parse a model answer into a list of ``{"transformed_IR", "applied_strategy"}`` dicts.

    Accepts ``<answer>...</answer>`` (also the ``<\\answer>`` variant), optionally fenced
    with ```json, holding a JSON object or a list of objects. Every ``transformed_IR`` must
    parse as LEIR; with ``signature`` (a :class:`~steptp.leir.fileformat.Signature` or a
    dictionary entry's ``signature`` dict) it must also be a valid program over exactly
    the prompt's known tensors (``check_ir=False`` skips both checks). Linear time; text above :data:`MAX_ANSWER_CHARS` is
    refused. Raises :class:`AnswerError` naming what is wrong: no answer block, invalid
    JSON (with line/column, also JSON nested too deeply or numbers too long), a non-object
    item, a missing/non-string ``transformed_IR`` / ``applied_strategy``, or an IR that is
    not LEIR or does not fit the signature.
    """
    data = answer_payload(text)
    items = data if isinstance(data, list) else [data]
    if not items:
        raise AnswerError("answer list is empty")
    sig = signature_of(signature)
    out = []
    for i, it in enumerate(items):
        if not isinstance(it, dict):
            raise AnswerError(f"answer item {i} is a {type(it).__name__}, expected an object")
        for key in ("transformed_IR", "applied_strategy"):
            if not isinstance(it.get(key), str) or not it[key].strip():
                raise AnswerError(f"answer item {i} has no string '{key}'")
        if check_ir:
            _check_ir(i, it["transformed_IR"], sig)
        out.append({"transformed_IR": it["transformed_IR"], "applied_strategy": it["applied_strategy"]})
    return out


def answer_payload(text: str):
    """The JSON value inside the ``<answer>`` block of a model output (the envelope part of
    :func:`parse_answer`, without the item checks): linear time, same limits; raises
    :class:`AnswerError` for no/unclosed block or invalid JSON."""
    if not isinstance(text, str):
        raise AnswerError(f"the model output is a {type(text).__name__}, expected text")
    if len(text) > MAX_ANSWER_CHARS:
        raise AnswerError(f"the model output has {len(text)} characters, above the limit {MAX_ANSWER_CHARS}")
    start = text.find("<answer>")
    if start < 0:
        raise AnswerError("no <answer> block in the model output")
    body = text[start + len("<answer>"):]
    span = _find_close(body)
    if span is None:
        raise AnswerError("<answer> block is not closed")
    body = _strip_fence(body[:span[0]])
    try:
        data = json.loads(body)
    except json.JSONDecodeError as e:
        raise AnswerError(f"answer is not valid JSON: {e.msg} at line {e.lineno} column {e.colno}") from None
    except RecursionError:
        raise AnswerError("answer is not valid JSON: nested too deeply") from None
    except ValueError as e:  # e.g. an integer beyond Python's digit limit
        raise AnswerError(f"answer is not valid JSON: {e}") from None
    return data


__all__ = ["AnswerError", "single_prompt", "single_label", "multi_prompt", "parse_answer", "answer_payload",
           "MAX_ANSWER_CHARS"]
