"""Sign/interval analysis (steptp.engine.signs) and what it guards (issue 50, design.md §8 "The
symbolic check proves in floating point"): the splits introduce only provably safe values, and
the symbolic check calls "proved" only what holds in floating point. Real programs, the real
engine, the real verifier (with its edge-case trials: zeros, scattered zeros, negatives, inputs
up to 64)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from steptp.engine import NoMatch, apply_rule, list_candidates
from steptp.engine import signs as S
from steptp.engine.algebra import symbolic_check, symbolic_check_programs
from steptp.engine.filters import FILTERS, check_filters
from steptp.engine.magnitude import FLOAT_INPUT_BOUND
from steptp.leir import parse_expr, parse_leir
from steptp.leir.printer import format_expr
from steptp.rules import load_rule, load_rule_text
from steptp.verify import verify_pair

RULES = Path(__file__).resolve().parents[1] / "rules"

HDR = "% program: p\n% input A: f32[4,8]\n% input W: f32[8,8]\n% output C: f32[4,8]\n"
Aa, Wa = "A^{f32,g}_{tx,a}", "W^{f32,g}_{tx,a}"
PREV_A = "if_then_else(a<1,1.0,A^{f32,g}_{tx,a-1})"
#: D = A*A + 1.0 (>= 1), a matmul F, G = F/2.0 (any sign, zero included), a row maximum M of A,
#: the softmax denominator S = sum exp(A - M), then one element-wise nest (nest 6) reading them
NESTS = (
    f"B^{{4}}_{{tx=0}}L^{{8}}_{{a=0}}[D^{{f32,g}}_{{tx,a}}={Aa}*{Aa}+1.0;];\n"
    "B^{4}_{tx=0}L^{8}_{a=0}L^{8}_{c=0}[F^{f32,g}_{tx,a}=F^{f32,g}_{tx,a}+A^{f32,g}_{tx,c}*W^{f32,g}_{a,c};];\n"
    "B^{4}_{tx=0}L^{8}_{a=0}[G^{f32,g}_{tx,a}=F^{f32,g}_{tx,a}/2.0;];\n"
    f"B^{{4}}_{{tx=0}}L^{{8}}_{{a=0}}[M^{{f32,g}}_{{tx}}=max(M^{{f32,g}}_{{tx}},{Aa});];\n"
    f"B^{{4}}_{{tx=0}}L^{{8}}_{{a=0}}[S^{{f32,g}}_{{tx}}=S^{{f32,g}}_{{tx}}+exp({Aa}-M^{{f32,g}}_{{tx}});];\n"
    f"B^{{4}}_{{tx=0}}L^{{8}}_{{a=0}}[Q^{{f32,g}}_{{tx,a}}={Aa}*2.0;];\n"
)


def program(last_value: str, dtype: str = "f32"):
    """NESTS, then ``C = last_value`` over (tx, a) in nest 6 (all in ``dtype``)."""
    text = HDR + NESTS + f"B^{{4}}_{{tx=0}}L^{{8}}_{{a=0}}[C^{{f32,g}}_{{tx,a}}={last_value};];\n"
    return parse_leir(text.replace("f32", dtype))


def judge(dtype: str = "f32"):
    m = program(Aa, dtype)
    return S.site_judge(m.program, (6, 0), m.signature)


def ex(text: str, dtype: str = "f32"):
    return parse_expr(text.replace("f32", dtype))


def rule(name: str):
    return load_rule(RULES / f"{name}.yaml")


# ---------------------------------------------------------------------------
# (c) the analysis
# ---------------------------------------------------------------------------


def test_inputs_are_finite_but_never_provably_nonzero_or_signed():
    j = judge()
    a = ex(Aa)
    assert j.range(a) == S.Range(-FLOAT_INPUT_BOUND, FLOAT_INPUT_BOUND, 0.0)
    assert j.finite(a) and not j.nonzero(a) and not j.positive(a) and not j.nonneg(a)
    assert not j.nonzero(ex(PREV_A))                 # the guard's 1.0 does not help the other branch
    assert j.nonneg(ex(f"{Aa}*{Aa}")) and not j.nonzero(ex(f"{Aa}*{Aa}"))   # a square may be 0


def test_intermediates_get_the_facts_of_their_writes():
    j = judge()
    d, g, q = ex("D^{f32,g}_{tx,a}"), ex("G^{f32,g}_{tx,a}"), ex("Q^{f32,g}_{tx,a}")
    assert j.range(d) == S.Range(1.0, 64.0 * 64.0 + 1.0, 1.0)       # square plus a positive constant
    assert j.positive(d) and j.nonzero(d) and j.finite(d)
    assert j.finite(g) and not j.nonzero(g)                          # a matmul halved: any sign, zero too
    assert j.range(g).mag == 8 * 64 * 64 / 2                         # 8 products of inputs up to 64
    assert not j.nonzero(q)
    assert j.positive(ex("sqrt(D^{f32,g}_{tx,a})")) and j.finite(ex("log(D^{f32,g}_{tx,a})"))
    assert not j.finite(ex(f"log({Aa})")) and not j.finite(ex("1.0/G^{f32,g}_{tx,a}"))
    assert j.nonzero(ex(f"-(D^{{f32,g}}_{{tx,a}}*({Aa}*{Aa}))-2.0")) and not j.positive(ex("0.0-D^{f32,g}_{tx,a}"))
    assert j.nonzero(ex("1.0/D^{f32,g}_{tx,a}")) and j.finite(ex(f"{Aa}/D^{{f32,g}}_{{tx,a}}"))


def test_saturating_functions_and_literals():
    j = judge()
    assert not j.nonzero(ex(f"1.0+tanh({Aa})"))     # 1 + tanh(x) = 0 for very negative x
    assert j.positive(ex(f"2.0+tanh({Aa})")) and j.positive(ex(f"2.0+erf({Aa})"))
    assert not j.nonzero(ex(f"max({Aa},0.0)")) and j.positive(ex(f"max({Aa},0.5)"))
    assert not j.nonzero(ex("0.0")) and j.nonzero(ex("-(2.0)")) and not j.positive(ex("-(2.0)"))
    assert not j.finite(ex("-(inf)")) and not j.finite(ex(f"if_then_else(a<1,-(inf),{Aa})"))


@pytest.mark.parametrize("dtype, ok, underflows", [("f32", -86.0, -88.0), ("f16", -8.5, -10.0),
                                                   ("f64", -700.0, -710.0)])
def test_exp_is_positive_only_where_it_cannot_underflow(dtype, ok, underflows):
    j = judge(dtype)
    assert j.positive(ex(f"exp({ok})", dtype)) and j.nonzero(ex(f"exp({ok})", dtype))
    assert not j.positive(ex(f"exp({underflows})", dtype)) and j.nonneg(ex(f"exp({underflows})", dtype))


def test_exp_of_inputs_by_dtype():
    # inputs up to 64: exp(A) lies in [e^-64, e^64] = [1.6e-28, 6.2e27]: normal and finite in f32,
    # both ends out of range in f16 (normal minimum 6.1e-5, maximum 65504)
    assert judge("f32").positive(ex(f"exp({Aa})")) and judge("f32").finite(ex(f"exp({Aa})"))
    e16 = ex(f"exp({Aa})", "f16")
    assert not judge("f16").positive(e16) and not judge("f16").finite(e16)
    e2 = f"exp({Aa}*2.0)"
    assert not judge("f32").finite(ex(e2))
    assert judge("f64").finite(ex(e2, "f64")) and judge("f64").positive(ex(e2, "f64"))


def test_a_row_maximum_bounds_the_shifted_exponent():
    j = judge()
    shifted = ex(f"{Aa}-M^{{f32,g}}_{{tx}}")
    assert j.range(shifted).hi == 0.0 and j.range(shifted).lo == -128.0
    e = ex(f"exp({Aa}-M^{{f32,g}}_{{tx}})")
    assert j.finite(e) and j.range(e).hi == 1.0 and not j.positive(e)   # exp(-128) underflows in f32
    assert not j.finite(ex(f"exp(M^{{f32,g}}_{{tx}}-{Aa}+{Aa}*0.5)"))   # the other way round: up to e^96
    # the denominator is >= 1 (its largest term is exp(0)), but an interval analysis cannot see
    # that: not provably non-zero
    assert j.range(ex("S^{f32,g}_{tx}")) == S.Range(0.0, 8.0, 0.0)
    # x - c + c has x's range; a product of exponentials is the exponential of the sum
    assert j.range(ex(f"{Aa}-D^{{f32,g}}_{{tx,a}}+D^{{f32,g}}_{{tx,a}}")) == j.range(ex(Aa))
    assert j.finite(ex(f"exp({Aa}*0.25-{PREV_A})*exp({PREV_A})"))


def test_accurate_and_keeps_precision():
    j = judge()
    assert j.accurate(ex(f"{Aa}/D^{{f32,g}}_{{tx,a}}*D^{{f32,g}}_{{tx,a}}"))
    assert not j.accurate(ex(f"{Aa}/G^{{f32,g}}_{{tx,a}}*G^{{f32,g}}_{{tx,a}}"))
    # exp(x-M) may underflow to 0, and exp(M) is at most e^64: the loss, tiny * e^64 = 7e-11, is
    # below f32's epsilon; in f16 no exponent of an input is accurate
    assert j.accurate(ex(f"exp({Aa}-M^{{f32,g}}_{{tx}})*exp(M^{{f32,g}}_{{tx}})"))
    assert j.keeps_precision(ex(Aa), ex(PREV_A))
    assert not j.keeps_precision(ex(Aa), ex("D^{f32,g}_{tx,a}"))      # 4097 beside 64: 6 bits lost
    assert not j.keeps_precision(ex(Aa), ex("S^{f32,g}_{tx}*(inf)"))


def test_a_tensor_written_in_the_site_nest_is_unknown_there():
    m = parse_leir(HDR + f"B^{{4}}_{{tx=0}}L^{{8}}_{{a=0}}[D^{{f32,g}}_{{tx,a}}={Aa}*{Aa}+1.0;"
                   f"C^{{f32,g}}_{{tx,a}}={Aa}/D^{{f32,g}}_{{tx,a}};];")
    j = S.site_judge(m.program, (0, 1), m.signature)
    assert j.range(ex("D^{f32,g}_{tx,a}")) == S.ANY
    assert S.program_facts(m.program, m.signature).before("D", 1).lo == 1.0


def test_operand_requirements_and_factors():
    e = ex(f"{Aa}/D^{{f32,g}}_{{tx,a}}+log(G^{{f32,g}}_{{tx,a}})+sqrt(Q^{{f32,g}}_{{tx,a}})+{Aa}**-1+{Aa}**0.5")
    reqs = [(format_expr(x), r) for x, r in S.operand_requirements(e)]
    assert reqs == [("D^{f32,g}_{tx,a}", "nonzero"), ("G^{f32,g}_{tx,a}", "positive"),
                    ("Q^{f32,g}_{tx,a}", "nonneg"), (Aa, "nonzero"), (Aa, "nonneg")]
    assert [format_expr(f) for f in S.factors(ex(f"-2.0*{Aa}*({Aa}+1.0)"))] == [Aa, f"{Aa}+1.0"]


# ---------------------------------------------------------------------------
# (a) the splits introduce only provably safe values
# ---------------------------------------------------------------------------


def _cs(rule_, m) -> list[str]:
    try:
        return [format_expr(p["c"]) for _, p in list_candidates(rule_, m)]
    except NoMatch:
        return []


def test_multiplicative_split_refuses_possibly_zero_divisors():
    mul = rule("multiplicative_split")
    # the demo: the guarded previous element of an input
    demo = parse_leir(HDR + f"B^{{4}}_{{tx=0}}L^{{8}}_{{a=0}}[C^{{f32,g}}_{{tx,a}}={Aa}*{Aa};];")
    with pytest.raises(NoMatch, match="provably"):
        list_candidates(mul, demo)
    # the filter is what refuses it: without it the split is offered, and the verifier's zero
    # trials show the 0/0
    stripped = re.sub(r"filter:\n(  - .*\n)+", "", (RULES / "multiplicative_split.yaml").read_text())
    unfiltered = load_rule_text(stripped, "multiplicative_split without its filter")
    cands = [(s, p) for s, p in list_candidates(unfiltered, demo) if format_expr(p["c"]) == PREV_A]
    assert cands
    step = apply_rule(unfiltered, demo, site=cands[0][0], params=cands[0][1])
    res = verify_pair(demo, step.after, trials=3, seed=0)
    assert not res.equal and "zeros" in res.reason
    assert symbolic_check_programs(demo.program, step.after.program, demo.signature) == "unknown"
    # intermediates: the matmul F, G = F/2.0 and the scaled input Q are never divisors; D = A*A+1 is
    m = program(f"{Aa}*G^{{f32,g}}_{{tx,a}}+D^{{f32,g}}_{{tx,a}}")
    cs = _cs(mul, m)
    assert not any(re.search(r"(^|[^A-Z])[AFGQW]\^", c) for c in cs), cs
    assert "D^{f32,g}_{tx,a}" in cs and "if_then_else(a<1,1.0,D^{f32,g}_{tx,a-1})" in cs


def test_multiplicative_split_by_a_provably_nonzero_value_verifies():
    mul = rule("multiplicative_split")
    m = program(f"{Aa}*W^{{f32,g}}_{{a,a}}")
    site, params = next((s, p) for s, p in list_candidates(mul, m)
                        if s.equation == (6, 0) and format_expr(p["c"]) == "D^{f32,g}_{tx,a}")
    step = apply_rule(mul, m, site=site, params=params)
    assert f"{Aa}/D^{{f32,g}}_{{tx,a}}*D^{{f32,g}}_{{tx,a}}" in format_expr(step.after.program.nests[6].body[0].value)
    assert symbolic_check_programs(m.program, step.after.program, m.signature) == "proved"
    res = verify_pair(m, step.after, trials=3, seed=0)
    assert res.equal, res.reason


def test_exponential_split_keeps_the_softmax_shift_and_refuses_overflow():
    exp_split = rule("exponential_split")
    # exp(A) with the row maximum M as c: exp(A - M) <= 1, exp(M) <= e^64
    m = program(f"exp({Aa})")
    cs = [format_expr(p["c"]) for s, p in list_candidates(exp_split, m) if s.equation == (6, 0)]
    assert "M^{f32,g}_{tx}" in cs
    # the previous element of an input: exp(A - A') up to e^128 overflows f32; D up to 4097 too
    assert "if_then_else(a<1,0.0,A^{f32,g}_{tx,a-1})" not in cs and "D^{f32,g}_{tx,a}" not in cs
    site, params = next((s, p) for s, p in list_candidates(exp_split, m)
                        if s.equation == (6, 0) and format_expr(p["c"]) == "M^{f32,g}_{tx}")
    step = apply_rule(exp_split, m, site=site, params=params)
    assert verify_pair(m, step.after, trials=3, seed=0).equal


def test_additive_split_adds_only_values_of_comparable_size():
    add = rule("additive_split")
    m = program(f"{Aa}+1.0")
    cs = [format_expr(p["c"]) for s, p in list_candidates(add, m) if s.equation == (6, 0)]
    assert "if_then_else(a<1,0.0,A^{f32,g}_{tx,a-1})" in cs and "Q^{f32,g}_{tx,a}" in cs   # 64, 128 beside 64
    assert "D^{f32,g}_{tx,a}" not in cs and "G^{f32,g}_{tx,a}" not in cs   # 4097, 16384 beside 64


def test_the_provably_filter_is_registered_and_checked():
    from steptp.rules import RuleError

    assert "provably" in FILTERS
    text = (RULES / "additive_split.yaml").read_text()
    assert check_filters(load_rule_text(text, "additive_split")) == []
    with pytest.raises(RuleError, match="keeps_precisio"):
        load_rule_text(text.replace("keeps_precision:", "keeps_precisio:"), "bad")


# ---------------------------------------------------------------------------
# (b) the symbolic check proves in floating point
# ---------------------------------------------------------------------------


def _check(before_value: str, after_value: str) -> str:
    b, a = program(before_value), program(after_value)
    return symbolic_check_programs(b.program, a.program, b.signature)


def test_division_by_a_possibly_zero_value_is_never_proved():
    x = "W^{f32,g}_{a,a}"
    assert _check(x, f"{x}/{Aa}*{Aa}") == "unknown"                                   # an input
    assert _check(x, f"{x}/{PREV_A}*{PREV_A}") == "unknown"                           # its guarded previous element
    assert _check(x, f"{x}/G^{{f32,g}}_{{tx,a}}*G^{{f32,g}}_{{tx,a}}") == "unknown"   # a matmul's output
    assert _check(x, f"{x}/S^{{f32,g}}_{{tx}}*S^{{f32,g}}_{{tx}}") == "unknown"       # may underflow to 0
    assert _check(x, f"{x}*sqrt({Aa})/sqrt({Aa})") == "unknown"
    assert _check(x, f"log(exp({x})*Q^{{f32,g}}_{{tx,a}})-log(Q^{{f32,g}}_{{tx,a}})") == "unknown"
    # removing a division by a possibly-zero value turns its nan into a number
    assert _check(f"{x}*{Aa}/{Aa}", x) == "unknown"
    # "disproved" is not affected
    assert _check(x, f"{x}/{Aa}*{Aa}*2.0") == "disproved"


def test_safe_divisions_and_ordinary_algebra_are_proved():
    x = "W^{f32,g}_{a,a}"
    d = "D^{f32,g}_{tx,a}"
    assert _check(x, f"{x}/{d}*{d}") == "proved"
    assert _check(x, f"{x}*sqrt({d})/sqrt({d})") == "proved"
    assert _check(f"{x}/{d}", f"{x}*2.0/({d}*2.0)") == "proved"
    assert _check(f"({Aa}+{x})*{d}", f"{Aa}*{d}+{x}*{d}") == "proved"
    assert _check(f"{x}/2.0", f"{x}*0.5") == "proved"
    # a new divisor whose factors the original already divides by is zero only where they are
    assert _check(f"1.0/({Aa}*({Aa}+1.0))", f"1.0/{Aa}-1.0/({Aa}+1.0)") == "proved"


def test_expression_level_check_is_context_free_and_conservative():
    x = parse_expr("W^{f32,g}_{a,a}")
    assert symbolic_check(x, parse_expr(f"W^{{f32,g}}_{{a,a}}/{Aa}*{Aa}")) == "unknown"
    assert symbolic_check(x, parse_expr("W^{f32,g}_{a,a}/2.0*2.0")) == "proved"
    assert symbolic_check(parse_expr(f"({Aa}+1.0)*{Aa}"), parse_expr(f"{Aa}*{Aa}+{Aa}")) == "proved"


def test_input_bound_matches_the_verifiers_largest_input():
    from steptp.runner import inputs

    largest = getattr(inputs, "LARGEST_INPUT", None)
    if largest is None:
        pytest.skip("steptp.runner.inputs has no LARGEST_INPUT")
    assert FLOAT_INPUT_BOUND == largest
