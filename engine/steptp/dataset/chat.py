"""Chat-template training sets (paper §3.3) in ms-swift ``{"messages": [...]}`` form.

Prompts and labels are rendered from the Jinja templates ``templates/prompt_single.j2``,
``prompt_multi.j2``, ``answer_single.j2`` and ``answer_multi.j2``. Labels are
``<think>CoT</think><answer>JSON</answer>``; the JSON uses the key ``applied_strategy``
in both the prompt and the label (the paper's code asked for ``applied_strategies`` but
labelled ``applied_strategy``). JSON is always double-quoted (``json.dumps``).

:func:`parse_answer` reads a model's answer back and raises :class:`AnswerError` with a
precise reason for garbage.
"""

from __future__ import annotations

import json
import re

from ..leir.ast import DTYPES
from ..resources import render


class AnswerError(ValueError):
    """A model answer that cannot be read (no <answer> block, invalid JSON, missing keys)."""


def _tensor_rows(signature: dict) -> list[dict]:
    return [
        {"name": t["name"], "role": t["role"], "torch_dtype": "torch." + DTYPES[t["dtype"]], "shape": list(t["shape"])}
        for t in signature["tensors"]
    ]


def single_messages(entry: dict) -> dict:
    """One ms-swift record ``{"messages": [user, assistant]}`` from a dictionary entry."""
    prompt = render("prompt_single.j2", name=entry["program"], leir=entry["original"]["leir"],
                    tensors=_tensor_rows(entry["signature"]))
    answer = json.dumps({"transformed_IR": entry["transformed"]["leir"],
                         "applied_strategy": entry["strategy"]["name"]}, ensure_ascii=False)
    label = render("answer_single.j2", cot=entry["cot"], answer_json=answer)
    return {"messages": [{"role": "user", "content": prompt}, {"role": "assistant", "content": label}],
            "meta": {"kind": "single", "entry_id": entry["id"], "strategy": entry["strategy"]["id"],
                     "level": entry["difficulty"]["level"]}}


def multi_messages(entries: list[dict]) -> dict:
    """One multi-answer record from ``entries`` (>= 2 steps from the same original program)."""
    if len(entries) < 2:
        raise ValueError("a multi-answer record needs at least two transformations")
    first = entries[0]
    if any(e["original"]["leir"] != first["original"]["leir"] for e in entries):
        raise ValueError("multi-answer items must share the original program")
    prompt = render("prompt_multi.j2", name=first["program"], leir=first["original"]["leir"],
                    tensors=_tensor_rows(first["signature"]), count=len(entries))
    answer = json.dumps([{"idx": i, "transformed_IR": e["transformed"]["leir"],
                          "applied_strategy": e["strategy"]["name"]} for i, e in enumerate(entries)],
                        ensure_ascii=False)
    label = render("answer_multi.j2", cots=[e["cot"] for e in entries], answer_json=answer)
    return {"messages": [{"role": "user", "content": prompt}, {"role": "assistant", "content": label}],
            "meta": {"kind": "multi", "entry_ids": [e["id"] for e in entries],
                     "strategies": [e["strategy"]["id"] for e in entries]}}


_ANSWER_RE = re.compile(r"<\s*[\\/]answer\s*>")


def parse_answer(text: str) -> list[dict]:
    """Parse a model answer into a list of ``{"transformed_IR", "applied_strategy"}`` dicts.

    Accepts ``<answer>...</answer>`` (also the ``<\\answer>`` variant), optionally fenced
    with ```json, holding a JSON object or a list of objects. Raises :class:`AnswerError`
    naming what is wrong: no answer block, invalid JSON (with line/column), a non-object
    item, or a missing/non-string ``transformed_IR`` / ``applied_strategy``.
    """
    start = text.find("<answer>")
    if start < 0:
        raise AnswerError("no <answer> block in the model output")
    body = text[start + len("<answer>"):]
    m = _ANSWER_RE.search(body)
    if not m:
        raise AnswerError("<answer> block is not closed")
    body = body[:m.start()].strip()
    body = re.sub(r"^```(?:json)?\s*|\s*```$", "", body)
    try:
        data = json.loads(body)
    except json.JSONDecodeError as e:
        raise AnswerError(f"answer is not valid JSON: {e.msg} at line {e.lineno} column {e.colno}") from None
    items = data if isinstance(data, list) else [data]
    if not items:
        raise AnswerError("answer list is empty")
    out = []
    for i, it in enumerate(items):
        if not isinstance(it, dict):
            raise AnswerError(f"answer item {i} is a {type(it).__name__}, expected an object")
        for key in ("transformed_IR", "applied_strategy"):
            if not isinstance(it.get(key), str) or not it[key].strip():
                raise AnswerError(f"answer item {i} has no string '{key}'")
        out.append({"transformed_IR": it["transformed_IR"], "applied_strategy": it["applied_strategy"]})
    return out


__all__ = ["AnswerError", "single_messages", "multi_messages", "parse_answer"]
