"""Bounded egglog equality saturation: a cheap proof that two LEIR value expressions are
equal (egglog-notes Q7), used by :func:`steptp.engine.algebra.symbolic_check` before sympy.

Terms are encoded subscript-aware (every distinct tensor access is its own ``Sym`` by its
canonical LEIR text; ``if_then_else``, comparisons, ``//`` and ``%`` are opaque ``Sym``
leaves), then a fresh scope of an e-graph holding ~25 field axioms (commutativity and
associativity of ``+``/``*``, distributivity, ``a-b = a+(-1)*b``, ``a/b = a*b**-1``,
``exp(a+b) = exp(a)*exp(b)``, power laws, constant folding, neutral elements) is saturated
for at most :data:`MAX_ITERS` iterations or :data:`MAX_NODES` e-nodes, checking
``before == after`` after each one.

The axioms hold for real numbers wherever both sides are defined; ``log``/``sqrt`` laws
that need positive arguments are deliberately absent, so a log rewrite is never "proved"
here. "Wherever both sides are defined" is the catch: ``a/b = a*b**-1`` with
``b**-1 * b = 1`` makes ``x = x/c*c`` provable for any ``c``, also one that is exactly 0 in
floating point (0/0 = nan), and nothing here knows about overflow. An egglog proof is
therefore a proof over the reals only; :func:`steptp.engine.algebra.symbolic_check` grants
"proved" only after the floating-point gate :func:`steptp.engine.signs.unsafe_operands`
(every division, ``log``, ``sqrt`` or negative/fractional power the step adds or removes is
of an operand the sign analysis proves safe; design.md §8). A failed proof says nothing (the
check is incomplete): the caller falls back to sympy.
Sources: egglog 13 (``egglog.bindings``), egglog-notes Q7.
"""

from __future__ import annotations

import json
import math

from egglog import bindings as B

from ..leir import ast as A
from ..leir.printer import format_expr

MAX_ITERS = 6
MAX_NODES = 20_000

_SCHEMA = """
(datatype M
  (Num f64)
  (Sym String)
  (Add M M) (Mul M M) (Sub M M) (Div M M) (Pow M M) (Neg M)
  (Fn String M)
  (Fn2 String M M))
(ruleset ax)
(rewrite (Add a b) (Add b a) :ruleset ax)
(rewrite (Mul a b) (Mul b a) :ruleset ax)
(birewrite (Add (Add a b) c) (Add a (Add b c)) :ruleset ax)
(birewrite (Mul (Mul a b) c) (Mul a (Mul b c)) :ruleset ax)
(birewrite (Mul a (Add b c)) (Add (Mul a b) (Mul a c)) :ruleset ax)
(birewrite (Sub a b) (Add a (Mul (Num -1.0) b)) :ruleset ax)
(birewrite (Div a b) (Mul a (Pow b (Num -1.0))) :ruleset ax)
(birewrite (Neg a) (Mul (Num -1.0) a) :ruleset ax)
(birewrite (Fn "exp" (Add a b)) (Mul (Fn "exp" a) (Fn "exp" b)) :ruleset ax)
(birewrite (Pow (Fn "exp" a) b) (Fn "exp" (Mul a b)) :ruleset ax)
(birewrite (Mul (Pow a b) (Pow a c)) (Pow a (Add b c)) :ruleset ax)
(rewrite (Mul a a) (Pow a (Num 2.0)) :ruleset ax)
(rewrite (Mul a (Pow a b)) (Pow a (Add b (Num 1.0))) :ruleset ax)
(rewrite (Pow a (Num 1.0)) a :ruleset ax)
(rewrite (Add (Num x) (Num y)) (Num (+ x y)) :ruleset ax)
(rewrite (Mul (Num x) (Num y)) (Num (* x y)) :ruleset ax)
(rewrite (Mul (Num 1.0) a) a :ruleset ax)
(rewrite (Add (Num 0.0) a) a :ruleset ax)
(rewrite (Add a (Mul (Num -1.0) a)) (Num 0.0) :ruleset ax)
(rewrite (Fn "exp" (Num 0.0)) (Num 1.0) :ruleset ax)
"""

_SPAN = B.RustSpan("", 0, 0)


class _Unencodable(ValueError):
    pass


def _num(v: float) -> str:
    if not math.isfinite(v):
        raise _Unencodable("non-finite literal")
    return f"(Num {float(v)!r})"


def encode(e: A.Expr) -> str:
    """The egglog term of a LEIR value expression (see the module docstring)."""
    if isinstance(e, A.Int):
        return _num(float(e.value))
    if isinstance(e, A.Float):
        if math.isinf(e.value):
            return f"(Sym {json.dumps('@' + format_expr(e))})"
        return _num(e.value)
    if isinstance(e, (A.Tensor, A.Index)):
        return f"(Sym {json.dumps(format_expr(e))})"
    if isinstance(e, A.Neg):
        return f"(Neg {encode(e.operand)})"
    if isinstance(e, A.BinOp) and e.op in ("+", "-", "*", "/", "**"):
        name = {"+": "Add", "-": "Sub", "*": "Mul", "/": "Div", "**": "Pow"}[e.op]
        return f"({name} {encode(e.lhs)} {encode(e.rhs)})"
    if isinstance(e, A.Call) and e.func != "if_then_else":
        if len(e.args) == 1:
            return f"(Fn {json.dumps(e.func)} {encode(e.args[0])})"
        return f"(Fn2 {json.dumps(e.func)} {encode(e.args[0])} {encode(e.args[1])})"
    return f"(Sym {json.dumps('@' + format_expr(e))})"  # if_then_else, //, %, comparisons


_EGRAPH: B.EGraph | None = None


def _egraph() -> B.EGraph:
    global _EGRAPH
    if _EGRAPH is None:
        eg = B.EGraph()
        eg.run_program(*eg.parse_program(_SCHEMA))
        _EGRAPH = eg
    return _EGRAPH


def _run(eg: B.EGraph, text: str):
    return eg.run_program(*eg.parse_program(text))


def _size(eg: B.EGraph) -> int:
    (out,) = eg.run_program(B.PrintSize(_SPAN, None))
    return sum(n for _, n in out.sizes)


def egglog_prove(before: A.Expr, after: A.Expr, max_iters: int = MAX_ITERS, max_nodes: int = MAX_NODES) -> bool:
    """True when bounded equality saturation shows ``before == after`` over the reals (not in
    floating point: see the module docstring); False when it could not (within ``max_iters``
    iterations / ``max_nodes`` e-nodes), which proves nothing."""
    try:
        lhs, rhs = encode(before), encode(after)
    except _Unencodable:
        return False
    eg = _egraph()
    _run(eg, "(push)")
    try:
        _run(eg, f"(let $l {lhs}) (let $r {rhs})")
        for it in range(max_iters + 1):
            try:
                _run(eg, "(check (= $l $r))")
                return True
            except Exception:  # noqa: BLE001 - egglog signals a failed check with an exception
                pass
            if it == max_iters or _size(eg) > max_nodes:
                return False
            _run(eg, "(run ax 1)")
        return False
    finally:
        _run(eg, "(pop)")


__all__ = ["MAX_ITERS", "MAX_NODES", "encode", "egglog_prove"]
