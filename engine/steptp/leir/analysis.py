"""Static analysis of LEIR programs: tensors, reads/writes, shapes, reduction axes, implicit init.

This module is the single place where LEIR semantics (design.md §2) are decided:

* **Known vs intermediate.** Known tensors are those of the :class:`Signature`; every
  other tensor written by the program is an intermediate.
* **Shapes.** An intermediate's shape is inferred from its writes: for each subscript
  position, ``max(index) + 1`` over the enclosing loop ranges (interval arithmetic).
* **Reduction axes.** For an equation whose target also appears on its right-hand side,
  every enclosing loop index absent from the target subscript is a reduction axis.
* **Implicit initialisation.** A self-referencing equation ``X = X (+|-|*) ...``,
  ``X = max(X, ...)`` / ``min(X, ...)`` (same subscript) whose buffer is neither a known
  input nor written by an earlier equation is initialised to the identity of its operator
  (sum/sub -> 0, prod -> 1, max -> -inf, min -> +inf) before accumulation. A buffer
  written earlier accumulates onto what is there (``D = D + bias`` after a matmul).
  Recurrences on a shifted index (``F_{tx,a} = f(F_{tx,a-1})`` under an ``if_then_else``
  guard) get no implicit init: the guard handles the boundary.
* **Bounds.** Every unguarded read and every write must stay inside the tensor's shape;
  reads under an ``if_then_else`` branch are only evaluated when selected (TVM's
  ``if_then_else`` is lazy), so they are checked for their guard-free part only.

All functions raise :class:`LeirSemanticError` (a ``ValueError``) with the offending
tensor/equation named.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Iterator

from . import ast as A
from .fileformat import Signature
from .printer import format_assign, format_expr


class LeirSemanticError(ValueError):
    """A syntactically valid program that is not meaningful (shape, bounds, dtype clash...)."""


# ---------------------------------------------------------------------------
# Equation instances
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class EqInstance:
    """One equation with its position: ``path`` = (nest index, body index, body index, ...)."""

    path: tuple[int, ...]
    loops: tuple[A.Loop, ...]
    eq: A.Assign

    @property
    def text(self) -> str:
        return format_assign(self.eq)


def equation_instances(prog: A.Program) -> list[EqInstance]:
    """All equations in program (execution text) order, with enclosing loops and paths."""
    out: list[EqInstance] = []

    def rec(nest: A.Nest, path: tuple[int, ...], loops: tuple[A.Loop, ...]):
        loops = loops + nest.loops
        for i, item in enumerate(nest.body):
            if isinstance(item, A.Assign):
                out.append(EqInstance(path + (i,), loops, item))
            else:
                rec(item, path + (i,), loops)

    for n, nest in enumerate(prog.nests):
        rec(nest, (n,), ())
    return out


def tensor_refs(e: A.Expr) -> Iterator[A.Tensor]:
    """Every tensor access inside ``e`` (indirect subscripts included)."""
    for x in A.walk(e):
        if isinstance(x, A.Tensor):
            yield x


def index_names(e: A.Expr) -> set[str]:
    return {x.name for x in A.walk(e) if isinstance(x, A.Index)}


def reads(eq: A.Assign) -> set[str]:
    """Names read by an equation (RHS tensors plus tensors in the target's subscripts)."""
    names = {t.name for t in tensor_refs(eq.value)}
    for idx in eq.target.indices:
        names |= {t.name for t in tensor_refs(idx)}
    return names


def nest_reads(nest: A.Nest) -> set[str]:
    return set().union(*[reads(eq) for _, eq in nest.equations()]) if nest.body else set()


def nest_writes(nest: A.Nest) -> set[str]:
    return {eq.target.name for _, eq in nest.equations()}


def tensor_types(prog: A.Program) -> dict[str, tuple[str, str]]:
    """name -> (dtype code, scope code) of the first occurrence; conflicts raise."""
    seen: dict[str, tuple[str, str]] = {}
    for inst in equation_instances(prog):
        for t in [inst.eq.target, *tensor_refs(inst.eq.value),
                  *[r for i in inst.eq.target.indices for r in tensor_refs(i)]]:
            prev = seen.get(t.name)
            if prev is None:
                seen[t.name] = (t.dtype, t.scope)
            elif prev[0] != t.dtype:
                raise LeirSemanticError(
                    f"tensor {t.name} is used with dtypes {prev[0]} and {t.dtype} (in '{inst.text}')")
    return seen


def loop_vars(loops: tuple[A.Loop, ...]) -> dict[str, int]:
    return {l.var: l.extent for l in loops}


# ---------------------------------------------------------------------------
# Interval arithmetic over index expressions
# ---------------------------------------------------------------------------

Interval = tuple[float, float]


def interval(e: A.Expr, ranges: dict[str, int], values: dict[str, Interval] | None = None) -> Interval:
    """Range ``[lo, hi]`` of an integer index expression when each loop index ``i`` takes
    ``0 .. ranges[i]-1``. ``values`` gives value ranges of integer tensors used for
    indirect indexing. Raises :class:`LeirSemanticError` for unknown indices."""
    values = values or {}
    if isinstance(e, A.Int):
        return (e.value, e.value)
    if isinstance(e, A.Float):
        return (e.value, e.value)
    if isinstance(e, A.Index):
        if e.name not in ranges:
            raise LeirSemanticError(f"index '{e.name}' is not bound by an enclosing loop")
        return (0, ranges[e.name] - 1)
    if isinstance(e, A.Tensor):
        return values.get(e.name, (-math.inf, math.inf))
    if isinstance(e, A.Neg):
        lo, hi = interval(e.operand, ranges, values)
        return (-hi, -lo)
    if isinstance(e, A.Call) and e.func in ("max", "min"):
        a = interval(e.args[0], ranges, values)
        b = interval(e.args[1], ranges, values)
        f = max if e.func == "max" else min
        return (f(a[0], b[0]), f(a[1], b[1]))
    if isinstance(e, A.Call) and e.func == "if_then_else":
        a = interval(e.args[1], ranges, values)
        b = interval(e.args[2], ranges, values)
        return (min(a[0], b[0]), max(a[1], b[1]))
    if isinstance(e, A.BinOp):
        a = interval(e.lhs, ranges, values)
        b = interval(e.rhs, ranges, values)
        if e.op == "+":
            return (a[0] + b[0], a[1] + b[1])
        if e.op == "-":
            return (a[0] - b[1], a[1] - b[0])
        if e.op == "*":
            cands = [x * y for x in a for y in b if not (math.isinf(x) or math.isinf(y)) or (x and y)]
            return (min(cands), max(cands)) if cands else (-math.inf, math.inf)
        if e.op == "//" and b[0] == b[1] and b[0] > 0:
            return (math.floor(a[0] / b[0]) if not math.isinf(a[0]) else a[0],
                    math.floor(a[1] / b[0]) if not math.isinf(a[1]) else a[1])
        if e.op == "%" and b[0] == b[1] and b[0] > 0:
            if a[0] >= 0 and a[1] < b[0]:
                return a
            return (0, b[0] - 1)
    if isinstance(e, (A.Compare, A.BoolOp, A.Not)):
        return (0, 1)
    return (-math.inf, math.inf)


# ---------------------------------------------------------------------------
# Reductions and implicit init
# ---------------------------------------------------------------------------

#: identity element per reduction operator
INIT_VALUES = {"sum": 0.0, "prod": 1.0, "max": -math.inf, "min": math.inf}


def self_reference_kind(eq: A.Assign) -> str | None:
    """Operator of an accumulation ``X = X op ...`` on the identical subscript.

    Returns ``"sum"`` (``X+..``, ``..+X``, ``X-..``), ``"prod"`` (``X*..``, ``..*X``),
    ``"max"``/``"min"`` (``max(X,..)``, ``max(..,X)``) or ``None``.
    """
    t, v = eq.target, eq.value
    if isinstance(v, A.BinOp):
        if v.op == "+" and (v.lhs == t or v.rhs == t):
            return "sum"
        if v.op == "-" and v.lhs == t:
            return "sum"
        if v.op == "*" and (v.lhs == t or v.rhs == t):
            return "prod"
    if isinstance(v, A.Call) and v.func in ("max", "min") and t in v.args:
        return v.func
    return None


def is_self_referencing(eq: A.Assign) -> bool:
    """True when the target tensor name is read on the right-hand side (any subscript)."""
    return any(r.name == eq.target.name for r in tensor_refs(eq.value))


def reduction_axes(loops: tuple[A.Loop, ...], eq: A.Assign) -> list[str]:
    """Loop indices of ``loops`` absent from the target subscript of a self-referencing
    equation (the reduction axes, paper App. A.2 check 8). Empty for other equations."""
    if not is_self_referencing(eq):
        return []
    used = set().union(*[index_names(i) for i in eq.target.indices]) if eq.target.indices else set()
    return [l.var for l in loops if l.var not in used]


@dataclass(frozen=True)
class EqSemantics:
    """What the backend must do for one equation instance."""

    inst: EqInstance
    reduction_axes: tuple[str, ...]
    init: float | None  # identity value to initialise with, or None (accumulate / plain store)


@dataclass
class ProgramInfo:
    """Result of :func:`analyze`: known/intermediate tensors, shapes, per-equation semantics."""

    signature: Signature
    types: dict[str, tuple[str, str]]
    shapes: dict[str, tuple[int, ...]]
    intermediates: list[str]
    equations: list[EqSemantics] = field(default_factory=list)
    first_write: dict[str, int] = field(default_factory=dict)

    def dtype(self, name: str) -> str:
        decl = self.signature.get(name)
        return decl.dtype if decl else self.types[name][0]


def analyze(prog: A.Program, sig: Signature, check_bounds: bool = True) -> ProgramInfo:
    """Analyse ``prog`` against ``sig``.

    Infers intermediate shapes, decides implicit init per equation and checks that
    every known tensor is used with its declared dtype and rank, that outputs are
    written, that nothing writes an input, and (``check_bounds``) that no access leaves
    its tensor. Raises :class:`LeirSemanticError` naming the tensor and equation.
    """
    types = tensor_types(prog)
    known = {t.name: t for t in sig.tensors}
    insts = equation_instances(prog)

    for name, (dtype, _scope) in types.items():
        if name in known and known[name].dtype != dtype:
            raise LeirSemanticError(
                f"tensor {name} is declared {known[name].dtype} in the signature but used as {dtype}")

    # value ranges of integer tensors (for indirect indexing)
    values: dict[str, Interval] = {}
    shapes: dict[str, list[float]] = {}
    intermediates: list[str] = []
    written: set[str] = set()
    first_write: dict[str, int] = {}
    sem: list[EqSemantics] = []
    for k, inst in enumerate(insts):
        eq = inst.eq
        ranges = loop_vars(inst.loops)
        if len(ranges) != len(inst.loops):
            raise LeirSemanticError(f"duplicate loop index in the loops enclosing '{inst.text}'")
        name = eq.target.name
        if name in known and not known[name].is_output:
            raise LeirSemanticError(f"equation '{inst.text}' writes input tensor {name}")
        for i in index_names(eq.value) | set().union(*[index_names(x) for x in eq.target.indices] or [set()]):
            if i not in ranges:
                raise LeirSemanticError(f"index '{i}' in '{inst.text}' is not bound by an enclosing loop")
        if name not in known:
            if name not in shapes:
                intermediates.append(name)
                shapes[name] = [0] * len(eq.target.indices)
            if len(shapes[name]) != len(eq.target.indices):
                raise LeirSemanticError(f"intermediate {name} is written with different ranks")
            for d, idx in enumerate(eq.target.indices):
                lo, hi = interval(idx, ranges, values)
                if math.isinf(hi):
                    raise LeirSemanticError(f"cannot infer the extent of {name} (dimension {d}) in '{inst.text}'")
                shapes[name][d] = max(shapes[name][d], int(hi) + 1)
        if types[name][0].startswith(("i", "u")) or types[name][0] == "bool":
            lo, hi = interval(eq.value, ranges, values)
            old = values.get(name)
            values[name] = (lo, hi) if old is None else (min(old[0], lo), max(old[1], hi))
        kind = self_reference_kind(eq)
        init = None
        if kind is not None and name not in written:
            init = INIT_VALUES[kind]
        sem.append(EqSemantics(inst, tuple(reduction_axes(inst.loops, eq)), init))
        written.add(name)
        first_write.setdefault(name, k)

    for t in sig.outputs:
        if t.name not in written:
            raise LeirSemanticError(f"output tensor {t.name} is never written")

    all_shapes: dict[str, tuple[int, ...]] = {n: tuple(int(x) for x in s) for n, s in shapes.items()}
    for t in sig.tensors:
        all_shapes[t.name] = t.shape
    for name in types:
        if name not in all_shapes:
            raise LeirSemanticError(f"tensor {name} is read but never written and not declared in the signature")

    info = ProgramInfo(sig, types, all_shapes, intermediates, sem, first_write)
    if check_bounds:
        for s in sem:
            _check_access_bounds(s.inst, all_shapes, values)
    return info


def _guard_free_reads(e: A.Expr) -> Iterator[A.Tensor]:
    """Tensor reads not inside an ``if_then_else`` branch (those are lazily evaluated)."""
    if isinstance(e, A.Tensor):
        yield e
        for i in e.indices:
            yield from _guard_free_reads(i)
        return
    if isinstance(e, A.Call) and e.func == "if_then_else":
        yield from _guard_free_reads(e.args[0])
        return
    for c in A.children(e):
        yield from _guard_free_reads(c)


def _check_access_bounds(inst: EqInstance, shapes: dict[str, tuple[int, ...]], values) -> None:
    ranges = loop_vars(inst.loops)
    for t in [inst.eq.target, *_guard_free_reads(inst.eq.value)]:
        shape = shapes[t.name]
        if len(t.indices) != len(shape):
            raise LeirSemanticError(
                f"tensor {t.name} has rank {len(shape)} but is accessed as '{format_expr(t)}' in '{inst.text}'")
        for d, idx in enumerate(t.indices):
            lo, hi = interval(idx, ranges, values)
            if lo < 0 or hi > shape[d] - 1:
                if math.isinf(lo) or math.isinf(hi):
                    continue  # indirect index of unknown range: checked at run time only
                raise LeirSemanticError(
                    f"out-of-bounds access '{format_expr(t)}' in '{inst.text}': dimension {d} ranges over "
                    f"[{int(lo)}, {int(hi)}] but {t.name} has extent {shape[d]}")


__all__ = ["LeirSemanticError", "EqInstance", "equation_instances", "tensor_refs", "index_names", "reads",
           "nest_reads", "nest_writes", "tensor_types", "interval", "INIT_VALUES", "self_reference_kind",
           "is_self_referencing", "reduction_axes", "EqSemantics", "ProgramInfo", "analyze"]
