"""Engine: egglog encoding and analyses, site enumeration, single-site application,
seeded reproducibility, fresh names, generic primitives and YAML-only extensibility."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from steptp.engine import NoMatch, Site, apply_rule, find_sites, find_sites_many, list_candidates
from steptp.engine import patterns as P
from steptp.engine.apply import RewriteError
from steptp.engine.egraph import analyze_relations, proper_divisors
from steptp.engine.match import compile_rule, matcher_for
from steptp.engine.primitives import (RESERVED_INDEX_NAMES, NestRef, RewriteContext, fresh_index_name,
                                      fresh_tensor_name, get_item, permutations, program_names, run_primitive,
                                      value_children)
from steptp.leir import ast as A
from steptp.leir import format_program, load_leir, parse_expr, parse_leir, parse_program
from steptp.leir.printer import format_expr, format_nest
from steptp.rules import load_rule_text, load_rules
from steptp.verify import verify_pair

RULES = {r.id: r for r in load_rules()}
EXAMPLES = sorted((Path(__file__).resolve().parent.parent / "examples").glob("*.leir"))

GEMM = """% program: gemm
% input A: f32[8,12]
% param W: f32[12,16]
% output C: f32[8,16]
B^{8}_{tx=0}L^{16}_{a=0}L^{12}_{c=0}[C^{f32,g}_{tx,a}=C^{f32,g}_{tx,a}+A^{f32,g}_{tx,c}*W^{f32,g}_{c,a};];
"""

SOFTMAX = """% program: softmax
% input A: f32[4,32]
% output C: f32[4,32]
B^{4}_{tx=0}L^{32}_{a=0}[D^{f32,g}_{tx}=max(D^{f32,g}_{tx},A^{f32,g}_{tx,a});];
B^{4}_{tx=0}L^{32}_{a=0}[E^{f32,g}_{tx}=E^{f32,g}_{tx}+exp(A^{f32,g}_{tx,a}-D^{f32,g}_{tx});];
B^{4}_{tx=0}L^{32}_{a=0}[C^{f32,g}_{tx,a}=exp(A^{f32,g}_{tx,a}-D^{f32,g}_{tx})/E^{f32,g}_{tx};];
"""

# two identical log(a*b) sites in one equation, one more in another nest
THREE_LOGS = """% program: three_logs
% input A: f32[4,8]
% output C: f32[4,8]
% output G: f32[4]
B^{4}_{tx=0}L^{8}_{a=0}[C^{f32,g}_{tx,a}=log(exp(A^{f32,g}_{tx,a})*2.0)*log(exp(A^{f32,g}_{tx,a})*2.0);];
B^{4}_{tx=0}[G^{f32,g}_{tx}=log(exp(A^{f32,g}_{tx,0})*3.0);];
"""

NESTED = """% program: nested
% input A: f32[4,8]
% output C: f32[4]
B^{4}_{tx=0}[D^{f32,g}_{tx}=0.0;L^{8}_{a=0}[D^{f32,g}_{tx}=D^{f32,g}_{tx}+log(exp(A^{f32,g}_{tx,a})*2.0);];C^{f32,g}_{tx}=D^{f32,g}_{tx}*2.0;];
"""


def verify(before, after):
    from steptp.verify import verify_pair

    res = verify_pair(before, after, trials=3, seed=0)
    assert res.equal, res.reason
    return res


# ---------------------------------------------------------------- patterns

def test_pattern_parse_and_sorts():
    p = P.parse_expr_pattern("log(?a*?b)")
    assert P.metavar_sorts(p) == {"a": "Term", "b": "Term"}
    (l,) = P.parse_loops_pattern("?k^{?n}_{?i=0}")
    assert P.metavar_sorts(l) == {"k": "String", "n": "Int", "i": "String"}
    assert P.loop_sexp(l) == "(LOOP mv_k mv_n mv_i)"
    t = P.parse_expr_pattern("?X^{?dt,g}_{?i,tx}")
    assert P.metavar_sorts(t) == {"X": "String", "dt": "String", "i": "Term"}
    with pytest.raises(P.PatternError, match="column"):
        P.parse_expr_pattern("log(?a*)")


def test_pattern_matching_respects_subscripts_and_is_non_linear():
    pat = P.parse_expr_pattern("log(?a*?a)")
    same = parse_expr("log(A^{f32,g}_{tx,a}*A^{f32,g}_{tx,a})")
    diff = parse_expr("log(A^{f32,g}_{tx,a}*A^{f32,g}_{tx,c})")
    assert P.match_node(pat, same) == {"a": parse_expr("A^{f32,g}_{tx,a}")}
    assert P.match_node(pat, diff) is None
    # whole subterms: ?a binds a product, not a name
    env = P.match_node(P.parse_expr_pattern("log(?a*?b)"), parse_expr("log(A^{f32,g}_{tx}*B^{f32,g}_{tx}*2.0)"))
    assert format_expr(env["a"]) == "A^{f32,g}_{tx}*B^{f32,g}_{tx}" and format_expr(env["b"]) == "2.0"


def test_template_instantiation_coerces_names_and_ints():
    e = P.instantiate(P.parse_expr_pattern("?io*?f+?ii"), {"io": "d", "f": 4, "ii": "f"})
    assert format_expr(e) == "d*4+f"
    loops = P.instantiate(P.parse_loops_pattern("?k^{?n/?f}_{?io=0}L^{?f}_{?ii=0}"),
                          {"k": "B", "n": 8, "f": 2, "io": "txa", "ii": "c"})
    assert loops == (A.Loop("B", 4, "txa"), A.Loop("L", 2, "c"))
    with pytest.raises(P.TemplateError, match="exact division"):
        P.instantiate(P.parse_loops_pattern("L^{?n/?f}_{a=0}"), {"n": 8, "f": 3})


# ---------------------------------------------------------------- egglog analyses

def test_analyses_on_softmax():
    m = parse_leir(SOFTMAX)
    r = analyze_relations(m, ["depends", "same_loops", "reduction_axis", "intermediate", "fuse_conflict",
                              "reorder_hazard", "cross_nest", "factorizable", "loop_count"])
    assert sorted(map(tuple, r["depends"])) == [(0, 1), (0, 2), (1, 2)]
    assert sorted(map(tuple, r["reduction_axis"])) == [(0, "a"), (1, "a")]
    assert sorted(x for (x,) in r["intermediate"]) == ["D", "E"]
    assert sorted(map(tuple, r["fuse_conflict"])) == [(0, 1), (1, 2)]
    assert r["reorder_hazard"] == []
    assert sorted(x for (x,) in r["cross_nest"]) == ["A", "D", "E"]
    assert sorted(x for (x,) in r["factorizable"]) == [4, 32]
    assert sorted(map(tuple, r["loop_count"])) == [(0, 2), (1, 2), (2, 2)]


@pytest.mark.parametrize("body,hazard", [
    ("[C^{f32,g}_{tx,a}=C^{f32,g}_{tx,a}+A^{f32,g}_{tx,a};];", False),                 # element-wise
    ("[S^{f32,g}_{tx}=S^{f32,g}_{tx}+A^{f32,g}_{tx,a};C^{f32,g}_{tx,a}=S^{f32,g}_{tx};];", True),  # partial sum read
    ("[S^{f32,g}=A^{f32,g}_{tx,a};C^{f32,g}_{tx,a}=A^{f32,g}_{tx,a};];", True),         # last writer over 2 loops
    ("[S^{f32,g}=max(S^{f32,g},A^{f32,g}_{tx,a});C^{f32,g}_{tx,a}=A^{f32,g}_{tx,a};];", False),  # commutative max
    ("[C^{f32,g}_{tx,a}=if_then_else(a<1,A^{f32,g}_{tx,a},C^{f32,g}_{tx,a-1});];", True),  # carried dependence
])
def test_reorder_hazard(body, hazard):
    m = parse_leir("% program: p\n% input A: f32[4,8]\n% output C: f32[4,8]\n"
                   f"B^{{4}}_{{tx=0}}L^{{8}}_{{a=0}}{body}")
    assert bool(analyze_relations(m, ["reorder_hazard"])["reorder_hazard"]) is hazard
    sites = find_sites(RULES["loop_reorder"], m)
    assert (not sites) is hazard


@pytest.mark.parametrize("first,second,fusable", [
    ("D^{f32,g}_{tx}=A^{f32,g}_{tx}*2.0;", "C^{f32,g}_{tx}=D^{f32,g}_{tx}+1.0;", True),
    ("D^{f32,g}_{0}=A^{f32,g}_{tx};", "C^{f32,g}_{tx}=D^{f32,g}_{0};", False),              # broadcast write
    ("D^{f32,g}_{tx}=A^{f32,g}_{tx};", "C^{f32,g}_{tx}=D^{f32,g}_{3-tx};", False),         # other subscript
    ("D^{f32,g}_{tx}=A^{f32,g}_{tx};", "A2^{f32,g}_{tx}=A^{f32,g}_{tx}+D^{f32,g}_{tx};C^{f32,g}_{tx}=A2^{f32,g}_{tx};", True),
    ("D^{f32,g}_{tx}=C^{f32,g}_{3-tx};", "C^{f32,g}_{tx}=A^{f32,g}_{tx};", False),          # WAR at another subscript
])
def test_fusion_conflicts(first, second, fusable):
    m = parse_leir("% program: p\n% input A: f32[4]\n% output C: f32[4]\n"
                   f"B^{{4}}_{{tx=0}}[{first}];B^{{4}}_{{tx=0}}[{second}];")
    sites = find_sites(RULES["operator_fusion"], m)
    assert bool(sites) is fusable


def test_proper_divisors():
    assert proper_divisors(12) == [2, 3, 4, 6]
    assert proper_divisors(7) == [] and proper_divisors(4) == [2]


def test_negated_clauses_compile_to_stratified_rules():
    text = compile_rule(RULES["operator_fusion"]).text
    assert "pre__operator_fusion" in text and "blk__operator_fusion" in text and ":ruleset fin" in text
    assert "blk__" not in compile_rule(RULES["logsimp"]).text


# ---------------------------------------------------------------- site enumeration

def test_three_log_sites_identical_subterms_are_separate_sites():
    m = parse_leir(THREE_LOGS)
    rule = RULES["expand_log"]
    sites = find_sites(rule, m)
    assert len(sites) == 3
    assert [(s.equation, s.expr) for s in sites] == [((0, 0), (0,)), ((0, 0), (1,)), ((1, 0), ())]
    assert len(list_candidates(rule, m)) == 3
    # each application changes exactly its own occurrence
    texts = set()
    for s in sites:
        step = apply_rule(rule, m, site=s)
        eq_b, eq_a = get_item(m.program, s.equation), get_item(step.after.program, s.equation)
        assert _diff_paths(eq_b.value, eq_a.value) == [s.expr]
        for i, n in enumerate(m.program.nests):
            if i != s.equation[0]:
                assert step.after.program.nests[i] == n
        texts.add(format_program(step.after.program))
    assert len(texts) == 3


def _diff_paths(a, b, prefix=()):
    """Maximal value paths where two expressions differ (one path per differing subtree)."""
    if a == b:
        return []
    ka, kb = value_children(a), value_children(b)
    if type(a) is not type(b) or len(ka) != len(kb) or not ka or \
            getattr(a, "op", None) != getattr(b, "op", None) or getattr(a, "func", None) != getattr(b, "func", None):
        return [prefix]
    out = []
    for i, (x, y) in enumerate(zip(ka, kb)):
        out += _diff_paths(x, y, prefix + (i,))
    return out


def _brute_force_expr_sites(rule, module):
    pat = P.parse_expr_pattern(rule.match)
    sorts = P.metavar_sorts(pat)
    found = []
    for n, nest in enumerate(module.program.nests):
        def rec(item, path):
            if isinstance(item, A.Nest):
                for i, x in enumerate(item.body):
                    rec(x, path + (i,))
                return

            def walk(e, ep):
                if P.match_node(pat, e, sorts=sorts) is not None:
                    found.append((path, ep))
                for i, c in enumerate(value_children(e)):
                    walk(c, ep + (i,))
            walk(item.value, ())
        rec(nest, (n,))
    return sorted(found)


@pytest.mark.parametrize("rule_id", ["exponential_split", "logsimp", "expand_log"])
@pytest.mark.parametrize("text", [THREE_LOGS, NESTED] + [p.read_text() for p in EXAMPLES],
                         ids=["three_logs", "nested"] + [p.stem for p in EXAMPLES])
def test_expr_sites_agree_with_brute_force(rule_id, text):
    """egglog's sites are the pattern's occurrences (brute force over every subexpression);
    a rule with ``where:`` checks keeps a subset of them."""
    m = parse_leir(text)
    rule = RULES[rule_id]
    got = sorted((s.equation, s.expr) for s in find_sites(rule, m))
    brute = _brute_force_expr_sites(rule, m)
    if rule.raw.get("where"):
        assert set(got) <= set(brute)
    else:
        assert got == brute


def test_sites_in_nested_nests():
    m = parse_leir(NESTED)
    logs = find_sites(RULES["expand_log"], m)
    assert [(s.nest, s.equation, s.expr) for s in logs] == [((0, 1), (0, 1, 0), (1,))]
    split = find_sites(RULES["loop_split"], m)
    assert sorted((s.nest, s.loop) for s in split) == [((0,), 0), ((0, 1), 0)]
    step = apply_rule(RULES["loop_split"], m, site={"nest": [0, 1]}, params={"f": 2})
    assert format_program(step.after.program) == (
        "B^{4}_{tx=0}[D^{f32,g}_{tx}=0.0;L^{4}_{c=0}L^{2}_{d=0}[D^{f32,g}_{tx}=D^{f32,g}_{tx}+"
        "log(exp(A^{f32,g}_{tx,c*2+d})*2.0);];C^{f32,g}_{tx}=D^{f32,g}_{tx}*2.0;];")
    verify(m, step.after)
    step = apply_rule(RULES["expand_log"], m)
    verify(m, step.after)


def test_reorder_outer_loops_around_an_inner_nest():
    m = parse_leir("% program: nested2\n% input A: f32[4,8]\n% param W: f32[3]\n% output C: f32[4,3]\n"
                   "B^{4}_{tx=0}L^{3}_{c=0}[D^{f32,g}_{tx,c}=0.0;L^{8}_{a=0}[D^{f32,g}_{tx,c}=D^{f32,g}_{tx,c}+"
                   "A^{f32,g}_{tx,a}*W^{f32,g}_{c};];C^{f32,g}_{tx,c}=D^{f32,g}_{tx,c}*2.0;];")
    sites = find_sites(RULES["loop_reorder"], m)
    assert [s.nest for s in sites] == [(0,)]            # the inner single-loop nest is not a site
    step = apply_rule(RULES["loop_reorder"], m, params={"order": [1, 0]})
    assert format_program(step.after.program).startswith("L^{3}_{c=0}B^{4}_{tx=0}[D^{f32,g}_{tx,c}=0.0;L^{8}_{a=0}[")
    verify(m, step.after)


def test_loop_split_candidates_are_all_proper_divisors():
    m = parse_leir(GEMM)
    cands = list_candidates(RULES["loop_split"], m)
    got = sorted((s.loop, p["f"]) for s, p in cands)
    assert got == [(0, 2), (0, 4), (1, 2), (1, 4), (1, 8), (2, 2), (2, 3), (2, 4), (2, 6)]


def test_loop_reorder_candidates_and_vector_loops_stay_innermost():
    m = parse_leir(GEMM)
    assert len(list_candidates(RULES["loop_reorder"], m)) == 5       # 3! - identity
    assert permutations((A.Loop("L", 2, "a"), A.Loop("L", 2, "c"), A.Loop("V", 4, "d")),
                        keep_innermost_kinds=["V"]) == [(1, 0, 2)]
    loops = tuple(A.Loop("L", 2, v) for v in "abcd") + (A.Loop("V", 4, "e"),)
    assert permutations(loops, keep_innermost_kinds=["V"], innermost=2) == [(0, 1, 3, 2, 4)]
    assert len(permutations(loops, innermost=3)) == 5 and all(p[:2] == (0, 1) for p in permutations(loops, innermost=3))


def test_loop_reorder_on_a_nine_loop_nest_permutes_the_innermost_seven():
    """A 3-D convolution nest has 9 loops (9! orders, above the domain limit): loop_reorder
    keeps the two outer loops and still yields every order of the inner seven."""
    loops = "".join(f"L^{{2}}_{{{v}=0}}" for v in "acdefghi")
    m = parse_leir("% program: deep\n% input A: f32[2,2,2,2,2,2,2,2,2]\n% output C: f32[2]\n"
                   f"B^{{2}}_{{tx=0}}{loops}[C^{{f32,g}}_{{tx}}=C^{{f32,g}}_{{tx}}+A^{{f32,g}}_{{tx,a,c,d,e,f,g,h,i}};];")
    cands = list_candidates(RULES["loop_reorder"], m)
    assert len(cands) == 5039                                           # 7! - identity
    assert all(p["order"][:2] == (0, 1) for _, p in cands)
    step = apply_rule(RULES["loop_reorder"], m, site=cands[0][0], params={"order": (0, 1, 2, 3, 4, 5, 6, 8, 7)})
    assert format_program(step.after.program).startswith("B^{2}_{tx=0}L^{2}_{a=0}L^{2}_{c=0}L^{2}_{d=0}L^{2}_{e=0}"
                                                          "L^{2}_{f=0}L^{2}_{g=0}L^{2}_{i=0}L^{2}_{h=0}[")
    assert verify_pair(m, step.after, trials=3).equal


def test_find_sites_many_equals_single_rule_matching():
    for p in EXAMPLES:
        m = load_leir(p)
        many = find_sites_many(list(RULES.values()), m)
        for rid, rule in RULES.items():
            assert matcher_for([rule]).sites(m)[rid] == many[rid], (p.stem, rid)
            assert find_sites(rule, m) == many[rid]


def test_site_enumeration_is_fast():
    rules = list(RULES.values())
    matcher_for(rules)                      # build once (schema + analyses + compiled rules)
    worst = 0.0
    for p in EXAMPLES:
        m = load_leir(p)
        t0 = time.perf_counter()
        matcher_for(rules).sites(m)
        worst = max(worst, time.perf_counter() - t0)
    assert worst < 1.0


# ---------------------------------------------------------------- application

def test_no_match_raises_with_a_clear_message():
    m = parse_leir("% program: prime\n% input A: f32[7,5]\n% output C: f32[7,5]\n"
                   "B^{7}_{tx=0}L^{5}_{a=0}[C^{f32,g}_{tx,a}=A^{f32,g}_{tx,a}+1.0;];")
    with pytest.raises(NoMatch, match=r"rule 'loop_split' matches nothing in program 'prime'.*loop_range_factorization"):
        apply_rule(RULES["loop_split"], m)
    with pytest.raises(NoMatch):
        list_candidates(RULES["loop_split"], m)
    with pytest.raises(NoMatch, match="operator_fusion"):
        apply_rule(RULES["operator_fusion"], parse_leir(SOFTMAX))


def test_bad_site_and_params():
    m = parse_leir(GEMM)
    rule = RULES["loop_split"]
    with pytest.raises(ValueError, match="not in its domain"):
        apply_rule(rule, m, site={"loop": 2}, params={"f": 5})
    with pytest.raises(ValueError, match="no parameter"):
        apply_rule(rule, m, params={"g": 2})
    with pytest.raises(NoMatch, match="out of range"):
        apply_rule(rule, m, site=99)
    other = find_sites(rule, parse_leir(SOFTMAX))[0]
    with pytest.raises(NoMatch, match="not a match site"):
        apply_rule(rule, m, site=Site("loop_split", "loop", nest=(5,), loop=0))
    assert apply_rule(rule, m, site=0, params={"f": 2}).site == find_sites(rule, m)[0]
    assert other.scope == "loop"


def test_given_params_restrict_the_site_choice():
    m = parse_leir(GEMM)
    for seed in range(6):
        step = apply_rule(RULES["loop_split"], m, seed=seed, params={"f": 3})
        assert step.site.loop == 2 and step.params == {"f": 3}


def test_same_seed_same_output_and_seeds_vary():
    outs = {}
    for rid, text in [("loop_split", GEMM), ("loop_reorder", GEMM), ("expand_log", THREE_LOGS),
                      ("set_storage_scope", _FUSED_TANH)]:
        m = parse_leir(text)
        a = apply_rule(RULES[rid], m, seed=7)
        b = apply_rule(RULES[rid], m, seed=7)
        assert (a.after, a.cot, a.params, a.site) == (b.after, b.cot, b.params, b.site)
        outs[rid] = {format_program(apply_rule(RULES[rid], m, seed=s).after.program) for s in range(12)}
    assert all(len(v) > 1 for v in outs.values()), {k: len(v) for k, v in outs.items()}


def test_same_seed_same_output_across_processes():
    code = textwrap.dedent("""
        import json, sys
        from steptp.rules import load_rules
        from steptp.engine import apply_rule
        from steptp.leir import parse_leir, format_program
        rules = {r.id: r for r in load_rules()}
        m = parse_leir(sys.stdin.read())
        out = []
        for rid in ("loop_split", "loop_reorder"):
            for seed in range(5):
                s = apply_rule(rules[rid], m, seed=seed)
                out.append([format_program(s.after.program), s.cot, str(s.site), repr(s.params)])
        print(json.dumps(out))
    """)
    runs = []
    for hashseed in ("1", "12345"):
        env = dict(os.environ, PYTHONHASHSEED=hashseed)
        r = subprocess.run([sys.executable, "-c", code], input=GEMM, capture_output=True, text=True, env=env,
                           check=True)
        runs.append(json.loads(r.stdout))
    assert runs[0] == runs[1]


_FUSED_TANH = """% program: tanh_fused
% input A: f32[4,8]
% output C: f32[4,8]
B^{4}_{tx=0}L^{8}_{a=0}[D^{f32,g}_{tx,a}=exp(A^{f32,g}_{tx,a});E^{f32,g}_{tx,a}=exp(-A^{f32,g}_{tx,a});C^{f32,g}_{tx,a}=(D^{f32,g}_{tx,a}-E^{f32,g}_{tx,a})/(D^{f32,g}_{tx,a}+E^{f32,g}_{tx,a});];
"""


def test_each_candidate_changes_only_its_site():
    cases = [("loop_split", GEMM), ("loop_reorder", load_leir(EXAMPLES[0]).text()),
             ("operator_fusion", (EXAMPLES[0].parent / "mlp.leir").read_text()),
             ("set_storage_scope", _FUSED_TANH)]
    for rid, text in cases:
        m = parse_leir(text)
        for site, params in list_candidates(RULES[rid], m):
            after = apply_rule(RULES[rid], m, site=site, params=params).after.program
            before = m.program
            if site.scope in ("loop", "nest"):
                i = site.nest[0]
                assert after.nests[:i] == before.nests[:i] and after.nests[i + 1:] == before.nests[i + 1:]
                assert after.nests[i].body != before.nests[i].body or after.nests[i].loops != before.nests[i].loops
            elif site.scope == "nests":
                i = site.nests[0][0]
                assert after.nests[:i] == before.nests[:i] and after.nests[i + 1:] == before.nests[i + 2:]
                assert after.nests[i].body == before.nests[i].body + before.nests[i + 1].body
            elif site.scope == "tensor":
                # mapping the tensor back to global gives the original program
                back = A.map_program_exprs(after, lambda e: A.transform(
                    e, lambda x: x.with_scope("g") if isinstance(x, A.Tensor) and x.name == site.tensor else x))
                assert back == before


def test_step_fields_and_cot_quotes_the_real_texts():
    m = parse_leir(GEMM)
    step = apply_rule(RULES["loop_split"], m, site={"loop": 2}, params={"f": 6})
    assert step.after.signature == m.signature and step.before is m
    assert json.loads(json.dumps(step.params)) == {"f": 6}
    assert step.site_description == "loop 2 of nest(0)"
    nb, na = format_nest(m.program.nests[0]), format_nest(step.after.program.nests[0])
    assert f"'{nb}'" in step.cot and f"'{na}'" in step.cot
    assert "L^{2}_{d=0}L^{6}_{f=0}" in step.cot and "'d*6+f'" in step.cot
    assert [c.kind for c in step.changes] == ["loops", "substitute"]


def test_rewrite_errors_are_reported():
    rule = load_rule_text(textwrap.dedent("""
        id: bad_split
        name: bad split
        category: operator
        description: Splits into a wrong extent.
        preconditions: [loop_range_factorization]
        difficulty: {K: 1, P: 1, S: 0}
        match: {loop: "?k^{?n}_{?i=0}"}
        where: ["factorizable(?n)"]
        params: {f: {divisors_of: "?n", exclude: [1, "?n"]}}
        rewrite:
          - replace: "?k^{?n}_{?i=0}?k^{?f}_{?i=0}"
        cot: "{{ description }}"
        tests:
          - before: "% program: x\\n% input A: f32[4]\\n% output C: f32[4]\\nB^{4}_{tx=0}[C^{f32,g}_{tx}=A^{f32,g}_{tx};];"
            no_match: true
    """), "<bad_split>")
    m = parse_leir(GEMM)
    with pytest.raises(RewriteError, match="bad_split"):
        apply_rule(rule, m, site={"loop": 1}, params={"f": 2})


# ---------------------------------------------------------------- fresh names

def test_fresh_names_never_collide():
    taken = {"a", "c", "d", "tx", "txa", "f", "inf"}
    assert fresh_index_name(set(taken)) == "g"
    assert fresh_index_name(set(taken), kind="B", like="tx") == "txc"
    assert fresh_index_name(set(taken), kind="B", prefix="by") == "bya"
    t = set(taken)
    names = [fresh_index_name(t) for _ in range(400)]
    assert len(set(names)) == 400 and not set(names) & taken
    assert not set(names) & RESERVED_INDEX_NAMES
    assert not any(n[:2] in ("tx", "ty", "tz", "bx", "by", "bz") for n in names)
    tt = {"A", "C", "D"}
    assert fresh_tensor_name(tt) == "E" and "E" in tt
    with pytest.raises(RewriteError):
        fresh_index_name(set(), kind="B", like="a")


def test_split_fresh_names_avoid_the_nest_and_signature_names():
    """Loop indices are local to their top-level nest: a split's two new indices avoid every
    name of the nest it splits and every tensor/signature name, not other nests' indices."""
    text = ("% program: crowded\n% input A: f32[4,6]\n% output C: f32[4,6]\n"
            "B^{4}_{tx=0}L^{6}_{d=0}[C^{f32,g}_{tx,d}=A^{f32,g}_{tx,d};];"
            "B^{4}_{tx=0}L^{6}_{a=0}L^{1}_{c=0}L^{1}_{f=0}L^{1}_{g=0}[C^{f32,g}_{tx,a}=C^{f32,g}_{tx,a}*2.0;];")
    m = parse_leir(text)
    seen_reuse = False
    for site, params in list_candidates(RULES["loop_split"], m):
        step = apply_rule(RULES["loop_split"], m, site=site, params=params)
        k = site.nest[0]
        before, after = program_names(m, [k]), program_names(step.after, [k])
        new = after - before
        assert len(new) == 2 and not new & before and not new & {"A", "C"}
        seen_reuse |= bool(new & program_names(m, [1 - k]))
    assert seen_reuse  # nest 0's split may use a name of nest 1 (a, c...), which is not in scope


# ---------------------------------------------------------------- generic primitives

def _ctx(m, site=None, env=None):
    return RewriteContext(module=m, program=m.program, site=site, env=env or {}, taken=program_names(m))


def test_structural_primitives_keep_nest_references_valid():
    m = parse_leir(SOFTMAX)
    ctx = _ctx(m, env={"n0": NestRef((0,)), "n2": NestRef((2,)), "T": "Z"})
    run_primitive(ctx, "insert_nest", {"nest": "B^{4}_{tx=0}[Z^{f32,g}_{tx}=1.0;];", "before": "?n0"})
    run_primitive(ctx, "remove_nest", "?n2")       # the original nest 2, now at position 3
    assert len(ctx.program.nests) == 3
    assert format_nest(ctx.program.nests[0]) == "B^{4}_{tx=0}[Z^{f32,g}_{tx}=1.0;];"
    assert ctx.program.nests[1:] == m.program.nests[:2]
    run_primitive(ctx, "rename_tensor", {"tensor": "D", "to": "Q"})
    assert "Q" in format_program(ctx.program) and "D^" not in format_program(ctx.program)
    run_primitive(ctx, "replace_all", {"pattern": "exp(?x)", "with": "exp(?x)*1.0"})
    assert ctx.changes[-1].extra["occurrences"] == 1
    with pytest.raises(RewriteError, match="removed"):
        run_primitive(ctx, "remove_nest", "?n2")


YAML_ONLY = {
    # operator fission: split_nest + a range domain over a value function
    "operator_fission": """
        id: operator_fission
        name: operator fission
        category: graph
        inverse: operator_fusion
        description: Operator fission moves the later equations of a nest into a new nest with the same loops.
        preconditions: [equation_count, dependency]
        difficulty: {K: 2, P: 2, S: 0}
        match: {nest: "?N"}
        where: ["item_count(?N) >= 2", "not reorder_hazard(?N)"]
        params: {at: {range: [1, "item_count(?N) - 1"]}}
        rewrite: [{split_nest: {at: "?at"}}]
        cot: cot_loop_change.j2
        tests:
          - before: "% program: x\\n% input A: f32[4]\\n% output C: f32[4]\\nB^{4}_{tx=0}[D^{f32,g}_{tx}=A^{f32,g}_{tx}*2.0;C^{f32,g}_{tx}=D^{f32,g}_{tx}+1.0;];"
            after: "B^{4}_{tx=0}[D^{f32,g}_{tx}=A^{f32,g}_{tx}*2.0;];B^{4}_{tx=0}[C^{f32,g}_{tx}=D^{f32,g}_{tx}+1.0;];"
    """,
    # expression reorder: swap independent consecutive nests
    "expression_reorder": """
        id: expression_reorder
        name: expression reorder
        category: graph
        description: Expression reorder swaps two consecutive independent nests.
        preconditions: [dependency]
        difficulty: {K: 1, P: 3, S: 0}
        match: {nests: ["?n1", "?n2"]}
        where: ["not conflicts(?n1, ?n2)"]
        rewrite: [{swap_nests: ["?n1", "?n2"]}]
        cot: "{{ description }} {{ nests_before[0] }} <-> {{ nests_before[1] }}"
        tests:
          - before: "% program: x\\n% input A: f32[4]\\n% output C: f32[4]\\n% output G: f32[4]\\nB^{4}_{tx=0}[C^{f32,g}_{tx}=A^{f32,g}_{tx}*2.0;];B^{4}_{tx=0}[G^{f32,g}_{tx}=A^{f32,g}_{tx}+1.0;];"
            after: "B^{4}_{tx=0}[G^{f32,g}_{tx}=A^{f32,g}_{tx}+1.0;];B^{4}_{tx=0}[C^{f32,g}_{tx}=A^{f32,g}_{tx}*2.0;];"
    """,
    # loop parallelization: change a serial, non-reduction loop's kind
    "loop_parallelization": """
        id: loop_parallelization
        name: loop parallelization
        category: operator
        description: Loop parallelization runs the iterations of a serial spatial loop in parallel.
        preconditions: [reduction_axis]
        difficulty: {K: 1, P: 2, S: 0}
        match: {loop: "L^{?n}_{?i=0}"}
        where: ["not reduction_loop(?nest, ?pos)", "not reorder_hazard(?nest)"]
        rewrite: [{set_loop: {kind: P}}]
        cot: cot_loop_change.j2
        tests:
          - before: "% program: x\\n% input A: f32[4,8]\\n% output C: f32[4,8]\\nB^{4}_{tx=0}L^{8}_{a=0}[C^{f32,g}_{tx,a}=A^{f32,g}_{tx,a}*2.0;];"
            after: "B^{4}_{tx=0}P^{8}_{a=0}[C^{f32,g}_{tx,a}=A^{f32,g}_{tx,a}*2.0;];"
          - before: "% program: x\\n% input A: f32[4,8]\\n% output C: f32[4]\\nB^{4}_{tx=0}L^{8}_{a=0}[C^{f32,g}_{tx}=C^{f32,g}_{tx}+A^{f32,g}_{tx,a};];"
            no_match: true
    """,
}


@pytest.mark.parametrize("rid", sorted(YAML_ONLY))
def test_new_strategies_are_yaml_only(rid):
    from steptp.rules.selftest import run_rule_tests

    rule = load_rule_text(textwrap.dedent(YAML_ONLY[rid]), f"<{rid}>")
    for out in run_rule_tests(rule, verify=True):
        assert out.ok, out.message


def test_apply_rule_takes_a_loaded_rule_not_a_path():
    # the engine sits below the loader: a path is refused with a pointer to steptp.rules.load_rule
    from steptp.rules.loader import default_rules_dir

    r = RULES["loop_split"]
    m = parse_leir(r.tests[0].before)
    path = default_rules_dir() / "loop_split.yaml"
    for bad in (path, str(path), str(path).encode()):
        with pytest.raises(TypeError, match="load_rule"):
            apply_rule(bad, m)
    assert apply_rule(r, m, site=r.tests[0].site, params=r.tests[0].params).after.program
