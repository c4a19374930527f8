"""Immutable LEIR abstract syntax tree.

LEIR (paper §2.2, reference-notes §1) is a loop-equation IR: a program is a
sequence of loop nests; a nest is a list of loop descriptors plus a body of
equations (and nested nests) executed in order inside one iteration.

All nodes are frozen dataclasses, so they hash, compare structurally and can be
shared between programs. Equality is class-sensitive: ``Int(1) != Float(1.0)``.

Expression nodes (used both for values and for index arithmetic):

* :class:`Int`, :class:`Float` - numeric literals (``inf`` is ``Float(inf)``;
  a negative literal is ``Neg(Int(3))``).
* :class:`Index` - a loop index used in a subscript or as a value (``tx``, ``a``).
* :class:`Tensor` - a tensor access ``D^{f32,g}_{tx,a}``; a scalar has no indices.
* :class:`Neg`, :class:`BinOp`, :class:`Call`, :class:`Compare`, :class:`BoolOp`, :class:`Not`.

Structure nodes: :class:`Loop`, :class:`Assign`, :class:`Nest`, :class:`Program`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator, Union

#: LEIR dtype codes -> TVM/numpy dtype names (reference-notes §1.4).
DTYPES: dict[str, str] = {
    "f16": "float16",
    "f32": "float32",
    "f64": "float64",
    "bf16": "bfloat16",
    "i8": "int8",
    "i16": "int16",
    "i32": "int32",
    "i64": "int64",
    "u8": "uint8",
    "u16": "uint16",
    "u32": "uint32",
    "u64": "uint64",
    "bool": "bool",
}
#: LEIR dtype codes -> bytes per element (``bool`` is stored as one byte).
DTYPE_BYTES: dict[str, int] = {"f16": 2, "bf16": 2, "f32": 4, "f64": 8, "i8": 1, "i16": 2, "i32": 4, "i64": 8,
                               "u8": 1, "u16": 2, "u32": 4, "u64": 8, "bool": 1}
#: LEIR storage-scope codes -> TVM storage scopes. ``w``: a tensor-core fragment, a tile held
#: collectively by the one warp of a thread block (TVM ``wmma.matrix_a``/``wmma.matrix_b``/
#: ``wmma.accumulator``: the lowering picks the role from the equations, see
#: :mod:`steptp.backend.tvmscript`; plain memory on the CPU).
SCOPES: dict[str, str] = {"g": "global", "s": "shared", "l": "local", "w": "wmma"}
#: Loop kinds: serial, parallel, vectorized, unrolled, bound (thread binding).
LOOP_KINDS: dict[str, str] = {
    "L": "serial",
    "P": "parallel",
    "V": "vectorized",
    "U": "unroll",
    "B": "thread_binding",
}
#: Intrinsic functions and their arities.
FUNCTIONS: dict[str, int] = {
    "exp": 1,
    "log": 1,
    "sqrt": 1,
    "abs": 1,
    "erf": 1,
    "tanh": 1,
    "max": 2,
    "min": 2,
    "if_then_else": 3,
}
BIN_OPS = ("+", "-", "*", "/", "//", "%", "**")
CMP_OPS = ("<", "<=", ">", ">=", "==", "!=")


def _hash_once(cls):
    """Cache the dataclass hash of an immutable composite node in its ``__dict__`` (the
    engine hashes the same subtrees over and over as dict keys: on the 31-nest matching
    bench 115,000 recursive hash calls were 12 % of listing every rule's candidates). The
    cached value is dropped when pickling (``str`` hashes differ between processes)."""
    field_hash = cls.__hash__

    def __hash__(self):
        try:
            return self.__dict__["_hash"]
        except KeyError:
            h = field_hash(self)
            object.__setattr__(self, "_hash", h)
            return h

    def __getstate__(self):
        state = dict(self.__dict__)
        state.pop("_hash", None)
        return state

    cls.__hash__ = __hash__
    cls.__getstate__ = __getstate__
    return cls


@dataclass(frozen=True)
class Int:
    value: int


def int_literal(value: int) -> "Int | Neg":
    """The canonical AST of an integer constant: ``Int(v)`` for v >= 0, ``Neg(Int(-v))``
    otherwise (the parser reads ``-1`` as a negation, so a negative ``Int`` node would print
    as text that does not parse back to it)."""
    return Int(value) if value >= 0 else Neg(Int(-value))


def float_literal(value: float) -> "Float | Neg":
    """The canonical AST of a float constant (``inf`` included): ``Float(v)`` for v >= 0,
    ``Neg(Float(-v))`` otherwise, as the parser reads ``-inf`` or ``-1.0``."""
    return Float(value) if value >= 0 else Neg(Float(-value))


@dataclass(frozen=True)
class Float:
    value: float


@dataclass(frozen=True)
class Index:
    """A loop index variable (lowercase name, e.g. ``tx``, ``a``, ``bxa``)."""

    name: str


@_hash_once
@dataclass(frozen=True)
class Tensor:
    """Tensor access ``name^{dtype,scope}_{indices}``; ``indices == ()`` is a scalar."""

    name: str
    dtype: str
    scope: str
    indices: tuple["Expr", ...] = ()

    def with_indices(self, indices: tuple["Expr", ...]) -> "Tensor":
        return Tensor(self.name, self.dtype, self.scope, tuple(indices))

    def with_scope(self, scope: str) -> "Tensor":
        return Tensor(self.name, self.dtype, scope, self.indices)


@_hash_once
@dataclass(frozen=True)
class Neg:
    operand: "Expr"


@_hash_once
@dataclass(frozen=True)
class BinOp:
    op: str  # one of BIN_OPS
    lhs: "Expr"
    rhs: "Expr"


@_hash_once
@dataclass(frozen=True)
class Call:
    func: str  # one of FUNCTIONS
    args: tuple["Expr", ...]


@_hash_once
@dataclass(frozen=True)
class Compare:
    op: str  # one of CMP_OPS
    lhs: "Expr"
    rhs: "Expr"


@_hash_once
@dataclass(frozen=True)
class BoolOp:
    op: str  # "and" | "or"
    lhs: "Expr"
    rhs: "Expr"


@_hash_once
@dataclass(frozen=True)
class Not:
    operand: "Expr"


Expr = Union[Int, Float, Index, Tensor, Neg, BinOp, Call, Compare, BoolOp, Not]


@dataclass(frozen=True)
class Loop:
    """Loop descriptor ``kind^{extent}_{var=0}``; kind in :data:`LOOP_KINDS`."""

    kind: str
    extent: int
    var: str

    @property
    def thread_tag(self) -> str | None:
        """CUDA tag for a bound loop (``tx`` -> ``threadIdx.x``, ``bya`` -> ``blockIdx.y``)."""
        if self.kind != "B":
            return None
        return ("threadIdx." if self.var[0] == "t" else "blockIdx.") + self.var[1]


@_hash_once
@dataclass(frozen=True)
class Assign:
    """Equation ``target = value`` executed once per iteration of the enclosing loops."""

    target: Tensor
    value: Expr


@_hash_once
@dataclass(frozen=True)
class Nest:
    """Loop nest: ``loops`` (outermost first) and a body of equations / inner nests."""

    loops: tuple[Loop, ...]
    body: tuple[Union[Assign, "Nest"], ...]

    def equations(self) -> Iterator[tuple[tuple[Loop, ...], Assign]]:
        """Yield every equation with the full list of loops enclosing it."""
        for item in self.body:
            if isinstance(item, Assign):
                yield self.loops, item
            else:
                for loops, eq in item.equations():
                    yield self.loops + loops, eq

    def all_loops(self) -> Iterator[Loop]:
        """Yield every loop of the nest and of its inner nests, in program order (a kernel's
        launch axes are the ``B`` loops among them)."""
        yield from self.loops
        for item in self.body:
            if isinstance(item, Nest):
                yield from item.all_loops()


@_hash_once
@dataclass(frozen=True)
class Program:
    nests: tuple[Nest, ...]

    def equations(self) -> Iterator[tuple[tuple[Loop, ...], Assign]]:
        for nest in self.nests:
            yield from nest.equations()


Node = Union[Expr, Loop, Assign, Nest, Program]

# ---------------------------------------------------------------------------
# Generic traversal helpers
# ---------------------------------------------------------------------------


def children(e: Expr) -> tuple[Expr, ...]:
    """Direct sub-expressions of ``e`` (tensor indices included)."""
    if isinstance(e, Tensor):
        return e.indices
    if isinstance(e, (Neg, Not)):
        return (e.operand,)
    if isinstance(e, (BinOp, Compare, BoolOp)):
        return (e.lhs, e.rhs)
    if isinstance(e, Call):
        return e.args
    return ()


def rebuild(e: Expr, new_children: tuple[Expr, ...]) -> Expr:
    """Return ``e`` with its direct sub-expressions replaced (same order as :func:`children`)."""
    if isinstance(e, Tensor):
        return e.with_indices(new_children)
    if isinstance(e, Neg):
        return Neg(new_children[0])
    if isinstance(e, Not):
        return Not(new_children[0])
    if isinstance(e, BinOp):
        return BinOp(e.op, new_children[0], new_children[1])
    if isinstance(e, Compare):
        return Compare(e.op, new_children[0], new_children[1])
    if isinstance(e, BoolOp):
        return BoolOp(e.op, new_children[0], new_children[1])
    if isinstance(e, Call):
        return Call(e.func, tuple(new_children))
    return e


def walk(e: Expr) -> Iterator[Expr]:
    """Pre-order traversal of an expression (tensor subscripts included)."""
    yield e
    for c in children(e):
        yield from walk(c)


def transform(e: Expr, fn) -> Expr:
    """Bottom-up rewrite: ``fn`` is applied to every node after its children."""
    kids = children(e)
    if kids:
        new = tuple(transform(c, fn) for c in kids)
        if new != kids:
            e = rebuild(e, new)
    return fn(e)


def substitute_indices(e: Expr, mapping: dict[str, Expr]) -> Expr:
    """Replace loop indices by expressions everywhere in ``e`` (subscripts and values)."""

    def fn(x: Expr) -> Expr:
        if isinstance(x, Index) and x.name in mapping:
            return mapping[x.name]
        return x

    return transform(e, fn)


def map_program_exprs(prog: Program, fn) -> Program:
    """Apply ``fn(expr) -> expr`` to every equation target and value of a program."""

    def do_nest(n: Nest) -> Nest:
        body = []
        for item in n.body:
            if isinstance(item, Assign):
                t = fn(item.target)
                if not isinstance(t, Tensor):
                    raise TypeError("target rewrite must return a Tensor")
                body.append(Assign(t, fn(item.value)))
            else:
                body.append(do_nest(item))
        return Nest(n.loops, tuple(body))

    return Program(tuple(do_nest(n) for n in prog.nests))


__all__ = [
    "DTYPES", "DTYPE_BYTES", "SCOPES", "LOOP_KINDS", "FUNCTIONS", "BIN_OPS", "CMP_OPS",
    "Int", "Float", "Index", "Tensor", "Neg", "BinOp", "Call", "Compare", "BoolOp", "Not",
    "Expr", "Loop", "Assign", "Nest", "Program", "Node",
    "children", "rebuild", "walk", "transform", "substitute_indices", "map_program_exprs",
]
