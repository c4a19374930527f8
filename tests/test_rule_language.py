"""The generic rule-language pieces of issue 7 (part A), each on its own: list splices in
patterns and templates, value functions (lists, loops, shapes, GPU facts, counts),
quantifying preconditions (``not ( ... and ... )`` with existential variables, reader /
writer counts, ``{check: ...}``), ``set_loops`` / ``replace_all in_subscripts``, the GPU
preflight inside ``apply_rule``, per-rule matching schedules and the staged join plan,
and the ``stp rules list / lint / coverage`` commands; plus a brand-new rule written to a
temporary directory and applied with ``stp apply`` (no Python change)."""

import textwrap
from pathlib import Path

import pytest
from typer.testing import CliRunner

from steptp.cli import app
from steptp.engine import NoMatch, PreflightRejected, apply_rule, find_sites, list_candidates
from steptp.engine import match as M
from steptp.engine import patterns as P
from steptp.engine.primitives import EvalContext, NestRef, ValueExprError, eval_value
from steptp.leir import ast as A
from steptp.leir import load_leir, parse_leir
from steptp.leir.printer import format_program
from steptp.rules import load_rule_text, load_rules
from steptp.rules.tools import PAPER_STRATEGIES, coverage, format_coverage, merge_programs, replicate

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
runner = CliRunner()

GEMM = """% program: gemm
% input A: f32[8,12]
% param W: f32[12,16]
% output C: f32[8,16]
B^{8}_{tx=0}L^{16}_{a=0}L^{12}_{c=0}[C^{f32,g}_{tx,a}=C^{f32,g}_{tx,a}+A^{f32,g}_{tx,c}*W^{f32,g}_{c,a};];
"""

TWO = """% program: two
% input A: f32[4,8]
% output C: f32[4,8]
B^{4}_{tx=0}L^{8}_{a=0}[D^{f32,g}_{tx,a}=A^{f32,g}_{tx,a}*2.0;];
B^{4}_{tx=0}L^{8}_{a=0}B^{2}_{ty=0}[E^{f32,g}_{tx,a,ty}=D^{f32,g}_{tx,a}+1.0;];
B^{4}_{tx=0}L^{8}_{a=0}[C^{f32,g}_{tx,a}=E^{f32,g}_{tx,a,0}+E^{f32,g}_{tx,a,1}+D^{f32,g}_{tx,a};];
"""


def ev(text, module, **env):
    return eval_value(text, EvalContext(module, env))


def rule(body: str, rid: str = "probe"):
    head = (f"id: {rid}\nname: probe\ncategory: operator\ndescription: probe rule\npreconditions: []\n"
            "difficulty: {K: 0, P: 1, S: 0}\ncot: \"{{ description }}\"\n")
    tests = ("tests:\n  - before: |\n      % program: t\n      % input A: f32[4]\n      % output C: f32[4]\n"
             "      B^{4}_{tx=0}[C^{f32,g}_{tx}=A^{f32,g}_{tx};];\n    no_match: true\n")
    return load_rule_text(head + textwrap.dedent(body) + tests, f"<{rid}>")


# ---------------------------------------------------------------- splices

def test_subscript_splice_parses_matches_and_instantiates():
    pat = P.parse_equation_pattern("?X^{?d,?s}_{*?S}=?X^{?d,?s}_{*?S}+?v")
    assert P.metavar_sorts(pat)["S"] == "TL"
    eq = parse_leir(GEMM).program.nests[0].body[0]
    env = P.match_node(pat, eq, {}, P.metavar_sorts(pat))
    assert env["S"] == (A.Index("tx"), A.Index("a")) and env["X"] == "C"
    tpl = P.parse_expr_pattern("?R^{f32,g}_{*?S,?k}")
    got = P.instantiate(tpl, {**env, "R": "D", "k": "c"})
    assert got == A.Tensor("D", "f32", "g", (A.Index("tx"), A.Index("a"), A.Index("c")))
    # entries after a splice are matched from the end through tl_last atoms
    with pytest.raises(P.PatternError, match="not supported here"):
        P.to_sexp(P.parse_expr_pattern("?X_{*?S,tx}"), {})
    aux: list = []
    P.to_sexp(P.parse_expr_pattern("?X_{*?S,tx}"), {}, aux)
    assert len(aux) == 1 and aux[0].startswith("(tl_last ")


def test_loop_splice_in_loops_and_nest_templates():
    m = parse_leir(GEMM)
    loops = m.program.nests[0].loops
    tpl = P.parse_loops_pattern("*?pre L^{4}_{?i=0} *?post")
    got = P.instantiate(tpl, {"pre": loops[:1], "post": loops[2:], "i": "d"})
    assert got == (loops[0], A.Loop("L", 4, "d"), loops[2])
    nest = P.instantiate(P.parse_nest_pattern("*?L[C^{f32,g}_{tx}=1.0;];"), {"L": loops[:1]})
    assert nest.loops == loops[:1]
    with pytest.raises(P.TemplateError, match="loop list"):
        P.instantiate(tpl, {"pre": (A.Index("a"),), "post": (), "i": "d"})


def test_splice_in_an_egglog_match_binds_the_subscript_list():
    r = rule("""
        match:
          equation: "?X^{?d,?s}_{*?S}=?X^{?d,?s}_{*?S}+?v"
        where:
          - {check: "len(?S) == 2"}
        rewrite:
          - replace: "?X^{?d,?s}_{*?S}=?X^{?d,?s}_{*?S}+?v*2.0"
        """)
    sites = find_sites(r, parse_leir(GEMM))
    assert len(sites) == 1 and sites[0].env["S"] == (A.Index("tx"), A.Index("a"))


# ---------------------------------------------------------------- value functions

def test_list_and_loop_value_functions():
    m = parse_leir(GEMM)
    N = NestRef((0,))
    L = m.program.nests[0].loops
    assert ev("loops_of(?N)", m, N=N) == L
    assert ev("drop(loops_of(?N), 1)", m, N=N) == (L[0], L[2])
    assert ev("slice(loops_of(?N), 1, 3)", m, N=N) == L[1:]
    assert ev("replace_at(loops_of(?N), 2, with_extent(loop(?N, 2), 3))", m, N=N)[2] == A.Loop("L", 3, "c")
    assert ev("insert_at(loops_of(?N), 0, with_kind(loop(?N, 1), U))", m, N=N)[0] == A.Loop("U", 16, "a")
    assert ev("with_index(loop(?N, 1), d)", m, N=N) == A.Loop("L", 16, "d")
    assert ev("kind_of(?N, 0)", m, N=N) == "B" and ev("index_of(?N, 2)", m, N=N) == "c"
    assert ev("axis_of(?N, 0)", m, N=N) == "tx" and ev("axis_of(?N, 1)", m, N=N) == ""
    assert ev("indices_of(loops_of(?N))", m, N=N) == ("tx", "a", "c")
    assert ev("loop_pos(?N, c)", m, N=N) == 2 and ev("loop_pos(?N, q)", m, N=N) == -1
    assert ev("len(loops_of(?N))", m, N=N) == 3 and ev("item(loops_of(?N), -1)", m, N=N) == L[2]
    assert ev("contains(indices_of(loops_of(?N)), a)", m, N=N) is True
    assert ev("not contains(indices_of(loops_of(?N)), q)", m, N=N) is True
    with pytest.raises(ValueExprError, match="drop: position 5"):
        ev("drop(loops_of(?N), 5)", m, N=N)


def test_term_functions_free_indices_and_only_in():
    m = parse_leir(GEMM)
    eq = m.program.nests[0].body[0]
    N = NestRef((0,))
    assert ev("free_indices(?t)", m, t=eq.value) == ("tx", "a", "c")
    assert ev("subscripts_of(?t)", m, t=eq.target) == (A.Index("tx"), A.Index("a"))
    assert ev("keep_loops(loops_of(?N), free_indices(subscripts_of(?t)))", m, N=N, t=eq.target) == \
        m.program.nests[0].loops[:2]
    assert ev("tensors_of(?t)", m, t=eq.value) == ("C", "A", "W")
    split = parse_leir(GEMM.replace("L^{16}_{a=0}", "L^{4}_{d=0}L^{4}_{f=0}").replace("_{tx,a}", "_{tx,d*4+f}")
                       .replace("_{c,a}", "_{c,d*4+f}"))
    env = {"N": N, "o": "d", "f": 4, "i": "f"}
    assert ev('index_only_in(?N, ?o, "?o*?f+?i")', split, **env) is True
    assert ev('index_only_in(?N, c, "?o*?f+?i")', split, **env) is False


def test_shape_rank_and_counts():
    m = parse_leir(TWO)
    assert ev("shape_of(A, 1)", m) == 8 and ev("rank_of(A)", m) == 2
    assert ev("shape_of(E, 2)", m) == 2 and ev("rank_of(E)", m) == 3       # inferred intermediate
    assert ev("readers(D)", m) == 2 and ev("writers(D)", m) == 1 and ev("readers(C)", m) == 0
    with pytest.raises(ValueExprError, match="no dimension 3"):
        ev("shape_of(A, 3)", m)


def test_value_functions_are_defined_once():
    from steptp.engine import signs as SG
    from steptp.engine import tiling as TL
    from steptp.engine import values as V
    from steptp.engine.primitives import VALUE_FUNCTIONS

    # every value function lives in values.py (the GPU tiling ones in tiling.py, the floating-point
    # ones in signs.py) and is the registered one
    assert VALUE_FUNCTIONS == {**V.LANGUAGE_FUNCTIONS, **TL.TILING_FUNCTIONS, **SG.SIGN_FUNCTIONS} \
        and len(VALUE_FUNCTIONS) == 98
    assert not set(V.LANGUAGE_FUNCTIONS) & set(TL.TILING_FUNCTIONS)
    assert not (set(V.LANGUAGE_FUNCTIONS) | set(TL.TILING_FUNCTIONS)) & set(SG.SIGN_FUNCTIONS)
    assert all(fn.__module__ in ("steptp.engine.values", "steptp.engine.tiling", "steptp.engine.signs")
               for _, fn in VALUE_FUNCTIONS.values())
    from steptp.engine.domains import register_value_functions  # the one registration of all three

    with pytest.raises(RuntimeError, match="defined twice: rank_of"):
        register_value_functions({"rank_of": (1, lambda ctx, x: 0)})
    with pytest.raises(RuntimeError, match="defined twice: provably"):
        register_value_functions({"provably": (-1, lambda ctx, *a: 0)})


def test_gpu_value_functions():
    m = parse_leir(TWO)
    assert ev("bound_axes(?N)", m, N=NestRef((1,))) == ("tx", "ty")
    assert ev("bound_axes(?N)", m, N=NestRef((0,))) == ("tx",)
    assert ev("threads_per_block(?N)", m, N=NestRef((1,))) == 8
    assert ev("axis_limit(tz)", m) == 64 and ev("axis_limit(by)", m) == 65535
    assert ev("is_thread_axis(ty)", m) is True and ev("is_thread_axis(bx)", m) is False
    assert ev("max_threads_per_block()", m) == 1024


def test_block_fusion_value_functions():
    m = parse_leir("% program: rows\n% input A: f32[4,8]\n% output C: f32[4,8]\n% output F: f32[4]\n"
                   "B^{4}_{bxa=0}B^{8}_{tya=0}[J^{f32,g}_{bxa}=J^{f32,g}_{bxa}+A^{f32,g}_{bxa,tya};];\n"
                   "B^{4}_{bxa=0}B^{8}_{tya=0}[C^{f32,g}_{bxa,tya}=A^{f32,g}_{bxa,tya}-J^{f32,g}_{bxa};];\n"
                   "B^{4}_{bxa=0}B^{4}_{tya=0}[F^{f32,g}_{bxa}=F^{f32,g}_{bxa}+J^{f32,g}_{tya};];\n")
    n0, n1, n2 = (NestRef((k,)) for k in range(3))
    assert [lp.var for lp in ev("block_prefix(loops_of(?N))", m, N=n0)] == ["bxa"]
    assert ev("handoff(?a, ?b)", m, a=n0, b=n1) == ("J",) and ev("handoff(?a, ?b)", m, a=n1, b=n0) == ()
    assert ev("used_outside(handoff(?a, ?b), ?a, ?b)", m, a=n0, b=n1) is True     # nest 2 reads J too
    assert ev("used_outside(handoff(?a, ?b), ?a, ?b)", m, a=n1, b=n2) is False    # nothing handed over
    assert ev("sliced_by(?a, ?b, indices_of(block_prefix(loops_of(?a))))", m, a=n0, b=n1) is True
    assert ev("sliced_by(?a, ?b, indices_of(block_prefix(loops_of(?a))))", m, a=n1, b=n2) is True
    # block bxa of nest 2 reads J at every row (J_{tya}): not inside its own slice
    m2 = parse_leir("% program: rows\n% input A: f32[4,8]\n% output F: f32[4]\n"
                    "B^{4}_{bxa=0}B^{8}_{tya=0}[J^{f32,g}_{bxa}=J^{f32,g}_{bxa}+A^{f32,g}_{bxa,tya};];\n"
                    "B^{4}_{bxa=0}B^{4}_{tya=0}[F^{f32,g}_{bxa}=F^{f32,g}_{bxa}+J^{f32,g}_{tya};];\n")
    assert ev("sliced_by(?a, ?b, indices_of(block_prefix(loops_of(?a))))", m2, a=n0, b=n1) is False
    assert ev("threads_agree(?a, ?b)", m, a=n0, b=n1) is True
    assert ev("threads_agree(?a, ?b)", m, a=n1, b=n2) is False


# ---------------------------------------------------------------- quantifying preconditions

def test_not_group_with_existential_variable_no_later_reader():
    r = rule("""
        match:
          nest: "?N"
        where:
          - "writes(?N, ?X)"
          - "not (before(?N, ?M) and reads(?M, ?X))"
        rewrite:
          - set_loop: {pos: 0, kind: B}
        """)
    cr = M.compile_rule(r)
    assert "M" not in cr.columns and "anon_ex0_M" in cr.text
    got = {(s.nest, s.env["X"]) for s in find_sites(r, parse_leir(TWO))}
    assert got == {((2,), "C")}        # D and E are read by a later nest


def test_reader_and_writer_counts_in_where():
    r = rule("""
        match:
          tensor: "?X"
        where:
          - "intermediate(?X)"
          - "reader_count(?X) >= 2"
          - "writer_count(?X) == 1"
        rewrite:
          - set_scope: {tensor: "?X", scope: l}
        """)
    assert [s.tensor for s in find_sites(r, parse_leir(TWO))] == ["D"]


def test_check_clause_filters_sites_and_must_be_bound():
    r = rule("""
        match:
          loop: "L^{?n}_{?i=0}"
        where:
          - {check: "?n >= 12 and not contains(bound_axes(?nest), ty)"}
        rewrite:
          - set_loop: {kind: U}
        """)
    assert [(s.nest, s.loop) for s in find_sites(r, parse_leir(GEMM))] == [((0,), 1), ((0,), 2)]
    with pytest.raises(Exception, match="where\\[0\\].check: unbound"):
        rule("""
            match:
              loop: "L^{?n}_{?i=0}"
            where:
              - {check: "?zz > 1"}
            rewrite:
              - set_loop: {kind: U}
            """, "probe2")


# ---------------------------------------------------------------- primitives

def test_set_loops_and_replace_all_in_subscripts():
    r = rule("""
        match:
          loop: "L^{?n}_{?i=0}"
        where:
          - "?pos == 1"
        let:
          rest: "drop(loops_of(?nest), ?pos)"
        fresh:
          j: {index: {kind: L}}
        rewrite:
          - replace_all: {pattern: "?i", with: "?j", nest: "?nest", in_subscripts: true}
          - set_loops: "L^{?n}_{?j=0} *?rest"
        """)
    step = apply_rule(r, parse_leir(GEMM))
    assert format_program(step.after.program) == \
        "L^{16}_{d=0}B^{8}_{tx=0}L^{12}_{c=0}[C^{f32,g}_{tx,d}=C^{f32,g}_{tx,d}+A^{f32,g}_{tx,c}*W^{f32,g}_{c,d};];"


# ---------------------------------------------------------------- GPU preflight inside apply_rule

BIG_BIND = """% program: wide
% input A: f32[64,32]
% output C: f32[64,32]
B^{64}_{tx=0}L^{32}_{a=0}[C^{f32,g}_{tx,a}=A^{f32,g}_{tx,a}*2.0;];
"""


def test_rewrite_failing_the_gpu_preflight_is_rejected_and_not_listed():
    # binds the loop to threadIdx.y without a threads-per-block precondition: 64*32 = 2048 threads
    r = rule("""
        match:
          loop: "L^{?n}_{?i=0}"
        fresh:
          t: {index: {kind: B, prefix: ty}}
        rewrite:
          - set_loop: {kind: B, var: "?t"}
        """, "careless_bind")
    m = parse_leir(BIG_BIND)
    assert len(list_candidates(r, m)) == 1
    with pytest.raises(PreflightRejected, match="2048 threads per block"):
        apply_rule(r, m, site=0)
    with pytest.raises(NoMatch, match="GPU preflight"):
        apply_rule(r, m)
    with pytest.raises(NoMatch, match="rejected"):
        list_candidates(r, m, check=True)
    # the shipped loop_binding states the limits as preconditions: ty is not offered here
    lb = {x.id: x for x in load_rules()}["loop_binding"]
    axes = {p["ax"] for _, p in list_candidates(lb, m)}
    assert axes == {"bx", "by", "bz"}          # ty and tz would give 64*32 = 2048 threads per block


def test_every_listed_candidate_of_the_new_rules_applies_on_the_examples():
    rules = [r for r in load_rules() if r.id in ("loop_binding", "loop_parallelization", "loop_vectorization",
                                                  "loop_fusion", "loop_tiling", "loop_unrolling",
                                                  "reduction_factorization")]
    for p in ("gemm_relu.leir", "softmax.leir", "mean_reduction.leir"):
        m = load_leir(EXAMPLES / p)
        for r in rules:
            try:
                cands = list_candidates(r, m)
            except NoMatch:
                continue
            for s, params in cands[:6]:
                apply_rule(r, m, site=s, params=params)   # raises if invalid or not GPU-legal


# ---------------------------------------------------------------- matching: schedules and staging

def test_each_rule_runs_in_its_own_schedule():
    rules = load_rules()
    m = M.Matcher(rules)
    prog = load_leir(EXAMPLES / "softmax.leir")
    m.sites_of(rules[0], prog)
    assert list(m.timings["rule_ms"]) == [rules[0].id]       # no other rule was run
    m.sites_of(rules[1], prog)
    assert set(m.timings["rule_ms"]) == {rules[0].id, rules[1].id}
    # same sites as one rule per fresh matcher
    for r in rules:
        assert m.sites_of(r, prog) == M.Matcher([r]).sites_of(r, prog)


MANY = """
match:
  nests: ["?n1", "?n2"]
where:
  - "nest_next(?n2, ?n3)"
  - "item_count(?n1) == 1"
  - "item_count(?n2) == 1"
  - "item_count(?n3) == 1"
  - "loop_count(?n1) == loop_count(?n2)"
  - "eq_at(?n1, 0, ?e1)"
  - "eq_at(?n2, 0, ?e2)"
  - "eq_at(?n3, 0, ?e3)"
  - "writes_at(?e1, ?X, ?l1)"
  - "reads_at(?e2, ?X, ?l2)"
  - "writes_at(?e2, ?Y, ?l3)"
  - "reads_at(?e3, ?Y, ?l4)"
  - "intermediate(?X)"
  - "intermediate(?Y)"
rewrite:
  - swap_nests: ["?n1", "?n2"]
"""


def test_many_clause_precondition_scales_and_costs_only_itself():
    """A 14-clause precondition over three consecutive nests (joined in egglog stages) on a
    4x replicated program: four times the sites, and asking another rule afterwards does
    not run it again (each rule has its own schedule). Its speed is a figure of
    benchmarks/bench_matching.py (the many-clause probe), not an assertion here."""
    r = rule(MANY, "many")
    assert "(relation stg1__many" in M.compile_rule(r).text
    prog = merge_programs([load_leir(p) for p in sorted(EXAMPLES.glob("*.leir"))])
    n_small = len(M.Matcher([r]).sites_of(r, prog))
    big = replicate(prog, 4)
    other = {x.id: x for x in load_rules()}["logsimp"]
    m = M.Matcher([r, other])
    m._load(big)
    sites = m.sites_of(r, big)
    assert len(sites) == 4 * n_small and n_small > 0
    many_ms = m.timings["rule_ms"]["many"]
    m.sites_of(other, big)
    assert set(m.timings["rule_ms"]) == {"many", "logsimp"}
    assert m.timings["rule_ms"]["many"] == many_ms  # not run again


def test_replicate_and_merge_give_valid_programs():
    from steptp.leir.analysis import analyze

    mods = [load_leir(EXAMPLES / "softmax.leir"), load_leir(EXAMPLES / "gemm_relu.leir")]
    merged = merge_programs(mods)
    analyze(merged.program, merged.signature)
    assert len(merged.program.nests) == 6
    big = replicate(merged, 3)
    analyze(big.program, big.signature)
    assert len(big.program.nests) == 18 and len(big.signature.tensors) == 3 * len(merged.signature.tensors)


# ---------------------------------------------------------------- CLI

def stp(*args):
    return runner.invoke(app, [str(a) for a in args])


def test_rules_list_prints_difficulty_columns():
    res = stp("rules", "list")
    assert res.exit_code == 0, res.output
    lines = res.output.splitlines()
    assert lines[0].split() == ["id", "category", "K", "P", "S", "score", "level"]
    row = next(l for l in lines if l.startswith("loop_tiling "))
    assert row.split() == ["loop_tiling", "operator", "2", "4", "2", "3.7", "difficult"]


def test_rules_lint_passes_and_reports_cost(tmp_path):
    res = stp("rules", "lint", "--program", EXAMPLES / "softmax.leir", "--nests", "24")
    assert res.exit_code == 0, res.output
    assert "rule file(s) load and validate" in res.output and "scaled to 24 nests" in res.output


def test_match_cost_counts_sites_or_candidates():
    from steptp.engine import find_sites, list_candidates
    from steptp.rules import load_rule
    from steptp.rules.tools import match_cost

    m = load_leir(EXAMPLES / "softmax.leir")
    rule = load_rule(ROOT / "rules" / "loop_split.yaml")
    sites = match_cost([rule], m, repeat=1)
    cands = match_cost([rule], m, repeat=1, candidates=True)
    assert sites["counts"]["loop_split"] == len(find_sites(rule, m)) > 0
    assert cands["counts"]["loop_split"] == len(list_candidates(rule, m)) > sites["counts"]["loop_split"]
    assert cands["total_ms"] >= cands["load_ms"] and cands["rules"]["loop_split"] > 0


def test_rules_lint_warns_about_a_slow_rule(tmp_path):
    p = tmp_path / "slowish.yaml"
    p.write_text(textwrap.dedent("""
        id: slowish
        name: slowish
        category: graph
        description: quadratic join over all pairs of equations and subterms
        preconditions: []
        difficulty: {K: 0, P: 1, S: 0}
        match:
          nest: "?N"
        where:
          - "any_sub(?e1, ?t)"
          - "any_sub(?e2, ?t)"
          - "any_sub(?e3, ?t)"
        rewrite:
          - set_loop: {pos: 0, kind: B}
        cot: "x"
        tests:
          - before: |
              % program: t
              % input A: f32[4]
              % output C: f32[4]
              L^{4}_{a=0}[C^{f32,g}_{a}=A^{f32,g}_{a};];
            no_match: true
        """))
    res = stp("rules", "lint", p, "--program", EXAMPLES / "softmax.leir", "--nests", "12", "--slow-ms", "1",
              "--strict")
    assert res.exit_code == 1 and "warning: slowish: matching" in res.output


def test_rules_coverage_on_a_small_input(tmp_path):
    (tmp_path / "gemm.leir").write_text(GEMM)
    rl = [str(Path(r.path)) for r in load_rules() if r.id in ("loop_tiling", "loop_unrolling", "logsimp")]
    res = stp("rules", "coverage", tmp_path, *sum((["--rule", x] for x in rl), []), "--per-program", "1",
              "--trials", "1")
    assert res.exit_code == 0, res.output
    lines = res.output.splitlines()
    row = next(l for l in lines if l.startswith("loop_tiling "))
    # 1 program; (tx,a): 2 x 3 factor pairs + (a,c): 3 x 4 = 18 candidates; 1 tried, 1 Equal
    assert row.split()[1:5] == ["1", "18", "1", "1"]
    assert next(l for l in lines if l.startswith("logsimp ")).split()[1:3] == ["0", "0"]
    assert lines[-1] == "strategies with a verified transformation: 2/43"
    assert len(PAPER_STRATEGIES) == 43


def test_coverage_reports_first_failure():
    r = rule("""
        match:
          expr: "?a*2.0"
        rewrite: "?a*2.5"
        """, "wrong_constant")
    rows = coverage([r], [parse_leir(BIG_BIND)], per_program=1, trials=1)
    assert rows[0].tried == 1 and rows[0].equal == 0 and rows[0].first_failure
    assert "0/43" in format_coverage(rows)


def test_a_brand_new_rule_from_a_temporary_directory(tmp_path):
    """Not one of the 43: sqrt(a*a) -> abs(a), written as YAML and applied with stp apply."""
    (tmp_path / "sqrt_of_square.yaml").write_text(textwrap.dedent("""
        id: sqrt_of_square
        name: sqrt of square
        category: math
        description: The square root of a square is the absolute value, sqrt(a*a) = |a|.
        preconditions: [pattern_match]
        difficulty: {K: 1, P: 1, S: 0}
        match:
          expr: "sqrt(?a*?a)"
        rewrite: "abs(?a)"
        cot: |
          {{ description }}
          '{{ site_before }}' becomes '{{ site_after }}' in '{{ equation_after }}'.
        tests:
          - before: |
              % program: norm
              % input A: f32[4,8]
              % output C: f32[4,8]
              B^{4}_{tx=0}L^{8}_{a=0}[C^{f32,g}_{tx,a}=sqrt(A^{f32,g}_{tx,a}*A^{f32,g}_{tx,a})+1.0;];
            after: "B^{4}_{tx=0}L^{8}_{a=0}[C^{f32,g}_{tx,a}=abs(A^{f32,g}_{tx,a})+1.0;];"
          - before: |
              % program: norm
              % input A: f32[4,8]
              % output C: f32[4,8]
              B^{4}_{tx=0}L^{8}_{a=0}[C^{f32,g}_{tx,a}=sqrt(A^{f32,g}_{tx,a}*2.0);];
            no_match: true
        """))
    prog = tmp_path / "p.leir"
    prog.write_text("% program: p\n% input A: f32[4,8]\n% output C: f32[4,8]\n"
                    "B^{4}_{tx=0}L^{8}_{a=0}[C^{f32,g}_{tx,a}=sqrt((A^{f32,g}_{tx,a}-1.0)*(A^{f32,g}_{tx,a}-1.0));];\n")
    out = tmp_path / "q.leir"
    res = stp("apply", tmp_path / "sqrt_of_square.yaml", prog, "-o", out, "--verify")
    assert res.exit_code == 0, res.output
    assert "C^{f32,g}_{tx,a}=abs(A^{f32,g}_{tx,a}-1.0);" in res.output
    assert "becomes 'abs(A^{f32,g}_{tx,a}-1.0)'" in res.output and "Equal  pass" in res.output
    assert "abs(" in out.read_text()
    res = stp("rules", "test", tmp_path / "sqrt_of_square.yaml")
    assert res.exit_code == 0 and "2 test(s), all passed" in res.output


def test_existing_preflight_problems_are_not_blamed_on_a_rule_that_shifts_nests():
    # nest 1 already fails the preflight (no thread binding); rfactor inserts a nest before it
    m = parse_leir("""% program: t
% input A: f32[4,8]
% output C: f32[4]
% output E: f32[4]
B^{4}_{tx=0}L^{8}_{a=0}[C^{f32,g}_{tx}=C^{f32,g}_{tx}+A^{f32,g}_{tx,a};];
L^{4}_{c=0}[E^{f32,g}_{c}=A^{f32,g}_{c,0}*2.0;];
""")
    rf = {x.id: x for x in load_rules()}["reduction_factorization"]
    step = apply_rule(rf, m, params={"f": 2})
    assert len(step.after.program.nests) == 3


def test_coverage_tries_only_candidates_the_gpu_preflight_accepts():
    """A site whose rewrite the GPU preflight rejects (a threadIdx.x loop that would write
    another iteration's elements) is not a step of the rule: stp apply --all does not list
    it, the dataset never records it, and coverage neither tries it nor counts a failure."""
    prog = load_leir(EXAMPLES / "conv_pair.leir")
    r = next(x for x in load_rules() if x.id == "cache_read_write")
    listed = list_candidates(r, prog)
    rejected = []
    for s, p in listed:
        try:
            apply_rule(r, prog, site=s, params=p)
        except PreflightRejected:
            rejected.append((s, p))
    assert rejected, "conv_pair has a cache_read_write site the preflight rejects"
    rows = coverage([r], [prog], per_program=2, trials=1)
    assert rows[0].candidates == len(listed) - len(rejected)
    assert rows[0].tried == rows[0].equal == 2 and not rows[0].failures
