"""What the verifier's inputs can be and the limits of each dtype, for the engine's value
analyses (:mod:`steptp.engine.magnitude`, a pre-filter, and :mod:`steptp.engine.signs`, which
proves): a leaf module, so both (and :mod:`steptp.engine.algebra`, which asks signs) import it
without a cycle. The figures mirror :mod:`steptp.runner.inputs` (its ``LARGEST_INPUT``; not
imported: the engine sits below the runner; a test checks they agree). Source: design.md §8.
"""

from __future__ import annotations

import math

from ..leir import ast as A

#: bound on |x| of a floating point input, param or constant under the verifier's draws: the
#: large edge-case trial, uniform(-2, 2) * 32 (design.md §8; steptp.runner.inputs.LARGEST_INPUT,
#: not imported: the engine sits below the runner). Inputs may also be exactly 0 (the zero
#: trials): see steptp.engine.signs for what is provably non-zero.
FLOAT_INPUT_BOUND = 64.0
#: the large trial's smaller scale (uniform(-2, 2) * 20): the verifier uses it where the
#: original's outputs are not finite at the larger one; :func:`tensor_bounds` uses it where
#: an output's bound at :data:`FLOAT_INPUT_BOUND` exceeds its dtype's largest value
FALLBACK_INPUT_BOUND = 40.0
#: bound on |x| of an integer input (random draws are in [-8, 8]; index tensors stay below
#: a dimension, covered by the largest dimension of the signature, see :func:`tensor_bounds`)
INT_INPUT_BOUND = 9.0
#: largest finite value per LEIR dtype code (IEEE 754 binary16/32/64, bfloat16)
DTYPE_MAX = {"f16": 65504.0, "bf16": 3.3895313892515355e38, "f32": 3.4028234663852886e38,
             "f64": 1.7976931348623157e308}


def literal_value(e: A.Expr) -> float | None:
    """The value of a literal (``2.0``, ``-3``, ``-inf``) as a float, else None."""
    if isinstance(e, (A.Int, A.Float)):
        return float(e.value)
    if isinstance(e, A.Neg):
        v = literal_value(e.operand)
        return None if v is None else -v
    return None


def linear_form(e: A.Expr) -> tuple[dict, float]:
    """``e`` as ``sum(k * term) + const`` over its terms that are not ``+``, ``-``, a
    negation or a product with a finite literal: ``({term: k}, const)``, terms with a zero
    coefficient dropped (first occurrence order)."""
    terms: dict[A.Expr, float] = {}
    const = 0.0

    def rec(x: A.Expr, k: float) -> None:
        nonlocal const
        v = literal_value(x)
        if v is not None and math.isfinite(v):
            const += k * v
        elif isinstance(x, A.Neg):
            rec(x.operand, -k)
        elif isinstance(x, A.BinOp) and x.op in ("+", "-"):
            rec(x.lhs, k)
            rec(x.rhs, -k if x.op == "-" else k)
        elif isinstance(x, A.BinOp) and x.op == "*" and finite_literal(x.lhs) is not None:
            rec(x.rhs, k * finite_literal(x.lhs))
        elif isinstance(x, A.BinOp) and x.op == "*" and finite_literal(x.rhs) is not None:
            rec(x.lhs, k * finite_literal(x.rhs))
        else:
            terms[x] = terms.get(x, 0.0) + k

    rec(e, 1.0)
    return {x: k for x, k in terms.items() if k != 0}, const


def finite_literal(e: A.Expr) -> float | None:
    """:func:`literal_value` when it is finite, else None."""
    v = literal_value(e)
    return v if v is not None and math.isfinite(v) else None


__all__ = ["FLOAT_INPUT_BOUND", "FALLBACK_INPUT_BOUND", "INT_INPUT_BOUND", "DTYPE_MAX", "literal_value", "linear_form",
           "finite_literal"]
