"""The subscript-aware sympy bridge (steptp.engine.algebra) and its registrations
(steptp.engine.mathprims, steptp.engine.filters): conversion, normal forms, candidate
filtering, ownership between strategies, accumulations, symbolic check, split domains."""

from __future__ import annotations

import time

import pytest
import sympy as sp

from steptp.engine import NoMatch, apply_rule, list_candidates
from steptp.engine import algebra as G
from steptp.engine.filters import EXTRA_DOMAINS, FILTERS
from steptp.engine.primitives import PRIMITIVES
from steptp.leir import ast as A
from steptp.leir.fileformat import parse_leir
from steptp.leir.parser import parse_program
from steptp.leir.printer import format_expr, format_program
from steptp.rules import load_rule
from steptp.resources import rules_dir

HEAD = "% program: t\n% input A: f32[4,8]\n% input W: f32[4,8]\n% output C: f32[4,8]\n"


def val(text: str) -> A.Expr:
    """The value of ``C = text`` inside a loop nest over tx, a, c."""
    p = parse_program("B^{4}_{tx=0}L^{8}_{a=0}L^{8}_{c=0}[C^{f32,g}_{tx,a}=" + text + ";];")
    return p.nests[0].body[0].value


Aa, Ac, Wa = "A^{f32,g}_{tx,a}", "A^{f32,g}_{tx,c}", "W^{f32,g}_{tx,a}"


def rule(name: str):
    return load_rule(rules_dir() / f"{name}.yaml")


def test_same_tensor_at_two_subscripts_is_two_symbols():
    t = G.SymbolTable()
    s = G.to_sympy(val(f"{Aa}*{Ac}+{Aa}"), t)
    assert len(s.free_symbols) == 2
    # merged (the paper's code) it would factor as A*(A+1); kept apart it is A_a*(A_c+1)
    out = G.normal_form(val(f"{Aa}*{Ac}+{Aa}"), "factor")
    assert format_expr(out) == f"{Aa}*({Ac}+1.0)"
    assert G.normal_form(val(f"{Aa}*{Aa}+{Aa}"), "factor") is not None


def test_round_trip_keeps_opaque_parts_and_functions():
    e = val(f"if_then_else(a<1,0.0,{Aa})*sqrt({Wa}+1e-05)+erf({Aa})*max({Aa},0.0)+tanh({Wa})")
    t = G.SymbolTable()
    back = G.from_sympy(G.to_sympy(e, t), t)
    assert G.symbolic_check(e, back) == "proved"
    text = format_expr(back)
    assert f"if_then_else(a<1,0.0,{Aa})" in text and "sqrt(" in text and "1e-05" in text
    assert "erf(" in text and "tanh(" in text and "max(" in text


def test_small_powers_print_as_products_and_rationals_as_decimals_or_quotients():
    t = G.SymbolTable()
    x = G.to_sympy(val(Aa), t)
    assert format_expr(G.from_sympy(x**3, t)) == f"{Aa}*{Aa}*{Aa}"
    assert format_expr(G.from_sympy(x / 2, t)) == f"0.5*{Aa}"
    assert format_expr(G.from_sympy(x / 3, t)) == f"{Aa}/3.0"
    assert format_expr(G.from_sympy(1 / x, t)) == f"1.0/{Aa}"


def test_unsupported_sympy_output_is_an_error():
    t = G.SymbolTable()
    x = G.to_sympy(val(Aa), t)
    with pytest.raises(G.AlgebraError):
        G.from_sympy(sp.sign(x), t)


def test_no_change_or_mere_reformatting_is_not_a_candidate():
    assert G.normal_form(val(f"{Aa}+1e-05"), "factor") is None       # 1e-05*(100000*A+1) is no factorization
    assert G.normal_form(val(f"({Aa}+1.0)*{Wa}"), "factor") is None  # already factored
    assert G.normal_form(val(f"{Aa}*{Wa}+{Aa}"), "expand") is None  # already expanded


def test_number_times_sum_inside_a_function_is_left_alone():
    e = val(f"0.5*{Aa}*(1.0+tanh(0.7978845608028654*({Aa}+0.044715*{Aa}*{Aa}*{Aa})))")
    out = G.normal_form(e, "distribute", val(Aa))
    assert "tanh(0.7978845608028654*(" in format_expr(out)
    assert G.symbolic_check(e, out) == "proved"
    assert G.normal_form(e, "factor") is None


def test_deterministic_and_cached():
    e = val(f"{Aa}/({Wa}+1.0)+{Wa}/({Aa}+1.0)")
    a = format_expr(G.normal_form(e, "together"))
    G._normal_form_cached.cache_clear()
    assert format_expr(G.normal_form(e, "together")) == a


def test_time_limit_raises():
    with pytest.raises(G.AlgebraTimeout):
        with G.time_limit(0.05):
            time.sleep(1)


def test_nested_time_limits_keep_the_outer_deadline():
    # sympy's limit (steptp.engine.algebra) nested in a candidate's limit (steptp.timelimit), as in
    # stp dataset / eval: the outer limit still fires at its own deadline, and is restored after
    import signal

    from steptp.timelimit import WorkTimeout, time_limit

    handler = signal.getsignal(signal.SIGALRM)
    # the outer deadline comes first: it fires inside the inner block
    t0 = time.perf_counter()
    with pytest.raises(WorkTimeout, match="outer exceeded"):
        with time_limit(0.2, "outer"):
            with G.time_limit(5.0):
                time.sleep(3)
    assert time.perf_counter() - t0 < 1.5
    # the inner limit fires first; the outer timer is re-armed with what is left of it, not reset
    t0 = time.perf_counter()
    with pytest.raises(WorkTimeout, match="outer exceeded"):
        with time_limit(0.5, "outer"):
            with pytest.raises(G.AlgebraTimeout):
                with G.time_limit(0.1):
                    time.sleep(3)
            left = signal.getitimer(signal.ITIMER_REAL)[0]
            assert 0 < left <= 0.45
            time.sleep(3)
    assert 0.45 < time.perf_counter() - t0 < 1.5
    # an outer deadline that passed while the inner block ran fires as soon as it exits
    with pytest.raises(WorkTimeout, match="outer exceeded"):
        with time_limit(0.1, "outer"):
            with time_limit(5.0, "inner"):
                signal.setitimer(signal.ITIMER_REAL, 0)  # (stand-in for a block the alarm cannot reach)
                time.sleep(0.2)
            time.sleep(3)
    assert signal.getsignal(signal.SIGALRM) is handler and signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)


def test_time_limit_inside_a_foreign_timer():
    # an outer SIGALRM handler that returns runs once, at its time; the limit still fires at its own
    import signal

    from steptp.timelimit import WorkTimeout, time_limit

    ticks = []
    old = signal.signal(signal.SIGALRM, lambda *a: ticks.append(time.perf_counter()))
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.1)
        t0 = time.perf_counter()
        with pytest.raises(WorkTimeout):
            with time_limit(0.3, "inner"):
                time.sleep(3)
        assert len(ticks) == 1 and ticks[0] - t0 < 0.25 and 0.25 < time.perf_counter() - t0 < 1.5
        assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)
        # SIG_IGN outside: ignored inside too, and the limit fires at its own deadline
        signal.signal(signal.SIGALRM, signal.SIG_IGN)
        signal.setitimer(signal.ITIMER_REAL, 0.05)
        t0 = time.perf_counter()
        with pytest.raises(WorkTimeout):
            with time_limit(0.3, "inner"):
                time.sleep(3)
        assert 0.25 < time.perf_counter() - t0 < 1.5
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def test_oversized_expression_is_not_a_candidate():
    # 10 parenthesised groups of 20 products: > MAX_NODES nodes, within the parser's depth limit
    big = val("+".join("(" + "+".join([f"{Aa}*{Wa}"] * 20) + ")" for _ in range(10)))
    assert G.count_nodes(big) > G.MAX_NODES
    assert G.normal_form(big, "factor") is None


def test_unknown_function_name_raises():
    with pytest.raises(G.AlgebraError):
        G.normal_form(val(Aa), "simplify_everything")


def test_symbolic_check_outcomes():
    assert G.symbolic_check(val(f"({Aa}+1.0)*({Aa}+1.0)"), val(f"{Aa}*{Aa}+2.0*{Aa}+1.0")) == "proved"
    assert G.symbolic_check(val(f"{Aa}*{Ac}"), val(f"{Aa}*{Aa}")) == "disproved"   # subscripts matter
    # log(a)+log(b) = log(a*b) only for positive a, b: not provable over the reals
    assert G.symbolic_check(val(f"log({Aa})+log({Wa})"), val(f"log({Aa}*{Wa})")) == "unknown"


def test_accumulation_target_is_the_added_term():
    p = parse_program("B^{4}_{tx=0}L^{8}_{a=0}L^{8}_{c=0}[C^{f32,g}_{tx}=C^{f32,g}_{tx}+" + f"{Aa}*{Ac}+{Aa};];")
    eq = p.nests[0].body[0]
    assert G.accumulation(eq) == ("+", val(f"{Aa}*{Ac}+{Aa}"))
    new = G.replace_target(eq, None, val(f"{Aa}*({Ac}+1.0)"))
    assert format_expr(new) == f"C^{{f32,g}}_{{tx}}+{Aa}*({Ac}+1.0)"
    m = parse_program("B^{4}_{tx=0}L^{8}_{a=0}[C^{f32,g}_{tx}=max(C^{f32,g}_{tx},exp(" + Aa + "));];").nests[0].body[0]
    assert G.algebraic_target(m) == ((1,), val(f"exp({Aa})"))


def test_registrations():
    assert "normal_form" in PRIMITIVES and "normal_form" in FILTERS
    assert {"atoms_of", "exp_factors_of", "reusable_terms"} <= set(EXTRA_DOMAINS)


def test_factorization_rule_rewrites_only_the_accumulated_term():
    m = parse_leir("% program: t\n% input A: f32[4,8]\n% input W: f32[4,8]\n% output E: f32[4]\n"
                   "B^{4}_{tx=0}L^{8}_{a=0}L^{8}_{c=0}[E^{f32,g}_{tx}=E^{f32,g}_{tx}+" + f"{Aa}*{Ac}+{Aa}*W^{{f32,g}}_{{tx,c}};];")
    step = apply_rule(rule("factorization"), m)
    assert format_program(step.after.program) == ("B^{4}_{tx=0}L^{8}_{a=0}L^{8}_{c=0}[E^{f32,g}_{tx}=E^{f32,g}_{tx}+"
                                                  f"{Aa}*({Ac}+W^{{f32,g}}_{{tx,c}});];")
    assert "accumulated term" in step.cot and "product of the factors" in step.cot


def test_ownership_one_label_per_transformation():
    # (A*A*W+A*W)/(A*(A+W)): cancel and factor differ, so cancellation owns its result;
    # A/(W*W+1)+W/(A*A+1): cancel expands, together keeps the factored denominators (denominators
    # provably >= 1: with W+1 and A+1 the expanded A*W+A+W+1 is not provably non-zero, and
    # cancellation, safe_operands, does not propose it)
    m = parse_leir(HEAD + f"B^{{4}}_{{tx=0}}L^{{8}}_{{a=0}}[C^{{f32,g}}_{{tx,a}}={Aa}/({Wa}*{Wa}+1.0)+{Wa}/({Aa}*{Aa}+1.0);];")
    t = apply_rule(rule("together"), m)
    assert format_program(t.after.program) != format_program(apply_rule(rule("cancellation"), m).after.program)
    # W*exp(A)+2*exp(A): factor and collect give the same product, factorization owns it
    m2 = parse_leir(HEAD + f"B^{{4}}_{{tx=0}}L^{{8}}_{{a=0}}[C^{{f32,g}}_{{tx,a}}={Wa}*exp({Aa})+2.0*exp({Aa});];")
    assert apply_rule(rule("factorization"), m2)
    with pytest.raises(NoMatch):
        list_candidates(rule("collect"), m2)


def test_integer_equations_are_not_rewritten():
    m = parse_leir("% program: t\n% input A: i32[4,8]\n% output C: i32[4,8]\n"
                   "B^{4}_{tx=0}L^{8}_{a=0}[C^{i32,g}_{tx,a}=A^{i32,g}_{tx,a}*A^{i32,g}_{tx,a}+2*A^{i32,g}_{tx,a}+1;];")
    with pytest.raises(NoMatch):
        list_candidates(rule("factorization"), m)


def test_split_domains_honour_avoid_and_accumulators():
    text = HEAD.replace("% output C", "% output E: f32[4]\n% output C") + (
        "B^{4}_{tx=0}L^{8}_{a=0}[D^{f32,g}_{tx,a}=max(" + Aa + ",0.0);];"
        "B^{4}_{tx=0}L^{8}_{a=0}[F^{f32,g}_{tx,a}=exp(" + Wa + ");];"
        "B^{4}_{tx=0}L^{8}_{a=0}[K^{f32,g}_{tx,a}=F^{f32,g}_{tx,a}*2.0;];"
        "B^{4}_{tx=0}L^{8}_{a=0}[M^{f32,g}_{tx,a}=" + Wa + "*" + Wa + "+1.0;];"
        "B^{4}_{tx=0}L^{8}_{a=0}[C^{f32,g}_{tx,a}=D^{f32,g}_{tx,a}*" + Wa + "+exp(" + Aa + ");E^{f32,g}_{tx}=max(E^{f32,g}_{tx}," + Aa + ");];")
    m = parse_leir(text)
    cs = [format_expr(p["c"]) for _, p in list_candidates(rule("multiplicative_split"), m)]
    assert "D^{f32,g}_{tx,a}" not in cs            # a ReLU output may be exactly zero
    assert "F^{f32,g}_{tx,a}" not in cs and "K^{f32,g}_{tx,a}" not in cs   # exp underflows, K inherits it
    assert "M^{f32,g}_{tx,a}" in cs
    sites = {s.expr for s, _ in list_candidates(rule("multiplicative_split"), m) if s.equation == (4, 1)}
    assert () not in sites                          # max(E, A) contains the accumulator E
    ecs = [format_expr(p["c"]) for s, p in list_candidates(rule("exponential_split"), m) if s.equation == (4, 0)]
    assert "D^{f32,g}_{tx,a}" in ecs
    assert "M^{f32,g}_{tx,a}" not in ecs  # W*W+1 is up to 4097 for inputs up to 64: exp(c) overflows
    assert "F^{f32,g}_{tx,a}" not in ecs and "K^{f32,g}_{tx,a}" not in ecs  # exp outputs may overflow in exp(c)


def test_egglog_saturation_proves_simple_steps_and_refuses_wrong_ones():
    from steptp.engine.equiv import egglog_prove

    assert egglog_prove(val(f"exp({Aa})*exp({Wa})"), val(f"exp({Aa}+{Wa})"))
    assert egglog_prove(val(f"{Aa}*{Ac}+{Aa}*{Wa}"), val(f"{Aa}*({Ac}+{Wa})"))
    assert egglog_prove(val(f"exp({Aa}-if_then_else(a<1,0.0,{Ac}))*exp(if_then_else(a<1,0.0,{Ac}))"),
                        val(f"exp({Aa})"))
    assert not egglog_prove(val(f"{Aa}*{Ac}"), val(f"{Aa}*{Aa}"))              # subscripts stay apart
    assert not egglog_prove(val(f"log({Aa})+log({Wa})"), val(f"log({Aa}*{Wa})"))  # needs a, b > 0


def test_bad_filter_is_a_rule_error_naming_the_field():
    from steptp.rules import RuleError, load_rule_text

    text = (rules_dir() / "factorization.yaml").read_text().replace("- normal_form:\n      function: factor",
                                                                   "- normal_fom:\n      function: factor", 1)
    with pytest.raises(RuleError, match=r"filter\[0\]\.normal_fom: unknown filter"):
        load_rule_text(text, "<bad>")
    text2 = (rules_dir() / "factorization.yaml").read_text().replace("function: factor\n", "function: factor\n      bogus: 1\n", 1)
    with pytest.raises(RuleError, match=r"filter\[0\]\.normal_form: unknown argument"):
        load_rule_text(text2, "<bad>")


# ---- looking through producer nests (the translator's one nest per operator) -------------------

_THROUGH = """% program: through
% input A: f32[4,8]
% input W: f32[4,8]
% input V: f32[4,8]
% output C: f32[4,8]
B^{4}_{tx=0}L^{8}_{a=0}[E^{f32,g}_{tx,a}=exp(A^{f32,g}_{tx,a});];
B^{4}_{tx=0}L^{8}_{a=0}[F^{f32,g}_{tx,a}=E^{f32,g}_{tx,a}*W^{f32,g}_{tx,a};];
B^{4}_{tx=0}L^{8}_{a=0}[G^{f32,g}_{tx,a}=exp(A^{f32,g}_{tx,a});];
B^{4}_{tx=0}L^{8}_{a=0}[H^{f32,g}_{tx,a}=G^{f32,g}_{tx,a}*V^{f32,g}_{tx,a};];
B^{4}_{tx=0}L^{8}_{a=0}[C^{f32,g}_{tx,a}=F^{f32,g}_{tx,a}+H^{f32,g}_{tx,a}+W^{f32,g}_{tx,a};];
"""


def test_through_targets_inline_definitions_level_by_level():
    m = parse_leir(_THROUGH)
    eq = m.program.nests[4].body[0]
    ts = [format_expr(t) for t in G.through_targets(m.program, 4, eq.value, frozenset({"A", "W", "V", "C"}))]
    assert ts == ["F^{f32,g}_{tx,a}+H^{f32,g}_{tx,a}+W^{f32,g}_{tx,a}",
                  "E^{f32,g}_{tx,a}*W^{f32,g}_{tx,a}+G^{f32,g}_{tx,a}*V^{f32,g}_{tx,a}+W^{f32,g}_{tx,a}",
                  "exp(A^{f32,g}_{tx,a})*W^{f32,g}_{tx,a}+exp(A^{f32,g}_{tx,a})*V^{f32,g}_{tx,a}+W^{f32,g}_{tx,a}"]
    # keep= refuses a definition: that read stays
    t = G.inline_definitions(m.program, 4, eq.value, keep=lambda d: not isinstance(d, A.BinOp) or d.op != "*"
                             or "H" in format_expr(d))
    assert format_expr(t) == "F^{f32,g}_{tx,a}+H^{f32,g}_{tx,a}+W^{f32,g}_{tx,a}"


def test_collect_looks_through_producers_and_the_symbolic_check_follows():
    m = parse_leir(_THROUGH)
    rule = load_rule(rules_dir() / "collect.yaml")
    cands = list_candidates(rule, m)
    xs = sorted(format_expr(p["x"]) for _, p in cands)
    assert "exp(A^{f32,g}_{tx,a})" in xs
    site, params = next(c for c in cands if format_expr(c[1]["x"]) == "exp(A^{f32,g}_{tx,a})")
    step = apply_rule(rule, m, site=site, params=params)
    last = format_program(step.after.program).split(";];")[-2]
    assert last.endswith("C^{f32,g}_{tx,a}=W^{f32,g}_{tx,a}+(V^{f32,g}_{tx,a}+W^{f32,g}_{tx,a})*exp(A^{f32,g}_{tx,a})")
    # the changed equation alone (F+H+W vs the collected form) differs; with definitions it is proved
    assert G.symbolic_check(m.program.nests[4].body[0].value, step.after.program.nests[4].body[0].value) == "disproved"
    assert G.symbolic_check_programs(m.program, step.after.program) == "proved"


def test_look_through_is_not_used_when_an_input_is_overwritten():
    text = _THROUGH.replace("B^{4}_{tx=0}L^{8}_{a=0}[C^{f32,g}",
                            "B^{4}_{tx=0}L^{8}_{a=0}[E^{f32,g}_{tx,a}=A^{f32,g}_{tx,a};];\nB^{4}_{tx=0}L^{8}_{a=0}[C^{f32,g}")
    m = parse_leir(text)
    eq = m.program.nests[5].body[0]
    ts = G.through_targets(m.program, 5, eq.value, frozenset({"A", "W", "V", "C"}))
    assert len(ts) > 1 and all("F^{f32,g}_{tx,a}" in format_expr(t) for t in ts)  # F reads E, overwritten later
    assert G.inline_definitions(m.program, 5, A.Tensor("F", "f32", "g", (A.Index("tx"), A.Index("a")))) \
        == A.Tensor("F", "f32", "g", (A.Index("tx"), A.Index("a")))


def test_symbolic_check_of_guarded_values_and_constant_differences():
    """Opaque subterms are symbols, not independent values: the corpus' Tril
    (``if_then_else(a<=tx, A, 0)``) after an additive split inside the guard was called
    disproved (9 of 234 additive splits of a 2000-program run were lost that way)."""
    from steptp.leir import parse_expr

    symbolic_check = G.symbolic_check
    tril = parse_expr("if_then_else(a<=tx,A^{f16,g}_{tx,a},0.0)")
    split = parse_expr("if_then_else(a<=tx,A^{f16,g}_{tx,a}+if_then_else(a<1,0.0,A^{f16,g}_{tx,a-1})"
                       "-if_then_else(a<1,0.0,A^{f16,g}_{tx,a-1}),0.0)")
    assert symbolic_check(tril, split) == "proved"
    assert symbolic_check(tril, parse_expr("if_then_else(a<=tx,A^{f16,g}_{tx,a}*2.0,0.0)")) == "disproved"
    # a one-sided opaque subterm decides nothing; a constant difference is a disproof
    assert symbolic_check(parse_expr("if_then_else(a<1,0.0,A^{f32,g}_{a})"),
                          parse_expr("if_then_else(a<2,0.0,A^{f32,g}_{a})")) == "unknown"
    assert symbolic_check(parse_expr("A^{f32,g}_{tx}+1.0"), parse_expr("A^{f32,g}_{tx}+2.0")) == "disproved"


def test_an_outer_limit_swallowed_in_an_inner_block_fires_again_after_it():
    # algebra.describe catches every exception: an outer (candidate) limit that fires inside
    # it must not be lost, or the candidate's work would run unbounded
    from steptp.timelimit import WorkTimeout, time_limit

    swallowed = []
    t0 = time.perf_counter()
    with pytest.raises(WorkTimeout, match="outer exceeded"):
        with time_limit(0.2, "outer"):
            with G.time_limit(5.0):
                try:
                    time.sleep(3)
                except Exception as e:  # noqa: BLE001 - a best-effort caller
                    swallowed.append(e)
            time.sleep(3)  # the outer limit fires here at once
    assert swallowed and isinstance(swallowed[0], WorkTimeout)
    assert time.perf_counter() - t0 < 1.5


@pytest.mark.parametrize("c", ["2.0", "32.0", "1000.0", "0.001"])
def test_a_perturbed_constant_is_disproved_whatever_its_size(c):
    """Issue 34: ``x/c`` rewritten to ``x*(1.00001/c)`` was "unknown" (the numeric test had an
    absolute floor of 1e-6): constants are exact rationals, so the difference is decided."""
    from steptp.leir import parse_expr

    before = parse_expr(f"A^{{f32,g}}_{{tx}}/{c}")
    assert G.symbolic_check(before, parse_expr(f"A^{{f32,g}}_{{tx}}*(1.00001/{c})")) == "disproved"
    assert G.symbolic_check(before, parse_expr(f"A^{{f32,g}}_{{tx}}*(1.0/{c})")) == "proved"
    # a transcendental side: decided at 50 digits with the same threshold
    assert G.symbolic_check(parse_expr(f"exp(A^{{f32,g}}_{{tx}}/{c})"),
                            parse_expr(f"exp(A^{{f32,g}}_{{tx}}*(1.00001/{c}))")) == "disproved"


def test_a_folded_constant_rounded_to_float64_is_not_a_disproof():
    from steptp.leir import parse_expr

    # 1/3 printed as a decimal: differs from x/3 by 3e-17 relative, the rounding of the constant
    assert G.symbolic_check(parse_expr("A^{f32,g}_{tx}/3.0"), parse_expr("A^{f32,g}_{tx}*0.3333333333333333")) \
        in ("proved", "unknown")
