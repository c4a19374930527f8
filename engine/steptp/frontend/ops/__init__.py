"""One lowering function per ATen op, in the registry :data:`OPS` (op name -> function).

The registry and the context live in :mod:`.context`; the lowerings, one module per PyTorch
op family: :mod:`.elementwise` (arithmetic, activations), :mod:`.masks` (comparisons,
masks, selection), :mod:`.matmul` (matrix products, einsum, attention), :mod:`.reductions`
(reductions, softmax, norms), :mod:`.shape` (views, copies, concatenation, indexing),
:mod:`.conv` (convolution, pooling) and :mod:`.losses`. A new op goes into its family's
module with ``@lowering("aten_name")``.

A lowering function receives an :class:`OpContext` (the fx node, its arguments bound to the
op schema's names with graph values already lowered, the result's static shape/dtype) and
returns the lowered :class:`~steptp.frontend.ir.Value` (or a tuple of them for multi-result
ops such as ``max.dim``). It emits nests through ``ctx.em`` (an :class:`Emitter`) and names
its result with ``ctx.result()`` (the program output's name when the node is an output).

Conventions of the emitted LEIR (see ``ir.py`` for the binding policy):

* one op = one or more nests, each with its own loops; elementwise ops write a fresh tensor;
* reductions append their reduced loops and rely on implicit init (``D=D+...``,
  ``D=max(D,...)``); multi-step ops (softmax, mean, layer norm) use fresh intermediates;
* views (reshape, transpose, permute, unsqueeze, expand, select, slice ...) emit nothing: they
  are index remappings applied where the value is read;
* dtypes: every tensor carries its PyTorch dtype; an equation may mix dtypes (the backend
  types LEIR expressions like PyTorch - wider float wins, ints promote to float - and casts
  the right-hand side to the target's dtype), so ``x.to(dtype)`` is a copy nest. Sums,
  products, matmuls, convolutions and norm statistics over f16/bf16 accumulate in an f32
  intermediate (then one cast nest), as PyTorch's CPU kernels do;
* any unsupported argument value raises :class:`TranslationError` naming op, argument, node.

Numerics follow PyTorch's formulas (e.g. ``gelu = 0.5*x*(1+erf(x*0.7071067811865476))``,
``sigmoid = 1/(1+exp(-x))``, softmax as max / sum of exp(x-max) / divide).
"""

from __future__ import annotations

from .context import LONG_REDUCTION, lowering, OpContext, OPS, STATS_REDUCTION

# Each family module registers its lowerings in OPS on import.
from . import elementwise, masks, matmul, reductions, shape, conv, losses  # noqa: E402,F401,I001

__all__ = ["OpContext", "OPS", "lowering", "LONG_REDUCTION", "STATS_REDUCTION"]
