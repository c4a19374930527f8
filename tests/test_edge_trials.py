"""What a label promises (issue 50, design.md §8): edge-case trials in verification, one label
per step, and no step back to a derived original's parent."""

from __future__ import annotations

import json

import numpy as np
import pytest

from steptp.dataset.labels import one_label_per_step, program_key, step_digest, step_key
from steptp.leir import parse_leir
from steptp.runner.inputs import EDGE_TRIALS, LARGE_SCALES, ZERO_FRACTION, TensorSpec, edge_arrays, trial_inputs
from steptp.verify import reference_data, verify_pair

SOFTMAX_HDR = "% program: softmax_t\n% input A: f32[4,32]\n% output C: f32[4,32]\n"
MAX = "B^{4}_{tx=0}L^{32}_{a=0}[D^{f32,g}_{tx}=max(D^{f32,g}_{tx},A^{f32,g}_{tx,a});];"
SUM = "B^{4}_{tx=0}L^{32}_{a=0}[E^{f32,g}_{tx}=E^{f32,g}_{tx}+exp(A^{f32,g}_{tx,a}-D^{f32,g}_{tx});];"
NORM = "B^{4}_{tx=0}L^{32}_{a=0}[C^{f32,g}_{tx,a}=NUM/E^{f32,g}_{tx};];"
STABLE = "exp(A^{f32,g}_{tx,a}-D^{f32,g}_{tx})"


def softmax(numerator: str):
    return parse_leir(SOFTMAX_HDR + MAX + SUM + NORM.replace("NUM", numerator))


def test_edge_arrays_are_the_documented_kinds_and_deterministic():
    specs = [TensorSpec("A", (64, 50), "f32", False), TensorSpec("I", (64,), "i64", False),
             TensorSpec("C", (64,), "f32", True)]
    zeros = edge_arrays(specs, 3, "zeros")
    scattered = edge_arrays(specs, 3, "scattered_zeros")
    neg = edge_arrays(specs, 3, "negative")
    large = edge_arrays(specs, 3, "large", LARGE_SCALES[0])
    assert (zeros["A"] == 0).all() and zeros["A"].dtype == np.float32 and "C" not in zeros
    share = float((scattered["A"] == 0).mean())
    assert abs(share - ZERO_FRACTION) < 0.05 and np.abs(scattered["A"]).max() <= 2
    assert (neg["A"] < 0).all() and neg["A"].max() <= -0.1
    assert 2 * LARGE_SCALES[0] * 0.9 < np.abs(large["A"]).max() <= 2 * LARGE_SCALES[0]
    for x in (zeros, scattered, neg, large):
        assert (x["I"] >= 1).all()            # integers as the positive random trial: no zero divisor
    again = edge_arrays(specs, 3, "scattered_zeros")
    assert np.array_equal(again["A"], scattered["A"])
    with pytest.raises(ValueError, match="unknown edge-case trial"):
        edge_arrays(specs, 0, "huge")
    # a GPU node regenerates the same sets from the plan a pack records
    sets = trial_inputs(specs, 3, 3, (1, -1), {}, [(k, 1.0) for k in EDGE_TRIALS[:3]] + [("large", 20.0)])
    assert len(sets) == 3 + 2 + 4 and np.array_equal(sets[5]["A"], zeros["A"])


def test_overflowing_softmax_numerator_is_not_equal_on_large_inputs():
    """The demo's expand_powsimp step: exp(A-D) -> exp(D-A)*exp(2A-2D) is exact algebra and
    passes every random trial, but overflows to inf*0 once a row spreads over ~89."""
    orig = softmax(STABLE)
    bad = softmax("exp(D^{f32,g}_{tx}-A^{f32,g}_{tx,a})*exp(2.0*A^{f32,g}_{tx,a}-2.0*D^{f32,g}_{tx})")
    assert verify_pair(orig, bad, edge=False).ok       # what the verifier said before
    r = verify_pair(orig, bad)
    assert not r.equal and r.trials == 9
    assert "large x32 inputs" in r.reason and "inf/nan" in r.reason, r.reason
    ref = reference_data(orig)
    assert [k for k, _ in ref.edge] == list(EDGE_TRIALS) and ref.edge[-1][1] == LARGE_SCALES[0]
    assert all(np.isfinite(x["C"]).all() for x in ref.refs)   # the stable original is finite on all of them


def test_division_by_an_input_that_can_be_zero_is_not_equal():
    """multiplicative_split by the guarded previous element of an input: 0/0 on the zero trials."""
    hdr = "% program: mul\n% input A: f32[4,8]\n% input W: f32[4,8]\n% output C: f32[4,8]\n"
    orig = parse_leir(hdr + "B^{4}_{tx=0}L^{8}_{a=0}[C^{f32,g}_{tx,a}=A^{f32,g}_{tx,a}*W^{f32,g}_{tx,a};];")
    prev = "if_then_else(a<1,1.0,A^{f32,g}_{tx,a-1})"
    split = parse_leir(hdr + f"B^{{4}}_{{tx=0}}L^{{8}}_{{a=0}}[C^{{f32,g}}_{{tx,a}}=A^{{f32,g}}_{{tx,a}}/{prev}*{prev}"
                       "*W^{f32,g}_{tx,a};];")
    assert verify_pair(orig, split, edge=False).ok
    r = verify_pair(orig, split)
    assert not r.equal and "zeros inputs" in r.reason, r.reason
    safe = parse_leir(hdr + "B^{4}_{tx=0}L^{8}_{a=0}[C^{f32,g}_{tx,a}=A^{f32,g}_{tx,a}/(A^{f32,g}_{tx,a}*A^{f32,g}_{tx,a}"
                      "+1.0)*(A^{f32,g}_{tx,a}*A^{f32,g}_{tx,a}+1.0)*W^{f32,g}_{tx,a};];")
    assert verify_pair(orig, safe).ok


def test_large_trial_falls_back_to_a_scale_where_the_original_is_finite():
    """exp of an input at x32 (up to 64) is finite in f32 but not in f16 (max 65504 = e^11.09):
    the f16 original is non-finite at both scales, so the last one is used and a candidate must
    give the same infinities."""
    hdr = "% program: e\n% input A: T[4,8]\n% output C: T[4,8]\n"
    body = "B^{4}_{tx=0}L^{8}_{a=0}[C^{T,g}_{tx,a}=exp(A^{T,g}_{tx,a})*2.0;];"
    f32 = parse_leir((hdr + body).replace("T", "f32"))
    assert reference_data(f32).edge[-1] == ("large", LARGE_SCALES[0])
    f16 = parse_leir((hdr + body).replace("T", "f16"))
    assert reference_data(f16).edge[-1] == ("large", LARGE_SCALES[-1])
    same = parse_leir((hdr + body.replace("exp(A^{T,g}_{tx,a})*2.0", "2.0*exp(A^{T,g}_{tx,a})")).replace("T", "f16"))
    assert verify_pair(f16, same).ok


def _entry(strategy: str, score: float, src: str, dst: str) -> dict:
    return {"strategy": {"id": strategy}, "difficulty": {"score": score},
            "signature": {"tensors": [{"name": "A"}, {"name": "C"}]},
            "original": {"leir": src}, "transformed": {"leir": dst}}


def test_one_label_per_step_keeps_the_lowest_score_and_names_the_others():
    src = "B^{4}_{tx=0}L^{8}_{a=0}[D^{f32,g}_{tx,a}=exp(A^{f32,g}_{tx,a})*exp(A^{f32,g}_{tx,a});];" \
          "B^{4}_{tx=0}L^{8}_{a=0}[C^{f32,g}_{tx,a}=D^{f32,g}_{tx,a};];"
    dst = src.replace("exp(A^{f32,g}_{tx,a})*exp(A^{f32,g}_{tx,a})", "exp(2.0*A^{f32,g}_{tx,a})")
    # the same step with renamed loop variables and intermediates: alpha-equivalent, one step
    renamed = dst.replace("_{a=0}", "_{b=0}").replace("tx,a}", "tx,b}").replace("D^", "Q^")
    entries = [_entry("expand_powsimp", 2.5, src, dst), _entry("factorization", 1.5, src, renamed),
               _entry("loop_split", 1.0, src, src.replace("L^{8}_{a=0}[C", "L^{2}_{c=0}L^{4}_{a=0}[C"))]
    assert step_key(entries[0]) == step_key(entries[1]) != step_key(entries[2])
    kept, dropped = one_label_per_step(entries)
    assert [e["strategy"]["id"] for e in kept] == ["factorization", "loop_split"]
    assert kept[0]["also_strategies"] == ["expand_powsimp"] and "also_strategies" not in kept[1]
    assert [(e["strategy"]["id"], e["duplicate_of"]) for e in dropped] == [("expand_powsimp", "factorization")]
    assert program_key(src, {"A", "C"}) != program_key(dst, {"A", "C"})


def test_dataset_has_one_label_per_step_and_no_step_back_to_the_parent(tmp_path):
    """A two-round data set: every (source, target) pair once (alpha-normal), no entry of a
    derived original whose target is the program it was derived from, and the counts in
    report.json."""
    from steptp.dataset.generate import Options
    from steptp.dataset.pipeline import generate_dataset
    from steptp.resources import rules_dir

    prog = tmp_path / "p.leir"
    prog.write_text(SOFTMAX_HDR + MAX + SUM + NORM.replace("NUM", STABLE) + "\n")
    rules = [rules_dir() / f"{r}.yaml" for r in ("operator_fusion", "operator_fission", "loop_split",
                                                  "powsimp", "expand_powsimp", "factorization")]
    out = tmp_path / "out"
    opts = Options(rule_paths=[str(r) for r in rules], rounds=2, derived_per_round=8, per_rule=2, nvcc=False,
                   with_cuda=False)
    generate_dataset([str(prog)], str(out), opts, workers=1, progress=False)
    entries = [json.loads(l) for l in (out / "dictionary.jsonl").read_text().splitlines()]
    assert entries
    keys = [step_key(e) for e in entries]
    assert len(set(keys)) == len(keys)
    # the digest written at generation (from the programs in hand) is the one of the texts
    assert [e["step_key"] for e in entries] == [step_digest(*k) for k in keys]
    by_target = {k[1]: e for k, e in zip(keys, entries)}
    for e, (src, dst) in zip(entries, keys):
        if e.get("derived_from"):
            parent = next(x for x in entries if x["id"] == e["derived_from"]["id"])
            assert dst != step_key(parent)[0], e["strategy"]
    report = json.loads((out / "report.json").read_text())
    assert set(report["labels"]) >= {"duplicate_labels_merged", "reverts_parent_skipped", "steps_under_two_labels"}
    assert report["labels"]["steps_under_two_labels"] == 0
    attempts = [json.loads(l) for l in (out / "attempts.jsonl").read_text().splitlines()]
    assert report["labels"]["reverts_parent_skipped"] == sum(a["outcome"] == "reverts_parent" for a in attempts)
    assert by_target
