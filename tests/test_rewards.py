"""steptp.rewards: the graded RL reward from the verifier (issue 28), on real programs.

Each completion's reward must agree with what `verify_pair` (what `stp verify` runs) says
of the same program; hostile completions never crash, hang or earn more than an unparsable
one."""

from __future__ import annotations

import random
import time
from pathlib import Path

import pytest

from steptp import rewards
from steptp.leir import load_leir
from steptp.leir.printer import format_program
from steptp.llm import parse_single
from steptp.llm.prompts import single_label
from steptp.verify import verify_pair

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
SOFTMAX = load_leir(EXAMPLES / "softmax.leir")
PROG = format_program(SOFTMAX.program)


@pytest.fixture(scope="module", autouse=True)
def _close_workers():
    yield
    rewards.close()


def _answer(program_text: str, strategy: str = "Loop Split") -> str:
    return single_label("think", program_text, strategy)


def _completions():
    from steptp.engine import apply_rule
    from steptp.rules import load_rules

    rules = {r.id: r for r in load_rules()}
    split = format_program(apply_rule(rules["loop_split"], SOFTMAX, seed=0).after.program)
    wrong = PROG.replace("exp(A^{f32,g}_{tx,a}-D^{f32,g}_{tx})/", "exp(A^{f32,g}_{tx,a}-D^{f32,g}_{tx})*")
    # a vectorized reduction axis: TVM would miscompile it, the lowering refuses it (Build)
    oob = PROG.replace("B^{4}_{tx=0}L^{32}_{a=0}[D", "B^{4}_{tx=0}V^{32}_{a=0}[D")
    # half of C is never written: the poisoned outputs show it (Exec)
    half = PROG.replace("B^{4}_{tx=0}L^{32}_{a=0}[C", "B^{4}_{tx=0}L^{16}_{a=0}[C")
    assert wrong != PROG and oob != PROG and half != PROG
    return {
        "exec": _answer(half),
        "equal": _answer(split),
        "unchanged": _answer(PROG),
        "not_equal": _answer(wrong),
        "build": _answer(oob),
        "unparsable": "I would split the loop.",
    }


def test_graded_rewards_agree_with_the_verifier():
    comps = _completions()
    got = rewards.step_reward(["p"] * len(comps), list(comps.values()), original=[SOFTMAX.text()] * len(comps))
    assert dict(zip(comps, got)) == {k: rewards.REWARDS[k] for k in comps}
    # the same stage as verify_pair (what stp verify runs) on the same programs
    for stage, text in comps.items():
        cand = parse_single(text, SOFTMAX.signature)
        if not cand.ok:
            assert stage == "unparsable"
            continue
        res = verify_pair(SOFTMAX, cand.module, isolated=True, timeout_s=120)
        first_fail = next((s for s in ("diff", "build", "exec", "equal") if not getattr(res, s)), None)
        assert {"diff": "unchanged", "build": "build", "exec": "exec", "equal": "not_equal", None: "equal"}[
            first_fail] == stage, (stage, res.reason)
    # conversational completions, TRL's other format; deterministic
    conv = [[{"role": "assistant", "content": t}] for t in comps.values()]
    assert rewards.step_reward(["p"] * len(conv), conv, original=[SOFTMAX.text()] * len(conv)) == got
    # verl's adapter
    assert rewards.compute_score("stp", comps["equal"], SOFTMAX.text()) == 1.0


def test_missing_original_is_a_clear_error():
    with pytest.raises(ValueError, match="original"):
        rewards.step_reward(["p"], ["x"])


def _hostile(rng: random.Random) -> str:
    kind = rng.randrange(9)
    if kind == 0:
        return "".join(chr(rng.randrange(1, 0x2FFF)) for _ in range(rng.randrange(1, 400)))
    if kind == 1:
        return "<answer>" + "[" * rng.randrange(100, 20000) + "</answer>"
    if kind == 2:
        return "<answer>" + "{\"transformed_IR\": " * rng.randrange(10, 3000) + "</answer>"
    if kind == 3:  # an IR that is not LEIR
        junk = " ".join(rng.choice(["for", "(", ")", "{", "B^{", "}_", "[", "];", "x", "=", "+"]) for _ in range(60))
        return _answer(junk)
    if kind == 4:  # LEIR with extents past the limits
        return _answer(PROG.replace("L^{32}", f"L^{{{2 ** rng.randrange(40, 70)}}}"))
    if kind == 5:  # tensors the prompt does not declare
        return _answer(PROG.replace("A^{f32,g}", "Z^{f32,g}"))
    if kind == 6:  # a wrong dtype for a declared tensor
        return _answer(PROG.replace("C^{f32,g}", "C^{f16,g}"))
    if kind == 7:
        return "<think>" + "x" * rng.randrange(10, 2_500_000) + "</think>"
    text = _answer(PROG)
    cut = rng.randrange(len(text) // 3, len(text) - 10)
    return text[:cut]  # truncated mid-answer


def test_fuzz_hostile_completions_never_crash_hang_or_earn():
    rng = random.Random(0)
    comps = [_hostile(rng) for _ in range(1000)]
    t0 = time.perf_counter()
    got = rewards.step_reward(["p"] * len(comps), comps, original=[SOFTMAX.text()] * len(comps), timeout_s=30)
    assert len(got) == 1000
    assert max(got) <= rewards.REWARDS["unparsable"], [c[:200] for c, r in zip(comps, got) if r > 0][:3]
    assert time.perf_counter() - t0 < 600  # a bound, not a speed target: no hang
