"""Magnitude bounds and the no_overflow precondition (steptp.engine.magnitude): the bounds
follow the documented rules, and the rewrites the filter removes really fail verification."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest

from steptp.engine import NoMatch, apply_rule, list_candidates
from steptp.engine.magnitude import (FALLBACK_INPUT_BOUND, FLOAT_INPUT_BOUND, expr_bound, input_bound,
                                     introduces_overflow, tensor_bounds)
from steptp.leir import parse_expr, parse_leir
from steptp.rules import load_rule, load_rule_text
from steptp.verify import verify_pair

RULES = Path(__file__).resolve().parents[1] / "rules"

# a row of a 256-long matmul: |D| <= 256 * 40 * 40 = 409600 (inputs up to 40: the output overflows at
# 64, where the verifier falls back to its smaller large-trial scale), far beyond ln(f32 max) = 88.7
MATMUL_EXP = parse_leir("""% program: exp_overflow
% input A: f32[4,256]
% input W: f32[8,256]
% output C: f32[4,8]
B^{4}_{tx=0}L^{8}_{a=0}L^{256}_{c=0}[D^{f32,g}_{tx,a}=D^{f32,g}_{tx,a}+A^{f32,g}_{tx,c}*W^{f32,g}_{a,c};];
B^{4}_{tx=0}L^{8}_{a=0}[C^{f32,g}_{tx,a}=exp(D^{f32,g}_{tx,a}*0.01);];
""")

SOFTMAX_OF_INPUTS = parse_leir("""% program: softmax_small
% input A: f32[4,8]
% output C: f32[4,8]
B^{4}_{tx=0}L^{8}_{a=0}[D^{f32,g}_{tx}=max(D^{f32,g}_{tx},A^{f32,g}_{tx,a});];
B^{4}_{tx=0}L^{8}_{a=0}[E^{f32,g}_{tx}=E^{f32,g}_{tx}+exp(A^{f32,g}_{tx,a}-D^{f32,g}_{tx});];
B^{4}_{tx=0}L^{8}_{a=0}[C^{f32,g}_{tx,a}=exp(A^{f32,g}_{tx,a}-D^{f32,g}_{tx})/E^{f32,g}_{tx};];
""")


def _without_filter(rule_id: str, pattern: str) -> object:
    text = (RULES / f"{rule_id}.yaml").read_text()
    stripped = re.sub(pattern, "", text)
    assert stripped != text
    return load_rule_text(stripped, f"{rule_id} without no_overflow")


def test_tensor_bounds_follow_the_documented_rules():
    b = tensor_bounds(MATMUL_EXP)
    assert input_bound(MATMUL_EXP) == FALLBACK_INPUT_BOUND      # its output overflows at 64: the smaller scale
    assert b["A"] == b["W"] == FALLBACK_INPUT_BOUND
    assert b["D"] == 256 * FALLBACK_INPUT_BOUND ** 2           # accumulation over the reduction axis c
    assert b["C"] == math.inf
    s = tensor_bounds(SOFTMAX_OF_INPUTS)
    assert input_bound(SOFTMAX_OF_INPUTS) == FLOAT_INPUT_BOUND  # its output (a quotient) is unknown, not overflowing
    assert s["D"] == FLOAT_INPUT_BOUND                          # a max keeps the element bound
    assert s["E"] == pytest.approx(8 * math.exp(2 * FLOAT_INPUT_BOUND))
    assert math.isnan(s["C"])                                  # a quotient by a tensor: unknown
    assert math.isnan(expr_bound(parse_expr("log(A^{f32,g}_{tx,a})"), s, {}))
    assert expr_bound(parse_expr("a*2"), {}, {"a": 8}) == 14.0  # index a < 8
    assert expr_bound(parse_expr("exp(D^{f32,g}_{tx,a})"), b, {}) == math.inf


def test_overflow_is_judged_on_new_subterms_in_the_dtype():
    old = parse_expr("exp(D^{f32,g}_{tx,a}*0.01)")
    assert introduces_overflow(MATMUL_EXP, (), "f32", old, parse_expr("exp(D^{f32,g}_{tx,a})"))
    assert not introduces_overflow(MATMUL_EXP, (), "f64", old, parse_expr("exp(D^{f32,g}_{tx,a}*0.001)"))
    assert introduces_overflow(MATMUL_EXP, (), "f16", old, parse_expr("exp(D^{f32,g}_{tx,a}*0.002)"))
    # a subterm the original already has is not the rewrite's doing; new arithmetic on it is
    assert not introduces_overflow(MATMUL_EXP, (), "f32", parse_expr("exp(D^{f32,g}_{tx,a})*2.0"),
                                   parse_expr("exp(D^{f32,g}_{tx,a})"))
    assert introduces_overflow(MATMUL_EXP, (), "f32", parse_expr("exp(D^{f32,g}_{tx,a})"),
                               parse_expr("exp(D^{f32,g}_{tx,a})*1.0"))
    # a product of exponentials equal (in real numbers) to an old one overflows where it does; its
    # factors are new: exp(A)*exp(W) for exp(A+W) is judged by exp(A) and exp(W) alone (inputs here
    # up to 40: e^40 is finite in f32, e^120 is not)
    aw = parse_expr("exp(A^{f32,g}_{tx,c}+W^{f32,g}_{a,c})")
    assert not introduces_overflow(MATMUL_EXP, (), "f32", aw,
                                   parse_expr("exp(A^{f32,g}_{tx,c})*exp(W^{f32,g}_{a,c})"))
    e120 = "exp(3.0*A^{f32,g}_{tx,c})*exp(W^{f32,g}_{a,c}-2.0*A^{f32,g}_{tx,c})"   # exp(3A) up to e^120
    assert introduces_overflow(MATMUL_EXP, (), "f32", aw, parse_expr(e120))
    # an unknown bound (a quotient) never rejects
    assert not introduces_overflow(SOFTMAX_OF_INPUTS, (), "f32", old, parse_expr("exp(C^{f32,g}_{tx,a})"))


#: the filter of exponential_split (steptp.engine.signs: exp(c) and exp(x-c) bounded for inputs up to 64)
SPLIT_FILTER = r"filter:\n  - provably: \{[^\n]*\}\n"


def test_exponential_split_no_longer_proposes_the_overflowing_split():
    shipped = load_rule(RULES / "exponential_split.yaml")
    with pytest.raises(NoMatch, match="provably"):
        list_candidates(shipped, MATMUL_EXP)
    unfiltered = _without_filter("exponential_split", SPLIT_FILTER)
    cands = list_candidates(unfiltered, MATMUL_EXP)
    assert cands, "without the filter the previous row element is a candidate"
    step = apply_rule(unfiltered, MATMUL_EXP, site=cands[0][0], params=cands[0][1])
    res = verify_pair(MATMUL_EXP, step.after, trials=3, seed=0)
    assert not res.equal and "inf/nan" in res.reason   # what the filter spares the verifier
    # where the values are small the split is still proposed, and verifies
    ok = list_candidates(shipped, SOFTMAX_OF_INPUTS)
    assert ok
    step = apply_rule(shipped, SOFTMAX_OF_INPUTS, site=ok[0][0], params=ok[0][1])
    assert verify_pair(SOFTMAX_OF_INPUTS, step.after, trials=3, seed=0).equal


def test_expand_powsimp_keeps_exp_of_a_difference_of_large_sums_whole():
    prog = parse_leir("""% program: exp_diff
% input A: f32[4,256]
% input W: f32[8,256]
% input V: f32[8,256]
% output C: f32[4,8]
B^{4}_{tx=0}L^{8}_{a=0}L^{256}_{c=0}[D^{f32,g}_{tx,a}=D^{f32,g}_{tx,a}+A^{f32,g}_{tx,c}*W^{f32,g}_{a,c};];
B^{4}_{tx=0}L^{8}_{a=0}L^{256}_{c=0}[E^{f32,g}_{tx,a}=E^{f32,g}_{tx,a}+A^{f32,g}_{tx,c}*V^{f32,g}_{a,c};];
B^{4}_{tx=0}L^{8}_{a=0}[C^{f32,g}_{tx,a}=exp(D^{f32,g}_{tx,a}*0.02-E^{f32,g}_{tx,a}*0.02);];
""")
    with pytest.raises(NoMatch):
        list_candidates(load_rule(RULES / "expand_powsimp.yaml"), prog)
    unfiltered = _without_filter("expand_powsimp", r"\n      no_overflow: true[^\n]*")
    assert list_candidates(unfiltered, prog)


def test_a_normalised_value_is_bounded_and_a_mask_value_rejects_the_split():
    """x / sqrt(var + eps) gets the bound |x| / sqrt(eps) (var is a sum of squares, so
    non-negative); a causal mask's -inf has bound inf, so exp(c) of a masked score is
    rejected: exp(-inf - -inf) = nan where the softmax was finite."""
    prog = parse_leir("""% program: norm_mask
% input A: f32[4,8]
% input M: bool[8,8]
% output C: f32[4,8,8]
B^{4}_{tx=0}L^{8}_{a=0}[Z^{f32,g}_{tx}=Z^{f32,g}_{tx}+A^{f32,g}_{tx,a};];
B^{4}_{tx=0}L^{8}_{a=0}[V^{f32,g}_{tx}=V^{f32,g}_{tx}+(A^{f32,g}_{tx,a}-Z^{f32,g}_{tx}/8.0)*(A^{f32,g}_{tx,a}-Z^{f32,g}_{tx}/8.0);];
B^{4}_{tx=0}L^{8}_{a=0}[N^{f32,g}_{tx,a}=(A^{f32,g}_{tx,a}-Z^{f32,g}_{tx}/8.0)/sqrt(V^{f32,g}_{tx}/8.0+1e-05);];
B^{4}_{tx=0}L^{8}_{a=0}L^{8}_{c=0}[S^{f32,g}_{tx,a,c}=if_then_else(M^{bool,g}_{a,c},-inf,N^{f32,g}_{tx,c});];
B^{4}_{tx=0}L^{8}_{a=0}L^{8}_{c=0}[C^{f32,g}_{tx,a,c}=exp(S^{f32,g}_{tx,a,c}-N^{f32,g}_{tx,a});];
""")
    b = tensor_bounds(prog)
    x = input_bound(prog)   # the masked output exp(S - N) has bound inf at 64: the smaller scale
    assert x == FALLBACK_INPUT_BOUND
    assert b["V"] == pytest.approx(8 * (x + 8 * x / 8) ** 2)
    assert b["N"] == pytest.approx(2 * x / math.sqrt(1e-5))
    assert b["S"] == math.inf
    unfiltered = _without_filter("exponential_split", SPLIT_FILTER)
    masked = [(s, p) for s, p in list_candidates(unfiltered, prog) if "name='S'" in repr(p["c"])]
    assert masked, "without the filter a masked score is offered as c"
    step = apply_rule(unfiltered, prog, site=masked[0][0], params=masked[0][1])
    res = verify_pair(prog, step.after, trials=3, seed=0)
    assert not res.equal and "inf/nan" in res.reason
    shipped = load_rule(RULES / "exponential_split.yaml")
    try:
        kept = list_candidates(shipped, prog)
    except NoMatch:
        kept = []
    assert not any("name='S'" in repr(p["c"]) for _, p in kept)
