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
