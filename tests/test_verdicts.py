"""Verdicts and rewards you can train on (issue 34), on real programs and the real CLI.

* the RL reward: unparsable 0 <= not Equal <= unchanged < Equal; a renamed program is unchanged;
  a worker stalled by the machine is infrastructure (None), a hanging program is not let off;
* the timed CPU form is checked against the verified one;
* a wrong rule fails its own tests (exact constants, float64 verification), a broken template
  fails lint with its line and makes `stp dataset` exit nonzero; a changed rule refuses a resume;
* every dataset writes an RL prompt set that loads with `datasets` and feeds `step_reward`.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from steptp import rewards
from steptp.leir import load_leir, parse_leir
from steptp.leir.alpha import alpha_equivalent
from steptp.leir.printer import format_program
from steptp.llm.prompts import single_label

ROOT = Path(__file__).resolve().parents[1]
SOFTMAX = load_leir(ROOT / "examples" / "softmax.leir")
PROG = format_program(SOFTMAX.program)
STP = Path(sys.executable).parent / "stp"


@pytest.fixture(scope="module", autouse=True)
def _close_workers():
    yield
    rewards.close()


def _answer(program_text: str) -> str:
    return single_label("think", program_text, "Loop Split")


# --------------------------------------------------------------------------- reward


def test_reward_order_never_pays_a_wrong_program_more_than_no_change():
    r = rewards.REWARDS
    assert r["unparsable"] == 0.0
    for stage in ("build", "exec", "not_equal"):
        assert r["unparsable"] <= r[stage] <= r["unchanged"], stage
    assert r["unchanged"] < r["equal"]


def test_renamed_loop_variable_or_intermediate_is_unchanged():
    # `a` -> `q` in the second nest only, and the intermediate E renamed to Q everywhere
    renamed = PROG.replace("B^{4}_{tx=0}L^{32}_{a=0}[E^{f32,g}_{tx}=E^{f32,g}_{tx}+exp(A^{f32,g}_{tx,a}-",
                           "B^{4}_{tx=0}L^{32}_{q=0}[E^{f32,g}_{tx}=E^{f32,g}_{tx}+exp(A^{f32,g}_{tx,q}-")
    assert renamed != PROG
    intermediate = PROG.replace("E^{f32,g}", "Q^{f32,g}")
    got = {k: rewards.score(SOFTMAX.text(), _answer(t)) for k, t in
           {"same": PROG, "renamed": renamed, "intermediate": intermediate, "wrong": WRONG}.items()}
    assert got["same"] == got["renamed"] == got["intermediate"] == (rewards.REWARDS["unchanged"], "unchanged")
    assert got["wrong"] == (rewards.REWARDS["not_equal"], "not_equal")
    assert got["wrong"][0] < got["renamed"][0]


def test_alpha_equivalence_keeps_thread_bindings_and_known_tensors():
    known = SOFTMAX.signature.names
    p = SOFTMAX.program
    ty = parse_leir(SOFTMAX.text().replace("tx", "ty")).program      # another thread axis: a real change
    bx = parse_leir(SOFTMAX.text().replace("tx", "bxq")).program     # block instead of thread: a real change
    assert not alpha_equivalent(p, ty, known) and not alpha_equivalent(p, bx, known)
    bxa = parse_leir(SOFTMAX.text().replace("tx", "bxa")).program
    bxq = parse_leir(SOFTMAX.text().replace("tx", "bxq")).program
    assert alpha_equivalent(bxa, bxq, known)                          # only the free part renamed
    # an input is not an intermediate: renaming it is another program
    assert not alpha_equivalent(p, parse_leir(SOFTMAX.text().replace("A", "Z")).program, known)


def _split() -> str:
    from steptp.engine import apply_rule
    from steptp.rules import load_rules

    rule = next(r for r in load_rules() if r.id == "loop_split")
    return format_program(apply_rule(rule, SOFTMAX, seed=0).after.program)


WRONG = PROG.replace("exp(A^{f32,g}_{tx,a}-D^{f32,g}_{tx})/", "exp(A^{f32,g}_{tx,a}-D^{f32,g}_{tx})*")


def test_a_worker_stalled_by_the_machine_is_infrastructure_not_the_program():
    """The machine stops the worker (SIGSTOP, as a loaded or swapping node would); the call hits
    its limit, the same completion runs fine in a fresh worker: reward None, counted."""
    rewards.close()
    split = _answer(_split())
    assert rewards.score(SOFTMAX.text(), split, timeout_s=60)[1] == "equal"  # warm: worker + references
    run = rewards._runner(60)
    before = rewards.STATS["infrastructure"]
    os.kill(run.pid, signal.SIGSTOP)
    # the stalled call waits out its limit; the fresh worker must start and build within the same limit,
    # on a machine loaded by the rest of the suite
    assert rewards.score(SOFTMAX.text(), split, timeout_s=30) == (None, "infrastructure")
    assert rewards.STATS["infrastructure"] == before + 1
    # the next completion runs in the fresh worker as usual
    assert rewards.score(SOFTMAX.text(), split, timeout_s=60) == (rewards.REWARDS["equal"], "equal")


def test_a_failure_that_reproduces_in_a_fresh_worker_is_the_programs():
    """Every run of this completion exceeds a 10 ms limit (a fresh worker cannot even start in
    that time): the failure reproduces, so it scores as not Equal (exec), never None. An
    original that cannot be run is infrastructure: nothing can be judged."""
    from steptp.verify import clear_reference_cache

    rewards.close()
    clear_reference_cache()
    assert rewards.score(SOFTMAX.text(), _answer(WRONG), timeout_s=0.01) == (None, "infrastructure")
    rewards.close()
    assert rewards.score(SOFTMAX.text(), _answer(_split()), timeout_s=60)[1] == "equal"  # references cached
    assert rewards.score(SOFTMAX.text(), _answer(WRONG), timeout_s=0.01) == (rewards.REWARDS["exec"], "exec")


# --------------------------------------------------------------------------- timed form


def test_the_timed_form_is_checked_against_the_verified_one():
    from steptp.backend.errors import FormMismatch
    from steptp.backend.perf import build_perf_cpu
    from steptp.runner.timing import check_performance_form

    check_performance_form(SOFTMAX)  # the real performance form (polynomial exp) agrees
    wrong = parse_leir(SOFTMAX.text().replace("exp(A^{f32,g}_{tx,a}-D^{f32,g}_{tx})/",
                                              "exp(A^{f32,g}_{tx,a}-D^{f32,g}_{tx})*"))
    # a timed kernel that computes something else than the verified program is caught
    with pytest.raises(FormMismatch) as ei:
        check_performance_form(SOFTMAX, seed=1, kernel=build_perf_cpu(wrong))
    e = ei.value
    assert "disagrees with the verification form" in e.reason and "output C" in e.reason
    assert "T.prim_func" in e.verification and "T.prim_func" in e.performance


# --------------------------------------------------------------------------- rules

PERTURBED = """\
id: {id}
name: division by a constant to multiplication
category: math
description: Multiplication by the reciprocal instead of a division.
preconditions: [pattern_match]
difficulty: {{K: 1, P: 1, S: 0}}
match:
  expr: "?x/?c"
rewrite: "?x*({num}/?c)"
cot: "{cot}"
tests:
  - name: a scale by a constant
    before: |
      % program: scale
      % input A: f32[64]
      % output C: f32[64]
      B^{{64}}_{{tx=0}}[C^{{f32,g}}_{{tx}}=A^{{f32,g}}_{{tx}}/32.0;];
    after: >-
      B^{{64}}_{{tx=0}}[C^{{f32,g}}_{{tx}}=A^{{f32,g}}_{{tx}}*({num}/32.0);];
"""


def _rule(tmp: Path, rid: str, num: str = "1.0", cot: str = "We multiply by the reciprocal.") -> Path:
    p = tmp / f"{rid}.yaml"
    p.write_text(PERTURBED.format(id=rid, num=num, cot=cot))
    return p


def test_a_rule_that_perturbs_a_constant_fails_its_own_tests(tmp_path):
    bad = subprocess.run([str(STP), "rules", "test", str(_rule(tmp_path, "perturbed", "1.00001"))],
                         capture_output=True, text=True, timeout=300)
    assert bad.returncode == 1 and "symbolic=disproved" in bad.stdout, bad.stdout + bad.stderr
    good = subprocess.run([str(STP), "rules", "test", str(_rule(tmp_path, "exact"))],
                          capture_output=True, text=True, timeout=300)
    assert good.returncode == 0 and "verified symbolic=proved" in good.stdout, good.stdout + good.stderr


def test_float64_verification_sees_what_the_f32_tolerance_hides():
    from steptp.rules.selftest import _float64_refutes
    from steptp.verify import verify_pair

    before = parse_leir("% program: s\n% input A: f32[64]\n% output C: f32[64]\n"
                        "B^{64}_{tx=0}[C^{f32,g}_{tx}=A^{f32,g}_{tx}*3.0;];\n")
    after = parse_leir(before.text().replace("*3.0", "*3.00003"))
    assert verify_pair(before, after).equal                       # 1e-5 relative: inside f32's 1e-4
    assert "outside the tolerance" in _float64_refutes(before, after)
    assert _float64_refutes(before, parse_leir(before.text().replace("*3.0", "*(1.5+1.5)"))) == ""


def test_lint_names_the_template_line_and_the_rejecting_where_clause(tmp_path):
    tpl = _rule(tmp_path, "broken_cot", cot="We rewrite {{ no_such_variable }} as a product.")
    text = PERTURBED.format(id="strict_where", num="1.0", cot="x").replace(
        'rewrite:', 'where:\n  - {check: "head_of(?c) == \\"log\\""}\nrewrite:')
    (tmp_path / "strict_where.yaml").write_text(text)
    r = subprocess.run([str(STP), "rules", "lint", str(tpl), str(tmp_path / "strict_where.yaml"),
                        "--program", str(ROOT / "examples" / "softmax.leir")],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 1, r.stdout + r.stderr
    # an unknown template variable is refused when the rule loads (issue 54), at the name itself
    cot_line = next(i for i, ln in enumerate(tpl.read_text().splitlines(), 1) if ln.startswith("cot:"))
    col = tpl.read_text().splitlines()[cot_line - 1].index("no_such_variable") + 1
    assert f"broken_cot.yaml:{cot_line}:{col}: cot: unknown template variable 'no_such_variable'" in r.stderr, \
        r.stderr
    # a template that loads but cannot render on a test: the cot: line (an attribute no parameter has)
    tpl2 = _rule(tmp_path, "broken_attr", cot="We rewrite {{ params.no_such_parameter }} as a product.")
    r2 = subprocess.run([str(STP), "rules", "lint", str(tpl2)], capture_output=True, text=True, timeout=300)
    assert r2.returncode == 1 and f"broken_attr.yaml:{cot_line}:1: cot: the template cannot render" in r2.stderr, \
        r2.stdout + r2.stderr
    assert "strict_where.yaml:10:5: where[0]" in r.stderr and "rejects all 1 site(s)" in r.stderr, r.stderr


# --------------------------------------------------------------------------- dataset


def test_a_broken_rule_fails_the_run_and_a_fixed_one_never_serves_the_stale_result(tmp_path):
    progs = tmp_path / "progs"
    progs.mkdir()
    (progs / "scale.leir").write_text("% program: scale\n% input A: f32[64]\n% output C: f32[64]\n"
                                      "B^{64}_{tx=0}[C^{f32,g}_{tx}=A^{f32,g}_{tx}/32.0;];\n")
    # (an unknown template variable is refused at load since issue 54: a missing attribute renders wrong)
    rule = _rule(tmp_path, "div_rule", cot="We rewrite {{ params.no_such_parameter }} as a product.")
    out = tmp_path / "out"
    cmd = [str(STP), "dataset", str(progs), "-o", str(out), "--rule", str(rule), "-q"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "rule div_rule" in r.stderr and "no_such_parameter" in r.stderr
    assert json.loads((out / "report.json").read_text())["rule_errors"].keys() == {"div_rule"}
    _rule(tmp_path, "div_rule")  # fixed
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert r.returncode == 2 and "div_rule.yaml" in r.stderr and "stale" in r.stderr, r.stderr
    r = subprocess.run(cmd[:4] + [str(tmp_path / "fresh")] + cmd[5:], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    assert json.loads((tmp_path / "fresh" / "report.json").read_text())["entries"] == 1
    # a rule file added since (a new strategy shipped): named, one line, not the whole option dict
    more = _rule(tmp_path, "div_rule_two")
    r = subprocess.run(cmd[:4] + [str(tmp_path / "fresh")] + cmd[5:] + ["--rule", str(more)], capture_output=True,
                       text=True, timeout=600)
    assert r.returncode == 2 and "added: div_rule_two.yaml" in r.stderr and "stale" in r.stderr, r.stderr
    assert len(r.stderr) < 400, r.stderr


def test_every_dataset_writes_an_rl_prompt_set_step_reward_reads(tmp_path):
    from datasets import load_dataset

    out = tmp_path / "out"
    r = subprocess.run([str(STP), "dataset", str(ROOT / "examples" / "softmax.leir"), "-o", str(out),
                        "--rule", str(ROOT / "rules" / "loop_split.yaml"), "--per-rule", "2", "-q"],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    ds = load_dataset("json", data_files=str(out / "rl_prompts.jsonl"))["train"]
    assert len(ds) == 1 and ds[0]["prompt"][0]["role"] == "user"
    entries = [json.loads(x) for x in (out / "dictionary.jsonl").read_text().splitlines()]
    assert sorted(ds[0]["entry_ids"]) == sorted(e["id"] for e in entries)
    labels = [single_label(e["cot"], e["transformed"]["leir"], e["strategy"]["name"]) for e in entries]
    columns = {k: [ds[0][k]] * len(labels) for k in ds.column_names if k != "prompt"}
    got = rewards.step_reward([ds[0]["prompt"]] * len(labels), labels, **columns)
    assert got == [rewards.REWARDS["equal"]] * len(labels)


def test_broken_rules_are_rule_errors_not_preflight_rejections_or_limits():
    """A rule whose candidates the GPU preflight rejects on a program, or that hits a time limit
    there, is not a broken rule; one whose template fails on every attempt is."""
    from steptp.dataset.pipeline import broken_rules

    attempts = [
        {"rule": "binding", "outcome": "apply_error", "reason": "PreflightRejected: 2048 threads per block"},
        {"rule": "slow", "outcome": "match_error", "reason": "WorkTimeout: rule slow: site enumeration"},
        {"rule": "tpl", "outcome": "apply_error", "reason": "UndefinedError: 'no_such_variable' is undefined"},
        {"rule": "tpl", "outcome": "apply_error", "reason": "UndefinedError: 'no_such_variable' is undefined"},
        {"rule": "mixed", "outcome": "apply_error", "reason": "KeyError: 'x'"},
        {"rule": "mixed", "outcome": "equal", "reason": ""},
        {"rule": "flaky", "outcome": "infrastructure", "reason": "exec: worker process crashed (SIGKILL)"},
    ]
    assert broken_rules(attempts) == {"tpl": "UndefinedError: 'no_such_variable' is undefined"}
