"""Paired timing statistics (numpy only): the speedup of a candidate over its baseline from
interleaved measurements (A, B, A, B ... in one process, same warm state).

:func:`paired_speedup` takes per-call times of the baseline ``a`` and the candidate ``b``
measured in alternation (round ``i`` gives ``a[i]`` and ``b[i]``), forms the paired ratios
``a[i] / b[i]`` and reports their median with a percentile-bootstrap confidence interval
(Efron & Tibshirani 1993, ch. 13: resample the rounds with replacement, median of each
resample). A candidate is called faster (slower) only when the whole interval lies above
(below) 1; otherwise the difference is noise at this number of rounds.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np


def paired_speedup(a: Sequence[float], b: Sequence[float], *, confidence: float = 0.95, n_boot: int = 2000,
                   seed: int = 0) -> dict:
    """Speedup of ``b`` over ``a`` from paired measurements (same length >= 1, seconds or any
    one unit per call). Returns ``{"speedup", "ci": [lo, hi], "verdict", "rounds",
    "a_median", "b_median"}``: ``speedup`` is the median of the paired ratios ``a/b``,
    ``ci`` its bootstrap interval at ``confidence``, ``verdict`` ``faster`` / ``slower`` /
    ``same`` (interval above 1 / below 1 / containing 1). Deterministic for ``seed``.
    Raises ``ValueError`` for empty, unequal or non-positive inputs."""
    x = np.asarray(a, dtype=np.float64)
    y = np.asarray(b, dtype=np.float64)
    if x.size == 0 or x.shape != y.shape:
        raise ValueError("paired_speedup: need two equally long, non-empty series")
    if (x <= 0).any() or (y <= 0).any():
        raise ValueError("paired_speedup: times must be positive")
    r = x / y
    med = float(np.median(r))
    if r.size == 1:
        lo = hi = med
    else:
        rng = np.random.default_rng(seed)
        idx = rng.integers(0, r.size, size=(n_boot, r.size))
        boots = np.median(r[idx], axis=1)
        alpha = (1.0 - confidence) / 2.0
        lo, hi = (float(v) for v in np.quantile(boots, [alpha, 1.0 - alpha]))
    verdict = "faster" if lo > 1.0 else "slower" if hi < 1.0 else "same"
    return {"speedup": med, "ci": [lo, hi], "verdict": verdict, "rounds": int(r.size),
            "a_median": float(np.median(x)), "b_median": float(np.median(y))}


def spread(x: Sequence[float], *, scale: float = 1.0) -> dict:
    """Median and spread of one series of measurements (any one unit; ``scale`` multiplies
    every figure, e.g. ``1e6`` for seconds -> microseconds): ``{"median", "q1", "q3", "min",
    "max", "n"}``, ``q1``/``q3`` the 25th/75th percentiles (numpy's linear interpolation;
    their difference is the interquartile range). Raises ``ValueError`` for an empty series."""
    v = np.asarray(x, dtype=np.float64) * scale
    if v.size == 0:
        raise ValueError("spread: need at least one measurement")
    q1, med, q3 = (float(t) for t in np.percentile(v, [25, 50, 75]))
    return {"median": med, "q1": q1, "q3": q3, "min": float(v.min()), "max": float(v.max()), "n": int(v.size)}


__all__ = ["paired_speedup", "spread"]
