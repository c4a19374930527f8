"""Value functions over loop lists and terms, for rules that rebuild nests (``let:``).

Registered into :data:`steptp.engine.primitives.VALUE_FUNCTIONS` on import (the engine
package imports this module), so any rule may use them:

* ``loops_without(L, i)`` - the loop list ``L`` (a tuple of :class:`~steptp.leir.ast.Loop`,
  e.g. ``loops_of(?N)``) without the loop whose index is ``i``: the loops of a reduction
  nest minus its reduction axis, i.e. the nest that writes the reduced result back.
  Raises :class:`~steptp.engine.primitives.ValueExprError` if no loop has index ``i``.
* ``subst_index(t, i1, e1, i2, e2, ...)`` - the term ``t`` (an expression, or a tuple of
  expressions such as a subscript list) with loop indices ``i1, i2, ...`` replaced
  *simultaneously* by ``e1, e2, ...`` (index names or expressions). Used to move an
  access from one nest's index names to another's (``V_{f,d}`` read in a matmul nest over
  ``f``, ``d`` becomes ``V_{a,j}`` inside the softmax nest over ``a`` with a new loop ``j``);
  simultaneous, so swapping two names is safe. Source: ordinary capture-free substitution
  (:func:`steptp.leir.ast.substitute_indices`).

Both are generic list/term utilities; they know nothing about any strategy.
"""

from __future__ import annotations

from ..leir import ast as A
from . import patterns as P
from .primitives import VALUE_FUNCTIONS, EvalContext, ValueExprError


def _index_name(x, what: str) -> str:
    if isinstance(x, A.Index):
        return x.name
    if isinstance(x, str):
        return x
    raise ValueExprError(f"{what} must be a loop index name, got {x!r}")


def loops_without(ctx: EvalContext, loops, index) -> tuple:
    """``loops`` minus the loop with index ``index`` (order kept)."""
    if not (isinstance(loops, tuple) and all(isinstance(l, A.Loop) for l in loops)):
        raise ValueExprError(f"loops_without expects a loop list (e.g. loops_of(?N)), got {loops!r}")
    name = _index_name(index, "loops_without's second argument")
    kept = tuple(l for l in loops if l.var != name)
    if len(kept) == len(loops):
        raise ValueExprError(f"loops_without: no loop with index {name!r} in "
                             f"{''.join(f'{l.kind}^{{{l.extent}}}_{{{l.var}=0}}' for l in loops)}")
    return kept


def subst_index(ctx: EvalContext, term, *pairs) -> object:
    """``term`` with indices renamed simultaneously: ``pairs = (i1, e1, i2, e2, ...)``."""
    if len(pairs) % 2 or not pairs:
        raise ValueExprError("subst_index takes a term and index/replacement pairs")
    mapping = {}
    for k in range(0, len(pairs), 2):
        mapping[_index_name(pairs[k], "subst_index's index argument")] = P.value_to_expr(pairs[k + 1])
    if isinstance(term, tuple):
        return tuple(A.substitute_indices(P.value_to_expr(t), mapping) for t in term)
    try:
        expr = P.value_to_expr(term)
    except P.TemplateError as e:
        raise ValueExprError(str(e)) from None
    return A.substitute_indices(expr, mapping)


#: arity -1 = variadic (checked by the function itself)
VALUE_FUNCTIONS.setdefault("loops_without", (2, loops_without))
VALUE_FUNCTIONS.setdefault("subst_index", (-1, subst_index))

__all__ = ["loops_without", "subst_index"]
