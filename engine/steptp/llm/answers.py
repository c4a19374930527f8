"""Tolerant reading of model answers, shared by ``stp eval`` and the search's LLM policy.

Every failure (no ``<answer>`` block, garbage, oversized or deeply nested JSON, a
non-LEIR or ill-fitting ``transformed_IR``, wrong tensor names, shapes or dtypes) becomes a
reason string, never an exception: :func:`parse_single` for the single-answer format
(wraps :func:`steptp.llm.format.parse_answer`), :func:`parse_candidates` for answers
holding several candidate IRs (JSON entries with ``idx``, ``transformed_IR`` and
``applied_strategy`` or ``applied_strategies``), each candidate judged on its own.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from ..leir.fileformat import LeirModule, Signature, parse_leir
from ..leir.printer import format_program


@dataclass
class Candidate:
    """One transformed program read from an answer.

    ``module`` carries the prompt's signature and the answer's program (None when the item
    failed); ``leir`` its canonical text; ``strategy`` the claimed strategy name ('' when
    absent); ``idx`` the item's ``idx`` (else its position); ``reason`` '' or why it failed."""

    idx: int
    strategy: str
    module: LeirModule | None
    leir: str | None
    reason: str = ""

    @property
    def ok(self) -> bool:
        return self.module is not None and not self.reason


def _signature(signature) -> Signature:
    from ..leir.signatures import signature_of

    return signature_of(signature)


def _module_of(ir: str, sig: Signature) -> LeirModule:
    """The answer's program under the prompt's signature (the IR may omit the header)."""
    m = parse_leir(ir, "answer")
    return LeirModule(sig, m.program)


def parse_single(text, signature) -> Candidate:
    """Read a single-answer output: the first item of :func:`~steptp.llm.format.parse_answer`
    with ``signature`` (a :class:`~steptp.leir.fileformat.Signature` or an entry's signature
    dict). Never raises: a failure is a :class:`Candidate` with ``module`` None and the
    reason (a list with several items is scored by its first; the reason then stays '')."""
    from .format import AnswerError, parse_answer

    sig = _signature(signature)
    try:
        items = parse_answer(text, signature=sig, check_ir=True)
        it = items[0]
        mod = _module_of(it["transformed_IR"], sig)
        return Candidate(0, it["applied_strategy"], mod, format_program(mod.program))
    except AnswerError as e:
        return Candidate(0, _claimed(text), None, None, str(e))
    except RecursionError:
        return Candidate(0, "", None, None, "answer nested too deeply")
    except Exception as e:  # noqa: BLE001 - hostile text must never crash the caller
        return Candidate(0, "", None, None, f"unreadable answer: {type(e).__name__}: {_short(str(e))}")


def parse_candidates(text, signature, max_items: int = 64) -> tuple[list[Candidate], str]:
    """Read an answer holding one or several candidates. Returns ``(candidates, reason)``:
    ``reason`` is '' or why nothing could be read (no block, invalid JSON...); each candidate
    has its own reason. Strategy key ``applied_strategy`` or ``applied_strategies`` (string or
    list of strings, joined with ``, ``). At most ``max_items`` items are read. Never raises."""
    from .format import AnswerError, answer_payload, parse_answer

    try:
        sig = _signature(signature)
        data = answer_payload(text)
    except AnswerError as e:
        return [], str(e)
    except Exception as e:  # noqa: BLE001
        return [], f"unreadable answer: {type(e).__name__}: {_short(str(e))}"
    items = data if isinstance(data, list) else [data]
    if not items:
        return [], "answer list is empty"
    out = []
    for pos, it in enumerate(items[:max_items]):
        idx = pos
        if isinstance(it, dict) and isinstance(it.get("idx"), int) and not isinstance(it.get("idx"), bool):
            idx = it["idx"]
        if not isinstance(it, dict):
            out.append(Candidate(idx, "", None, None, f"answer item {pos} is a {type(it).__name__}, expected an object"))
            continue
        strat = it.get("applied_strategy", it.get("applied_strategies"))
        if isinstance(strat, list) and all(isinstance(s, str) for s in strat):
            strat = ", ".join(strat)
        if not isinstance(strat, str) or not strat.strip():
            strat = ""
        ir = it.get("transformed_IR")
        if not isinstance(ir, str) or not ir.strip():
            out.append(Candidate(idx, strat, None, None, f"answer item {pos} has no string 'transformed_IR'"))
            continue
        one = "<answer>" + json.dumps({"transformed_IR": ir, "applied_strategy": strat or "?"}) + "</answer>"
        try:
            parse_answer(one, signature=sig, check_ir=True)
            mod = _module_of(ir, sig)
            out.append(Candidate(idx, strat, mod, format_program(mod.program)))
        except AnswerError as e:
            out.append(Candidate(idx, strat, None, None, str(e).replace("answer item 0", f"answer item {pos}", 1)))
        except Exception as e:  # noqa: BLE001
            out.append(Candidate(idx, strat, None, None, f"answer item {pos}: {type(e).__name__}: {_short(str(e))}"))
    return out, ""


def _claimed(text) -> str:
    """Best-effort claimed strategy of an answer that failed (for the claimed-vs-recognised table)."""
    from .format import answer_payload

    try:
        data = answer_payload(text)
    except Exception:  # noqa: BLE001
        return ""
    it = data[0] if isinstance(data, list) and data else data
    s = it.get("applied_strategy", it.get("applied_strategies")) if isinstance(it, dict) else None
    if isinstance(s, list) and all(isinstance(x, str) for x in s):
        s = ", ".join(s)
    return s[:200] if isinstance(s, str) else ""


def _short(s: str, limit: int = 300) -> str:
    s = " ".join(s.split())
    return s if len(s) <= limit else s[:limit] + "..."


__all__ = ["Candidate", "parse_single", "parse_candidates"]
