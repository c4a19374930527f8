"""The lowering context every op receives (:class:`OpContext`) and the op registry :data:`OPS`
with its decorator :func:`lowering`."""

from __future__ import annotations

from typing import Any, Callable, Sequence

import torch.fx as fx

from ...leir import ast as A
from ..ir import FLOAT_CODES, Buffer, Emitter, Fill, TranslationError, Value, literal


# ---------------------------------------------------------------------------
# Context and registry
# ---------------------------------------------------------------------------


class OpContext:
    """Everything a lowering function needs for one fx node.

    ``args`` maps schema argument names to values: lowered graph values (:class:`Value`,
    tuples for multi-result producers), Python numbers/lists/None otherwise."""

    def __init__(self, node: fx.Node, op: str, overload: str, args: dict[str, Any], em: Emitter,
                 result_fn: Callable[..., Buffer], meta_fn: Callable[..., tuple[tuple[int, ...], str]],
                 needs_fn: Callable[[fx.Node, int], bool] = lambda n, k: True):
        self._needs_fn = needs_fn
        self.node = node
        self.op = op
        self.overload = overload
        self.args = args
        self.em = em
        self._result_fn = result_fn
        self._meta_fn = meta_fn

    @property
    def qualname(self) -> str:
        """``aten.<op>.<overload>`` (as in error messages)."""
        return f"aten.{self.op}.{self.overload}" if self.overload else self.op

    # -- metadata -------------------------------------------------------------

    def meta(self, k: int | None = None) -> tuple[tuple[int, ...], str]:
        """(shape, LEIR dtype) of the node's result (element ``k`` of a tuple result)."""
        return self._meta_fn(self.node, k)

    @property
    def out_shape(self) -> tuple[int, ...]:
        """Static shape of the (first) result."""
        return self.meta(0 if isinstance(self.node.meta.get("val"), (tuple, list)) else None)[0]

    @property
    def out_dtype(self) -> str:
        """LEIR dtype of the (first) result."""
        return self.meta(0 if isinstance(self.node.meta.get("val"), (tuple, list)) else None)[1]

    # -- errors and arguments -------------------------------------------------

    def fail(self, message: str, argument: str | None = None) -> TranslationError:
        """Raise a :class:`TranslationError` naming this op, ``argument`` and the node."""
        raise TranslationError(message, op=self.qualname, argument=argument, node=self.node)

    def unsupported(self, argument: str) -> TranslationError:
        """Raise a :class:`TranslationError` for an unsupported value of ``argument``."""
        raise TranslationError(f"unsupported value {self.args.get(argument)!r}", op=self.qualname,
                               argument=argument, node=self.node)

    def tensor(self, name: str) -> Value:
        """The tensor argument ``name``; raises if it is not a tensor."""
        v = self.args.get(name)
        if not isinstance(v, Value):
            self.fail(f"expected a tensor, got {type(v).__name__}", name)
        return v

    def operand(self, name: str, dtype: str | None = None) -> Value:
        """A tensor argument, or a Python number as a constant of ``dtype`` (default: the
        result dtype). Tensors of another dtype are fine: LEIR expressions are typed like
        PyTorch's (wider float wins, ints promote to float) and the value is cast to the
        target's dtype on assignment (backend ``tvmscript`` "Types")."""
        dtype = dtype or self.out_dtype
        v = self.args.get(name)
        if isinstance(v, (bool, int, float)):
            return Fill(v, dtype)
        if not isinstance(v, Value):
            self.fail(f"expected a tensor or a number, got {type(v).__name__}", name)
        return v

    def number(self, name: str) -> float | int:
        """The number argument ``name``; raises if it is not a Python number."""
        v = self.args.get(name)
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            self.fail(f"expected a number, got {v!r}", name)
        return v

    def lit(self, v, dtype: str | None = None) -> A.Expr:
        """A LEIR literal for ``v`` in ``dtype`` (default: the result dtype)."""
        return literal(v, dtype or self.out_dtype)

    def dim(self, d: int, rank: int, argument: str = "dim") -> int:
        """Normalise a (possibly negative) dimension; rank 0 accepts 0 and -1."""
        r = max(rank, 1)
        if not isinstance(d, int) or not -r <= d < r:
            self.fail(f"dimension {d!r} out of range for rank {rank}", argument)
        return d % r

    def dims(self, ds, rank: int, argument: str = "dim") -> list[int]:
        """Normalised, sorted, de-duplicated reduction dims (``None``/``[]`` = all dims)."""
        if ds is None or (isinstance(ds, (list, tuple)) and len(ds) == 0):
            return list(range(rank))
        if isinstance(ds, int):
            ds = [ds]
        return sorted({self.dim(d, rank, argument) for d in ds}) if rank else []

    def require_float(self, *values: Value) -> None:
        """Raise unless every tensor among ``values`` has a floating-point dtype."""
        for v in values:
            if isinstance(v, Value) and v.dtype not in FLOAT_CODES:
                self.fail(f"only floating-point tensors are supported here, got {v.dtype}")

    # -- results and nests ----------------------------------------------------

    def result(self, k: int | None = None) -> Buffer:
        """The buffer this node's result (element ``k``) is written to."""
        return self._result_fn(self.node, k)

    def needs_item(self, k: int) -> bool:
        """Whether element ``k`` of this node's tuple result is used (by a live ``getitem``)."""
        return self._needs_fn(self.node, k)

    def temp(self, shape: Sequence[int], dtype: str | None = None) -> Buffer:
        """A fresh intermediate of ``dtype`` (default: the result dtype)."""
        return self.em.temp(shape, dtype or self.out_dtype)

    def map(self, fn: Callable[..., A.Expr], *operands: Value, out: Buffer | None = None) -> Buffer:
        """Elementwise ``out = fn(operands...)`` (broadcasting) into the node's result."""
        return self.em.map(out or self.result(), fn, *operands)

    def opmath(self, x: Value) -> Value:
        """``x`` itself, or for a 16-bit float tensor (f16/bf16) an f32 copy of it, so that an
        elementwise composite (sigmoid, silu, mish, gelu, softplus...) mapped over it computes
        in float32 and rounds once when stored into the 16-bit result. PyTorch's kernels do
        this for reduced floating types (``opmath_t`` = float on CPU and CUDA); computing
        ``x*tanh(log(1+exp(x)))`` in f16 rounds five times and differs by an ulp or more,
        which a following normalisation of a nearly constant group amplifies 300-fold."""
        if not isinstance(x, Value) or x.dtype not in ("f16", "bf16"):
            return x
        return self.em.copy(self.em.temp(x.shape, "f32"), x)

    def acc_dtype(self, dtype: str | None = None, n: int = 1, long_at: int | None = None) -> str:
        """Accumulation dtype of a sum of ``n`` terms of ``dtype``: float32 for 16-bit floats
        (PyTorch accumulates f16/bf16 sums, matmuls and norms in float32), float64 for float32
        sums of at least :data:`LONG_REDUCTION` terms (a sequential float32 sum of millions of
        terms drifts by ~1e-3 relative; PyTorch's CPU kernels use cascade sums or double
        accumulators there, e.g. batch-norm statistics and cumsum), else ``dtype``."""
        dtype = dtype or self.out_dtype
        if dtype in ("f16", "bf16"):
            return "f32"
        if dtype == "f32" and n >= (long_at or LONG_REDUCTION):
            return "f64"
        return dtype

    def acc_temp(self, shape: Sequence[int], dtype: str | None = None, n: int = 1,
                 long_at: int | None = None) -> Buffer:
        """A fresh intermediate in the accumulation dtype (:meth:`acc_dtype`)."""
        return self.em.temp(shape, self.acc_dtype(dtype, n, long_at))

    def accumulate(self, out: Buffer, build: Callable[[Buffer], Any], n: int = 1) -> Buffer:
        """``build(target)`` emits nests accumulating ``n`` terms into ``target``: ``out``
        itself, or, when :meth:`acc_dtype` is wider, a temp of that dtype and then a cast
        nest ``out = temp``."""
        acc_dt = self.acc_dtype(out.dtype, n)
        if acc_dt == out.dtype:
            build(out)
            return out
        acc = self.em.temp(out.shape, acc_dt)
        build(acc)
        return self.em.copy(out, acc)


#: float32 sums of at least this many terms accumulate in float64 (:meth:`OpContext.acc_dtype`)
LONG_REDUCTION = 1 << 16
#: the same for normalisation statistics (mean/variance of layer/group/instance/batch norm,
#: var/std), at any length: a normalised output amplifies the error of the mean by 1/std,
#: and PyTorch's CPU kernels compute these statistics with double accumulators or cascade
#: sums. (At 256 terms and up only, an instance norm of a clamped, nearly constant channel
#: of 216 elements came out 8e-5 where PyTorch gives 2.5e-6: stp corpus --count 40 --seed 5,
#: 00008_Random5_Conv3d.)
STATS_REDUCTION = 1

#: op name (ATen schema name without namespace, or ``getitem``) -> lowering function
OPS: dict[str, Callable[[OpContext], Any]] = {}


def lowering(*names: str):
    """Register a lowering function for the given op names."""

    def deco(fn):
        for n in names:
            if n in OPS:
                raise AssertionError(f"duplicate lowering for {n}")
            OPS[n] = fn
        return fn

    return deco
