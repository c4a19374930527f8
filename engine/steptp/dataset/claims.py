"""The reason checker (design.md §8 "A reason is true of its step"; issue 50): which effect
claims of a CoT's instance part its step's figures contradict.

A CoT is the strategy's description (its first line, the rule's ``description:``, a purpose
that may repeat across entries) followed by the instance part (this step's targets, how they
are reassembled, and its figures). Only the instance part is checked. Four kinds of claim are
recognised, sentence by sentence, by phrase (a claim preceded in its sentence by a negation,
``no``/``not``/``without``..., is not a claim):

=============  ===========================================  =====================================
claim          phrases (examples)                           contradicted when
=============  ===========================================  =====================================
parallelism    "more parallelism", "more threads", "runs    neither threads nor blocks per launch
               concurrently", "spread over the              increased
               multiprocessors"
operations     "fewer operations", "computed once", "one    the operation count (all kinds) did
               division replaces several", "fewer exp"      not decrease; a claim naming a kind
                                                            (``exp``, division...) is held to that
                                                            kind's count
memory         "fewer memory accesses", "less traffic",     neither the global bytes read nor
               "never stored", "instead of re-reading       the global bytes written decreased
               global memory"
reuse          "reuse", "reused", "close together in time"  the global bytes read did not
                                                            decrease and no shared/local tensor
                                                            was introduced
=============  ===========================================  =====================================

The figures are the step's :func:`steptp.engine.figures.step_figures` (the entry's ``figures``
field); a claim whose figure is missing is not checked (not counted as contradicted).
"""

from __future__ import annotations

import re

#: kind of claim -> phrases that make it (case-insensitive regular expressions)
CLAIM_PATTERNS: dict[str, tuple[str, ...]] = {
    "parallelism": (
        r"\bmore (parallelism|parallel work|concurrency|threads|thread blocks|blocks)\b",
        r"\b(increas\w*|rais\w*|expos\w*|add\w*|improv\w*|higher) (the )?(parallelism|concurrency|occupancy)\b",
        r"\b(runs?|running|execute[sd]?) concurrently\b",
        r"\bspread\w* over (the |more |all )?(multiprocessors|SMs|cores)\b",
        r"\bin parallel\b",
    ),
    "operations": (
        r"\bfewer (arithmetic )?(operations|ops|instructions|evaluations|calls|flops)\b",
        r"\b(is |are |gets )?(computed|evaluated|calculated|computes( it| them)?|evaluates( it| them)?) once\b",
        r"\b(saves?|saving|avoids?|removes?|eliminates?) (the |a |an |one )?(redundant |repeated )?"
        r"(operations?|computations?|evaluations?|recomputations?|divisions?|multiplications?|exponentials?)\b",
        r"\bone [\w ]{1,30}? (replaces|in place of|instead of|takes the place of) (two|several|many)\b",
        r"\breplac\w* (two|several|many) [\w ]{1,30}? by one\b",
        r"\bfewer (exp|exps|exponentials?|logs?|logarithms?|divisions?|multiplications?|additions?|square roots?|"
        r"transcendental calls?)\b",
    ),
    "memory": (
        r"\bfewer (global )?(memory )?(accesses|reads|writes|loads|stores|bytes|round trips|transfers)\b",
        r"\bless (global )?(memory )?(traffic|bandwidth)\b",
        r"\b(reduc\w*|sav\w*|avoid\w*|cut\w*|remov\w*|eliminat\w*) (the )?(global )?(memory )?"
        r"(accesses|traffic|reads|writes|round trips?|loads|stores)\b",
        r"\binstead of (going through|re-?reading|reading and writing) (global )?memory\b",
        r"\bnever (stored|written|read back)\b",
        r"\bsecond pass over memory\b",
    ),
    "reuse": (
        r"\b(re-?use|re-?uses|re-?used|re-?using)\b",
        r"\bclose (together )?in time\b",
    ),
}

_COMPILED = {k: [re.compile(p, re.IGNORECASE) for p in v] for k, v in CLAIM_PATTERNS.items()}
_NEGATION = re.compile(r"\b(no|not|without|never|neither|nor|none|cannot)\b|n't\b", re.IGNORECASE)
_SENTENCE = re.compile(r"(?<=[.!?;])\s+|\n+")
_QUOTED = re.compile(r"'[^'\n]*'")

#: words of a claim about one operation kind -> the kinds of ``figures["ops"]`` it is held to
_KIND_WORDS = (
    (re.compile(r"\bexp(s|onentials?)?\b", re.IGNORECASE), ("exp",)),
    (re.compile(r"\blog(s|arithms?)?\b", re.IGNORECASE), ("log",)),
    (re.compile(r"\bdivisions?\b", re.IGNORECASE), ("/",)),
    (re.compile(r"\bmultiplications?\b", re.IGNORECASE), ("*",)),
    (re.compile(r"\badditions?\b", re.IGNORECASE), ("+",)),
    (re.compile(r"\bsquare roots?\b|\bsqrt\b", re.IGNORECASE), ("sqrt",)),
    (re.compile(r"\btranscendental\b", re.IGNORECASE), ("exp", "log", "sqrt", "tanh", "erf", "**")),
)


def instance_part(cot: str, description: str | None = None) -> str:
    """The instance part of a CoT: the text after the strategy description (``description``
    when the CoT starts with it, else the first line, where every shipped template writes the
    description)."""
    text = cot.strip()
    if description and text.startswith(description.strip()):
        return text[len(description.strip()):].strip()
    return text.split("\n", 1)[1].strip() if "\n" in text else ""


def _pair(fig: dict, k: str):
    v = fig.get(k)
    if isinstance(v, (list, tuple)) and len(v) == 2 and all(isinstance(x, (int, float)) for x in v):
        return float(v[0]), float(v[1])
    return None


def _show(fig: dict, *keys: str) -> str:
    from ..engine.figures import _LABELS

    out = []
    for k in keys:
        p = _pair(fig, k)
        if p is not None:
            out.append(f"{_LABELS.get(k, k)} {p[0]:g} → {p[1]:g}")
    return "; ".join(out)


def _verdict(kind: str, sentence: str, fig: dict) -> tuple[bool | None, str]:
    """``(supported, figures shown)``; supported is None when the figures needed are missing."""
    if kind == "parallelism":
        t, b = _pair(fig, "threads"), _pair(fig, "blocks")
        if t is None and b is None:
            return None, ""
        ok = (t is not None and t[1] > t[0]) or (b is not None and b[1] > b[0])
        return ok, _show(fig, "threads", "blocks")
    if kind == "operations":
        ops = fig.get("ops")
        tot = _pair(fig, "ops_total")
        if not isinstance(ops, dict) or tot is None:
            return None, ""
        prose = _QUOTED.sub("''", sentence)
        named = [ks for rx, ks in _KIND_WORDS if rx.search(prose)]
        if named:
            kinds = {k for ks in named for k in ks}
            b = sum(ops.get(k, [0, 0])[0] for k in kinds)
            a = sum(ops.get(k, [0, 0])[1] for k in kinds)
            return a < b, "; ".join(f"{k} {ops[k][0]:g} → {ops[k][1]:g}" for k in sorted(kinds) if k in ops) or \
                f"{'/'.join(sorted(kinds))} 0 → 0"
        return tot[1] < tot[0], f"operations {tot[0]:g} → {tot[1]:g}"
    if kind == "memory":
        r, w = _pair(fig, "global_bytes_read"), _pair(fig, "global_bytes_written")
        if r is None or w is None:
            return None, ""
        return r[1] < r[0] or w[1] < w[0], _show(fig, "global_bytes_read", "global_bytes_written")
    if kind == "reuse":
        r, o = _pair(fig, "global_bytes_read"), _pair(fig, "onchip_tensors")
        if r is None or o is None:
            return None, ""
        return r[1] < r[0] or o[1] > o[0], _show(fig, "global_bytes_read", "onchip_tensors")
    return None, ""


def find_claims(text: str) -> list[tuple[str, str, str]]:
    """``(kind, phrase, sentence)`` of every claim in ``text`` (module docstring), at most one
    per kind and sentence."""
    out = []
    for sentence in (s.strip() for s in _SENTENCE.split(text)):
        if not sentence:
            continue
        prose = _QUOTED.sub("''", sentence)  # quoted LEIR is code, not a claim
        for kind, pats in _COMPILED.items():
            for rx in pats:
                m = next((m for m in rx.finditer(prose) if not _NEGATION.search(prose[max(0, m.start() - 40):
                                                                                        m.start()])), None)
                if m is not None:
                    out.append((kind, m.group(0), sentence))
                    break
    return out


def contradicted_claims(cot: str, figures: dict, description: str | None = None) -> list[dict]:
    """The claims of ``cot``'s instance part (:func:`instance_part`) that ``figures`` (a
    :func:`steptp.engine.figures.step_figures` dict: ``[before, after]`` per figure) contradict:
    a list of ``{"claim": kind, "phrase": ..., "sentence": ..., "figures": "threads per launch 8 →
    4; ..."}`` (empty when none is). Kinds and what contradicts them: see the module docstring.
    A claim whose figures are missing is not reported."""
    out = []
    for kind, phrase, sentence in find_claims(instance_part(cot, description)):
        ok, shown = _verdict(kind, sentence, figures or {})
        if ok is False:
            out.append({"claim": kind, "phrase": phrase, "sentence": sentence, "figures": shown})
    return out


def entry_figures(entry: dict) -> dict | None:
    """An entry's figures: its ``figures`` field, else computed from its ``original`` and
    ``transformed`` LEIR and ``signature`` (entries written before the field existed); None
    when neither is possible."""
    fig = entry.get("figures")
    if isinstance(fig, dict) and fig:
        return fig
    try:
        from ..engine.figures import step_figures
        from ..leir.fileformat import LeirModule, Signature, TensorDecl
        from ..leir.parser import parse_program

        sig = entry.get("signature") or {}
        signature = Signature(sig.get("name", entry.get("program", "")),
                              tuple(TensorDecl(t["name"], t["role"], t["dtype"], tuple(t["shape"]))
                                    for t in sig.get("tensors", ())))
        before = LeirModule(signature, parse_program(entry["original"]["leir"]))
        after = LeirModule(signature, parse_program(entry["transformed"]["leir"]))
        return step_figures(before, after) or None
    except Exception:  # noqa: BLE001 - an entry we cannot read is not checked
        return None


#: a figure written ``before → after`` (numbers, optionally with a unit)
_FIGURE = re.compile(r"\d[\d.]*\s*(?:[a-zµ]+\s*)?→\s*\d")


def claims_summary(entries: list[dict], examples: int = 5) -> dict:
    """``{"checked": n, "contradicted": k, "without_figure": m, "examples": [...]}`` over dataset
    entries: ``n`` entries with a CoT and figures, ``k`` of them with at least one contradicted
    claim, ``m`` whose CoT gives no figure written ``before → after`` (design.md §8: every reason
    gives one), and up to ``examples`` of the contradicted ones (``id``, ``strategy``, the
    contradicted claims)."""
    checked = bad = without = 0
    shown = []
    for e in entries:
        cot = e.get("cot")
        fig = entry_figures(e) if isinstance(cot, str) and cot else None
        if fig is None:
            continue
        checked += 1
        if not _FIGURE.search(cot):
            without += 1
        found = contradicted_claims(cot, fig)
        if found:
            bad += 1
            if len(shown) < examples:
                shown.append({"id": e.get("id"), "strategy": (e.get("strategy") or {}).get("id"), "claims": found})
    return {"checked": checked, "contradicted": bad, "without_figure": without, "examples": shown}


__all__ = ["CLAIM_PATTERNS", "instance_part", "find_claims", "contradicted_claims", "entry_figures", "claims_summary"]
