"""Fresh loop indices are local to the top-level nests a rewrite touches (as the translator
names every nest's loops a, c, d...): binding the same loop of two identical nests gives them
the same index, so they stay identical and operator fusion still applies afterwards."""

from __future__ import annotations

import pytest

from steptp.engine import NoMatch, apply_rule, list_candidates
from steptp.leir import parse_leir
from steptp.rules import load_rules

PROG = ("% program: scale_shift\n% input A: f32[4,8]\n% output C: f32[4,8]\n"
        "B^{4}_{tx=0}L^{8}_{a=0}[D^{f32,g}_{tx,a}=A^{f32,g}_{tx,a}*2.0;];\n"
        "B^{4}_{tx=0}L^{8}_{a=0}[C^{f32,g}_{tx,a}=D^{f32,g}_{tx,a}+1.0;];\n")


@pytest.fixture(scope="module")
def rules():
    return {r.id: r for r in load_rules()}


def _bind(rules, mod, nest):
    site = next(s for s, p in list_candidates(rules["loop_binding"], mod)
                if s.nest == (nest,) and p == {"ax": "bx"})
    return apply_rule(rules["loop_binding"], mod, seed=0, site=site, params={"ax": "bx"}).after


def test_binding_identical_nests_alike_keeps_them_fusable(rules):
    mod = parse_leir(PROG)
    once = _bind(rules, mod, 0)
    with pytest.raises(NoMatch):  # one bound, one serial: different loops
        list_candidates(rules["operator_fusion"], once)
    twice = _bind(rules, once, 1)
    a, b = twice.program.nests
    assert a.loops == b.loops and a.loops[1].var == "bxa", twice.text()
    fused = apply_rule(rules["operator_fusion"], twice, seed=0).after
    assert len(fused.program.nests) == 1


def test_a_fresh_index_still_avoids_the_names_of_its_own_nest(rules):
    """loop_split of loop a (extent 8) introduces two indices, distinct from each other and from
    the nest's other loop (tx) and from the split loop's own name while it is still in use."""
    mod = parse_leir(PROG)
    cands = list_candidates(rules["loop_split"], mod)
    site, params = next((s, p) for s, p in cands if s.nest == (0,) and s.loop == 1)
    after = apply_rule(rules["loop_split"], mod, seed=0, site=site, params=params).after
    names = [lp.var for lp in after.program.nests[0].loops]
    assert len(names) == 3 and len(set(names)) == 3 and names[0] == "tx" and "a" not in names, after.text()
