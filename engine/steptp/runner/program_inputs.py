"""Seeded inputs of a LEIR program's signature, for verification and timing.

:func:`random_inputs` and :func:`ordered_inputs` draw the known tensors of a signature
(inputs, params, constants) through the numpy core :mod:`steptp.runner.inputs`, after
:func:`index_bounds` has found, by interval analysis, the ranges that keep integer tensors
used in subscripts in bounds. The distributions are the table in :mod:`steptp.verify`'s
docstring. Used by :func:`steptp.verify.verify_pair`, :func:`steptp.runner.timing.measure`,
the translator's check and ``stp gpu pack``; needs the LEIR analysis, not TVM.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from ..leir import ast as A
from ..leir.analysis import LeirSemanticError, analyze, equation_instances, interval, tensor_refs
from ..leir.fileformat import Signature
from .inputs import EDGE_TRIALS, LARGE_SCALES, TensorSpec, edge_arrays, ordered_arrays, random_arrays



def index_bounds(signature: Signature, programs: Sequence[A.Program] = ()) -> dict[str, int]:
    """For each integer input used inside a subscript: the largest ``M`` such that values in
    ``[0, M)`` keep every subscript it appears in within its tensor's extent (by interval
    analysis with the enclosing loop ranges). Inputs with no provable bound are omitted."""
    ints = {t.name for t in signature.tensors if not t.is_output and (t.dtype[0] in "iu")}
    bounds: dict[str, int] = {}
    for prog in programs:
        try:
            shapes = analyze(prog, signature, check_bounds=False).shapes
        except (LeirSemanticError, ValueError):
            shapes = {t.name: t.shape for t in signature.tensors}
        for inst in equation_instances(prog):
            ranges = {l.var: l.extent for l in inst.loops}
            acc = [inst.eq.target, *tensor_refs(inst.eq.value)]
            acc += [r for i in inst.eq.target.indices for r in tensor_refs(i)]
            for t in acc:
                shape = shapes.get(t.name)
                if shape is None or len(shape) != len(t.indices):
                    continue
                for d, entry in enumerate(t.indices):
                    for x in {r.name for r in tensor_refs(entry)} & ints:
                        m = _largest_bound(entry, x, ranges, shape[d])
                        if m is not None:
                            bounds[x] = min(bounds.get(x, m), m)
    return bounds


def _largest_bound(entry: A.Expr, name: str, ranges: dict[str, int], extent: int) -> int | None:
    def fits(m: int) -> bool:
        try:
            lo, hi = interval(entry, ranges, {name: (0, m - 1)})
        except LeirSemanticError:
            return False
        return lo >= 0 and hi <= extent - 1

    if not fits(1):
        return None
    lo, hi = 1, extent
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if fits(mid):
            lo = mid
        else:
            hi = mid - 1
    return lo


def random_inputs(signature: Signature, seed: int = 0, trial: int = 0,
                  programs: Sequence[A.Program] = ()) -> dict[str, np.ndarray]:
    """Seeded random values for every non-output tensor of ``signature`` (inputs, params and
    constants), by name, with the declared shape and numpy dtype.

    The distribution depends on ``trial % 3`` (module docstring table). ``programs``
    (LEIR programs reading these inputs) lets integer tensors used as indices get a range
    that keeps the subscripts in bounds (:func:`index_bounds`). Deterministic: the same
    ``(signature, seed, trial, programs)`` gives bit-identical arrays
    (``np.random.default_rng([seed, trial])``, tensors drawn in header order).
    """
    bounds = index_bounds(signature, programs) if programs else {}
    return random_arrays(tensor_specs(signature), seed, trial, bounds)


def tensor_specs(signature: Signature) -> list[TensorSpec]:
    """The known tensors of ``signature`` as :class:`steptp.runner.inputs.TensorSpec` (header order)."""
    return [TensorSpec(t.name, tuple(int(s) for s in t.shape), t.dtype, t.is_output) for t in signature.tensors]


#: Ordered trials :func:`verify_pair` runs after the random ones: inputs increasing along
#: every axis (+1), then decreasing (-1).
ORDERED_TRIALS = (1, -1)


def ordered_inputs(signature: Signature, seed: int = 0, direction: int = 1,
                   programs: Sequence[A.Program] = ()) -> dict[str, np.ndarray]:
    """Inputs whose floating point tensors are strictly monotone along every axis, so that
    every element of a reduction matters in one of the two directions: the largest element
    of each row is the last one when ``direction`` is +1, the smallest when it is -1. A max
    (min) reduction that drops its last element therefore fails the increasing (decreasing)
    trial for every seed, which random draws miss now and then (a 15-of-16 max passes random
    trials 4 times in 20).

    Element ``(i_1..i_r)`` of a shape ``(n_1..n_r)`` gets ``0.1 + 1.9 * u`` (+1) or
    ``2 - 1.9 * u`` (-1), with ``u = mean_k(i_k / (n_k - 1))`` in [0, 1]: positive like
    trial kind 1, so log/sqrt stay finite. Neighbours along axis ``k`` differ by
    ``1.9 / (r (n_k - 1))``: distinct in f32/f64; in f16/bf16 long axes may round to ties.
    Integer, boolean and index tensors are drawn as in :func:`random_inputs` (trial kind 1).
    Deterministic for ``(signature, seed, direction, programs)``."""
    bounds = index_bounds(signature, programs) if programs else {}
    return ordered_arrays(tensor_specs(signature), seed, direction, bounds)


def edge_inputs(signature: Signature, seed: int = 0, kind: str = "zeros", scale: float = 1.0,
                programs: Sequence[A.Program] = ()) -> dict[str, np.ndarray]:
    """Edge-case inputs of ``kind`` (one of :data:`EDGE_TRIALS`: exact zeros, scattered exact
    zeros, all negative, large magnitudes times ``scale``) for every non-output tensor of
    ``signature``; integer tensors used as indices stay in bounds (:func:`index_bounds` over
    ``programs``). The numpy core is :func:`steptp.runner.inputs.edge_arrays`; design.md §8."""
    bounds = index_bounds(signature, programs) if programs else {}
    return edge_arrays(tensor_specs(signature), seed, kind, scale, bounds)


__all__ = ["index_bounds", "random_inputs", "tensor_specs", "ORDERED_TRIALS", "ordered_inputs", "edge_inputs",
           "EDGE_TRIALS", "LARGE_SCALES"]
