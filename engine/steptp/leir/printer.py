"""Canonical LEIR printer: superscript first, no whitespace, minimal parentheses.

``parse_program(format_program(p)) == p`` for every AST (tested with hypothesis-style
round trips in ``tests/test_leir.py``). The canonical text is what the dataset stores
and hashes.
"""

from __future__ import annotations

from collections import OrderedDict

import math

from . import ast as A

# precedence levels (higher binds tighter)
_OR, _AND, _CMP, _SUM, _PROD, _UNARY, _POW, _ATOM = range(1, 9)
_BIN_LEVEL = {"+": _SUM, "-": _SUM, "*": _PROD, "/": _PROD, "//": _PROD, "%": _PROD, "**": _POW}


def format_number(e: A.Int | A.Float) -> str:
    if isinstance(e, A.Int):
        return str(e.value)
    v = e.value
    if math.isinf(v):
        return "inf" if v > 0 else "-inf"
    if math.isnan(v):
        raise ValueError("NaN literals are not representable in LEIR")
    return repr(float(v))


def _level(e: A.Expr) -> int:
    if isinstance(e, A.BoolOp):
        return _OR if e.op == "or" else _AND
    if isinstance(e, A.Compare):
        return _CMP
    if isinstance(e, A.BinOp):
        return _BIN_LEVEL[e.op]
    if isinstance(e, (A.Neg, A.Not)):
        return _UNARY
    if isinstance(e, A.Float) and math.isinf(e.value) and e.value < 0:
        return _UNARY
    return _ATOM


def format_expr(e: A.Expr, min_level: int = _OR) -> str:
    """Format an expression; parenthesised if its level is below ``min_level``."""
    s = _fmt(e)
    return f"({s})" if _level(e) < min_level else s


def _fmt(e: A.Expr) -> str:
    if isinstance(e, (A.Int, A.Float)):
        return format_number(e)
    if isinstance(e, A.Index):
        return e.name
    if isinstance(e, A.Tensor):
        return format_tensor(e)
    if isinstance(e, A.Neg):
        return "-" + format_expr(e.operand, _UNARY)
    if isinstance(e, A.Not):
        return "!" + format_expr(e.operand, _UNARY)
    if isinstance(e, A.Call):
        return e.func + "(" + ",".join(format_expr(a) for a in e.args) + ")"
    if isinstance(e, A.BinOp):
        lvl = _BIN_LEVEL[e.op]
        if e.op == "**":  # right-associative; left operand must be an atom
            return format_expr(e.lhs, _ATOM) + "**" + format_expr(e.rhs, _UNARY)
        return format_expr(e.lhs, lvl) + e.op + format_expr(e.rhs, lvl + 1)
    if isinstance(e, A.Compare):
        return format_expr(e.lhs, _SUM) + e.op + format_expr(e.rhs, _SUM)
    if isinstance(e, A.BoolOp):
        lvl = _level(e)
        sym = "|" if e.op == "or" else "&"
        return format_expr(e.lhs, lvl) + sym + format_expr(e.rhs, lvl + 1)
    raise TypeError(f"not a LEIR expression: {e!r}")


def format_tensor(t: A.Tensor) -> str:
    s = f"{t.name}^{{{t.dtype},{t.scope}}}"
    if t.indices:
        s += "_{" + ",".join(format_expr(i) for i in t.indices) + "}"
    return s


def format_loop(l: A.Loop) -> str:
    return f"{l.kind}^{{{l.extent}}}_{{{l.var}=0}}"


def format_loops(loops) -> str:
    return "".join(format_loop(l) for l in loops)


def format_assign(a: A.Assign) -> str:
    return format_tensor(a.target) + "=" + format_expr(a.value) + ";"


_NEST_TEXT: "OrderedDict[int, tuple[A.Nest, str]]" = OrderedDict()
_NEST_TEXT_SIZE = 4096


def format_nest(n: A.Nest) -> str:
    """Canonical text of a nest. The last 4096 texts are kept by nest identity (nests are
    immutable, and a rewrite shares every nest it does not touch with its input program, so
    candidate programs, their CoTs and entry ids print mostly known nests)."""
    hit = _NEST_TEXT.get(id(n))
    if hit is not None and hit[0] is n:
        return hit[1]
    body = "".join(format_assign(i) if isinstance(i, A.Assign) else format_nest(i) for i in n.body)
    text = format_loops(n.loops) + "[" + body + "];"
    _NEST_TEXT[id(n)] = (n, text)
    if len(_NEST_TEXT) > _NEST_TEXT_SIZE:
        _NEST_TEXT.popitem(last=False)
    return text


def format_program(p: A.Program, sep: str = "") -> str:
    """Canonical text of a program; ``sep`` goes between top-level nests ("" or "\\n")."""
    return sep.join(format_nest(n) for n in p.nests)


def format_node(n) -> str:
    """Format any AST node (program, nest, loop, equation or expression)."""
    if isinstance(n, A.Program):
        return format_program(n)
    if isinstance(n, A.Nest):
        return format_nest(n)
    if isinstance(n, A.Loop):
        return format_loop(n)
    if isinstance(n, A.Assign):
        return format_assign(n)
    return format_expr(n)


__all__ = ["format_number", "format_expr", "format_tensor", "format_loop", "format_loops",
           "format_assign", "format_nest", "format_program", "format_node"]
