"""The online-softmax family: the rule-language building blocks it needs (2-4 consecutive
nests, subscript-list splices, guarded previous-element reads, fresh tensors, the "only
writer/reader" relations, loop-list values), each tested on its own, then the six rules on
translated PyTorch programs through the CLI (apply + verify), and rule composition."""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

import pytest
from typer.testing import CliRunner

from steptp.backend.preflight import gpu_problems, loop_hazards
from steptp.backend.tvmscript import lower
from steptp.cli import app
from steptp.engine import apply_rule, find_sites
from steptp.engine import patterns as P
from steptp.engine.apply import NoMatch
from steptp.engine.egraph import analyze_relations
from steptp.engine.primitives import EvalContext, ValueExprError, eval_value
from steptp.leir import ast as A
from steptp.leir.analysis import analyze
from steptp.leir.fileformat import load_leir, parse_leir
from steptp.leir.parser import parse_expr
from steptp.leir.printer import format_expr, format_program
from steptp.rules import load_rule_text, load_rules
from steptp.verify import verify_pair

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
RULES_DIR = ROOT / "rules"
RULES = {r.id: r for r in load_rules()}
runner = CliRunner()

SOFTMAX = """% program: softmax
% input A: f32[4,16]
% output C: f32[4,16]
B^{4}_{tx=0}L^{16}_{a=0}[D^{f32,g}_{tx}=max(D^{f32,g}_{tx},A^{f32,g}_{tx,a});];
B^{4}_{tx=0}L^{16}_{a=0}[E^{f32,g}_{tx}=E^{f32,g}_{tx}+exp(A^{f32,g}_{tx,a}-D^{f32,g}_{tx});];
B^{4}_{tx=0}L^{16}_{a=0}[C^{f32,g}_{tx,a}=exp(A^{f32,g}_{tx,a}-D^{f32,g}_{tx})/E^{f32,g}_{tx};];
"""

FAMILY = ["normal_loop_max_to_prefix_max", "normal_loop_summation_on_exp_to_prefix_summation_on_exp",
          "online_softmax", "flashattention_wo_tiling", "normal_matmul_to_prefix_matmul_based_on_online_softmax",
          "partially_equivalent_then_correct"]


def _rule(text: str):
    return load_rule_text(textwrap.dedent(text), "<test>")


# ---------------------------------------------------------------- subscript-list splices


def test_splice_parses_matches_and_instantiates():
    pat = P.parse_expr_pattern("?X_{*?s,?a}")
    assert isinstance(pat.indices[0], P.PSplice) and P.metavar_sorts(pat)["s"] == P.LIST
    t = parse_expr("D^{f32,g}_{tx,c+1,a}")
    env = P.match_node(pat, t, {}, P.metavar_sorts(pat))
    assert env["s"] == (A.Index("tx"), parse_expr("c+1")) and env["a"] == A.Index("a")
    assert P.match_node(P.parse_expr_pattern("?X_{*?s}"), parse_expr("D^{f32,g}"), {}) == {
        "X": "D", "_w1": "f32", "_w2": "g", "s": ()}
    # a repeated list variable must bind the same entries (non-linear)
    two = P.parse_expr_pattern("?X_{*?s}+?Y_{*?s}")
    sorts = P.metavar_sorts(two)
    assert P.match_node(two, parse_expr("D^{f32,g}_{tx}+E^{f32,g}_{tx}"), {}, sorts) is not None
    assert P.match_node(two, parse_expr("D^{f32,g}_{tx}+E^{f32,g}_{a}"), {}, sorts) is None
    assert P.match_node(pat, parse_expr("D^{f32,g}"), {}, P.metavar_sorts(pat)) is None  # too short
    # templates splice anywhere; loops splice into a nest template
    tpl = P.parse_nest_pattern("*?L[?F^{f32,g}_{*?s,?a-1,*?s}=0.0;];")
    loops = (A.Loop("B", 4, "tx"), A.Loop("L", 8, "a"))
    nest = P.instantiate(tpl, {"L": loops, "F": "F", "s": (A.Index("tx"),), "a": "a"})
    assert nest.loops == loops and format_expr(nest.body[0].target) == "F^{f32,g}_{tx,a-1,tx}"
    with pytest.raises(P.TemplateError, match="list value"):
        P.instantiate(tpl, {"L": loops, "F": "F", "s": A.Index("tx"), "a": "a"})
    with pytest.raises(P.TemplateError, match="list of loops"):
        P.instantiate(tpl, {"L": (A.Index("tx"),), "F": "F", "s": (), "a": "a"})
    with pytest.raises(P.PatternError, match="one list splice"):
        P.to_sexp(P.parse_expr_pattern("?X_{*?s,*?t}"), {"s": P.LIST, "t": P.LIST}, [])
    with pytest.raises(P.PatternError, match="not supported here"):
        P.to_sexp(P.parse_expr_pattern("?X_{*?s,?a}"), {"s": P.LIST})


def _brute_force(pattern: str, module) -> list:
    pat = P.parse_expr_pattern(pattern)
    sorts = P.metavar_sorts(pat)
    hits = []
    for _, eq in module.program.equations():
        def walk(e):
            if P.match_node(pat, e, {}, sorts) is not None:
                hits.append(format_expr(e))
            if not isinstance(e, A.Tensor):
                for c in A.children(e):
                    walk(c)
        walk(eq.value)
    return sorted(hits)


@pytest.mark.parametrize("pattern", ["?X_{*?s,?k}", "?X_{?h,*?s}", "?X_{*?s,?i-1}", "?X_{?h,*?s,?k,?m}",
                                     "?X_{*?s}"])
@pytest.mark.parametrize("path", ["online.leir", "sdpa.leir", "conv_pair.leir"])
def test_egglog_splice_matching_agrees_with_python(pattern, path, tmp_path):
    if path == "online.leir":
        m = apply_rule(RULES["online_softmax"], parse_leir(SOFTMAX)).after
    else:
        m = load_leir(EXAMPLES / path)
    rule = _rule(f"""
        id: probe
        name: probe
        category: math
        description: probe
        preconditions: [pattern_match]
        difficulty: {{K: 1, P: 1, S: 0}}
        match:
          expr: "{pattern}"
        rewrite: "?site"
        cot: "x"
        tests:
          - before: |
              % program: p
              % input A: f32[2]
              % output C: f32[2]
              B^{{2}}_{{tx=0}}[C^{{f32,g}}_{{tx}}=A^{{f32,g}}_{{tx}};];
            no_match: true
        """)
    got = sorted(format_expr(dict(s.bindings)["site"]) for s in find_sites(rule, m))
    assert got == _brute_force(pattern, m)
    assert got or pattern in ("?X_{*?s,?i-1}", "?X_{?h,*?s,?k,?m}")


# ---------------------------------------------------------------- 2-4 consecutive nests


@pytest.mark.parametrize("k", [2, 3, 4])
def test_nests_scope_matches_every_run_of_k_consecutive_nests(k):
    m = load_leir(EXAMPLES / "sdpa.leir")
    names = [f'"?n{i}"' for i in range(k)]
    rule = _rule(f"""
        id: runs
        name: runs
        category: graph
        description: runs
        preconditions: []
        difficulty: {{K: 0, P: 1, S: 0}}
        match:
          nests: [{", ".join(names)}]
        rewrite:
          - remove_nest: "?n0"
        cot: "x"
        tests:
          - before: |
              % program: p
              % input A: f32[2]
              % output C: f32[2]
              B^{{2}}_{{tx=0}}[C^{{f32,g}}_{{tx}}=A^{{f32,g}}_{{tx}};];
            no_match: true
        """)
    n = len(m.program.nests)
    assert [s.nests for s in find_sites(rule, m)] == [tuple((i + j,) for j in range(k)) for i in range(n - k + 1)]


def test_nests_scope_rejects_five_nests():
    from steptp.rules import RuleError

    with pytest.raises(RuleError, match="match.nests"):
        _rule("""
            id: five
            name: five
            category: graph
            description: five
            preconditions: []
            difficulty: {K: 0, P: 1, S: 0}
            match:
              nests: ["?a", "?b", "?c", "?d", "?e"]
            rewrite:
              - remove_nest: "?a"
            cot: "x"
            tests: []
            """)


# ---------------------------------------------------------------- relations


def test_only_writer_reader_and_reduction_axis_relations():
    m = parse_leir("""% program: p
% input A: f32[4,8]
% output C: f32[4]
B^{4}_{tx=0}L^{8}_{a=0}[D^{f32,g}_{tx}=max(D^{f32,g}_{tx},A^{f32,g}_{tx,a});];
B^{4}_{tx=0}L^{8}_{a=0}[D^{f32,g}_{tx}=D^{f32,g}_{tx}+A^{f32,g}_{tx,a};];
B^{1}_{tx=0}L^{4}_{a=0}L^{8}_{c=0}[E^{f32,g}_{tx}=E^{f32,g}_{tx}+A^{f32,g}_{a,c};];
B^{4}_{tx=0}[C^{f32,g}_{tx}=D^{f32,g}_{tx}+E^{f32,g}_{0};];
""")
    rel = analyze_relations(m, ["other_writer", "other_reader", "other_reduction_axis", "loop_of", "tl_last"])
    assert sorted(map(tuple, rel["other_writer"])) == [("D", 0), ("D", 1)]
    # A is read by equations 0, 1, 2; D by 0, 1, 3; E by 2, 3
    assert {(x, e) for x, e in rel["other_reader"]} == {("A", 0), ("A", 1), ("A", 2), ("D", 0), ("D", 1),
                                                       ("D", 3), ("E", 2), ("E", 3)}
    assert sorted(map(tuple, rel["other_reduction_axis"])) == [(2, "a"), (2, "c")]
    assert [2, "c", 8, "L"] in rel["loop_of"] and [0, "tx", 4, "B"] in rel["loop_of"]
    assert [(A.Index("tx"), A.Index("a")), (A.Index("tx"),), A.Index("a")] in rel["tl_last"]


# ---------------------------------------------------------------- value functions


def test_loop_list_and_term_value_functions():
    m = load_leir(EXAMPLES / "sdpa.leir")
    from steptp.engine.primitives import NestRef

    ctx = EvalContext(m, {"N": NestRef((5,)), "t": parse_expr("D^{f32,g}_{tx,a,f,d}"),
                          "s": (A.Index("d"), A.Index("f")), "n": 3})
    loops = eval_value("loops_of(?N)", ctx)
    assert [l.var for l in eval_value("loops_without(loops_of(?N), f)", ctx)] == ["tx", "a", "c", "d"]
    assert [l.var for l in eval_value("loops_used_by(loops_of(?N), ?s)", ctx)] == ["d", "f"]
    assert [l.var for l in eval_value("loops_unused_by(loops_of(?N), ?s)", ctx)] == ["tx", "a", "c"]
    assert [l.extent for l in eval_value("set_extent(loops_of(?N), d, ?n * 2)", ctx)] == [2, 2, 8, 6, 8]
    assert len(loops) == 5
    # simultaneous: d and f swap without capture
    assert format_expr(eval_value("subst_index(?t, f, d, d, f)", ctx)) == "D^{f32,g}_{tx,a,d,f}"
    assert format_expr(eval_value("subst_index(?t, d, shifted(d, ?n))", ctx)) == "D^{f32,g}_{tx,a,f,d+3}"
    assert eval_value("subst_index(?s, d, shifted(d, 0))", ctx) == (A.Index("d"), A.Index("f"))
    assert format_expr(eval_value("shifted(d, 0 - 2)", ctx)) == "d-2"
    for bad, msg in [("loops_without(loops_of(?N), zz)", "no loop with index"),
                     ("set_extent(loops_of(?N), d, 0)", "positive"), ("subst_index(?t, d)", "pairs"),
                     ("loops_without(?s, d)", "loop list")]:
        with pytest.raises(ValueExprError, match=msg):
            eval_value(bad, ctx)


# ---------------------------------------------------------------- guarded recurrences


def test_guarded_recurrence_semantics_lowering_and_gpu_preflight():
    out = apply_rule(RULES["online_softmax"], parse_leir(SOFTMAX)).after
    info = analyze(out.program, out.signature)
    rec = [s for s in info.equations if s.inst.eq.target.name in ("F", "G")]
    # a guarded read of the previous element is not an accumulation: no implicit init, no reduction axis
    assert rec and all(s.init is None and s.reduction_axes == () for s in rec)
    assert info.shapes["F"] == (4, 16) and info.shapes["G"] == (4, 16)
    cpu = lower(out, target="cpu")
    assert "T.init()" not in cpu and "T.if_then_else" in cpu
    assert loop_hazards(out.program, out.signature, info) == []
    assert gpu_problems(out) == []
    from steptp.backend.build import cuda_source

    src = cuda_source(lower(out, target="cuda"))
    assert "threadIdx.x" in src and re.search(r"if \(a < 1\)", src)


def test_guarded_read_on_a_parallel_recurrence_axis_is_rejected():
    out = apply_rule(RULES["online_softmax"], parse_leir(SOFTMAX)).after
    text = format_program(out.program).replace("L^{16}_{a=0}[F", "P^{16}_{a=0}[F", 1)
    bad = parse_leir("\n".join(SOFTMAX.splitlines()[:3]) + "\n" + text + "\n")
    assert any("F" in h for h in loop_hazards(bad.program, bad.signature, analyze(bad.program, bad.signature)))


# ---------------------------------------------------------------- the rules


def test_family_rules_are_shipped_with_positive_and_no_match_tests():
    for rid in FAMILY:
        r = RULES[rid]
        assert (r.category, r.level) == ("math", "difficult"), rid
        pos = [t for t in r.tests if not t.no_match]
        assert len(pos) >= 2 and any(t.no_match for t in r.tests), rid
        assert r.difficulty["K"] == len(r.preconditions)


def test_online_softmax_matches_on_structure_not_names():
    """Renaming every tensor and index keeps exactly one site; the rewrite is the same up to names."""
    m = parse_leir(SOFTMAX)
    ren = SOFTMAX.replace("D^", "Xq^").replace("E^", "Mz^").replace("_{tx", "_{txb").replace("tx=0", "txb=0")
    ren = ren.replace(",a}", ",w}").replace("_{a=0}", "_{w=0}")
    m2 = parse_leir(ren)
    assert len(find_sites(RULES["online_softmax"], m)) == 1 == len(find_sites(RULES["online_softmax"], m2))
    a = format_program(apply_rule(RULES["online_softmax"], m).after.program)
    b = format_program(apply_rule(RULES["online_softmax"], m2).after.program)
    back = {"txb": "tx", ",w": ",a", "w-1": "a-1", "w=0": "a=0", "D^": "F^", "E^": "G^"}  # fresh names D, E there
    for k, v in back.items():
        b = b.replace(k, v)
    assert b == a


def test_online_softmax_needs_the_implicit_initialisation():
    """A max buffer written by an earlier nest accumulates onto it: not a softmax site."""
    pre = SOFTMAX.replace("% output C: f32[4,16]\n",
                          "% output C: f32[4,16]\nB^{4}_{tx=0}[D^{f32,g}_{tx}=0.0;];\n")
    with pytest.raises(NoMatch):
        apply_rule(RULES["online_softmax"], parse_leir(pre))


def stp(*args):
    return runner.invoke(app, [str(a) for a in args])


def _translate(tmp_path, name: str, dtype: str) -> Path:
    out = tmp_path / f"{name}_{dtype}.leir"
    if dtype == "f32":
        return EXAMPLES / f"{name}.leir"
    res = stp("translate", EXAMPLES / f"{name}.py", "-o", out, "--dtype", dtype)
    assert res.exit_code == 0, res.output
    return out


#: (rule, translated example, dtype, rule applied first)
ACCEPTANCE = [
    ("online_softmax", "softmax_3d", "f32", None),
    ("online_softmax", "softmax", "f16", None),
    ("normal_loop_max_to_prefix_max", "max_reduction", "f64", None),
    ("normal_loop_summation_on_exp_to_prefix_summation_on_exp", "log_softmax", "f32", None),
    ("flashattention_wo_tiling", "sdpa", "f32", None),
    ("normal_matmul_to_prefix_matmul_based_on_online_softmax", "sdpa", "f64", "online_softmax"),
    ("partially_equivalent_then_correct", "conv_pair", "f32", None),
]


@pytest.mark.parametrize("rule,name,dtype,pre", ACCEPTANCE, ids=[f"{r}-{n}-{d}" for r, n, d, _ in ACCEPTANCE])
def test_cli_apply_and_verify_on_translated_programs(tmp_path, rule, name, dtype, pre):
    src = _translate(tmp_path, name, dtype)
    inp = src
    if pre:
        inp = tmp_path / "pre.leir"
        assert stp("apply", RULES_DIR / f"{pre}.yaml", src, "-o", inp).exit_code == 0
    out = tmp_path / "out.leir"
    res = stp("apply", RULES_DIR / f"{rule}.yaml", inp, "-o", out)
    assert res.exit_code == 0, res.output
    assert f"{dtype}," in out.read_text()
    res = stp("verify", src, out)
    assert res.exit_code == 0 and "Equal  pass" in res.output, res.output


def test_results_are_valid_input_for_further_rules():
    """online softmax -> loop split of the recurrence axis; flash attention -> operator fusion of
    the scaling nest into the recurrence -> set storage scope (local) of the scaled scores."""
    m = parse_leir(SOFTMAX)
    on = apply_rule(RULES["online_softmax"], m).after
    split = apply_rule(RULES["loop_split"], on, site={"nest": [0], "loop": 1}, params={"f": 4}).after
    assert "F^{f32,g}_{tx,c*4+d-1}" in format_program(split.program)
    assert verify_pair(m, split).ok
    sd = load_leir(EXAMPLES / "sdpa.leir")
    fl = apply_rule(RULES["flashattention_wo_tiling"], sd).after
    fused = apply_rule(RULES["operator_fusion"], fl).after
    local = apply_rule(RULES["set_storage_scope"], fused, site={"tensor": "G"}, params={"s": "l"}).after
    assert "G^{f32,l}" in format_program(local.program)
    res = verify_pair(sd, local)
    assert res.ok, res.reason


def test_rules_do_not_fire_on_their_own_output():
    """No rule of the family matches the recurrence it produced (no rewrite loops)."""
    on = apply_rule(RULES["online_softmax"], parse_leir(SOFTMAX)).after
    for rid in FAMILY:
        if rid != "normal_matmul_to_prefix_matmul_based_on_online_softmax":
            assert find_sites(RULES[rid], on) == [], rid
