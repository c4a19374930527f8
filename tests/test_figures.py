"""The figures of a step and the reasons that state them (issue 50, design.md §8 "A reason is
true of its step"): real programs through the real engine, the shipped rules and templates.

* a loop split of a thread-bound loop halves the threads per launch and doubles each thread's
  serial trip count, and its reason says so (and says what it costs);
* a fusion's figures: one launch fewer; a block fusion's global bytes fall;
* every positive test of every shipped rule (applied as ``stp rules test`` applies it) renders a
  reason with a ``before → after`` figure or the explicit no-figure sentence, and the claims
  checker finds nothing contradicted in it;
* the checker flags a hand-written reason whose claims the figures contradict, and leaves
  negated claims and quoted LEIR alone.
"""

from __future__ import annotations

import re
import time

import pytest

from steptp.cost_model.opcount import _ops, _value_ops, op_kinds
from steptp.dataset.claims import claims_summary, contradicted_claims, entry_figures, find_claims, instance_part
from steptp.engine import apply_rule
from steptp.engine.figures import (NO_FIGURE_SENTENCE, changed_figures, figure_effects, read_reuse, render_figures,
                                   render_unchanged,
                                   step_figures)
from steptp.leir import parse_leir
from steptp.leir.fileformat import LeirModule
from steptp.leir.parser import parse_program
from steptp.leir.printer import format_program
from steptp.rules import load_rules

RULES = load_rules()
BY_ID = {r.id: r for r in RULES}
POSITIVE = [pytest.param(r, t, id=f"{r.id}-{t.index}") for r in RULES for t in r.tests if not t.no_match]

GEMM = """% program: gemm
% input A: f32[8,12]
% param W: f32[12,16]
% output C: f32[8,16]
B^{8}_{tx=0}L^{16}_{a=0}L^{12}_{c=0}[C^{f32,g}_{tx,a}=C^{f32,g}_{tx,a}+A^{f32,g}_{tx,c}*W^{f32,g}_{c,a};];
"""

#: an element-wise nest with a thread-bound loop and no reuse (the issue's loop_tiling case)
SCALE = """% program: scale
% input A: f32[4,8,12]
% output C: f32[4,8,12]
B^{4}_{tx=0}L^{8}_{a=0}L^{12}_{c=0}[C^{f32,g}_{tx,a,c}=A^{f32,g}_{tx,a,c}*2.0;];
"""


def step_of(rule_id: str, text: str, **kw):
    return apply_rule(BY_ID[rule_id], parse_leir(text, rule_id), **kw)


def test_a_split_of_a_bound_loop_halves_the_threads_and_says_so():
    step = step_of("loop_split", GEMM, site={"loop": 0}, params={"f": 2})
    assert format_program(step.after.program).startswith("B^{4}_{txa=0}L^{2}_")
    fig = step.figures
    assert fig["threads"] == [8, 4] and fig["blocks"] == [1, 1] and fig["kernels"] == [1, 1]
    assert fig["serial_trips"] == [16 * 12, 2 * 16 * 12]
    # the same arithmetic and the same accesses, in another order
    assert fig["ops"] == {"*": [1536, 1536], "+": [1536, 1536]}
    assert fig["global_bytes_read"][0] == fig["global_bytes_read"][1] == 3 * 4 * 8 * 16 * 12
    assert fig["static_ns"][1] > fig["static_ns"][0]
    assert set(changed_figures(fig)) == {"threads", "serial_trips", "loop_depth", "static_ns"}
    inst = instance_part(step.cot, BY_ID["loop_split"].description)
    assert "threads per launch 8 → 4" in inst and "serial trip count per thread 192 → 384" in inst
    assert "This step alone runs half the threads per launch and gives each thread twice the serial iterations" in inst
    assert "costs parallelism now" in inst
    assert "more parallelism" not in inst and contradicted_claims(step.cot, fig) == []


def test_tiling_an_element_wise_nest_claims_no_reuse():
    """The issue's case: tiling the bound loop of an element-wise nest. Before: 'which keeps
    the data of a tile close together in time for reuse'; now the description states a purpose
    and the instance part says there is no reuse and what the step costs."""
    rule = BY_ID["loop_tiling"]
    step = apply_rule(rule, parse_leir(SCALE, "scale"), site={"loop": 0}, params={"f1": 2, "f2": 4})
    assert "for reuse" not in rule.description and "purpose" in rule.description
    inst = instance_part(step.cot, rule.description)
    assert "every element it reads is read by one iteration only, so there is no reuse" in inst
    assert "threads per launch 4 → 2" in inst and "half the threads" in inst
    assert contradicted_claims(step.cot, step.figures) == []
    # a matmul's reads repeat: the instance part names them instead
    mm = step_of("loop_tiling", GEMM, site={"loop": 0}, params={"f1": 2, "f2": 8})
    assert "A is read 16 times per element" in mm.cot and "W is read 8 times per element" in mm.cot


def test_fusion_figures():
    fused = step_of("operator_fusion", """% program: scale_shift
% input A: f32[4,8]
% output C: f32[4,8]
B^{4}_{tx=0}L^{8}_{a=0}[D^{f32,g}_{tx,a}=A^{f32,g}_{tx,a}*2.0;];
B^{4}_{tx=0}L^{8}_{a=0}[C^{f32,g}_{tx,a}=D^{f32,g}_{tx,a}+1.0;];
""")
    fig = fused.figures
    assert fig["target"] == {"before": [0, 1], "after": [0], "program": False}
    assert fig["kernels"] == [2, 1] and fig["static_ns"][1] < fig["static_ns"][0]
    assert "kernel launches 2 → 1" in fused.cot and "It saves 1 kernel launch." in fused.cot
    # the static count of accesses is unchanged by operator fusion: no memory claim is made
    assert fig["global_bytes_read"][0] == fig["global_bytes_read"][1]
    assert "fewer global memory" not in fused.cot
    # block fusion keeps the handed-over row sum in shared memory: global bytes fall
    rule = BY_ID["block_fusion"]
    t = rule.tests[0]
    step = apply_rule(rule, parse_leir(t.before, "centre"), seed=t.seed, site=t.site, params=t.params)
    fig = step.figures
    assert fig["kernels"] == [2, 1] and fig["onchip_tensors"] == [0, 1]
    assert fig["global_bytes_read"] == [2048, 1024] and fig["global_bytes_written"] == [1024, 512]
    for text in ("kernel launches 2 → 1", "global bytes read 2048 → 1024", "global bytes written 1024 → 512",
                 "fewer global memory accesses (fewer reads and writes)", "data reuse"):
        assert text in step.cot, step.cot
    assert contradicted_claims(step.cot, fig) == []


def test_a_pure_reshuffle_says_it_changes_no_counted_figure():
    rule = BY_ID["expression_reorder"]
    t = rule.tests[0]
    step = apply_rule(rule, parse_leir(t.before, "x"), seed=t.seed, site=t.site, params=t.params)
    assert changed_figures(step.figures) == [] and step.figures["target"]["program"]
    # the figures are still stated, unchanged, before the sentence that says so (issue 50: every
    # reason gives at least one figure written before → after)
    assert step.cot.endswith(NO_FIGURE_SENTENCE)
    unchanged = render_unchanged(step.figures)
    assert "threads per launch 4 → 4" in unchanged and f"the figures stay: {unchanged}." in step.cot, step.cot


@pytest.mark.parametrize("rule,test", POSITIVE)
def test_every_rule_test_step_states_its_figures_and_contradicts_none(rule, test):
    """Applied the way `stp rules test` applies a rule test (steptp.rules.selftest)."""
    step = apply_rule(rule, parse_leir(test.before, f"{rule.id} tests[{test.index}]"), seed=test.seed,
                      site=test.site, params=test.params)
    inst = instance_part(step.cot, rule.description)
    assert step.cot.startswith(rule.description)
    text = render_figures(step.figures)
    if text:
        assert re.search(r"\S+ → \S+", inst) and text in inst, step.cot
    else:
        assert NO_FIGURE_SENTENCE in inst and "the figures stay:" in inst, step.cot
    assert re.search(r"\S+ → \S+", inst), step.cot   # a figure, before → after, in every reason
    assert step.cot.count("Counted over") == 1, step.cot
    assert contradicted_claims(step.cot, step.figures, rule.description) == [], step.cot


def test_the_checker_flags_a_contradicting_reason():
    step = step_of("loop_split", GEMM, site={"loop": 0}, params={"f": 2})
    desc = BY_ID["loop_split"].description
    bad = (desc + "\nThe split keeps the data of a tile close together in time for reuse and gives more "
           "parallelism.\nIt also makes fewer memory accesses and fewer operations.")
    kinds = sorted(c["claim"] for c in contradicted_claims(bad, step.figures, desc))
    assert kinds == ["memory", "operations", "parallelism", "reuse"]
    found = {c["claim"]: c for c in contradicted_claims(bad, step.figures)}
    assert found["parallelism"]["figures"] == "threads per launch 8 → 4; thread blocks per launch 1 → 1"
    # the description is the strategy's purpose, not a claim about this step
    assert contradicted_claims("Tiling is for reuse.\nThe nest becomes 'X'.", step.figures) == []
    # negated claims and quoted LEIR are not claims
    ok = desc + "\nThere is no reuse here and it does not add more parallelism; 'reuse' is quoted."
    assert contradicted_claims(ok, step.figures) == []


def test_a_factorization_that_doubles_an_exp_cannot_claim_it_is_computed_once():
    """The issue's factorization: exp(2a)-1 = (exp(a)-1)*(exp(a)+1) turns one exp into two
    (the pair sympy's factor gives; built here directly so the figures do not depend on the
    normal-form filter)."""
    head = "% program: f\n% input A: f32[4,8]\n% output C: f32[4,8]\n"
    before = parse_leir(head + "B^{4}_{tx=0}L^{8}_{a=0}[C^{f32,g}_{tx,a}=exp(A^{f32,g}_{tx,a}*2.0)-1.0;];", "f")
    after = parse_leir(head + "B^{4}_{tx=0}L^{8}_{a=0}[C^{f32,g}_{tx,a}=(exp(A^{f32,g}_{tx,a})-1.0)*"
                       "(exp(A^{f32,g}_{tx,a})+1.0);];", "f")
    fig = step_figures(before, after)
    assert fig["ops"]["exp"] == [32, 64] and fig["output_elements"] == 32
    assert "exp 1 → 2 per output element" in render_figures(fig)
    assert "This step alone evaluates more operations (more + and exp)" in " ".join(figure_effects(fig))
    rule = BY_ID["factorization"]
    assert "computed once" not in rule.description and "the aim is" in rule.description
    bad = rule.description + "\nThe shared factor exp(a) is computed once."
    (c,) = contradicted_claims(bad, fig)
    assert c["claim"] == "operations" and c["figures"] == "exp 32 → 64"
    assert contradicted_claims(bad, fig, rule.description) == [c]


def test_effects_are_written_only_where_the_figures_show_them():
    assert figure_effects({"threads": [4, 4], "ops": {"+": [2, 2]}, "ops_total": [2, 2]}) == []
    up = figure_effects({"threads": [4, 64], "serial_trips": [16, 1]})
    assert up == ["Each launch runs 16 times as many threads: more parallelism, and each thread runs 1/16 of "
                  "the serial iterations."]
    cheaper = " ".join(figure_effects({"ops": {"exp": [2, 1], "*": [1, 1]}, "ops_total": [3, 2],
                                       "global_bytes_read": [8, 8], "global_bytes_written": [4, 4]}))
    assert cheaper == "It evaluates fewer operations (fewer exp)."
    for e in (up, [cheaper]):
        assert contradicted_claims("d\n" + " ".join(e), {"threads": [4, 64], "blocks": [1, 1],
                                                           "ops": {"exp": [2, 1]}, "ops_total": [3, 2]}) == []


def test_op_kinds_share_the_cost_model_walk():
    eq = next(parse_program("B^{4}_{tx=0}L^{8}_{a=0}[G^{f32,g}_{tx,a}=if_then_else(F^{f32,g}_{tx,a}==-inf,0.0,"
                            "if_then_else(a-1<0,0.0,G^{f32,g}_{tx,a-1}*exp(F^{f32,g}_{tx,a-1}-F^{f32,g}_{tx,a}))"
                            "+exp(A^{f32,g}_{tx,a}-F^{f32,g}_{tx,a}));];").equations())[1]
    # the guard a-1<0 and the literal -inf are not arithmetic on values
    assert dict(op_kinds(eq.value)) == {"if_then_else": 2, "+": 1, "exp": 2, "-": 2, "*": 1, "comparison": 1}
    # the weighted counts of the cost models are those of before the refactoring (issue 50)
    assert (_ops(eq.value), _value_ops(eq.value)) == (36, 34)


def test_figures_never_raise_and_are_fast():
    from steptp.leir.fileformat import Signature

    prog = parse_program("L^{4}_{a=0}[B^{8}_{tx=0}[D^{f32,s}_{a}=D^{f32,s}_{a}+A^{f32,g}_{a,tx};];"
                         "E^{f32,l}_{a}=D^{f32,s}_{a}*2.0;];")
    m = LeirModule(Signature("x"), prog)
    fig = step_figures(m, m)
    assert changed_figures(fig) == [] and fig["output_elements"] == 0 and fig["kernels"] == [4, 4]
    assert fig["onchip_tensors"] == [2, 2] and fig["serial_trips"] == [1, 1]
    assert step_figures(None, m) == {}  # not a program: no figures, no exception
    mod = parse_leir(GEMM, "gemm")
    step = step_of("loop_binding", GEMM, seed=0)
    t0 = time.perf_counter()
    for _ in range(50):
        step_figures(mod, step.after)
    assert (time.perf_counter() - t0) / 50 < 0.01


def test_read_reuse_is_exact_only_for_plain_subscripts():
    nest = parse_program(SCALE.splitlines()[-1]).nests[0]
    assert read_reuse(nest) == ({}, True)
    split = parse_program("B^{4}_{tx=0}L^{2}_{d=0}L^{4}_{f=0}[C^{f32,g}_{tx,d*4+f}=A^{f32,g}_{tx,d*4+f};];").nests[0]
    assert read_reuse(split) == ({}, False)


def test_claims_summary_over_entries_and_entries_without_figures():
    step = step_of("loop_split", GEMM, site={"loop": 0}, params={"f": 2})
    mod = parse_leir(GEMM, "gemm")
    sig = {"name": "gemm", "tensors": [{"name": t.name, "role": t.role, "dtype": t.dtype, "shape": list(t.shape)}
                                       for t in mod.signature.tensors]}
    entry = {"id": "e1", "strategy": {"id": "loop_split"}, "cot": step.cot, "signature": sig,
             "original": {"leir": format_program(mod.program)}, "transformed": {"leir": format_program(step.after.program)}}
    assert entry_figures(entry) == step.figures  # recomputed from the texts
    bad = dict(entry, id="e2", cot=BY_ID["loop_split"].description + "\nThis gives more parallelism.",
               figures=step.figures)
    s = claims_summary([entry, bad, {"id": "e3", "cot": "x"}])
    assert s["checked"] == 2 and s["contradicted"] == 1
    assert s["examples"][0]["id"] == "e2" and s["examples"][0]["claims"][0]["claim"] == "parallelism"
    assert find_claims("It runs concurrently.") == [("parallelism", "runs concurrently", "It runs concurrently.")]


def test_a_template_without_the_partial_gets_the_figures_appended():
    """A user's rule whose `cot:` leaves out `_figures.j2` still states its step's figures."""
    import textwrap

    from steptp.rules import load_rule_text

    rule = load_rule_text(textwrap.dedent('''
        id: double_neg
        name: double negation
        category: math
        description: A double negation cancels.
        preconditions: [pattern_match]
        difficulty: {K: 1, P: 1, S: 0}
        match: {expr: "-(-?a)"}
        rewrite: "?a"
        cot: "{{ description }} '{{ site_before }}' becomes '{{ site_after }}'."
        tests:
          - before: |
              % program: neg
              % input A: f32[4]
              % output C: f32[4]
              B^{4}_{tx=0}[C^{f32,g}_{tx}=A^{f32,g}_{tx};];
            no_match: true
    '''), "<inline>")
    step = apply_rule(rule, parse_leir("% program: neg\n% input A: f32[4]\n% output C: f32[4]\n"
                                       "B^{4}_{tx=0}[C^{f32,g}_{tx}=-(-A^{f32,g}_{tx})+1.0;];", "neg"))
    lines = step.cot.split("\n")
    assert lines[0] == "A double negation cancels. '--A^{f32,g}_{tx}' becomes 'A^{f32,g}_{tx}'."
    assert lines[1] == "Counted over the kernel it changes: negation 2 → 0 per output element; static model time " \
        + lines[1].split("static model time ")[1]
    assert lines[2].startswith("It evaluates fewer operations (fewer negation).")
    # a template that includes it states the figures once
    assert step_of("operator_fusion", """% program: s
% input A: f32[4,8]
% output C: f32[4,8]
B^{4}_{tx=0}L^{8}_{a=0}[D^{f32,g}_{tx,a}=A^{f32,g}_{tx,a}*2.0;];
B^{4}_{tx=0}L^{8}_{a=0}[C^{f32,g}_{tx,a}=D^{f32,g}_{tx,a}+1.0;];
""").cot.count("Counted over") == 1
