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

* ``set_extent(L, i, n)`` - ``L`` with the extent of loop ``i`` set to ``n`` (a loop over
  a longer or shorter range of the same index).
* ``loops_used_by(L, t)`` / ``loops_unused_by(L, t)`` - the loops of ``L`` whose index
  does / does not occur in the term or subscript list ``t`` (with a reduction's target
  subscript: its spatial loops / its reduction loops).
* ``shifted(i, k)`` - the index expression ``i+k`` (``i`` for ``k = 0``), to pass to
  ``subst_index`` when a loop runs over a sub-range starting at ``k``.

All are generic list/term utilities; they know nothing about any strategy.
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


def _loop_list(loops, fn: str) -> tuple:
    if not (isinstance(loops, tuple) and all(isinstance(l, A.Loop) for l in loops)):
        raise ValueExprError(f"{fn} expects a loop list (e.g. loops_of(?N)), got {loops!r}")
    return loops


def set_extent(ctx: EvalContext, loops, index, extent) -> tuple:
    """``loops`` with the extent of the loop of index ``index`` set to ``extent`` (> 0)."""
    loops = _loop_list(loops, "set_extent")
    name = _index_name(index, "set_extent's second argument")
    if not isinstance(extent, int) or isinstance(extent, bool) or extent <= 0:
        raise ValueExprError(f"set_extent: the extent must be a positive integer, got {extent!r}")
    if name not in {l.var for l in loops}:
        raise ValueExprError(f"set_extent: no loop with index {name!r}")
    return tuple(A.Loop(l.kind, extent, l.var) if l.var == name else l for l in loops)


def _used(terms) -> set[str]:
    terms = terms if isinstance(terms, tuple) else (terms,)
    out: set[str] = set()
    for t in terms:
        out |= {x.name for x in A.walk(P.value_to_expr(t)) if isinstance(x, A.Index)}
    return out


def loops_used_by(ctx: EvalContext, loops, terms) -> tuple:
    """The loops of ``loops`` whose index occurs in ``terms`` (a term or a subscript list):
    with a reduction's target subscript, its spatial loops."""
    used = _used(terms)
    return tuple(l for l in _loop_list(loops, "loops_used_by") if l.var in used)


def loops_unused_by(ctx: EvalContext, loops, terms) -> tuple:
    """The loops of ``loops`` whose index does not occur in ``terms`` (a reduction's axes)."""
    used = _used(terms)
    return tuple(l for l in _loop_list(loops, "loops_unused_by") if l.var not in used)


def shifted(ctx: EvalContext, index, offset) -> A.Expr:
    """The index expression ``index + offset`` (just ``index`` for offset 0), for
    ``subst_index`` (a loop over a sub-range starting at ``offset``)."""
    name = _index_name(index, "shifted's first argument")
    if not isinstance(offset, int) or isinstance(offset, bool):
        raise ValueExprError(f"shifted: the offset must be an integer, got {offset!r}")
    if offset == 0:
        return A.Index(name)
    return A.BinOp("+", A.Index(name), A.Int(offset)) if offset > 0 else A.BinOp("-", A.Index(name), A.Int(-offset))


#: arity -1 = variadic (checked by the function itself)
VALUE_FUNCTIONS.setdefault("loops_without", (2, loops_without))
VALUE_FUNCTIONS.setdefault("subst_index", (-1, subst_index))
VALUE_FUNCTIONS.setdefault("set_extent", (3, set_extent))
VALUE_FUNCTIONS.setdefault("loops_used_by", (2, loops_used_by))
VALUE_FUNCTIONS.setdefault("loops_unused_by", (2, loops_unused_by))
VALUE_FUNCTIONS.setdefault("shifted", (2, shifted))

__all__ = ["loops_without", "subst_index", "set_extent", "loops_used_by", "loops_unused_by", "shifted"]
