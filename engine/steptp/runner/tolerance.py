"""The one tolerance rule of every comparison (verification here, GPU runs on a GPU node).

Imports only numpy and the poison table (:mod:`steptp.backend.poison`), so :mod:`steptp.gpu.run`
uses exactly this code on a machine that has no lark, TVM compiler or torch. Source of the rule: design.md §5; the table and its
rationale are below (:data:`TOLERANCES`); :mod:`steptp.verify` re-exports every name.
"""

from __future__ import annotations

import math

import numpy as np

from ..backend.poison import POISON_BITS  # noqa: F401  (re-exported: the table lives below both)

#: Per-dtype ``(rtol, atol)``. An element passes when
#: ``|out - ref| <= atol * scale + rtol * |ref|`` with ``scale = max(1, rms(ref))`` (the
#: root mean square of the finite reference values of that output). Equal infinities and
#: NaN == NaN pass; any other non-finite mismatch fails. Integers and booleans must be equal.
#:
#: Why the ``scale``: the absolute rounding error of a reduction grows with the magnitude of
#: what it sums, so a fixed atol rejects correct reorderings of long reductions at outputs
#: that happen to be near zero; scaling by the output's typical magnitude keeps the test
#: relative to the data (e.g. f32 matmul with K=2022: rms ~45, errors ~1e-4).
#:
#: Stricter than the paper's code (reference-notes §4), which passes a whole output when ANY
#: of: max relative error <= 5e-3, max abs error <= 1e-7, MSE <= 1e-5, or (f32) max abs
#: error < 1e-3, or (f16) max abs error < 1.5. Here every element of every trial must pass
#: (no MSE escape hatch: one wrong element fails), and the per-element bound is far below
#: theirs for outputs with rms(ref) <= 100: f32 allows 1e-5*scale + 1e-4*|ref| (theirs 1e-3
#: absolute or 5e-3 relative), f16 1e-2*scale + 1e-2*|ref| (theirs 1.5 absolute), f64
#: 1e-10*scale + 1e-9*|ref| (theirs 5e-3 relative).
TOLERANCES: dict[str, tuple[float, float]] = {
    "f64": (1e-9, 1e-10),
    "f32": (1e-4, 1e-5),
    "f16": (1e-2, 1e-2),
    "bf16": (4e-2, 4e-2),
    "i8": (0.0, 0.0), "i16": (0.0, 0.0), "i32": (0.0, 0.0), "i64": (0.0, 0.0),
    "u8": (0.0, 0.0), "u16": (0.0, 0.0), "u32": (0.0, 0.0), "u64": (0.0, 0.0),
    "bool": (0.0, 0.0),
}

_NP_TO_CODE = {"float64": "f64", "float32": "f32", "float16": "f16", "bfloat16": "bf16", "bool": "bool",
               "int8": "i8", "int16": "i16", "int32": "i32", "int64": "i64",
               "uint8": "u8", "uint16": "u16", "uint32": "u32", "uint64": "u64"}


def dtype_code(dtype) -> str:
    """LEIR dtype code of a LEIR code, TVM name or numpy dtype (``float32`` -> ``f32``)."""
    s = str(dtype)
    if s in TOLERANCES:
        return s
    s = str(np.dtype(dtype)) if s not in _NP_TO_CODE else s
    if s not in _NP_TO_CODE:
        raise ValueError(f"no tolerance for dtype {dtype!r}")
    return _NP_TO_CODE[s]


def _to_numpy(x) -> np.ndarray:
    if hasattr(x, "detach"):  # torch tensor
        x = x.detach().cpu()
        if str(x.dtype) == "torch.bfloat16":
            x = x.float()
        x = x.numpy()
    return np.asarray(x)


def compare(ref, out, dtype, rtol: float | None = None, atol: float | None = None,
            slack: float = 0.0) -> tuple[bool, float, float]:
    """Compare one output with its reference.

    * ``ref``, ``out``: arrays (numpy, or anything ``np.asarray`` takes; torch tensors are
      detached) of the same shape; compared in float64.
    * ``dtype``: the output's dtype (LEIR code ``f32``, TVM/numpy name or dtype); selects
      ``(rtol, atol)`` from :data:`TOLERANCES` unless given.
    * ``slack``: an absolute allowance added to every element's bound (see
      :func:`rounding_slack`: the original program's own rounding error).

    Returns ``(ok, max_abs_err, max_rel_err)``: ``max_abs_err = max|out-ref|`` over elements
    where both are finite; ``max_rel_err = max |out-ref| / (|ref| + 1e-8)`` (the paper code's
    definition, so numbers are comparable); both are ``inf`` when the non-finite patterns
    differ (NaN vs number, +inf vs -inf...) or the shapes differ. NaN == NaN and equal
    infinities count as equal. Integer/bool outputs must match exactly.
    """
    code = dtype_code(dtype)
    r_tol, a_tol = TOLERANCES[code]
    r_tol = r_tol if rtol is None else rtol
    a_tol = a_tol if atol is None else atol
    ref = _to_numpy(ref)
    out = _to_numpy(out)
    if ref.shape != out.shape:
        return False, math.inf, math.inf
    if ref.size == 0:
        return True, 0.0, 0.0
    r = ref.astype(np.float64)
    o = out.astype(np.float64)
    if code == "bool" or code[0] in "iu":
        if code == "bool":
            eq = ref.astype(bool) == out.astype(bool)
        else:
            eq = ref.astype(np.int64) == out.astype(np.int64)
        d = np.abs(r - o)
        return bool(eq.all()), float(d.max()), float((d / (np.abs(r) + 1e-8)).max())
    with np.errstate(invalid="ignore", over="ignore"):
        return _compare_float(r, o, r_tol, a_tol, slack)


def _rms(x: np.ndarray) -> float:
    """Root mean square without overflow (values near the float64 limit stay finite)."""
    if x.size == 0:
        return 0.0
    m = float(np.max(np.abs(x)))
    if m == 0.0:
        return 0.0
    return m * float(np.sqrt(np.mean(np.square(x / m))))


def _error_and_bound(r: np.ndarray, o: np.ndarray, r_tol: float, a_tol: float, slack: float):
    """``(finite, |r - o|, allowed)`` per element (0 error where either side is not finite):
    ``allowed = a_tol * max(1, rms(ref)) + r_tol * |ref| + slack`` (the tolerance rule of
    :func:`compare`, shared with the mismatch message)."""
    finite = np.isfinite(r) & np.isfinite(o)
    scale = max(1.0, _rms(r[np.isfinite(r)]))
    d = np.where(finite, np.abs(r - o), 0.0)
    return finite, d, a_tol * scale + r_tol * np.abs(np.where(finite, r, 0.0)) + slack


def _compare_float(r: np.ndarray, o: np.ndarray, r_tol: float, a_tol: float,
                   slack: float = 0.0) -> tuple[bool, float, float]:
    finite, d, allowed = _error_and_bound(r, o, r_tol, a_tol, slack)
    same = (np.isnan(r) & np.isnan(o)) | (r == o)
    special_bad = ~same & ~finite
    ok = bool(np.all(same | (finite & (d <= allowed))))
    if special_bad.any():
        return False, math.inf, math.inf
    return ok, float(d.max()), float((d / (np.abs(np.where(finite, r, 0.0)) + 1e-8)).max())


def _mismatch_detail(name: str, trial: int, ref: np.ndarray, out: np.ndarray, code: str, slack: float = 0.0) -> str:
    r = _to_numpy(ref).astype(np.float64)
    o = _to_numpy(out).astype(np.float64)
    if r.shape != o.shape:
        return f"output {name} has shape {list(o.shape)}, reference {list(r.shape)} (trial {trial})"
    bad_special = ~((np.isnan(r) & np.isnan(o)) | (r == o)) & ~(np.isfinite(r) & np.isfinite(o))
    if bad_special.any():
        idx = tuple(int(i) for i in np.argwhere(bad_special)[0])
        n = int(bad_special.sum())
        return (f"output {name} differs in trial {trial}: {n} element(s) with mismatched inf/nan, first at "
                f"{idx} (ref {r[idx]!r}, got {o[idx]!r})")
    rt, at = TOLERANCES[code]
    with np.errstate(invalid="ignore", over="ignore"):
        finite, d, allowed = _error_and_bound(r, o, rt, at, slack)
        excess = np.where(finite, d - allowed, -np.inf)
    failing = excess > 0
    n = int(failing.sum())
    # the element that fails the tolerance by the widest margin (not merely the largest error)
    flat = int(np.argmax(excess)) if n else int(np.argmax(d))
    idx = tuple(int(i) for i in np.unravel_index(flat, d.shape)) if d.ndim else ()
    return (f"output {name} differs in trial {trial}: {n} element(s) outside the tolerance, worst at {idx} "
            f"(ref {r[idx]:.9g}, got {o[idx]:.9g}, abs error {float(d[idx]):.3g} > allowed {float(allowed[idx]):.3g}); "
            f"tolerance {code} rtol={rt:g} atol={at:g}*max(1,rms)"
            + (f" + the original's own rounding error allowance {slack:.3g}" if slack else ""))


def compare_trials(refs, outs, outputs, slacks=None, labels=None) -> tuple[str, float, float]:
    """Compare every output of every trial by the tolerance rule (:func:`compare`).

    ``refs`` / ``outs``: per trial ``{output name: array}``; ``outputs``: ``[(name, dtype)]``
    compared in this order (dtype: a LEIR code or numpy/TVM name); ``slacks``: per trial
    ``{name: allowance}`` (:func:`steptp.verify.rounding_slack`; a missing trial, None or name
    allows 0); ``labels``: a name per trial (``zeros``, ``large x32``...) that the mismatch
    detail gives beside the trial number. Returns ``(first, max_abs_err, max_rel_err)``: ``first`` the detail of the first
    mismatch (:func:`_mismatch_detail`), '' when everything passes; the maxima over all
    compared outputs. Raises ``ValueError`` when a reference lacks an output. The one
    comparison loop of verification (:mod:`steptp.verify`), the timed form's check
    (:mod:`steptp.runner.timing`) and GPU pack runs (:mod:`steptp.gpu.node`)."""
    max_abs = max_rel = 0.0
    first = ""
    for trial, (ref, out) in enumerate(zip(refs, outs)):
        allow = (slacks[trial] if slacks and trial < len(slacks) else None) or {}
        for name, dtype in outputs:
            if name not in ref:
                raise ValueError(f"reference outputs lack tensor {name} (got {sorted(ref)})")
            slack = float(allow.get(name, 0.0))
            ok, a, r = compare(ref[name], out[name], dtype, slack=slack)
            max_abs, max_rel = max(max_abs, a), max(max_rel, r)
            if not ok and not first:
                first = _mismatch_detail(name, trial, ref[name], out[name], dtype_code(dtype), slack)
                if labels and trial < len(labels) and labels[trial]:
                    first = first.replace(f"trial {trial}", f"trial {trial} ({labels[trial]} inputs)", 1)
    return first, max_abs, max_rel




def poison_array(shape, dtype: str) -> np.ndarray | None:
    """An array of ``shape`` filled with the poison NaN of TVM dtype ``dtype``
    (``float32``...), or None for a dtype without one (integers, bool)."""
    if dtype not in POISON_BITS:
        return None
    bits_t, bits = POISON_BITS[dtype]
    a = np.full(tuple(shape), bits, dtype=np.dtype(bits_t))
    if dtype == "bfloat16":
        import ml_dtypes  # noqa: PLC0415

        return a.view(np.dtype(ml_dtypes.bfloat16))
    return a.view(np.dtype(dtype))


def poisoned_index(a: np.ndarray, dtype: str) -> tuple[tuple[int, ...], int] | None:
    """``(first index, count)`` of the elements of ``a`` (TVM dtype ``dtype``) that still
    hold the poison pattern, or None when none does."""
    if dtype not in POISON_BITS:
        return None
    bits_t, bits = POISON_BITS[dtype]
    a = np.ascontiguousarray(a)
    hit = a.view(np.dtype(bits_t)) == bits
    if not hit.any():
        return None
    idx = tuple(int(i) for i in np.argwhere(hit)[0]) if a.ndim else ()
    return idx, int(hit.sum())


def excess_ratio(ref, out, dtype, slack: float = 0.0) -> float:
    """How far ``out`` is outside the tolerance of :func:`compare`: the largest
    ``|out - ref| / allowed`` over the elements (``<= 1`` when it passes); ``inf`` for a
    mismatch of non-finite values, a shape difference or an integer/bool difference."""
    code = dtype_code(dtype)
    r_tol, a_tol = TOLERANCES[code]
    r = _to_numpy(ref).astype(np.float64)
    o = _to_numpy(out).astype(np.float64)
    if r.shape != o.shape:
        return math.inf
    if r.size == 0:
        return 0.0
    if code == "bool" or code[0] in "iu":
        return 0.0 if np.array_equal(r, o) else math.inf
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        same = (np.isnan(r) & np.isnan(o)) | (r == o)
        finite, d, allowed = _error_and_bound(r, o, r_tol, a_tol, slack)
        if (~same & ~finite).any():
            return math.inf
        ratio = np.where(finite & ~same, d / np.maximum(allowed, 1e-300), 0.0)
    return float(ratio.max())


__all__ = ["TOLERANCES", "dtype_code", "compare", "compare_trials", "excess_ratio", "POISON_BITS", "poison_array", "poisoned_index"]
