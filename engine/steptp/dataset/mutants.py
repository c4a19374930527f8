"""Hard negatives: plausible mistakes made to a verified step (``stp dataset --negatives``).

Each operator edits the canonical LEIR text of a transformed program in one place, the way a
model's wrong answer would differ from a right one:

* ``drop_iteration``: a loop runs one iteration fewer (a reduction that drops its last
  element, or an output row never written);
* ``flip_sign``: one binary ``+`` of an equation becomes ``-`` (a sign-flipped term);
* ``wrong_constant``: one floating point literal ``c`` becomes ``c * 1.5 + 0.5``;
* ``index_shift``: one index ``v`` of a read becomes ``v+1`` (off by one; may also read out of
  bounds, which the analysis refuses: a Build failure);
* ``precision_downgrade``: an intermediate tensor (an accumulator) stored in ``f16`` instead of
  ``f32``/``f64``.

:func:`mutants` yields distinct mutated texts that parse, in a seeded order. Whether each one
really fails is for the verifier to say: one that passes is a verifier defect (or an
equivalent edit) and is reported, never recorded as a negative.
"""

from __future__ import annotations

import random
import re
from typing import Iterator

OPERATORS = ("drop_iteration", "flip_sign", "wrong_constant", "index_shift", "precision_downgrade")


def _outside_braces(text: str, ch: str) -> list[int]:
    """Positions of ``ch`` outside ``{...}`` and not part of an exponent (``1e+5``)."""
    out, depth = [], 0
    for i, c in enumerate(text):
        if c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
        elif c == ch and depth == 0 and not (i > 0 and text[i - 1] in "eE" and i > 1 and text[i - 2].isdigit()):
            out.append(i)
    return out


def _sites(text: str, op: str, known: set[str]) -> list[tuple[int, int, str]]:
    """``(start, end, replacement)`` edits of ``op`` in ``text``."""
    if op == "drop_iteration":
        return [(m.start(1), m.end(1), str(int(m.group(1)) - 1))
                for m in re.finditer(r"[LPVUB]\^\{(\d+)\}", text) if int(m.group(1)) > 1]
    if op == "flip_sign":
        # only inside equations (after '=' within '[...]'): between '=' and ';'
        out = []
        for eq in re.finditer(r"=([^;\[\]]*);", text):
            body_start = eq.start(1)
            for k in _outside_braces(eq.group(1), "+"):
                out.append((body_start + k, body_start + k + 1, "-"))
        return out
    if op == "wrong_constant":
        return [(m.start(), m.end(), repr(float(m.group()) * 1.5 + 0.5))
                for m in re.finditer(r"(?<![\w.^{,])\d+\.\d+(?:[eE][+-]?\d+)?", text)]
    if op == "index_shift":
        # the last index of a read (right of '=') of a tensor: _{...,v} -> _{...,v+1}
        out = []
        for eq in re.finditer(r"=([^;\[\]]*);", text):
            for m in re.finditer(r"\}_\{([^{}]*?)([A-Za-z_]\w*)\}", eq.group(1)):
                s = eq.start(1) + m.start(2)
                out.append((s, s + len(m.group(2)), m.group(2) + "+1"))
        return out
    if op == "precision_downgrade":
        names = sorted({m.group(1) for m in re.finditer(r"\b([A-Za-z_]\w*)\^\{(?:f32|f64),", text)} - known)
        return [(-1, -1, n) for n in names]
    raise ValueError(f"unknown mutation operator {op!r}")


def _apply(text: str, op: str, site: tuple[int, int, str]) -> str:
    if op == "precision_downgrade":
        name = site[2]
        return re.sub(rf"\b{re.escape(name)}\^\{{(?:f32|f64),", f"{name}^{{f16,", text)
    s, e, new = site
    return text[:s] + new + text[e:]


def mutants(module, count: int, seed: int = 0) -> Iterator[tuple[str, object]]:
    """Up to ``count`` distinct mutants of ``module`` (a LeirModule): ``(operator, LeirModule)``
    pairs that parse, operators in a seeded round-robin, sites in a seeded order."""
    from ..leir.fileformat import LeirModule, parse_leir  # noqa: PLC0415
    from ..leir.printer import format_program  # noqa: PLC0415

    text = format_program(module.program)
    known = {t.name for t in module.signature.tensors}
    rng = random.Random(f"mutants:{seed}:{text}")
    ops = list(OPERATORS)
    rng.shuffle(ops)
    pools = {op: _sites(text, op, known) for op in ops}
    for p in pools.values():
        rng.shuffle(p)
    seen = {text}
    made = 0
    while made < count and any(pools.values()):
        for op in ops:
            if made >= count or not pools[op]:
                continue
            new = _apply(text, op, pools[op].pop())
            if new in seen:
                continue
            seen.add(new)
            try:
                m = parse_leir(new, "mutant")
            except Exception:  # noqa: BLE001 - an edit that does not parse is no mutant
                continue
            made += 1
            yield op, LeirModule(module.signature, m.program)


__all__ = ["OPERATORS", "mutants"]
