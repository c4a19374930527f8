"""stp eval / stp testset (issue 17, paper §4.3): a real OpenAI-compatible HTTP server
(tests/openai_stub.py) on 127.0.0.1 driven through the official openai client."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from openai_stub import OpenAIStub, Reply, closed_port

from steptp.cli import app
from steptp.eval import pass_at_k
from steptp.leir import load_leir

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
FIVE = ["softmax", "gemm_relu", "scale_bias", "gelu", "max_reduction"]
runner = CliRunner()


def _corpus(tmp_path: Path, names=FIVE) -> Path:
    d = tmp_path / "cases"
    d.mkdir()
    for n in names:
        (d / f"{n}.leir").write_text((EXAMPLES / f"{n}.leir").read_text())
    return d


def _oracle_table(progs: Path) -> dict[str, str]:
    """prompt -> a label made by our own engine (one rule step), as the dataset writes it."""
    from steptp.engine import apply_rule
    from steptp.llm import single_label, single_prompt
    from steptp.rules import load_rules

    rules = {r.id: r for r in load_rules()}
    table = {}
    for f in sorted(progs.glob("*.leir")):
        m = load_leir(f)
        for rid in ("loop_split", "loop_reorder", "additive_split", "exponential_split"):
            try:
                step = apply_rule(rules[rid], m, seed=1)
            except Exception:  # noqa: BLE001 - this rule does not match: the next one
                continue
            table[single_prompt(m)] = single_label(step.cot, step.after, rules[rid].name)
            break
    return table


def _oracle(table):
    def handler(req):
        return table.get(req["messages"][-1]["content"], "<answer>unknown prompt</answer>")
    return handler


def _eval(*args):
    return runner.invoke(app, ["eval", *map(str, args), "-q", "--trials", "3"])


def test_pass_at_k_matches_hand_computation():
    assert pass_at_k(5, 2, 2) == pytest.approx(1 - 3 / 10)          # 1 - C(3,2)/C(5,2)
    assert pass_at_k(10, 3, 1) == pytest.approx(0.3)                 # k=1: c/n
    assert pass_at_k(4, 0, 3) == 0.0
    assert pass_at_k(4, 2, 3) == 1.0                                 # n-c < k
    assert pass_at_k(16, 5, 4) == pytest.approx(1 - (11 * 10 * 9 * 8) / (16 * 15 * 14 * 13))
    with pytest.raises(ValueError):
        pass_at_k(3, 4, 1)


def test_oracle_endpoint_scores_resumes_and_reports(tmp_path):
    progs = _corpus(tmp_path)
    table = _oracle_table(progs)
    assert len(table) == 5
    out = tmp_path / "out"
    with OpenAIStub(_oracle(table)) as stub:
        r = _eval(progs, "-o", out, "--endpoint", stub.url, "--model", "stub", "--samples", "2", "--concurrency", "2")
        assert r.exit_code == 0, r.output
        assert stub.count == 5                       # n=2 in one request per case
        assert all(req.get("n") == 2 and req["temperature"] == 0.0 for req in stub.requests)
        s = json.loads((out / "summary.json").read_text())
        for key in ("cases", "samples", "diff", "build", "exec", "equal", "pass_at_k", "by_strategy", "by_category",
                    "by_level", "claimed_vs_recognised", "agreement", "reasons"):
            assert key in s
        assert s["cases"] == 5 and s["samples"] == 2
        assert s["equal"] >= 0.8
        assert set(s["pass_at_k"]["equal"]) == {"1", "2"}
        assert 0.0 <= s["diff"] <= 1.0 and s["equal"] <= s["exec"] <= s["build"] <= s["diff"]
        assert sum(s["by_category"]["recognised"].values()) >= 8
        assert s["agreement"] >= 0.8                 # the engine's label names the rule that made it
        recs = [json.loads(x) for x in (out / "results.jsonl").read_text().splitlines()]
        assert len(recs) == 10
        assert {"case", "sample", "prompt", "answer", "parsed_leir", "stage", "reason", "named_strategy",
                "recognised", "prompt_tokens", "completion_tokens"} <= set(recs[0])
        assert "| Diff | Build | Exec | Equal |" in (out / "report.md").read_text()
        assert (out / "stages.png").stat().st_size > 0 and (out / "strategies.png").exists()
        # resume: finished cases are not asked again (a torn last line is ignored)
        with open(out / "results.jsonl", "a") as f:
            f.write('{"case": "torn')
        r = _eval(progs, "-o", out, "--endpoint", stub.url, "--model", "stub", "--samples", "2")
        assert r.exit_code == 0, r.output
        assert stub.count == 5
        assert json.loads((out / "summary.json").read_text())["equal"] == s["equal"]
        # other options in the same directory: bad input
        r = _eval(progs, "-o", out, "--endpoint", stub.url, "--model", "other", "--samples", "2")
        assert r.exit_code == 2 and "other options" in r.output


HOSTILE = [
    "I would rather not.",
    "<answer>" + "[" * 100000 + "</answer>",
    "<answer>" + "x" * 2_100_000 + "</answer>",
    '<answer>{"transformed_IR": "B^{8}_{tx=0}[[[", "applied_strategy": "loop split"}</answer>',
    '<answer>{"transformed_IR": "L^{4}_{a=0}[Q^{f32,g}_{a}=1.0;];", "applied_strategy": "loop split"}</answer>',
]


def test_garbage_answers_fail_each_case_with_a_reason(tmp_path):
    progs = _corpus(tmp_path)
    with OpenAIStub(lambda req: HOSTILE[len(stub.requests) - 1]) as stub:
        r = _eval(progs, "-o", tmp_path / "out", "--endpoint", stub.url, "--model", "m", "--no-recognise")
    assert r.exit_code == 0, r.output
    s = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert s["equal"] == 0 and s["diff"] == 0
    recs = [json.loads(x) for x in (tmp_path / "out" / "results.jsonl").read_text().splitlines()]
    assert len(recs) == 5 and all(rec["reason"].startswith("parse:") for rec in recs)


def test_slow_server_times_out_as_a_failed_case_and_500_is_retried(tmp_path):
    progs = _corpus(tmp_path, ["scale_bias"])
    table = _oracle_table(progs)
    with OpenAIStub(_oracle(table), delay=3.0) as stub:
        t0 = time.monotonic()
        r = _eval(progs, "-o", tmp_path / "slow", "--endpoint", stub.url, "--model", "m",
                  "--request-timeout", "0.5", "--retries", "0", "--no-recognise")
        assert time.monotonic() - t0 < 30
    assert r.exit_code == 0, r.output
    rec = json.loads((tmp_path / "slow" / "results.jsonl").read_text().splitlines()[0])
    assert rec["error"] == "request" and "no answer within" in rec["reason"]

    calls = []

    def flaky(req):
        calls.append(1)
        return Reply(status=500) if len(calls) == 1 else table[req["messages"][-1]["content"]]

    with OpenAIStub(flaky) as stub:
        r = _eval(progs, "-o", tmp_path / "flaky", "--endpoint", stub.url, "--model", "m", "--retries", "2",
                  "--no-recognise")
        assert stub.count == 2
    assert r.exit_code == 0, r.output
    assert json.loads((tmp_path / "flaky" / "summary.json").read_text())["equal"] == 1.0


def test_unreachable_endpoint_exits_1_fast(tmp_path):
    progs = _corpus(tmp_path, ["scale_bias"])
    t0 = time.monotonic()
    r = _eval(progs, "-o", tmp_path / "out", "--endpoint", f"http://127.0.0.1:{closed_port()}/v1", "--model", "m")
    assert r.exit_code == 1
    assert time.monotonic() - t0 < 10
    assert "unreachable" in r.output and "Traceback" not in r.output
    assert not (tmp_path / "out" / "results.jsonl").exists()


def test_identity_policy_and_bad_input(tmp_path):
    progs = _corpus(tmp_path, ["scale_bias", "gelu"])
    r = _eval(progs, "-o", tmp_path / "id", "--policy", "identity", "--no-recognise")
    assert r.exit_code == 0, r.output
    s = json.loads((tmp_path / "id" / "summary.json").read_text())
    assert s["diff"] == 0 and s["equal"] == 0 and s["parse"] == 1.0
    assert _eval(tmp_path / "missing", "-o", tmp_path / "x", "--policy", "identity").exit_code == 2
    assert _eval(progs, "-o", tmp_path / "x").exit_code == 2                       # no answer source
    assert _eval(progs, "-o", tmp_path / "x", "--policy", "nope").exit_code == 2


def test_answers_file_and_candidate_parsing(tmp_path):
    from steptp.llm import parse_candidates, parse_single, single_prompt

    progs = _corpus(tmp_path, ["scale_bias"])
    m = load_leir(progs / "scale_bias.leir")
    label = next(iter(_oracle_table(progs).values()))
    (tmp_path / "a.jsonl").write_text(json.dumps({"prompt": single_prompt(m), "answer": label}) + "\n")
    r = _eval(progs, "-o", tmp_path / "out", "--answers", tmp_path / "a.jsonl", "--no-recognise")
    assert r.exit_code == 0, r.output
    assert json.loads((tmp_path / "out" / "summary.json").read_text())["equal"] == 1.0

    good = parse_single(label, m.signature)
    assert good.ok and good.module.signature == m.signature
    multi = "<answer>" + json.dumps([
        {"idx": 3, "transformed_IR": good.leir, "applied_strategies": ["loop split"]},
        {"idx": 4, "transformed_IR": "nonsense", "applied_strategies": "x"},
        "not an object"]) + "</answer>"
    cands, reason = parse_candidates(multi, m.signature)
    assert reason == "" and [c.idx for c in cands] == [3, 4, 2]
    assert cands[0].ok and cands[0].strategy == "loop split"
    assert not cands[1].ok and "answer item 1" in cands[1].reason and not cands[2].ok
    assert parse_candidates("garbage", m.signature)[1].startswith("no <answer>")


def test_client_falls_back_when_the_server_ignores_n():
    from steptp.llm import ChatClient

    with OpenAIStub(lambda req: "hello", honour_n=False) as stub:
        c = ChatClient(stub.url.removesuffix("/v1"), "m", max_retries=0)
        c.check()
        got = c.complete([{"role": "user", "content": "hi"}], n=3)
        assert [g.text for g in got] == ["hello"] * 3 and stub.count == 3


def test_testset_variants_and_overlap(tmp_path):
    from steptp.leir.printer import format_program

    progs = _corpus(tmp_path, ["scale_bias"])
    out = tmp_path / "ts"
    r = runner.invoke(app, ["testset", str(progs), "-o", str(out), "--variants", "2", "-q"])
    assert r.exit_code == 0, r.output
    files = sorted(out.glob("*.leir"))
    assert len(files) == 2
    dts = {load_leir(f).signature.tensors[0].dtype for f in files}
    assert dts == {"f16", "f64"}                      # the input is f32: the other dtypes first
    ds = tmp_path / "ds"
    ds.mkdir()
    entry = {"original": {"leir": format_program(load_leir(files[0]).program)}, "transformed": {"leir": "x"}}
    (ds / "dictionary.jsonl").write_text(json.dumps(entry) + "\n")
    out2 = tmp_path / "ts2"
    r = runner.invoke(app, ["testset", str(progs), "-o", str(out2), "--variants", "2", "--exclude", str(ds), "-q"])
    assert r.exit_code == 1 and "overlap" in r.output and not out2.exists()
    r = runner.invoke(app, ["testset", str(progs), "-o", str(out2), "--variants", "2", "--exclude", str(ds),
                            "--allow-overlap", "-q"])
    assert r.exit_code == 0 and len(list(out2.glob("*.leir"))) == 2
    assert runner.invoke(app, ["testset", str(tmp_path / "nope"), "-o", str(out2)]).exit_code == 2
