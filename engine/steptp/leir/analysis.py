"""Static analysis of LEIR programs: tensors, reads/writes, shapes, reduction axes, implicit init.

This module is the single place where LEIR semantics (design.md §2) are decided:

* **Known vs intermediate.** Known tensors are those of the :class:`Signature`; every
  other tensor written by the program is an intermediate.
* **Shapes.** An intermediate's shape is inferred from its writes: for each subscript
  position, ``max(index) + 1`` over the enclosing loop ranges (interval arithmetic).
* **Reduction axes.** For an equation whose target also appears on its right-hand side,
  every enclosing loop index absent from the target subscript is a reduction axis.
* **Implicit initialisation.** A self-referencing equation ``X = X (+|-|*) ...`` (also a
  longer chain ``X = X + a - b`` in which ``X`` occurs once with a plus sign),
  ``X = max(X, ...)`` / ``min(X, ...)`` (same subscript) whose buffer is neither a known
  input nor written by an earlier equation is initialised to the identity of its operator
  (sum/sub -> 0, prod -> 1, max -> -inf, min -> +inf) before accumulation. A buffer
  written earlier accumulates onto what is there (``D = D + bias`` after a matmul).
  Recurrences on a shifted index (``F_{tx,a} = f(F_{tx,a-1})`` under an ``if_then_else``
  guard) get no implicit init: the guard handles the boundary.
* **Bounds.** Every unguarded read and every write must stay inside the tensor's shape.
  Reads under an ``if_then_else`` branch are only evaluated when selected (TVM's
  ``if_then_else`` is lazy), so they must stay inside wherever their guards select them:
  decided exactly by enumerating small iteration spaces (index-only guards and subscripts),
  else by interval arithmetic over the loop ranges the guards narrow, when that is exact;
  other guarded reads are left to the verifier's run-time checks (isolated execution,
  poisoned buffers).
* **Reads after writes.** A read of an intermediate or output must follow a write of that
  tensor in an earlier top-level nest or in the same one (recurrences); literal division by
  zero is an error. Element-level coverage is checked at run time (:mod:`steptp.verify`).

All functions raise :class:`LeirSemanticError` (a ``ValueError``) with the offending
tensor/equation named.
"""

from __future__ import annotations

from collections import OrderedDict

import math
from dataclasses import dataclass, field
from typing import Iterator

from . import ast as A
from .fileformat import Signature
from .limits import MAX_ELEMENTS
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


def interval(e: A.Expr, ranges: dict[str, int], values: dict[str, Interval] | None = None,
             bounds: dict[str, Interval] | None = None) -> Interval:
    """Range ``[lo, hi]`` of an integer index expression when each loop index ``i`` takes
    ``0 .. ranges[i]-1`` (or ``bounds[i]`` when given: a range narrowed by a guard).
    ``values`` gives value ranges of integer tensors used for indirect indexing. Bounds
    beyond ``±2**62`` become infinite (no float overflow). Raises
    :class:`LeirSemanticError` for unknown indices."""
    lo, hi = _interval(e, ranges, values or {}, bounds or {})
    return (_clamp(lo), _clamp(hi))


_BIG = 2**62


def _clamp(x):
    if isinstance(x, int) and abs(x) > _BIG:
        return math.inf if x > 0 else -math.inf
    if isinstance(x, float) and math.isnan(x):
        return math.inf
    return x


def _interval(e: A.Expr, ranges: dict[str, int], values: dict[str, Interval], bounds: dict[str, Interval]) -> Interval:
    def interval(x, ranges, values):  # noqa: F811 - recursive calls keep the bounds and clamp
        lo, hi = _interval(x, ranges, values, bounds)
        return (_clamp(lo), _clamp(hi))

    if isinstance(e, A.Int):
        return (e.value, e.value)
    if isinstance(e, A.Float):
        return (e.value, e.value)
    if isinstance(e, A.Index):
        if e.name not in ranges:
            raise LeirSemanticError(f"index '{e.name}' is not bound by an enclosing loop")
        if e.name in bounds:
            return bounds[e.name]
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
            cands = [_clamp(x * y) for x in a for y in b if not (math.isinf(x) or math.isinf(y)) or (x and y)]
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

    Returns ``"sum"`` (``X+..``, ``..+X``, ``X-..``, and chains such as ``X+a+b`` or
    ``a-b+X`` where ``X`` occurs once with a plus sign), ``"prod"`` (``X*..``, ``..*X``,
    ``X*a*b``), ``"max"``/``"min"`` (``max(X,..)``, ``max(..,X)``) or ``None``.
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
    # a longer chain: X = X + a + b, X = a - b + X, X = X * a * b (X once, with a + sign)
    for kind, terms in (("sum", _chain_terms(v, ("+", "-"))), ("prod", _chain_terms(v, ("*",)))):
        if len(terms) > 2:
            mine = [sign for term, sign in terms if term == t]
            others = [term for term, _ in terms if term != t]
            if mine == [1] and not any(isinstance(x, A.Tensor) and x.name == t.name
                                       for o in others for x in A.walk(o)):
                return kind
    return None


def _chain_terms(e: A.Expr, ops: tuple[str, ...], sign: int = 1) -> list[tuple[A.Expr, int]]:
    """Operands of a left- or right-nested chain of ``ops`` with their signs (``-`` flips
    the sign of its right operand): ``X+a-b`` -> ``[(X,1), (a,1), (b,-1)]``."""
    stack, out = [(e, sign)], []
    while stack:
        x, sg = stack.pop()
        if isinstance(x, A.BinOp) and x.op in ops:
            stack.append((x.rhs, -sg if x.op == "-" else sg))
            stack.append((x.lhs, sg))
        else:
            out.append((x, sg))
    return out


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


_ANALYSED: "OrderedDict[tuple[int, int], tuple[A.Program, Signature, bool, ProgramInfo]]" = OrderedDict()
_ANALYSED_SIZE = 32


def analyze(prog: A.Program, sig: Signature, check_bounds: bool = True) -> ProgramInfo:
    """Analyse ``prog`` against ``sig``.

    Infers intermediate shapes, decides implicit init per equation and checks that
    every known tensor is used with its declared dtype and rank, that outputs are
    written, that nothing writes an input, and (``check_bounds``) that no access leaves
    its tensor. Raises :class:`LeirSemanticError` naming the tensor and equation.

    The last 32 results are kept by the identity of ``prog`` and ``sig`` (both immutable;
    a result with bounds checked also answers ``check_bounds=False``): one candidate is
    analysed by the rewrite, the GPU preflight and both lowerings (8 calls per verified
    candidate, 11 % of a dataset run's time). Treat the result as read-only.
    """
    key = (id(prog), id(sig))
    hit = _ANALYSED.get(key)
    if hit is not None and hit[0] is prog and hit[1] is sig and (hit[2] or not check_bounds):
        _ANALYSED.move_to_end(key)
        return hit[3]
    info = _analyze(prog, sig, check_bounds)
    _ANALYSED[key] = (prog, sig, check_bounds, info)
    _ANALYSED.move_to_end(key)
    while len(_ANALYSED) > _ANALYSED_SIZE:
        _ANALYSED.popitem(last=False)
    return info


def _analyze(prog: A.Program, sig: Signature, check_bounds: bool) -> ProgramInfo:
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
        for x in [*A.walk(eq.value), *[y for i in eq.target.indices for y in A.walk(i)]]:
            if isinstance(x, A.BinOp) and x.op in ("/", "//", "%") and _literal_zero(x.rhs):
                raise LeirSemanticError(f"division by zero '{format_expr(x)}' in '{inst.text}'")
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

    for n in intermediates:
        if math.prod(all_shapes[n]) > MAX_ELEMENTS:
            raise LeirSemanticError(f"intermediate {n} has shape {list(all_shapes[n])}: "
                                    f"{math.prod(all_shapes[n])} elements exceed the limit {MAX_ELEMENTS}")
    info = ProgramInfo(sig, types, all_shapes, intermediates, sem, first_write)
    if check_bounds:
        check_reads_after_writes(prog, sig)
        for s in sem:
            _check_access_bounds(s.inst, all_shapes, values)
    return info


def _literal_zero(e: A.Expr) -> bool:
    while isinstance(e, A.Neg):
        e = e.operand
    return isinstance(e, (A.Int, A.Float)) and e.value == 0


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
    for t, guards in _guarded_reads(inst.eq.value, ()):
        if guards:
            _check_guarded_read(inst, t, guards, shapes, values)


# ---------------------------------------------------------------------------
# Reads under if_then_else guards (paper App. A.2 check 9: no out-of-bounds access)
# ---------------------------------------------------------------------------

#: Iteration spaces up to this many points are checked exactly by enumeration.
ENUMERATION_LIMIT = 1 << 18

Guard = tuple[A.Expr, bool]  # (condition, branch taken: True = then, False = else)


def _guarded_reads(e: A.Expr, guards: tuple[Guard, ...]) -> Iterator[tuple[A.Tensor, tuple[Guard, ...]]]:
    """Every tensor read of ``e`` with the ``if_then_else`` conditions under which it is
    evaluated (TVM's ``if_then_else`` is lazy: only the selected branch is read)."""
    stack = [(e, guards)]
    while stack:
        x, g = stack.pop()
        if isinstance(x, A.Tensor):
            yield x, g
            stack.extend((i, g) for i in x.indices)
        elif isinstance(x, A.Call) and x.func == "if_then_else":
            c, a, b = x.args
            stack.append((c, g))
            stack.append((a, g + ((c, True),)))
            stack.append((b, g + ((c, False),)))
        else:
            stack.extend((c, g) for c in A.children(x))


def _index_only(e: A.Expr) -> bool:
    return all(isinstance(x, (A.Int, A.Index, A.BinOp, A.Neg, A.Compare, A.BoolOp, A.Not))
               or (isinstance(x, A.Call) and x.func in ("max", "min", "if_then_else"))
               for x in A.walk(e)) and not any(isinstance(x, A.BinOp) and x.op in ("/", "**") for x in A.walk(e))


def _eval_index(e: A.Expr, env: dict):
    """Vectorised value of an index-only expression over a numpy grid (int64 / bool)."""
    import numpy as np

    if isinstance(e, A.Int):
        return np.int64(e.value)
    if isinstance(e, A.Index):
        return env[e.name]
    if isinstance(e, A.Neg):
        return -_eval_index(e.operand, env)
    if isinstance(e, A.Not):
        return ~np.asarray(_eval_index(e.operand, env), dtype=bool)
    if isinstance(e, A.BoolOp):
        a = np.asarray(_eval_index(e.lhs, env), dtype=bool)
        b = np.asarray(_eval_index(e.rhs, env), dtype=bool)
        return (a & b) if e.op == "and" else (a | b)
    if isinstance(e, A.Compare):
        a, b = _eval_index(e.lhs, env), _eval_index(e.rhs, env)
        return {"<": np.less, "<=": np.less_equal, ">": np.greater, ">=": np.greater_equal,
                "==": np.equal, "!=": np.not_equal}[e.op](a, b)
    if isinstance(e, A.Call):
        args = [_eval_index(a, env) for a in e.args]
        if e.func == "max":
            return np.maximum(*args)
        if e.func == "min":
            return np.minimum(*args)
        return np.where(np.asarray(args[0], dtype=bool), args[1], args[2])
    if isinstance(e, A.BinOp):
        a, b = _eval_index(e.lhs, env), _eval_index(e.rhs, env)
        if e.op == "+":
            return a + b
        if e.op == "-":
            return a - b
        if e.op == "*":
            return a * b
        if np.any(np.asarray(b) == 0):
            raise ZeroDivisionError
        return np.floor_divide(a, b) if e.op == "//" else np.mod(a, b)
    raise TypeError(type(e).__name__)


def _guard_bounds(guards: tuple[Guard, ...], ranges: dict[str, int]) -> tuple[dict[str, Interval], bool]:
    """Index ranges narrowed by the guards' single-index comparisons (``a-1<0``,
    ``tx>=1``, ``a+2<n``...), and whether every guard was fully understood that way."""
    bounds: dict[str, Interval] = {k: (0, v - 1) for k, v in ranges.items()}
    exact = True
    facts: list[tuple[A.Expr, str, int]] = []

    def collect(c: A.Expr, truth: bool) -> bool:
        if isinstance(c, A.Not):
            return collect(c.operand, not truth)
        if isinstance(c, A.BoolOp):
            if (c.op == "and") == truth:
                return collect(c.lhs, truth) & collect(c.rhs, truth)
            return False
        if isinstance(c, A.Compare):
            op = c.op if truth else {"<": ">=", "<=": ">", ">": "<=", ">=": "<", "==": "!=", "!=": "=="}[c.op]
            lhs, rhs = c.lhs, c.rhs
            if not index_names(rhs) and index_names(lhs):
                pass
            elif not index_names(lhs) and index_names(rhs):
                lhs, rhs = rhs, lhs
                op = {"<": ">", "<=": ">=", ">": "<", ">=": "<=", "==": "==", "!=": "!="}[op]
            else:
                return False
            if not (_index_only(lhs) and _index_only(rhs)) or op == "!=":
                return False
            try:
                lo, hi = interval(rhs, ranges)
            except LeirSemanticError:
                return False
            if lo != hi or math.isinf(lo):
                return False
            facts.append((lhs, op, int(lo)))
            return True
        return False

    for cond, truth in guards:
        exact &= collect(cond, truth)
    for lhs, op, k in facts:
        var, off = _single_index(lhs)
        if var is None:
            exact = False
            continue
        lo, hi = bounds[var]
        c = k - off
        if op == "<":
            hi = min(hi, c - 1)
        elif op == "<=":
            hi = min(hi, c)
        elif op == ">":
            lo = max(lo, c + 1)
        elif op == ">=":
            lo = max(lo, c)
        else:  # ==
            lo, hi = max(lo, c), min(hi, c)
        bounds[var] = (lo, hi)
    return bounds, exact


def _single_index(e: A.Expr) -> tuple[str | None, int]:
    """``i``, ``i+k``, ``k+i``, ``i-k`` -> (``i``, offset); anything else -> (None, 0)."""
    if isinstance(e, A.Index):
        return e.name, 0
    if isinstance(e, A.BinOp) and e.op in ("+", "-"):
        if isinstance(e.lhs, A.Index) and isinstance(e.rhs, A.Int):
            return e.lhs.name, e.rhs.value if e.op == "+" else -e.rhs.value
        if e.op == "+" and isinstance(e.rhs, A.Index) and isinstance(e.lhs, A.Int):
            return e.rhs.name, e.lhs.value
    return None, 0


def _linear_once(e: A.Expr) -> bool:
    """Each loop index occurs at most once, only under ``+ - *constant`` and unary minus
    (then interval arithmetic is exact: the bounds are attained)."""
    names = [x.name for x in A.walk(e) if isinstance(x, A.Index)]
    if len(names) != len(set(names)):
        return False
    for x in A.walk(e):
        if isinstance(x, (A.Int, A.Index, A.Neg)):
            continue
        if isinstance(x, A.BinOp) and (x.op in ("+", "-") or (x.op == "*" and (not index_names(x.lhs)
                                                                               or not index_names(x.rhs)))):
            continue
        return False
    return True


def _check_guarded_read(inst: EqInstance, t: A.Tensor, guards: tuple[Guard, ...],
                        shapes: dict[str, tuple[int, ...]], values) -> None:
    """A read under ``if_then_else`` guards must stay in bounds wherever the guards select
    it. Decided exactly by enumeration (index-only guards and subscripts, iteration space
    up to :data:`ENUMERATION_LIMIT` points) or by interval arithmetic over the ranges the
    guards narrow (when that is exact); otherwise left to the run-time checks of
    :mod:`steptp.verify` (isolated execution, poisoned buffers)."""
    shape = shapes[t.name]
    if len(t.indices) != len(shape):
        raise LeirSemanticError(
            f"tensor {t.name} has rank {len(shape)} but is accessed as '{format_expr(t)}' in '{inst.text}'")
    ranges = loop_vars(inst.loops)
    conds = [c for c, _ in guards]
    where = " and ".join(f"{'' if b else 'not '}({format_expr(c)})" for c, b in guards)

    def fail(d: int, detail: str):
        raise LeirSemanticError(
            f"out-of-bounds read '{format_expr(t)}' in '{inst.text}' where {where}: dimension {d} {detail} "
            f"but {t.name} has extent {shape[d]}")

    used = sorted(set().union(*[index_names(x) for x in [*conds, *t.indices]]))
    space = math.prod(ranges[u] for u in used) if used else 1
    if all(_index_only(x) for x in [*conds, *t.indices]) and space <= ENUMERATION_LIMIT:
        import numpy as np

        grids = np.meshgrid(*[np.arange(ranges[u], dtype=np.int64) for u in used], indexing="ij") if used else []
        env = dict(zip(used, grids))
        failure = None
        try:
            sel = np.ones(grids[0].shape if used else (), dtype=bool)
            for c, b in guards:
                v = np.broadcast_to(np.asarray(_eval_index(c, env), dtype=bool), sel.shape)
                sel = sel & (v if b else ~v)
            for d, idx in enumerate(t.indices):
                v = np.broadcast_to(np.asarray(_eval_index(idx, env)), sel.shape)
                bad = sel & ((v < 0) | (v > shape[d] - 1))
                if bad.any():
                    pos = tuple(int(g[bad][0]) for g in grids)
                    point = ", ".join(f"{u}={p}" for u, p in zip(used, pos))
                    failure = (d, f"reaches {int(v[bad][0])} at {point}")
                    break
        except (ZeroDivisionError, OverflowError, TypeError, ValueError):
            failure = "unknown"  # fall through to interval reasoning
        if failure is None:
            return
        if failure != "unknown":
            fail(*failure)
    bounds, exact = _guard_bounds(guards, ranges)
    if any(lo > hi for lo, hi in bounds.values()):
        return  # the guards never select this branch
    for d, idx in enumerate(t.indices):
        try:
            lo, hi = interval(idx, ranges, values, bounds)
        except LeirSemanticError:
            return
        if math.isinf(lo) or math.isinf(hi):
            continue
        if (lo < 0 or hi > shape[d] - 1) and exact and _linear_once(idx):
            fail(d, f"ranges over [{int(lo)}, {int(hi)}]")


# ---------------------------------------------------------------------------
# Reads of buffers nothing has written yet
# ---------------------------------------------------------------------------


def check_reads_after_writes(prog: A.Program, sig: Signature) -> None:
    """Every read of an intermediate or output tensor must follow a write of it: some
    equation of an earlier top-level nest or of the same top-level nest (a recurrence
    reads what earlier iterations wrote) writes that tensor. Raises
    :class:`LeirSemanticError` naming the read and the equation. Element-level coverage
    (partly written buffers) is checked at run time with poisoned buffers
    (:mod:`steptp.verify`)."""
    readable = {t.name for t in sig.tensors if not t.is_output}
    written: set[str] = set()
    for n, nest in enumerate(prog.nests):
        here = nest_writes(nest)
        for loops, eq in nest.equations():
            for name in sorted(reads(eq)):
                if name in readable or name in written or name in here:
                    continue
                raise LeirSemanticError(f"'{format_assign(eq)}' reads {name}, which no earlier equation writes "
                                        f"(an uninitialised read)")
        written |= here


__all__ = ["LeirSemanticError", "EqInstance", "equation_instances", "tensor_refs", "index_names", "reads",
           "nest_reads", "nest_writes", "tensor_types", "interval", "INIT_VALUES", "self_reference_kind",
           "is_self_referencing", "reduction_axes", "EqSemantics", "ProgramInfo", "analyze", "check_reads_after_writes",
           "ENUMERATION_LIMIT"]
