"""Structural rewrite primitives on their own (engine/steptp/engine/structural.py):
names for created items (as:), conditional steps (when:), insert_into / move_nest
(compute_at), replace_equation away from the match site, replace_terms (subscripts,
targets), permute_subscripts, loop-list and subscript-list splicing in templates, and the
relations the graph/memory rules rely on (cut_hazard, read_later, write_after_read,
clobbers, compound, writes_other)."""

from __future__ import annotations

import pytest
import yaml

from steptp.engine import NoMatch, RewriteError, apply_rule, list_candidates
from steptp.engine import patterns as P
from steptp.engine.egraph import analyze_relations
from steptp.leir import ast as A
from steptp.leir.fileformat import parse_leir
from steptp.leir.printer import format_program
from steptp.rules.loader import load_rule_text
from steptp.rules.schema import RuleError

ELEMWISE = """% program: chain
% input A: f32[4,8]
% output C: f32[4,8]
B^{4}_{tx=0}L^{8}_{a=0}[D^{f32,g}_{tx,a}=exp(A^{f32,g}_{tx,a});];
B^{4}_{tx=0}L^{8}_{a=0}[C^{f32,g}_{tx,a}=D^{f32,g}_{tx,a}*2.0;];
"""


def rule(match, rewrite, where=(), let=None, fresh=None, params=None, rid="probe"):
    """A throw-away rule (the placeholder test is never run here)."""
    data = {"id": rid, "name": rid, "category": "graph", "description": "probe.", "preconditions": [],
            "difficulty": {"K": 0, "P": 1, "S": 0}, "match": match, "where": list(where), "rewrite": rewrite,
            "cot": "{{ description }}", "tests": [{"before": ELEMWISE, "no_match": True}]}
    for k, v in (("let", let), ("fresh", fresh), ("params", params)):
        if v:
            data[k] = v
    return load_rule_text(yaml.safe_dump(data, sort_keys=False), "<probe>")


def run(r, text=ELEMWISE, **kw):
    return format_program(apply_rule(r, parse_leir(text), **kw).after.program)


def test_as_names_a_created_nest_for_later_steps_and_follows_insertions():
    # the nest created first is named ?new; a second insertion before it shifts it, and the
    # later replace_terms still edits exactly that nest
    r = rule({"nest": "?N"}, [
        {"insert_nest": {"nest": "*?L[?T^{f32,g}_{*?I}=A^{f32,g}_{tx,a}+1.0;];", "before": "?N", "as": "new"}},
        {"insert_nest": {"nest": "*?L[?U^{f32,g}_{*?I}=A^{f32,g}_{tx,a};];", "before": "?new"}},
        {"replace_terms": {"pattern": "A^{f32,g}_{tx,a}+1.0", "with": "?U^{f32,g}_{*?I}+1.0", "nest": "?new"}},
    ], where=["nest_pos(?N, -1, 0)"], let={"L": "loops_of(?N)", "I": "indices_of(?L)"}, fresh={"T": "tensor", "U": "tensor"})
    out = run(r)
    assert out == ("B^{4}_{tx=0}L^{8}_{a=0}[F^{f32,g}_{tx,a}=A^{f32,g}_{tx,a};];"
                   "B^{4}_{tx=0}L^{8}_{a=0}[E^{f32,g}_{tx,a}=F^{f32,g}_{tx,a}+1.0;];"
                   "B^{4}_{tx=0}L^{8}_{a=0}[D^{f32,g}_{tx,a}=exp(A^{f32,g}_{tx,a});];"
                   "B^{4}_{tx=0}L^{8}_{a=0}[C^{f32,g}_{tx,a}=D^{f32,g}_{tx,a}*2.0;];")


def test_as_on_a_step_that_creates_nothing_is_an_error_and_names_must_be_fresh():
    r = rule({"nest": "?N"}, [{"remove_nest": {"nest": "?N", "as": "gone"}}], where=["nest_pos(?N, -1, 0)"])
    with pytest.raises(RewriteError, match="creates no nest or equation"):
        run(r)
    with pytest.raises(RuleError, match="already bound"):
        rule({"nest": "?N"}, [{"split_nest": {"at": 1, "as": "N"}}])


def test_insert_into_puts_an_equation_before_after_or_at_a_position():
    where = ["nest_pos(?N, -1, 1)", "eq_at(?N, 0, ?e)"]
    before = rule({"nest": "?N"}, [{"insert_into": {"item": "E^{f32,l}_{tx,a}=D^{f32,g}_{tx,a}", "before": "?e"}},
                                   {"replace_terms": {"pattern": "D^{f32,g}_{tx,a}", "with": "E^{f32,l}_{tx,a}",
                                                      "equation": "?e"}}], where=where)
    assert run(before).endswith("[E^{f32,l}_{tx,a}=D^{f32,g}_{tx,a};C^{f32,g}_{tx,a}=E^{f32,l}_{tx,a}*2.0;];")
    after = rule({"nest": "?N"}, [{"insert_into": {"item": "E^{f32,g}_{tx,a}=C^{f32,g}_{tx,a}", "after": "?e"}}],
                 where=where)
    assert run(after).endswith("[C^{f32,g}_{tx,a}=D^{f32,g}_{tx,a}*2.0;E^{f32,g}_{tx,a}=C^{f32,g}_{tx,a};];")
    at_end = rule({"nest": "?N"}, [{"insert_into": {"item": "E^{f32,g}_{tx,a}=C^{f32,g}_{tx,a}", "at": -1}}],
                  where=["nest_pos(?N, -1, 1)"])
    assert run(at_end) == run(after)


def test_insert_into_an_inner_nest_and_move_nest_compute_at():
    # an inner nest template (its own loop) inside the consumer's loops
    inner = rule({"nest": "?N"}, [{"insert_into": {"item": "L^{2}_{c=0}[E^{f32,g}_{tx,a}=E^{f32,g}_{tx,a}+A^{f32,g}_{tx,c};];",
                                                   "at": 0}}], where=["nest_pos(?N, -1, 1)"])
    assert "L^{8}_{a=0}[L^{2}_{c=0}[E^{f32,g}_{tx,a}=E^{f32,g}_{tx,a}+A^{f32,g}_{tx,c};];C^{f32,g}" in run(inner)
    # a producer nest moved inside the consumer keeps its own loop (recomputed per iteration);
    # its buffer is thread-local: a global one written by every thread is a race (preflight)
    text = """% program: producer
% input A: f32[4,8]
% output C: f32[4,8]
L^{2}_{c=0}[D^{f32,l}_{c}=A^{f32,g}_{0,c}*2.0;];
B^{4}_{tx=0}L^{8}_{a=0}[C^{f32,g}_{tx,a}=A^{f32,g}_{tx,a}+D^{f32,l}_{1};];
"""
    mv = rule({"nests": ["?p", "?c"]}, [{"move_nest": {"nest": "?p", "into": "?c", "at": 0}}])
    assert run(mv, text) == ("B^{4}_{tx=0}L^{8}_{a=0}[L^{2}_{c=0}[D^{f32,l}_{c}=A^{f32,g}_{0,c}*2.0;];"
                             "C^{f32,g}_{tx,a}=A^{f32,g}_{tx,a}+D^{f32,l}_{1};];")


def test_replace_equation_edits_an_equation_that_is_not_the_site():
    r = rule({"nests": ["?n1", "?n2"]}, [{"replace_equation": {"equation": "?e2", "with": "?t=?v*3.0"}}],
             where=["eq_at(?n2, 0, ?e2)", "eq_def(?e2, ?t, ?v)"])
    assert run(r).endswith("[C^{f32,g}_{tx,a}=D^{f32,g}_{tx,a}*2.0*3.0;];")
    # the first nest (the match site) is untouched
    assert run(r).startswith("B^{4}_{tx=0}L^{8}_{a=0}[D^{f32,g}_{tx,a}=exp(A^{f32,g}_{tx,a});];")


def test_replace_terms_subscripts_targets_and_no_match():
    text = """% program: pool
% input A: f32[4,16]
% output C: f32[4,8]
B^{4}_{tx=0}L^{8}_{a=0}L^{2}_{c=0}[C^{f32,g}_{tx,a}=max(C^{f32,g}_{tx,a},A^{f32,g}_{tx,a*2+c});];
"""
    sub = rule({"nest": "?N"}, [{"replace_terms": {"pattern": "a*2+c", "with": "c+a*2", "subscripts": True}}])
    assert "A^{f32,g}_{tx,c+a*2}" in run(sub, text)
    plain = rule({"nest": "?N"}, [{"replace_terms": {"pattern": "a*2+c", "with": "c+a*2"}}])
    with pytest.raises(RewriteError, match="nothing matches"):
        run(plain, text)          # value positions only: the subscript is not entered
    tgt = rule({"nest": "?N"}, [{"replace_terms": {"pattern": "C^{f32,g}_{tx,a}", "with": "C^{f32,g}_{tx,a}",
                                                   "targets": True}},
                                {"replace_terms": {"pattern": "A^{f32,g}_{tx,a*2+c}", "with": "0.0"}}])
    assert run(tgt, text).endswith("[C^{f32,g}_{tx,a}=max(C^{f32,g}_{tx,a},0.0);];")


def test_whole_subscript_lists_splice_and_match():
    # ?l bound to a subscript list (TL) by accessed_at: it matches only accesses at exactly
    # that subscript and instantiates to it
    r = rule({"nest": "?N"}, [{"replace_terms": {"pattern": "A^{f32,g}_{*?l}", "with": "(A^{f32,g}_{*?l}+1.0)",
                                                 "nest": "?N"}}],
             where=["nest_pos(?N, -1, 0)", "accessed_at(A, ?e, ?l)", "eq_in(?e, ?N)"])
    assert "exp(A^{f32,g}_{tx,a}+1.0)" in run(r)
    env = {"l": (A.Index("tx"), A.Int(0)), "L": (A.Loop("B", 4, "tx"), A.Loop("L", 8, "a")), "I": ("tx", "a")}
    t = P.instantiate(P.parse_expr_pattern("X^{f32,l}_{*?l}+Y^{f32,g}_{*?I}"), env)
    assert str(format_program(A.Program((A.Nest(env["L"], (A.Assign(A.Tensor("Z", "f32", "g", ()), t),)),)))) == \
        "B^{4}_{tx=0}L^{8}_{a=0}[Z^{f32,g}=X^{f32,l}_{tx,0}+Y^{f32,g}_{tx,a};];"
    nest = P.instantiate(P.parse_nest_pattern("*?L[Z^{f32,g}_{*?I}=1.0;];"), env)
    assert nest.loops == env["L"]
    assert P.match_node(P.parse_expr_pattern("X_{*?l}"), A.Tensor("X", "f32", "g", env["l"]), env) is not None
    assert P.match_node(P.parse_expr_pattern("X_{*?l}"), A.Tensor("X", "f32", "g", (A.Index("tx"),)), env) is None


def test_when_runs_a_step_only_if_its_condition_holds():
    r = rule({"nest": "?N"}, [
        {"insert_into": {"item": "E^{f32,g}_{tx,a}=1.0", "at": 0, "when": "?pick == one"}},
        {"insert_into": {"item": "E^{f32,g}_{tx,a}=2.0", "at": 0, "when": "?pick == two"}},
        {"replace_terms": {"pattern": "2.0", "with": "E^{f32,g}_{tx,a}", "nest": "?N"}}],
        where=["nest_pos(?N, -1, 1)"], params={"pick": {"choice": ["one", "two"]}})
    assert "[E^{f32,g}_{tx,a}=1.0;C^{f32,g}_{tx,a}=D^{f32,g}_{tx,a}*E^{f32,g}_{tx,a};]" in run(r, params={"pick": "one"})
    with pytest.raises(RuleError, match="unbound"):
        rule({"nest": "?N"}, [{"split_nest": {"at": 1, "when": "?nope == 1"}}])


def test_permute_subscripts_moves_every_access():
    r = rule({"tensor": "?X"}, [{"permute_subscripts": {"tensor": "?X", "order": [1, 0]}}], where=["intermediate(?X)"])
    assert run(r) == ("B^{4}_{tx=0}L^{8}_{a=0}[D^{f32,g}_{a,tx}=exp(A^{f32,g}_{tx,a});];"
                      "B^{4}_{tx=0}L^{8}_{a=0}[C^{f32,g}_{tx,a}=D^{f32,g}_{a,tx}*2.0;];")
    bad = rule({"tensor": "?X"}, [{"permute_subscripts": {"tensor": "?X", "order": [0, 1, 2]}}],
               where=["intermediate(?X)"])
    with pytest.raises(RewriteError, match="not a permutation"):
        run(bad)


def test_relations_for_fission_inline_and_cse():
    m = parse_leir("""% program: rel
% input A: f32[4,8]
% output C: f32[4,8]
B^{4}_{tx=0}L^{8}_{a=0}[D^{f32,g}_{tx}=D^{f32,g}_{tx}+A^{f32,g}_{tx,a};E^{f32,g}_{tx,a}=exp(A^{f32,g}_{tx,a});F^{f32,g}_{tx,a}=E^{f32,g}_{tx,a}*D^{f32,g}_{tx};];
B^{4}_{tx=0}L^{8}_{a=0}[C^{f32,g}_{tx,a}=exp(A^{f32,g}_{tx,a})+F^{f32,g}_{tx,a};];
B^{4}_{tx=0}L^{8}_{a=0}[A2^{f32,g}_{tx,a}=E^{f32,g}_{tx,a};];
""".replace("A2", "G"))
    r = analyze_relations(m, ["body_cut", "cut_hazard", "read_later", "write_after_read", "compound", "clobbers",
                              "writes_other", "item_dep"])
    assert sorted(map(tuple, r["body_cut"])) == [(0, 1), (0, 2)]
    # D is a running sum read by item 2: cutting before 1 or 2 separates them
    assert sorted(map(tuple, r["cut_hazard"])) == [(0, 1), (0, 2)]
    assert sorted(map(tuple, r["item_dep"])) == [(0, 0, 2)]
    assert [1, "E"] in r["read_later"] and [2, "E"] not in r["read_later"]
    assert r["write_after_read"] == []
    assert [A.Call("exp", (A.Tensor("A", "f32", "g", (A.Index("tx"), A.Index("a"))),))] in r["compound"]
    assert not any(row[0] == 1 for row in r["clobbers"])          # nest 1 writes only C
    assert [0, 1, "D"] in r["writes_other"] and [0, 0, "D"] not in r["writes_other"]


def test_a_new_rule_written_in_a_temporary_directory_applies_with_stp_apply(tmp_path):
    """A strategy that is not one of the 43 (hoisting a loop-invariant read into a local
    register) written as YAML only, applied by the CLI: no Python change."""
    import subprocess
    import sys

    rule_text = yaml.safe_dump({
        "id": "hoist_invariant_read", "name": "hoist invariant read", "category": "memory",
        "description": "A read that does not depend on the innermost loop is copied to a local register first.",
        "preconditions": [], "difficulty": {"K": 0, "P": 2, "S": 1},
        "match": {"nest": "?N"},
        "where": ["nest_pos(?N, -1, _)", "eq_at(?N, 0, ?e)", "reads_at(?e, ?X, ?l)", "input(?X)",
                  "not eq_mixed(?e, ?X)"],
        "fresh": {"R": "tensor"},
        "rewrite": [{"insert_into": {"item": "?R^{f32,l}_{*?l}=?X^{f32,g}_{*?l}", "before": "?e", "as": "copy"}},
                    {"replace_terms": {"pattern": "?X^{f32,g}_{*?l}", "with": "?R^{f32,l}_{*?l}", "equation": "?e"}}],
        "cot": "{{ description }} The nest becomes '{{ nest_after }}'.",
        "tests": [{"before": ELEMWISE, "after": "B^{4}_{tx=0}L^{8}_{a=0}[E^{f32,l}_{tx,a}=A^{f32,g}_{tx,a};"
                   "D^{f32,g}_{tx,a}=exp(E^{f32,l}_{tx,a});];B^{4}_{tx=0}L^{8}_{a=0}[C^{f32,g}_{tx,a}="
                   "D^{f32,g}_{tx,a}*2.0;];"}]}, sort_keys=False)
    (tmp_path / "hoist_invariant_read.yaml").write_text(rule_text)
    (tmp_path / "p.leir").write_text(ELEMWISE)
    stp = [sys.executable, "-m", "steptp.cli"]
    out = subprocess.run(stp + ["apply", str(tmp_path / "hoist_invariant_read.yaml"), str(tmp_path / "p.leir")],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert "E^{f32,l}_{tx,a}=A^{f32,g}_{tx,a};D^{f32,g}_{tx,a}=exp(E^{f32,l}_{tx,a})" in out.stdout


def test_compute_inline_has_no_candidate_on_attention_nests_1_2():
    from pathlib import Path

    from steptp.rules import load_rules

    ci = next(r for r in load_rules() if r.id == "compute_inline")
    text = (Path(__file__).resolve().parents[1] / "examples" / "attention_scores.leir").read_text()
    m = parse_leir(text)
    with pytest.raises(NoMatch):
        list_candidates(ci, m)


def test_guarded_reads_and_local_buffers_across_a_cut():
    m = parse_leir("""% program: guard
% input A: f32[4,8]
% output C: f32[4,8]
B^{4}_{tx=0}L^{8}_{a=0}[D^{f32,l}_{tx,a}=exp(A^{f32,g}_{tx,a});C^{f32,g}_{tx,a}=if_then_else(a<1,D^{f32,l}_{tx,a},A^{f32,g}_{tx,a-1}*2.0);];
""")
    r = analyze_relations(m, ["guarded", "guarded_read", "item_dep", "cut_hazard"])
    a = lambda i: A.Tensor("A", "f32", "g", (A.Index("tx"), i))  # noqa: E731
    prev = a(A.BinOp("-", A.Index("a"), A.Int(1)))
    assert [A.BinOp("*", prev, A.Float(2.0))] in r["guarded"] and [prev] in r["guarded"]
    assert [1, "A", (A.Index("tx"), A.BinOp("-", A.Index("a"), A.Int(1)))] in r["guarded_read"]
    assert not any(row[1] == "A" and row[2] == (A.Index("tx"), A.Index("a")) for row in r["guarded_read"])
    # D is local: the two equations must stay in one kernel, although D is read at its subscript
    assert r["item_dep"] == [[0, 0, 1]] and r["cut_hazard"] == [[0, 1]]


def test_value_functions_for_structural_rules():
    from steptp.engine.primitives import VALUE_FUNCTIONS, EvalContext, NestRef

    m = parse_leir("""% program: vf
% input A: f32[4,6,8]
% output C: f32[4,8]
B^{4}_{tx=0}L^{8}_{a=0}L^{6}_{c=0}[C^{f32,g}_{tx,a}=C^{f32,g}_{tx,a}+A^{f32,g}_{tx,c,a}*a;];
""")
    ctx = EvalContext(m, {})
    f = lambda n, *a: VALUE_FUNCTIONS[n][1](ctx, *a)  # noqa: E731
    tx, a, c = A.Index("tx"), A.Index("a"), A.Index("c")
    acc = A.Tensor("A", "f32", "g", (tx, c, a))
    assert f("flattened", (tx, c, a), "A") == (A.BinOp("+", A.BinOp("+", A.BinOp("*", tx, A.Int(48)),
                                                                      A.BinOp("*", c, A.Int(8))), a),)
    assert f("subst_index", (tx, c, a), "a", f("shifted", "a", 8)) == (tx, c, A.BinOp("+", a, A.Int(8)))
    assert f("renamed", A.BinOp("*", acc, a), "A", "G") == A.BinOp("*", A.Tensor("G", "f32", "g", (tx, c, a)), a)
    assert f("index_outside", A.BinOp("*", acc, a), "A", "a") is True      # a is used as a value
    assert f("index_outside", A.BinOp("*", acc, a), "A", "c") is False     # c only in A's subscript
    assert f("reads_only", A.BinOp("*", acc, a), "A") and not f("reads_only", A.BinOp("*", acc, acc.with_indices(())), "B")
    loops = f("set_extent", m.program.nests[0].loops, "a", 16)
    assert [l.extent for l in loops] == [4, 16, 6] and f("index_of", NestRef((0,)), 2) == "c"
    assert f("indices_of", loops) == ("tx", "a", "c")
    assert f("rank_of", "A") == 3 and f("target_of", __import__("steptp.engine", fromlist=["EqRef"]).EqRef((0, 0))) == "C"
    assert f("permuted", (tx, c, a), (2, 0, 1)) == (a, tx, c) and f("is_identity", (0, 1)) and f("not_identity", (1, 0))
    assert f("names_thread_indices", NestRef((0,)), (tx, a)) and not f("names_thread_indices", NestRef((0,)), (c, a))
    assert f("shape_of", "A", 1) == 6 and f("shape_of", "C", 1) == 8
    assert f("has_bound_index", (tx, c)) and not f("has_bound_index", A.BinOp("*", c, A.Int(2)))
    assert f("dim_has_bound_index", "A", 0) and not f("dim_has_bound_index", "A", 1) and f("item", (tx, c), -1) == c
    assert f("split_entry", (tx, c), 1, 3) == (tx, A.BinOp("//", c, A.Int(3)), A.BinOp("%", c, A.Int(3)))


def test_map_subscripts_rewrites_every_access_with_a_value_expression():
    r = rule({"tensor": "?X"}, [{"map_subscripts": {"tensor": "?X", "to": "split_entry(?sub, 1, 4)"}}],
             where=["intermediate(?X)"])
    assert run(r) == ("B^{4}_{tx=0}L^{8}_{a=0}[D^{f32,g}_{tx,a//4,a%4}=exp(A^{f32,g}_{tx,a});];"
                      "B^{4}_{tx=0}L^{8}_{a=0}[C^{f32,g}_{tx,a}=D^{f32,g}_{tx,a//4,a%4}*2.0;];")
    flat = rule({"tensor": "?X"}, [{"map_subscripts": {"tensor": "?X", "to": "flattened(?s, ?X)", "var": "s"}}],
                where=["intermediate(?X)"])
    assert "D^{f32,g}_{tx*8+a}=exp(A^{f32,g}_{tx,a})" in run(flat)    # the inferred shape [4,8]
    with pytest.raises(RuleError, match="unbound"):
        rule({"tensor": "?X"}, [{"map_subscripts": {"tensor": "?X", "to": "permuted(?sub, ?order)"}}])
    bad = rule({"tensor": "?X"}, [{"map_subscripts": {"tensor": "?X", "to": "rank_of(?X)"}}], where=["intermediate(?X)"])
    with pytest.raises(RewriteError, match="not a subscript list"):
        run(bad)
