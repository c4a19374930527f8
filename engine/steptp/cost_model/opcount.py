"""Operation and access counts of a LEIR equation, shared by the CPU and GPU cost models
(:mod:`steptp.cost_model.static`, :mod:`steptp.cost_model.gpu`) and the learned model's features.

``_ops`` counts arithmetic nodes: ``+ - * /`` = 1, ``// %`` = 4, ``**`` and ``exp log`` = 12,
``sqrt`` = 6, ``tanh erf`` = 14, ``max min abs`` and comparisons and ``if_then_else`` = 1
(rough instruction costs; Agner Fog's tables and the CUDA throughput table agree on the order).
"""

from __future__ import annotations

from ..leir import ast as A

_OP_COST = {"+": 1, "-": 1, "*": 1, "/": 1, "//": 4, "%": 4, "**": 12}
_CALL_COST = {"exp": 12, "log": 12, "sqrt": 6, "tanh": 14, "erf": 14, "abs": 1, "max": 1, "min": 1,
              "if_then_else": 1}


def _count(e: A.Expr, subscripts: bool) -> int:
    n = 0
    todo = [e]
    while todo:
        x = todo.pop()
        if isinstance(x, A.Tensor) and not subscripts:
            continue
        if isinstance(x, A.BinOp):
            n += _OP_COST.get(x.op, 1)
        elif isinstance(x, A.Call):
            n += _CALL_COST.get(x.func, 4)
        elif isinstance(x, (A.Compare, A.BoolOp, A.Not, A.Neg)):
            n += 1
        todo.extend(A.children(x))
    return max(n, 1)


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


__all__ = ["_ops", "_value_ops", "_accesses"]
