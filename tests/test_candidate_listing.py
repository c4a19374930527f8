"""Candidate listing internals that exist for speed (issue 26, bench_matching): each one must
give exactly what the plain definition gives, on real rules and programs."""

from __future__ import annotations

import copy
import random
from pathlib import Path

import pytest

from steptp.engine import NoMatch, list_candidates
from steptp.engine import match as M
from steptp.engine.domains import EvalContext, ValueExprError, domain_values
from steptp.engine.egraph import OPTIONAL_FACTS
from steptp.engine.match import Site, compile_rule, sort_sites
from steptp.leir import load_leir, parse_leir
from steptp.rules import load_rule_text, load_rules
from steptp.rules.tools import merge_programs

RULES = {r.id: r for r in load_rules()}
EXAMPLES = sorted((Path(__file__).resolve().parent.parent / "examples").glob("*.leir"))

PROG = parse_leir("""% program: p
% input A: f32[4,8]
% output C: f32[4,8]
B^{4}_{tx=0}L^{8}_{a=0}[C^{f32,g}_{tx,a}=A^{f32,g}_{tx,a}*2.0;];
""")


def test_rules_with_the_same_query_share_rows_but_keep_their_own_ids():
    shared = [r for r in RULES.values() if compile_rule(r).query_key == compile_rule(RULES["powsimp"]).query_key]
    assert len(shared) >= 2
    m = load_leir(next(p for p in EXAMPLES if "softmax" in p.stem))
    M.clear_caches()
    first = M.find_sites(shared[0], m)
    for r in shared[1:]:
        sites = M.find_sites(r, m)
        assert [s.rule for s in sites] == [r.id] * len(sites)
        assert [s.location for s in sites] == [s.location for s in first]
        # the same as a matcher that holds only this rule (no sharing possible)
        assert sites == M.Matcher([r]).sites_of(r, m)


def test_sort_sites_is_the_sort_key_order():
    m = merge_programs([load_leir(p) for p in EXAMPLES[:6]], "six")
    for rid in ("additive_split", "loop_reorder", "collect", "set_storage_layout"):
        sites = M.Matcher([RULES[rid]]).sites_of(RULES[rid], m)
        shuffled = list(sites)
        random.Random(0).shuffle(shuffled)
        assert sort_sites(shuffled) == sorted(shuffled, key=Site.sort_key)


def test_optional_facts_are_loaded_when_a_rule_reads_them():
    assert "reader_count" in OPTIONAL_FACTS
    rule = load_rule_text("""
id: read_twice
name: read twice
category: graph
description: a tensor read by two equations
preconditions: []
difficulty: {K: 0, P: 1, S: 0}
match:
  tensor: "?X"
where:
  - "reader_count(?X) >= 2"
rewrite:
  - map_subscripts: {tensor: "?X", to: "?sub"}
cot: "x"
tests:
  - before: |
      % program: t
      % input A: f32[4]
      % output C: f32[4]
      B^{4}_{tx=0}[C^{f32,g}_{tx}=A^{f32,g}_{tx};];
    no_match: true
""", "<read_twice>")
    m = parse_leir("""% program: two_reads
% input A: f32[4]
% output C: f32[4]
% output D: f32[4]
B^{4}_{tx=0}[C^{f32,g}_{tx}=A^{f32,g}_{tx}*2.0;];
B^{4}_{tx=0}[D^{f32,g}_{tx}=A^{f32,g}_{tx}+1.0;];
""")
    matcher = M.Matcher([RULES["loop_split"]])
    matcher.sites_of(RULES["loop_split"], m)        # loaded without the optional facts
    assert [s.tensor for s in matcher.sites_of(rule, m)] == ["A"]  # adding the rule reloads them


def test_require_parts_without_the_parameter_keep_errors_and_short_circuits():
    ctx = EvalContext(PROG, {"n": 6})
    # the part without ?f is evaluated once, the part with it per value: same result as plain
    spec = {"divisors_of": "?n", "require": "?n > 2 and ?f != 1 or ?f == 1"}
    assert domain_values(spec, ctx, "f") == [1, 2, 3, 6]
    # an error in a part without the parameter still surfaces ...
    with pytest.raises(ValueExprError, match="not bound"):
        domain_values({"divisors_of": "?n", "require": "?missing > 1 or ?f == 1"}, ctx, "f")
    # ... but only when evaluated: a short-circuit skips it, and an empty domain evaluates nothing
    assert domain_values({"choice": [1], "require": "?f == 1 or ?missing > 1"}, ctx, "f") == [1]
    assert domain_values({"choice": [], "require": "?missing > 1"}, ctx, "f") == []


def test_listing_a_fresh_copy_gives_the_same_candidates():
    """Memos kept by program identity (writers, look-through targets, condition subterms)
    must not change what a structurally equal program lists."""
    m = merge_programs([load_leir(p) for p in EXAMPLES[:8]], "eight")
    rules = [RULES[r] for r in ("collect", "additive_split", "exponential_split", "layout_transformation",
                                "set_storage_layout", "powsimp", "cache_read_write")]

    def listing(mod):
        M.clear_caches()
        out = {}
        for r in rules:
            try:
                out[r.id] = [(s.location, s.bindings, sorted(p.items(), key=str)) for s, p in list_candidates(r, mod)]
            except NoMatch:
                out[r.id] = []
        return out

    assert listing(m) == listing(copy.deepcopy(m))


DEEP = parse_leir("""% program: deep
% input A: f32[4,8,2]
% output C: f32[4]
B^{4}_{tx=0}[D^{f32,g}_{tx}=0.0;L^{8}_{a=0}[E^{f32,l}_{tx,a}=0.0;L^{2}_{b=0}[E^{f32,l}_{tx,a}=E^{f32,l}_{tx,a}+A^{f32,g}_{tx,a,b};];D^{f32,g}_{tx}=D^{f32,g}_{tx}+E^{f32,l}_{tx,a};];C^{f32,g}_{tx}=D^{f32,g}_{tx}*2.0;];
""")


def test_per_nest_and_per_equation_facts_derived_in_egglog_are_the_index():
    # Python inserts one nest_fact / eq_fact row each; stratum a0 derives the rest, transitive
    # containment included (three levels of nests here)
    from steptp.engine.egraph import EggSession, ProgramIndex

    for module in (DEEP, load_leir(next(p for p in EXAMPLES if "softmax" in p.stem))):
        s = EggSession()
        ix = s.load_program(module)
        assert ix == ProgramIndex.build(module.program)
        rows = lambda name: {tuple(r) for r in s.rows(name)}  # noqa: E731
        vals = lambda name: {tuple(r) + (v,) for r, v in s.values(name)}  # noqa: E731
        n = len(ix.nests)
        anc = set()
        for i in range(n):
            a = ix.nest_parent[i]
            while a >= 0:
                anc.add((i, a))
                a = ix.nest_parent[a]
        assert rows("nest") == {(i,) for i in range(n)}
        assert rows("nest_pos") == {(i, ix.nest_parent[i], ix.nest_paths[i][-1]) for i in range(n)}
        assert rows("nest_in") == anc
        assert rows("loop_at") == {(i, p, l) for i, nest in enumerate(ix.nests) for p, l in enumerate(nest.loops)}
        assert vals("loop_count") == {(i, len(nest.loops)) for i, nest in enumerate(ix.nests)}
        assert vals("item_count") == {(i, len(nest.body)) for i, nest in enumerate(ix.nests)}
        assert vals("eq_count") == {(i, sum(1 for _ in nest.equations())) for i, nest in enumerate(ix.nests)}
        assert rows("eq_at") == {(ix.eq_parent[e], ix.eq_paths[e][-1], e) for e in range(len(ix.eqs))}
        assert rows("eq_in") == {(e, m) for e in range(len(ix.eqs)) for m in ix.eq_encl[e]}
        assert rows("eq_def") == {(e, eq.target, eq.value) for e, eq in enumerate(ix.eqs)}
        if module is DEEP:  # the innermost equation is in all three nests
            assert {m for e, m in rows("eq_in") if e == 2} == {0, 1, 2}


def test_a_snapshot_decodes_every_relation_as_print_function_does():
    m = M.Matcher(list(RULES.values()))
    module = merge_programs([load_leir(p) for p in EXAMPLES[:6]] + [DEEP], "mix")
    m.prefetch(module)
    snap = m.session.snapshot()
    names = [cr.relation for cr in m.compiled.values()] + ["eq_def", "loop_at", "nest_loops", "val_sub", "reads_at", "tl_last"]
    nonempty = 0
    for name in names:
        rows = sorted(map(repr, m.session.rows(name)))
        assert sorted(map(repr, snap.rows(name))) == rows, name
        nonempty += bool(rows)
    assert nonempty >= 20


def test_prefetched_sites_are_the_sites_listed_rule_by_rule():
    module = merge_programs([load_leir(p) for p in EXAMPLES] + [DEEP], "all")
    rules = list(RULES.values())
    one = M.Matcher(rules)
    by_rule = {r.id: one.sites_of(r, module) for r in rules}
    batch = M.Matcher(rules)
    batch.prefetch(module)
    assert {r.id: batch.sites_of(r, module) for r in rules} == by_rule
    assert sum(map(len, by_rule.values())) > 1000
