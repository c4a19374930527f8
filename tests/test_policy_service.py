"""The engine service (steptp.rules.service) and the one Policy protocol (steptp.policy),
issue 27: one seeded generator, one bounded engine call, one EnginePolicy / LLMPolicy /
ReplayPolicy shared by stp search and stp eval. LLM paths talk to a real OpenAI-compatible
HTTP server on 127.0.0.1 (tests/openai_stub.py)."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from openai_stub import OpenAIStub, closed_port

from steptp.rules.service import EngineService, bounded
from steptp.seeds import seeded_rng
from steptp.leir import format_program, load_leir
from steptp.llm import ChatClient, single_label, single_prompt
from steptp.policy import EnginePolicy, LLMPolicy, ReplayError, ReplayPolicy, StrategyNames, program_key
from steptp.rules import load_rules
from steptp.timelimit import WorkTimeout

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


@pytest.fixture(scope="module")
def softmax():
    return load_leir(EXAMPLES / "softmax.leir")


@pytest.fixture(scope="module")
def rules():
    return [r for r in load_rules() if r.id in ("loop_split", "loop_reorder", "exponential_split", "loop_fusion")]


class _Case:
    """An eval case as steptp.eval.policies.Case holds it (the fields policies read)."""

    def __init__(self, module, cid="c0"):
        self.id, self.source, self.program, self.module = cid, f"{cid}.leir", module.signature.name, module
        self.prompt = single_prompt(module)


def test_seeded_rng_is_the_dataset_derivation():
    # stp dataset seeded random.Random(f"{seed}:{key}:{rule}") before the helper existed
    assert seeded_rng(0, "key", "loop_split").random() == random.Random("0:key:loop_split").random()
    assert seeded_rng(3, "k", "round2").sample(range(50), 5) == random.Random("3:k:round2").sample(range(50), 5)


def test_bounded_call_raises_past_its_limit():
    assert bounded(sum, [1, 2, 3], time_s=5) == 6
    with pytest.raises(WorkTimeout):
        bounded(lambda: [0 for _ in iter(int, 1)], time_s=0.2, what="spin")


def test_service_in_worker_and_in_process_agree(softmax, rules):
    with EngineService(rules, isolated=True) as iso, EngineService(rules, isolated=False) as local:
        assert iso.isolated and not local.isolated
        counts = iso.counts(softmax)
        assert counts == local.counts(softmax)
        rid = next(r for r, n in counts.items() if n)
        a, b = iso.apply(softmax, rid, 0, seed=1), local.apply(softmax, rid, 0, seed=1)
        assert a.ok and b.ok and b.step is not None and a.step is None
        assert format_program(a.module.program) == format_program(b.module.program)
        assert a.site == b.site and a.params == b.params and a.cot == b.cot
        assert a.module.signature == softmax.signature
        bad = iso.apply(softmax, rid, 10_000)  # no such candidate: a failure, never an exception
        assert not bad.ok and bad.error == "fail" and "IndexError" in bad.reason
        assert iso.skipped.get("apply: rewrite failed") == 1


def test_service_time_limit_kills_the_worker(softmax, rules):
    svc = EngineService(rules, apply_timeout_s=1e-4)
    try:
        svc.counts(softmax)  # starts the worker (its start-up is not charged to the call)
        a = svc.apply(softmax, rules[0].id, 0)
        assert not a.ok and a.error == "time"
        assert svc.skipped["apply: time limit or crash"] == 1
    finally:
        svc.close()


def test_engine_policy_is_seeded_and_never_repeats(softmax, rules):
    def run(seed):
        pol = EnginePolicy(rules, seed=seed, per_rule=3)
        try:
            first, second = pol.propose(softmax, [], 2), pol.propose(softmax, [], 2)
        finally:
            pol.close()
        return [(p.strategy, p.site, json.dumps(p.params, sort_keys=True)) for p in first + second]

    a = run(0)
    assert len(a) == 4 and len(set(a)) == 4  # a program never gets the same candidate twice
    assert a == run(0)


def test_engine_policy_rule_pick_draws_per_sample(softmax, rules):
    pol = EnginePolicy(rules, pick="rule", seed=0)
    try:
        p0 = pol.propose(softmax, [], 1, draw=("case", 0))
        again = pol.propose(softmax, [], 1, draw=("case", 0))
        assert len(p0) == 1 and p0[0].strategy in {r.id for r in rules}
        assert format_program(p0[0].module.program) == format_program(again[0].module.program)
        assert pol.rule_name(p0[0].strategy) == next(r.name for r in rules if r.id == p0[0].strategy)
    finally:
        pol.close()
    with pytest.raises(ValueError):
        EnginePolicy(rules, pick="nope")


def test_eval_engine_baseline_goes_through_the_adapter(softmax, rules):
    from steptp.eval.policies import EngineAnswers as EvalEngine

    ev = EvalEngine(seed=0, rules=rules)
    case = _Case(softmax)
    try:
        answers = ev.answers(case, 2, first_sample=0)
        resumed = ev.answers(case, 1, first_sample=1)  # a resumed run asks sample 1 alone: same answer
        assert answers[1].text == resumed[0].text
        p = ev.policy.propose(case, [], 1, draw=(case.id, 0))[0]
        assert answers[0].text == single_label(p.cot, p.module, ev.policy.rule_name(p.strategy))
        assert answers[0].extra == {"rule": p.strategy}
    finally:
        ev.close()


def test_strategy_names_one_lookup():
    names = StrategyNames()
    assert names.rule_id("Loop-Split ") == "loop_split"
    assert names.strategy_id("Loop Split; loop-reorder") == "loop_split+loop_reorder"
    assert names.strategy_id("a brand new trick") == "a_brand_new_trick"
    assert names.strategy_id("") == "llm"
    from steptp.eval.recognize import Recognizer

    rec = Recognizer(rules=load_rules())
    try:
        assert rec.rule_for_name("LOOP split").id == "loop_split"
    finally:
        rec.close()


def test_replay_policy_reads_search_and_answer_records(tmp_path, softmax):
    other = load_leir(EXAMPLES / "gelu.leir")
    label = single_label("split it", softmax, "Loop Split")
    f = tmp_path / "r.jsonl"
    f.write_text("\n".join(json.dumps(r) for r in (
        {"parent": format_program(softmax.program), "leir": format_program(softmax.program), "strategy": "x"},
        {"leir": format_program(other.program), "strategy": "y"},
        {"case": "c0", "answer": label, "sample": 1},
    )))  # no final newline: the last line still counts
    pol = ReplayPolicy(f)
    got = pol.propose(softmax, [], 5)
    assert [p.strategy for p in got] == ["x", "y"]
    assert pol.propose(softmax, [], 5) == []  # each record once
    case = _Case(softmax)
    ans = pol.propose(case, [], 1, draw=(1,))
    assert len(ans) == 1 and ans[0].answer == label and ans[0].module is not None
    assert pol.propose(case, [], 1, draw=(0,)) == []
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"nothing": 1}\n')
    with pytest.raises(ReplayError, match="bad.jsonl:1"):
        ReplayPolicy(bad)


def test_llm_policy_single_prompt_and_failed_request(softmax):
    label = single_label("split it", softmax, "Loop Split")
    with OpenAIStub(lambda req: [label, "garbage"]) as stub:
        pol = LLMPolicy(ChatClient(stub.url, "stub"), prompt="single", temperature=0.0, seed=7)
        case = _Case(softmax)
        got = pol.propose(case, [], 2)
        assert [p.answer for p in got] == [label, "garbage"]
        assert got[0].module is not None and got[1].module is None
        assert got[0].info["completion_tokens"] and stub.requests[0]["seed"] == 7
        assert stub.requests[0]["messages"][-1]["content"] == case.prompt
    dead = LLMPolicy(ChatClient(f"http://127.0.0.1:{closed_port()}/v1", "m", timeout_s=2, max_retries=0),
                     prompt="single")
    failed = dead.propose(_Case(softmax), [], 2)
    assert len(failed) == 2 and all(p.error and p.error.startswith("request:") for p in failed)


def test_program_key_is_canonical_text(softmax):
    assert program_key(softmax) == format_program(softmax.program) == program_key(_Case(softmax))
