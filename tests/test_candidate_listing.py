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
