"""Building blocks of the translator: values, loop nests, index simplification, errors.

A PyTorch graph value becomes one of four :class:`Value` kinds:

* :class:`Buffer` - a tensor stored under a LEIR name (an input, a parameter, an output or
  an intermediate written by some nest);
* :class:`View` - an *index remapping* of another value (transpose, permute, reshape,
  unsqueeze, expand, select, slice ...): no nest is emitted, readers index the base tensor
  through the remapping;
* :class:`Fill` - a constant (a Python scalar, or a tensor filled with one value);
* :class:`Lazy` - an elementwise expression evaluated where it is read (boolean masks).

Every value can be *read* at an index tuple (one index expression per dimension), which
yields the LEIR expression for that element. Lowering functions (``ops/``) build nests
with :class:`Emitter`: :meth:`Emitter.space` makes the loops of an iteration space
following the binding policy below, :meth:`Emitter.emit` appends a nest after simplifying
its subscripts (``(tx*16+a)//16`` -> ``tx``).

Binding policy (one place, used by every nest):
    the outermost output axis with extent > 1 is bound: ``B^{n}_{tx=0}`` (threadIdx.x) when
    ``n <= 1024``, otherwise ``B^{n}_{bx=0}`` (blockIdx.x, legal up to 2^31-1); larger axes
    stay serial. All other output axes and all reduction axes are serial ``L`` loops named
    ``a c d f ...`` (reduction loops last). Output axes of extent 1 get no loop (they are
    indexed by ``0``). A nest without any output axis (a scalar result) gets ``B^{1}_{tx=0}``
    so that every nest has a bound loop; bound loops are never reduction axes (see
    :meth:`Emitter.emit`). The limits come from the backend's hardware table
    (:mod:`steptp.backend.hardware`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Sequence

import torch

from ..backend.hardware import THREAD_LIMITS
from ..leir import ast as A
from ..leir.indexarith import simplify_subscripts
from .naming import BLOCK_X, THREAD_X, TensorNames, index_name

#: CUDA limits used by the binding policy (the backend's hardware table, design.md §2)
MAX_THREADS_X = THREAD_LIMITS["threadIdx.x"]
MAX_GRID_X = THREAD_LIMITS["blockIdx.x"]

#: torch dtype -> LEIR dtype code
TORCH_TO_LEIR: dict[torch.dtype, str] = {
    torch.float16: "f16",
    torch.bfloat16: "bf16",
    torch.float32: "f32",
    torch.float64: "f64",
    torch.int8: "i8",
    torch.int16: "i16",
    torch.int32: "i32",
    torch.int64: "i64",
    torch.uint8: "u8",
    torch.bool: "bool",
}
LEIR_TO_TORCH = {v: k for k, v in TORCH_TO_LEIR.items()}
FLOAT_CODES = ("f16", "bf16", "f32", "f64")


class TranslationError(ValueError):
    """The PyTorch program cannot be translated.

    ``op`` is the operator (``aten.softmax.int``), ``argument`` the offending argument (or
    ``None``), ``node`` the fx graph node's name (``softmax_1``); all three are also part of
    the message, together with the node's text and, when known, the user source line.
    """

    def __init__(self, message: str, *, op: str | None = None, argument: str | None = None,
                 node=None):
        self.op = op
        self.argument = argument
        self.node = getattr(node, "name", node)
        parts = []
        if op:
            parts.append(f"op {op}")
        if argument:
            parts.append(f"argument {argument!r}")
        if node is not None:
            parts.append(f"graph node %{self.node}")
        head = ", ".join(parts)
        text = f"{head}: {message}" if head else message
        if node is not None and hasattr(node, "format_node"):
            text += f"\n  node: {node.format_node()}"
            src = _user_source_line(node)
            if src:
                text += f"\n  source: {src}"
        super().__init__(text)


def _user_source_line(node) -> str | None:
    trace = (getattr(node, "meta", None) or {}).get("stack_trace")
    if not trace:
        return None
    lines = [l.strip() for l in trace.strip().splitlines() if l.strip()]
    files = [i for i, l in enumerate(lines) if l.startswith("File ")]
    if not files:
        return None
    i = files[-1]
    return lines[i] + (f" | {lines[i + 1]}" if i + 1 < len(lines) else "")


def leir_dtype(dtype: torch.dtype, *, op: str | None = None, node=None) -> str:
    """LEIR code of a torch dtype; raises :class:`TranslationError` for e.g. complex dtypes."""
    try:
        return TORCH_TO_LEIR[dtype]
    except KeyError:
        raise TranslationError(f"dtype {dtype} has no LEIR code", op=op, node=node) from None


# ---------------------------------------------------------------------------
# Literals and small expression constructors
# ---------------------------------------------------------------------------


def literal(value, dtype: str) -> A.Expr:
    """A LEIR literal for ``value`` in a tensor of LEIR ``dtype`` (floats for float dtypes).

    Negative values become ``Neg(...)`` (the parser's form), so printing round-trips."""
    if isinstance(value, bool):
        value = int(value)
    if dtype in FLOAT_CODES:
        v = float(value)
        if math.isnan(v):
            raise TranslationError("NaN constants cannot be written in LEIR")
        if v == 0:
            return A.Float(0.0)  # also for -0.0, which would not survive printing
        return A.Neg(A.Float(-v)) if v < 0 else A.Float(v)
    if isinstance(value, float) and not value.is_integer():
        raise TranslationError(f"non-integral constant {value} in a {dtype} computation")
    v = int(value)
    return A.Neg(A.Int(-v)) if v < 0 else A.Int(v)


def add(a: A.Expr, b: A.Expr) -> A.Expr:
    """``a + b``, written ``a - c`` when ``b`` is a negative literal ``-c``."""
    if isinstance(b, A.Neg) and isinstance(b.operand, (A.Int, A.Float)):
        return A.BinOp("-", a, b.operand)
    return A.BinOp("+", a, b)


def sub(a: A.Expr, b: A.Expr) -> A.Expr:
    """``a - b``, written ``a + c`` when ``b`` is a negative literal ``-c``."""
    if isinstance(b, A.Neg) and isinstance(b.operand, (A.Int, A.Float)):
        return A.BinOp("+", a, b.operand)
    return A.BinOp("-", a, b)


def mul(a: A.Expr, b: A.Expr) -> A.Expr:
    """``a * b``."""
    return A.BinOp("*", a, b)


def div(a: A.Expr, b: A.Expr) -> A.Expr:
    """``a / b`` (true division)."""
    return A.BinOp("/", a, b)


def call(func: str, *args: A.Expr) -> A.Expr:
    """``func(args...)`` for a LEIR intrinsic (``exp``, ``max``, ``if_then_else`` ...)."""
    return A.Call(func, tuple(args))


def iadd(a: A.Expr, b: A.Expr) -> A.Expr:
    """Integer index ``a + b`` with constant folding of zeros."""
    if isinstance(b, A.Int) and b.value < 0:          # never keep a negative Int node
        b = A.int_literal(b.value)
    if isinstance(a, A.Int) and a.value < 0:
        a = A.int_literal(a.value)
    if b == A.Int(0):
        return a
    if a == A.Int(0):
        return b
    if isinstance(a, A.Int) and isinstance(b, A.Int):
        return A.int_literal(a.value + b.value)
    if isinstance(b, A.Neg) and isinstance(b.operand, A.Int):
        return A.BinOp("-", a, b.operand)
    return A.BinOp("+", a, b)


def imul(a: A.Expr, k: int) -> A.Expr:
    """Integer index ``a * k`` with folding of 0 and 1."""
    if k == 0 or a == A.Int(0):
        return A.Int(0)
    if k == 1:
        return a
    if isinstance(a, A.Int):
        return A.int_literal(a.value * k)
    return A.BinOp("*", a, A.int_literal(k))


# ---------------------------------------------------------------------------
# Values
# ---------------------------------------------------------------------------


class Value:
    """A tensor-valued graph value of static ``shape`` and LEIR ``dtype``."""

    shape: tuple[int, ...]
    dtype: str

    @property
    def rank(self) -> int:
        return len(self.shape)

    def read(self, idx: Sequence[A.Expr]) -> A.Expr:
        """LEIR expression of the element at ``idx`` (one index expression per dimension)."""
        raise NotImplementedError


@dataclass(frozen=True, eq=False)
class Buffer(Value):
    """A tensor stored under a LEIR ``name`` (known tensor or intermediate)."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    #: a 0-d intermediate stored as a 1-element vector (so a reduction into it can index it
    #: by the bound ``tx`` of extent 1, see :meth:`Emitter.emit`)
    as_vector: bool = False

    def ref(self, idx: Sequence[A.Expr]) -> A.Tensor:
        if len(idx) != len(self.shape):
            raise AssertionError(f"{self.name}: rank {len(self.shape)} accessed with {len(idx)} indices")
        if self.as_vector:
            idx = (A.Int(0),)
        return A.Tensor(self.name, self.dtype, "g", tuple(idx))

    def read(self, idx):
        return self.ref(idx)


@dataclass(frozen=True, eq=False)
class View(Value):
    """``base`` read through ``remap`` (output index tuple -> base index tuple)."""

    base: Value
    shape: tuple[int, ...]
    remap: Callable[[tuple[A.Expr, ...]], tuple[A.Expr, ...]]
    what: str = "view"

    @property
    def dtype(self) -> str:  # type: ignore[override]
        return self.base.dtype

    def read(self, idx):
        return self.base.read(tuple(self.remap(tuple(idx))))


@dataclass(frozen=True, eq=False)
class Fill(Value):
    """A constant: every element equals ``value`` (a Python number); shape ``()`` for scalars."""

    value: float | int | bool
    dtype: str
    shape: tuple[int, ...] = ()

    def read(self, idx):
        return literal(self.value, self.dtype)


@dataclass(frozen=True, eq=False)
class Lazy(Value):
    """An elementwise expression computed where it is read (used for boolean masks such as
    ``x > 0`` feeding ``where``/``masked_fill``, so no boolean tensor is stored)."""

    shape: tuple[int, ...]
    dtype: str
    fn: Callable[[tuple[A.Expr, ...]], A.Expr]

    def read(self, idx):
        return self.fn(tuple(idx))


def broadcast_index(v: Value, idx: Sequence[A.Expr], out_shape: Sequence[int]) -> tuple[A.Expr, ...]:
    """Index into ``v`` for the output element ``idx`` of a broadcast to ``out_shape``
    (right-aligned; unit dimensions of ``v`` read element 0)."""
    off = len(out_shape) - v.rank
    if off < 0:
        raise AssertionError("operand rank exceeds the broadcast rank")
    return tuple(A.Int(0) if v.shape[j] == 1 else idx[off + j] for j in range(v.rank))


def bread(v: Value, idx: Sequence[A.Expr], out_shape: Sequence[int]) -> A.Expr:
    """Broadcasting read: ``v`` at the output element ``idx`` of shape ``out_shape``."""
    return v.read(broadcast_index(v, idx, out_shape))


# ---------------------------------------------------------------------------
# Views
# ---------------------------------------------------------------------------


def strides(shape: Sequence[int]) -> list[int]:
    """Row-major element strides of ``shape``."""
    out, s = [], 1
    for n in reversed(shape):
        out.append(s)
        s *= n
    return list(reversed(out))


def permute_view(x: Value, dims: Sequence[int]) -> Value:
    """``x.permute(dims)``: output dim j is input dim ``dims[j]``."""
    dims = list(dims)
    if list(range(x.rank)) == dims:
        return x
    inv = [dims.index(i) for i in range(x.rank)]
    return View(x, tuple(x.shape[d] for d in dims), lambda idx: tuple(idx[inv[i]] for i in range(len(inv))),
                "permute")


def reshape_view(x: Value, shape: Sequence[int]) -> Value:
    """Row-major reshape (``view``/``reshape``/``flatten``/``unflatten``/``squeeze``...).

    Reads go through the linear element index; :func:`steptp.leir.indexarith.simplify_index` later reduces the
    ``//`` and ``%`` to plain indices wherever the dimensions line up."""
    shape = tuple(int(s) for s in shape)
    if shape == x.shape:
        return x
    if math.prod(shape) != math.prod(x.shape):
        raise AssertionError("reshape changes the number of elements")
    ost, ist = strides(shape), strides(x.shape)
    in_shape = x.shape

    def remap(idx):
        lin: A.Expr = A.Int(0)
        for j, n in enumerate(shape):
            if n != 1:
                lin = iadd(lin, imul(idx[j], ost[j]))
        out = []
        for i, n in enumerate(in_shape):
            if n == 1:
                out.append(A.Int(0))
                continue
            e = lin if ist[i] == 1 else A.BinOp("//", lin, A.Int(ist[i]))
            out.append(A.BinOp("%", e, A.Int(n)))
        return tuple(out)

    return View(x, shape, remap, "reshape")


def expand_view(x: Value, shape: Sequence[int]) -> Value:
    """``x.expand(shape)`` / broadcast to ``shape`` (``-1`` keeps a dimension)."""
    shape = list(shape)
    off = len(shape) - x.rank
    for j in range(x.rank):
        if shape[off + j] == -1:
            shape[off + j] = x.shape[j]
    shape = tuple(shape)
    if shape == x.shape:
        return x
    return View(x, shape, lambda idx: broadcast_index(x, idx, shape), "expand")


def select_view(x: Value, dim: int, index: int) -> Value:
    """``x.select(dim, index)`` (``x[..., index, ...]``); negative values already normalised."""
    shape = x.shape[:dim] + x.shape[dim + 1:]
    return View(x, shape, lambda idx: tuple(idx[:dim]) + (A.Int(index),) + tuple(idx[dim:]), "select")


def slice_view(x: Value, dim: int, start: int, length: int, step: int) -> Value:
    """``x[..., start:start+length*step:step, ...]`` (normalised, ``step > 0``)."""
    if start == 0 and step == 1 and length == x.shape[dim]:
        return x
    shape = x.shape[:dim] + (length,) + x.shape[dim + 1:]

    def remap(idx):
        i = iadd(imul(idx[dim], step), A.Int(start))
        return tuple(idx[:dim]) + (i,) + tuple(idx[dim + 1:])

    return View(x, shape, remap, "slice")


# ---------------------------------------------------------------------------
# Nest construction
# ---------------------------------------------------------------------------


@dataclass
class Space:
    """Loops of one nest: ``out`` has one index expression per output dimension (``0`` for
    unit dimensions), ``red`` one per reduced dimension (``0`` for unit extents)."""

    loops: list[A.Loop]
    out: tuple[A.Expr, ...]
    red: tuple[A.Expr, ...]

    def full(self, rank: int, dims: Sequence[int]) -> tuple[A.Expr, ...]:
        """Index of the reduced operand: ``dims`` (sorted) take the reduction indices, the
        other positions the output indices, in order."""
        out, o, r = [], iter(self.out), iter(self.red)
        for d in range(rank):
            out.append(next(r) if d in dims else next(o))
        return tuple(out)


class Emitter:
    """Accumulates the nests of a program; owns tensor naming."""

    def __init__(self, names: TensorNames | None = None):
        self.names = names or TensorNames()
        self.nests: list[A.Nest] = []

    def temp(self, shape: Sequence[int], dtype: str) -> Buffer:
        """A fresh intermediate tensor (a 0-d one is stored as a 1-element vector)."""
        shape = tuple(int(s) for s in shape)
        return Buffer(self.names.fresh(), shape, dtype, as_vector=not shape)

    @staticmethod
    def space(out_shape: Sequence[int], red_shape: Sequence[int] = ()) -> Space:
        """Loops over ``out_shape`` then ``red_shape`` following the binding policy."""
        loops: list[A.Loop] = []
        serial = 0
        out: list[A.Expr] = []
        bound = False
        for n in out_shape:
            if n == 1:
                out.append(A.Int(0))
                continue
            if not bound and n <= MAX_GRID_X:
                var = THREAD_X if n <= MAX_THREADS_X else BLOCK_X
                loops.append(A.Loop("B", int(n), var))
                bound = True
            else:
                var = index_name(serial)
                serial += 1
                loops.append(A.Loop("L", int(n), var))
            out.append(A.Index(var))
        if not bound:
            loops.insert(0, A.Loop("B", 1, THREAD_X))
        red: list[A.Expr] = []
        for n in red_shape:
            if n == 1:
                red.append(A.Int(0))
                continue
            var = index_name(serial)
            serial += 1
            loops.append(A.Loop("L", int(n), var))
            red.append(A.Index(var))
        return Space(loops, tuple(out), tuple(red))

    def emit(self, loops: Sequence[A.Loop], *equations: A.Assign) -> None:
        """Append one nest (subscripts simplified).

        Keeps bound loops spatial: in a nest whose only bound loop is the synthetic
        ``B^{1}_{tx=0}`` (no output axis), an accumulation whose target does not use ``tx``
        would make ``tx`` a reduction axis (a cross-thread reduction on the GPU). Then a
        ``0`` subscript of the target is replaced by ``tx`` (equal, as ``tx`` only takes 0);
        a 0-d known output instead accumulates into a fresh 1-element vector ``T_{tx}``,
        copied to the output by an extra nest ``B^{1}_{tx=0}[O=T_{0};]``."""
        loops = tuple(loops)
        extra: list[A.Nest] = []
        if loops and loops[0] == A.Loop("B", 1, THREAD_X):
            eqs = []
            for eq in equations:
                fixed, copy = self._spatial_tx(eq)
                eqs.append(fixed)
                if copy is not None:
                    extra.append(A.Nest((A.Loop("B", 1, THREAD_X),), (copy,)))
            equations = tuple(eqs)
        self.nests.append(simplify_subscripts(A.Nest(loops, tuple(equations))))
        self.nests.extend(extra)

    def _spatial_tx(self, eq: A.Assign) -> tuple[A.Assign, A.Assign | None]:
        t = eq.target
        tx = A.Index(THREAD_X)
        uses_tx = any(isinstance(x, A.Index) and x.name == THREAD_X for i in t.indices for x in A.walk(i))
        self_ref = any(isinstance(x, A.Tensor) and x.name == t.name for x in A.walk(eq.value))
        if uses_tx or not self_ref:
            return eq, None
        if A.Int(0) in t.indices:
            k = t.indices.index(A.Int(0))
            new_t = t.with_indices(t.indices[:k] + (tx,) + t.indices[k + 1:])
        elif not t.indices:
            new_t = A.Tensor(self.names.fresh(), t.dtype, t.scope, (tx,))
        else:
            return eq, None
        value = A.transform(eq.value, lambda x: new_t if x == t else x)
        copy = None if t.indices else A.Assign(t, new_t.with_indices((A.Int(0),)))
        return A.Assign(new_t, value), copy

    # -- common nest shapes -------------------------------------------------

    def map(self, out: Buffer, fn: Callable[..., A.Expr], *operands: Value) -> Buffer:
        """``out[i] = fn(op0[i], op1[i], ...)`` over ``out.shape`` with broadcasting."""
        sp = self.space(out.shape)
        reads = [bread(v, sp.out, out.shape) for v in operands]
        self.emit(sp.loops, A.Assign(out.ref(sp.out), fn(*reads)))
        return out

    def copy(self, out: Buffer, x: Value) -> Buffer:
        """``out[i] = x[i]`` (materialise a view, an input alias or a constant)."""
        return self.map(out, lambda v: v, x)

    def reduce(self, out: Buffer, kind: str, x: Value, dims: Sequence[int], keepdim: bool,
               fn: Callable[[A.Expr, Space], A.Expr] | None = None) -> Buffer:
        """Reduce ``x`` over ``dims`` into ``out`` with implicit init: ``kind`` is ``sum``
        (``O=O+v``), ``prod`` (``O=O*v``), ``max`` (``O=max(O,v)``) or ``min``. ``fn(v, space)``
        transforms the element read before accumulation."""
        dims = sorted(set(dims))
        keep = [d for d in range(x.rank) if d not in dims]
        sp = self.space([x.shape[d] for d in keep], [x.shape[d] for d in dims])
        v = x.read(sp.full(x.rank, dims))
        if fn is not None:
            v = fn(v, sp)
        tgt = out.ref(self.target_index(sp, x.rank, dims, keepdim))
        if kind == "sum":
            rhs = add(tgt, v)
        elif kind == "prod":
            rhs = mul(tgt, v)
        elif kind in ("max", "min"):
            rhs = call(kind, tgt, v)
        else:
            raise AssertionError(kind)
        self.emit(sp.loops, A.Assign(tgt, rhs))
        return out

    @staticmethod
    def target_index(sp: Space, rank: int, dims: Sequence[int], keepdim: bool) -> tuple[A.Expr, ...]:
        """Index of a reduction result: the output indices, with ``0`` at the reduced
        positions when ``keepdim``."""
        if not keepdim:
            return tuple(sp.out)
        o = iter(sp.out)
        return tuple(A.Int(0) if d in dims else next(o) for d in range(rank))

    def program(self) -> A.Program:
        """The emitted nests as a program."""
        return A.Program(tuple(self.nests))


__all__ = ["MAX_THREADS_X", "MAX_GRID_X", "TORCH_TO_LEIR", "LEIR_TO_TORCH", "FLOAT_CODES",
           "TranslationError", "leir_dtype", "literal", "add", "sub", "mul", "div", "call", "iadd", "imul",
           "Value", "Buffer", "View", "Fill", "Lazy", "broadcast_index", "bread", "strides", "permute_view",
           "reshape_view", "expand_view", "select_view", "slice_view", "Space", "Emitter"]
