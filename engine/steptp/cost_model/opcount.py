"""Operation and access counts of a LEIR equation, shared by the CPU and GPU cost models
(:mod:`steptp.cost_model.static`, :mod:`steptp.cost_model.gpu`) and the learned model's features.

``_ops`` counts arithmetic nodes: ``+ - * /`` = 1, ``// %`` = 4, ``**`` and ``exp log`` = 12,
``sqrt`` = 6, ``tanh erf`` = 14, ``max min abs`` and comparisons and ``if_then_else`` = 1
(rough instruction costs; Agner Fog's tables and the CUDA throughput table agree on the order).
"""

from __future__ import annotations

from collections import Counter

from ..leir import ast as A

_OP_COST = {"+": 1, "-": 1, "*": 1, "/": 1, "//": 4, "%": 4, "**": 12}
_CALL_COST = {"exp": 12, "log": 12, "sqrt": 6, "tanh": 14, "erf": 14, "abs": 1, "max": 1, "min": 1,
              "if_then_else": 1}


def _count(e: A.Expr, subscripts: bool, kinds: Counter | None = None) -> int:
    """The weighted operation count of ``e`` (module docstring), the one walk :func:`_ops`,
    :func:`_value_ops` and :func:`op_kinds` share. ``subscripts``: descend into tensor
    subscripts. ``kinds``: also tally one per node by kind into this counter, skipping
    integer index arithmetic (a subexpression that reads no tensor and no float literal, such
    as a guard ``a-1<0``) and the negation of a literal (``-inf``)."""
    n = 0
    todo = [e]
    while todo:
        x = todo.pop()
        if isinstance(x, A.Tensor):
            if not subscripts:
                continue
        elif kinds is not None and not isinstance(x, (A.Float, A.Int, A.Index)) and (
                _index_only(x) or isinstance(x, A.Neg) and isinstance(x.operand, (A.Float, A.Int))):
            continue
        elif isinstance(x, A.BinOp):
            n += _OP_COST.get(x.op, 1)
            if kinds is not None:
                kinds[x.op] += 1
        elif isinstance(x, A.Call):
            n += _CALL_COST.get(x.func, 4)
            if kinds is not None:
                kinds[x.func] += 1
        elif isinstance(x, (A.Compare, A.BoolOp, A.Not, A.Neg)):
            n += 1
            if kinds is not None:
                kinds[_KIND_NAME.get(type(x), x.op if isinstance(x, A.BoolOp) else "?")] += 1
        todo.extend(A.children(x))
    return max(n, 1)


_KIND_NAME = {A.Compare: "comparison", A.Not: "not", A.Neg: "negation"}


def _index_only(e: A.Expr) -> bool:
    """Whether ``e`` reads no tensor and no float literal (integer index arithmetic: the
    integer pipe's address and guard computation, not arithmetic on values)."""
    return not any(isinstance(x, (A.Tensor, A.Float)) for x in A.walk(e))


def op_kinds(e: A.Expr) -> Counter:
    """Arithmetic operations of one evaluation of ``e`` by kind: ``+ - * / // % **`` by
    operator, calls by function name (``exp``, ``log``, ``sqrt``, ``max``, ``if_then_else``
    ...), ``comparison``, ``and``/``or``, ``not``, ``negation``; one per node, unweighted.
    Tensor subscripts and integer index arithmetic (subexpressions that read no tensor and no
    float literal, e.g. a guard ``a-1<0``) are not counted: they are address computation, as
    in :func:`_value_ops` and :mod:`steptp.roofline`. Same walk as :func:`_ops`."""
    kinds: Counter = Counter()
    _count(e, False, kinds)
    return kinds


def _ops(e: A.Expr) -> int:
    """The arithmetic of ``e``, tensor subscripts included (module docstring)."""
    return _count(e, True)


def _value_ops(e: A.Expr) -> int:
    """:func:`_ops` of ``e`` without the arithmetic inside tensor subscripts (the GPU model:
    a tiled kernel's subscripts are long mixed-radix forms that the compiler folds into
    address offsets of unrolled loops; an access already costs one instruction there)."""
    return _count(e, False)


def _accesses(eq: A.Assign):
    yield eq.target
    for x in A.walk(eq.value):
        if isinstance(x, A.Tensor):
            yield x


__all__ = ["_ops", "_value_ops", "_accesses", "op_kinds"]
