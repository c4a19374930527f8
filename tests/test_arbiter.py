"""The float64 arbiter of near misses against an external reference (issue 25).

A program checked against a reference (PyTorch in f32) that misses the tolerance by a small
factor is Equal only when, against the same reference computed in float64, it is at least as
accurate as the reference: the tolerance itself never widens, and a wrong program stays wrong.
"""

from __future__ import annotations

import numpy as np
import pytest

from steptp.leir import parse_leir
from steptp.verify import ARBITER_FACTOR, verify_against

SCALE3 = parse_leir("% program: scale\n% input A: f32[256]\n% output C: f32[256]\n"
                    "B^{256}_{tx=0}[C^{f32,g}_{tx}=A^{f32,g}_{tx}*3.0;];\n")
WRONG = parse_leir("% program: scale\n% input A: f32[256]\n% output C: f32[256]\n"
                   "B^{256}_{tx=0}[C^{f32,g}_{tx}=A^{f32,g}_{tx}*3.0006;];\n")


def truth(x):
    return {"C": np.asarray(x["A"], dtype=np.float64) * 3.0}


def off_by(factor):
    """A less accurate f32 reference: every element off by ``factor`` times its allowed error."""
    def ref(x):
        t = truth(x)["C"]
        rms = float(np.sqrt(np.mean(t * t)))
        allowed = 1e-5 * max(1.0, rms) + 1e-4 * np.abs(t)
        return {"C": (t + factor * allowed).astype(np.float32)}
    return ref


def test_near_miss_of_a_less_accurate_reference_is_equal_by_the_arbiter():
    plain = verify_against(SCALE3, off_by(2.0))
    assert not plain.equal and "outside the tolerance" in plain.reason  # the tolerance rule alone
    res = verify_against(SCALE3, off_by(2.0), reference64_fn=truth)
    assert res.equal and res.arbiter == "f64", res.reason
    assert res.to_dict()["arbiter"] == "f64"


def test_far_miss_never_reaches_the_arbiter():
    res = verify_against(SCALE3, off_by(ARBITER_FACTOR * 2.5), reference64_fn=truth)
    assert not res.equal and res.arbiter == ""
    assert "arbiter" not in res.to_dict()


@pytest.mark.parametrize("reference", [lambda x: {"C": truth(x)["C"].astype(np.float32)}, off_by(0.5)])
def test_a_wrong_program_stays_wrong(reference):
    # 2e-4 relative error: a near miss, but farther from the float64 truth than the reference
    res = verify_against(WRONG, reference, reference64_fn=truth)
    assert not res.equal and res.arbiter == "", res.to_dict()


# --- per element (issue 34): one bad element on each side, in different places ---------------

def _arrays(seed=0):
    """A float64 truth with one large element, and its f32 rounding (exact to the tolerance)."""
    rng = np.random.default_rng(seed)
    t = rng.uniform(-1.0, 1.0, 256) * 3.0
    t[7] = 3000.0
    return t, t.astype(np.float32)


def _bound(t, i):
    rms = float(np.sqrt(np.mean(t * t)))
    return 1e-5 * max(1.0, rms) + 1e-4 * abs(t[i])


def test_arbiter_rejects_ours_wrong_at_one_element_where_the_reference_is_exact():
    from steptp.verify import compare, f64_arbiter

    t, exact = _arrays()
    ref = exact.copy()
    ref[7] = t[7] + 2.0 * _bound(t, 7)        # the reference: off by 2x its bound at the large element
    ours = exact.copy()
    ours[50] = t[50] + 3.4 * _bound(t, 50)    # ours: 3.4x outside its bound at a small element
    assert not compare(ref, ours, "f32")[0]
    # the old test (one maximum per output) let this through: ours' largest error is the smaller
    assert np.abs(ours - t).max() < np.abs(ref - t).max()
    verdict = f64_arbiter(SCALE3, [{"C": ref}], [{"C": ours}], [{"C": t}])
    assert not verdict and not verdict.equal
    assert verdict.ours == pytest.approx(3.4, rel=1e-3) and verdict.reference == pytest.approx(2.0, rel=1e-3)
    assert "outside the tolerance of the float64 truth" in verdict.reason


def test_arbiter_accepts_ours_exact_where_the_reference_is_off_at_one_element():
    from steptp.verify import f64_arbiter

    t, exact = _arrays(1)
    ref = exact.copy()
    ref[7] = t[7] + 2.0 * _bound(t, 7)
    verdict = f64_arbiter(SCALE3, [{"C": ref}], [{"C": exact}], [{"C": t}])
    assert verdict and verdict.ours <= 1.0 < verdict.reference


def test_arbiter_needs_the_reference_to_be_the_inaccurate_side():
    """Both within the bound of the truth, but off in opposite directions (they disagree by more
    than the bound): the arbiter does not overrule the comparison."""
    from steptp.verify import f64_arbiter

    t, exact = _arrays(2)
    ref, ours = exact.copy(), exact.copy()
    ref[50] = t[50] + 0.9 * _bound(t, 50)
    ours[50] = t[50] - 0.9 * _bound(t, 50)
    verdict = f64_arbiter(SCALE3, [{"C": ref}], [{"C": ours}], [{"C": t}])
    assert not verdict and "not the inaccurate side" in verdict.reason


def test_arbiter_excess_ratios_are_recorded():
    res = verify_against(SCALE3, off_by(2.0), reference64_fn=truth)
    d = res.to_dict()
    assert d["arbiter"] == "f64" and d["arbiter_excess"]["ours"] <= 1.0 < d["arbiter_excess"]["reference"]
