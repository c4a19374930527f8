"""Seeded verification inputs from tensor specs alone (numpy only).

The numpy core of :func:`steptp.runner.program_inputs.random_inputs` and :func:`~steptp.runner.program_inputs.ordered_inputs`:
given each tensor's name, shape, LEIR dtype and whether it is an output, plus the index
bounds of integer tensors used in subscripts (computed on the build side by
:func:`steptp.runner.program_inputs.index_bounds`), it draws bit-identical arrays anywhere, so a GPU node
(:mod:`steptp.gpu.run`) regenerates a pack's inputs from seeds instead of carrying them.
Distributions: the table in :mod:`steptp.verify`'s docstring. Generator:
``numpy.random.default_rng([seed, trial])``, tensors drawn in header order.
"""

from __future__ import annotations

from typing import Mapping, NamedTuple, Sequence

import numpy as np

#: LEIR dtype -> numpy dtype name (``bfloat16`` through ml_dtypes).
NUMPY_DTYPES = {"f16": "float16", "bf16": "bfloat16", "f32": "float32", "f64": "float64", "bool": "bool",
                "i8": "int8", "i16": "int16", "i32": "int32", "i64": "int64",
                "u8": "uint8", "u16": "uint16", "u32": "uint32", "u64": "uint64"}


class TensorSpec(NamedTuple):
    """One known tensor: ``name``, ``shape`` (elements per axis), LEIR ``dtype`` code
    (``f32``...), ``is_output``."""

    name: str
    shape: tuple
    dtype: str
    is_output: bool


def numpy_dtype(code: str) -> np.dtype:
    """numpy dtype of a LEIR dtype code; ``KeyError`` for an unknown code."""
    name = NUMPY_DTYPES[code]
    if name == "bfloat16":
        import ml_dtypes  # noqa: PLC0415

        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(name)


def random_arrays(specs: Sequence[TensorSpec], seed: int = 0, trial: int = 0,
                  bounds: Mapping[str, int] | None = None) -> dict[str, np.ndarray]:
    """Seeded random values for every non-output tensor of ``specs``, by name (see
    :func:`steptp.verify.random_inputs`, which computes ``bounds`` and calls this)."""
    rng = np.random.default_rng([int(seed), int(trial)])
    kind = trial % 3
    bounds = bounds or {}
    out: dict[str, np.ndarray] = {}
    for t in specs:
        if t.is_output:
            continue
        dt = numpy_dtype(t.dtype)
        shape = tuple(int(s) for s in t.shape)
        if t.dtype == "bool":
            x = rng.random(shape) < 0.5
        elif t.dtype[0] in "iu":
            if t.name in bounds:
                x = rng.integers(0, bounds[t.name], size=shape)
            elif kind == 1 or t.dtype[0] == "u":
                x = rng.integers(1, 9, size=shape)
            else:
                x = rng.integers(1, 9, size=shape) * np.where(rng.random(shape) < 0.5, -1, 1)
        else:
            if kind == 0:
                x = rng.uniform(-2.0, 2.0, size=shape)
            elif kind == 1:
                x = rng.uniform(0.1, 2.0, size=shape)
            else:
                x = rng.standard_normal(size=shape)
        out[t.name] = np.asarray(x).astype(dt)
    return out


def ordered_arrays(specs: Sequence[TensorSpec], seed: int = 0, direction: int = 1,
                   bounds: Mapping[str, int] | None = None) -> dict[str, np.ndarray]:
    """Inputs strictly monotone along every axis (see :func:`steptp.verify.ordered_inputs`)."""
    trial = 4 if direction > 0 else 7  # ints and bools as random trial kind 1 (trial % 3 == 1)
    out = random_arrays(specs, seed, trial, bounds)
    for t in specs:
        if t.is_output or t.dtype == "bool" or t.dtype[0] in "iu":
            continue
        shape = tuple(int(s) for s in t.shape)
        u = np.zeros(shape, dtype=np.float64)
        for k, n in enumerate(shape):
            ramp = np.arange(n, dtype=np.float64) / max(n - 1, 1)
            u = u + ramp.reshape((1,) * k + (n,) + (1,) * (len(shape) - k - 1))
        u = u / max(len(shape), 1)
        x = 0.1 + 1.9 * u if direction > 0 else 2.0 - 1.9 * u
        out[t.name] = np.asarray(x).astype(numpy_dtype(t.dtype))
    return out


#: Edge-case trials of a step's verification (design.md §8), in order: every floating point
#: input exactly zero; uniform(-2, 2) with :data:`ZERO_FRACTION` of its elements exactly
#: zero; all negative, uniform(-2, -0.1); large magnitudes, uniform(-2, 2) times a scale
#: from :data:`LARGE_SCALES`.
EDGE_TRIALS = ("zeros", "scattered_zeros", "negative", "large")
#: Share of exact zeros in the ``scattered_zeros`` trial.
ZERO_FRACTION = 0.3
#: Scales of the ``large`` trial, largest first: the verifier uses the first one at which the
#: original program's outputs are all finite (inputs up to 64 in magnitude: softmax logits
#: spread over ~120 within a row, where an ``exp(max - x)`` overflows f32 past ~88.7), else
#: the last one (then a candidate must reproduce the original's non-finite elements).
LARGE_SCALES = (32.0, 20.0)
#: Largest magnitude of any floating point input the verifier draws (the ``large`` trial at
#: its largest scale); :mod:`steptp.engine.magnitude` bounds values with it.
LARGEST_INPUT = 2.0 * LARGE_SCALES[0]


def edge_arrays(specs: Sequence[TensorSpec], seed: int = 0, kind: str = "zeros", scale: float = 1.0,
                bounds: Mapping[str, int] | None = None) -> dict[str, np.ndarray]:
    """Edge-case inputs of one kind of :data:`EDGE_TRIALS` for every non-output tensor of
    ``specs`` (design.md §8: "equivalent" promises the original's finite outputs for every
    input, not only for random normals):

    * ``zeros``: every floating point element 0.0 (divisions by an input, ``log(0)``);
    * ``scattered_zeros``: uniform(-2, 2) with a seeded :data:`ZERO_FRACTION` of the elements
      exactly 0.0 (a divisor that is zero somewhere);
    * ``negative``: uniform(-2, -0.1) (sign-dependent rewrites; the random trials mix signs);
    * ``large``: uniform(-2, 2) times ``scale`` (overflow of a rewritten ``exp``/power where
      the original subtracts a maximum or divides first).

    Integer, boolean and index tensors are drawn as in :func:`random_arrays` trial kind 1, so
    subscripts stay in bounds and no integer divisor is zero. ``kind`` not in
    :data:`EDGE_TRIALS` raises ``ValueError``. Deterministic for ``(specs, seed, kind,
    scale, bounds)``: generator ``default_rng([seed, 100 + 3 * i, 7])`` for the kind's
    position ``i``."""
    if kind not in EDGE_TRIALS:
        raise ValueError(f"unknown edge-case trial {kind!r} (known: {', '.join(EDGE_TRIALS)})")
    i = EDGE_TRIALS.index(kind)
    out = random_arrays(specs, seed, 100 + 3 * i, bounds)  # ints and bools as trial kind 1 (100 % 3 == 1)
    rng = np.random.default_rng([int(seed), 100 + 3 * i, 7])
    for t in specs:
        if t.is_output or t.dtype == "bool" or t.dtype[0] in "iu":
            continue
        shape = tuple(int(s) for s in t.shape)
        if kind == "zeros":
            x = np.zeros(shape)
        elif kind == "scattered_zeros":
            x = rng.uniform(-2.0, 2.0, size=shape)
            x[rng.random(shape) < ZERO_FRACTION] = 0.0
        elif kind == "negative":
            x = rng.uniform(-2.0, -0.1, size=shape)
        else:
            x = rng.uniform(-2.0, 2.0, size=shape) * float(scale)
        out[t.name] = np.asarray(x).astype(numpy_dtype(t.dtype))
    return out


def trial_inputs(specs: Sequence[TensorSpec], seed: int, trials: int, ordered: Sequence[int] = (),
                 bounds: Mapping[str, int] | None = None,
                 edge: Sequence[Sequence] = ()) -> list[dict[str, np.ndarray]]:
    """The input sets of one verification: ``trials`` random ones, then one ordered set per
    direction in ``ordered`` (``steptp.verify.ORDERED_TRIALS``: ``(1, -1)``), then one
    edge-case set per ``(kind, scale)`` in ``edge`` (:func:`edge_arrays`; a pack records the
    scale the build side chose for the ``large`` trial)."""
    sets = [random_arrays(specs, seed, k, bounds) for k in range(trials)]
    sets += [ordered_arrays(specs, seed, d, bounds) for d in ordered]
    return sets + [edge_arrays(specs, seed, str(k), float(s), bounds) for k, s in edge]


def digest(arrays: Mapping[str, np.ndarray]) -> str:
    """SHA1 over the names, dtypes, shapes and bytes of ``arrays`` (sorted by name): lets a
    GPU node check that it regenerated exactly the inputs the build side used."""
    import hashlib  # noqa: PLC0415

    h = hashlib.sha1()
    for k in sorted(arrays):
        a = np.ascontiguousarray(arrays[k])
        h.update(f"{k}:{a.dtype}:{a.shape};".encode())
        h.update(a.tobytes())
    return h.hexdigest()


__all__ = ["TensorSpec", "NUMPY_DTYPES", "numpy_dtype", "random_arrays", "ordered_arrays", "edge_arrays", "EDGE_TRIALS",
           "ZERO_FRACTION", "LARGE_SCALES", "LARGEST_INPUT", "trial_inputs", "digest"]
