"""`stp dataset` end to end: verified rows, chat sets, resume, crash safety, reproducibility."""

import hashlib
import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from steptp.cli import app
from steptp.dataset.chat import parse_answer
from steptp.leir import parse_leir, parse_program
from steptp.leir.fileformat import LeirModule, Signature, TensorDecl
from steptp.resources import rules_dir
from steptp.verify import verify_pair

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
runner = CliRunner()


def stp(*args):
    return runner.invoke(app, [str(a) for a in args])


def rows(path):
    return [json.loads(l) for l in Path(path).read_text().splitlines() if l.strip()]


def digest(path):
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def small_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("ds") / "out"
    res = stp("dataset", EXAMPLES / "matmul.py", EXAMPLES / "softmax.py", "-o", out, "--seed", "0",
              "--in-process", "-q")
    assert res.exit_code == 0, res.output
    return out


def _module(sig: dict, leir: str) -> LeirModule:
    return LeirModule(Signature(sig["name"], tuple(TensorDecl(t["name"], t["role"], t["dtype"], tuple(t["shape"]))
                                                   for t in sig["tensors"])), parse_program(leir))


def test_every_row_is_a_verified_single_step(small_run):
    entries = rows(small_run / "dictionary.jsonl")
    assert {e["program"] for e in entries} == {"matmul", "softmax"}
    assert {"loop_split", "loop_reorder"} <= {e["strategy"]["id"] for e in entries}
    for e in entries:
        assert e["verification"]["equal"] and e["verification"]["trials"] == 9  # 3 random + 2 ordered + 4 edge-case
        assert e["verification"]["nvcc"] == (shutil.which("nvcc") is not None)  # nvcc --ptx in the Build pass
        assert e["original_verification"]["against"] == "pytorch" and e["original_verification"]["equal"]
        assert e["original"]["leir"] != e["transformed"]["leir"]
        assert "T.prim_func" in e["transformed"]["tir"] and "__global__" in e["transformed"]["cuda"]
        assert e["difficulty"]["level"] in ("easy", "medium", "difficult")
        assert e["cot"] and e["id"]
        # an independent re-check of the stored texts (another seed)
        res = verify_pair(_module(e["signature"], e["original"]["leir"]),
                          _module(e["signature"], e["transformed"]["leir"]), trials=3, seed=11)
        assert res.equal, res.reason


def test_chat_sets_are_ms_swift_and_answers_round_trip(small_run):
    entries = {e["id"]: e for e in rows(small_run / "dictionary.jsonl")}
    singles = rows(small_run / "chat_single.jsonl")
    assert singles
    for rec in singles:
        user, assistant = rec["messages"]
        assert (user["role"], assistant["role"]) == ("user", "assistant")
        assert len(rec["meta"]["entry_ids"]) == 1
        entry = entries[rec["meta"]["entry_ids"][0]]
        assert entry["original"]["leir"] in user["content"]
        (answer,) = parse_answer(assistant["content"])
        assert answer["transformed_IR"] == entry["transformed"]["leir"]
        assert answer["applied_strategy"] == entry["strategy"]["name"]
        assert assistant["content"].startswith("<think>" + entry["cot"])
    for rec in rows(small_run / "chat_multi.jsonl"):
        answers = parse_answer(rec["messages"][1]["content"])
        assert len(answers) == len(rec["meta"]["entry_ids"]) >= 2
        assert all(entries[i]["difficulty"]["level"] != "easy" for i in rec["meta"]["entry_ids"])


def test_report_counts_match_files(small_run):
    report = json.loads((small_run / "report.json").read_text())
    entries = rows(small_run / "dictionary.jsonl")
    assert report["programs"] == 2 and report["entries"] == len(entries)
    assert sum(report["by_strategy"].values()) == len(entries)
    assert report["chat_single"] == len(rows(small_run / "chat_single.jsonl"))


def test_outputs_load_with_datasets_and_parquet(small_run, tmp_path):
    datasets = pytest.importorskip("datasets")
    from steptp.dataset.writers import to_parquet

    d = datasets.load_dataset("json", data_files=str(small_run / "dictionary.jsonl"), split="train")
    assert d.num_rows == len(rows(small_run / "dictionary.jsonl"))
    assert set(d.column_names) >= {"id", "original", "transformed", "cot", "verification", "strategy"}
    c = datasets.load_dataset("json", data_files=str(small_run / "chat_single.jsonl"), split="train")
    assert c[0]["messages"][0]["role"] == "user"
    # both chat sets share one schema: one DatasetDict
    assert rows(small_run / "chat_multi.jsonl")
    dd = datasets.load_dataset("json", data_files={"single": str(small_run / "chat_single.jsonl"),
                                                   "multi": str(small_run / "chat_multi.jsonl")})
    assert set(dd) == {"single", "multi"} and dd["single"].features == dd["multi"].features
    assert dd["multi"][0]["meta"]["kind"] == "multi" and len(dd["multi"][0]["meta"]["entry_ids"]) >= 2
    pq = tmp_path / "dictionary.parquet"
    n = to_parquet(small_run / "dictionary.jsonl", pq)
    p = datasets.load_dataset("parquet", data_files=str(pq), split="train")
    assert p.num_rows == n == d.num_rows
    assert json.loads(p[0]["params"]) == d[0]["params"]


def test_same_seed_gives_identical_files(small_run, tmp_path):
    out = tmp_path / "again"
    res = stp("dataset", EXAMPLES / "softmax.py", EXAMPLES / "matmul.py", "-o", out, "--seed", "0",
              "--in-process", "-q")
    assert res.exit_code == 0, res.output
    for name in ("dictionary.jsonl", "chat_single.jsonl", "chat_multi.jsonl"):
        a = sorted((small_run / name).read_text().splitlines())
        b = sorted((out / name).read_text().splitlines())
        assert a == b, name


def test_resume_continues_without_duplicates_after_a_crash(small_run, tmp_path):
    out = tmp_path / "resume"
    shutil.copytree(small_run, out)
    before = rows(out / "dictionary.jsonl")
    # simulate a crash while the last program was being recorded: its state line is lost
    # and a torn half-record is left at the end of the dictionary
    state = (out / "state.jsonl").read_text().splitlines()
    (out / "state.jsonl").write_text("\n".join(state[:-1]) + "\n")
    with open(out / "dictionary.jsonl", "a") as f:
        f.write('{"id": "torn", "program": "mat')
    res = stp("dataset", EXAMPLES / "matmul.py", EXAMPLES / "softmax.py", "-o", out, "--seed", "0",
              "--in-process", "-q")
    assert res.exit_code == 0, res.output
    after = rows(out / "dictionary.jsonl")
    assert sorted(e["id"] for e in after) == sorted(e["id"] for e in before)
    assert len(rows(out / "state.jsonl")) == 2


def test_resume_adds_new_programs_only(small_run, tmp_path):
    out = tmp_path / "grow"
    shutil.copytree(small_run, out)
    n_before = len(rows(out / "dictionary.jsonl"))
    res = stp("dataset", EXAMPLES / "matmul.py", EXAMPLES / "softmax.py", EXAMPLES / "scale_bias.py", "-o", out,
              "--seed", "0", "--in-process", "-q")
    assert res.exit_code == 0, res.output
    entries = rows(out / "dictionary.jsonl")
    assert len(entries) > n_before and len({e["id"] for e in entries}) == len(entries)
    assert [s["source"].endswith("scale_bias.py") for s in rows(out / "state.jsonl")][-1]


def test_rerun_with_other_options_is_refused_and_changes_nothing(small_run, tmp_path):
    out = tmp_path / "other"
    shutil.copytree(small_run, out)
    before = {p.name: digest(p) for p in out.iterdir()}
    res = stp("dataset", EXAMPLES / "matmul.py", "-o", out, "--seed", "1", "--in-process", "-q")
    assert res.exit_code == 2
    assert "different options" in res.output and "seed: 0 there, 1 now" in res.output
    assert {p.name: digest(p) for p in out.iterdir()} == before


def test_bad_programs_are_reported_and_skipped(tmp_path):
    bad = tmp_path / "bad.leir"
    bad.write_text("% program: bad\n% input A: f32[4]\n% output C: f32[4]\nB^{4}_{tx=0}[C^{f32,g}_{tx}=A^{f32,g}_{tx}+;];\n")
    good = tmp_path / "good.leir"
    good.write_text((EXAMPLES / "scale_bias.leir").read_text())
    out = tmp_path / "out"
    res = stp("dataset", bad, good, "-o", out, "--in-process", "-q", "--rule",
              ROOT / "rules" / "loop_split.yaml")
    assert res.exit_code == 0, res.output
    report = json.loads((out / "report.json").read_text())
    (failed,) = report["programs_failed"]
    assert failed["source"] == str(bad) and f"{bad}:4:44" in failed["error"]
    assert report["entries"] >= 1 and report["by_strategy"] == {"loop_split": report["entries"]}


def test_isolated_workers_and_parallel_processes(tmp_path):
    out = tmp_path / "iso"
    res = stp("dataset", EXAMPLES / "scale_bias.leir", EXAMPLES / "gelu.leir", "-o", out, "-j", "2", "-q",
              "--rule", ROOT / "rules" / "loop_reorder.yaml", "--no-cuda")
    assert res.exit_code == 0, res.output
    entries = rows(out / "dictionary.jsonl")
    assert {e["program"] for e in entries} == {"scale_bias", "gelu"}
    assert all(e["verification"]["equal"] for e in entries)


# ---- rounds: derived originals (--rounds) ---------------------------------------------------

_ROUND_RULES = ["operator_fusion", "operator_fission", "set_storage_scope"]


def _rounds_run(out, rounds, *extra):
    args = ["dataset", EXAMPLES / "scale_bias.leir", EXAMPLES / "two_branch.leir", "-o", out, "--seed", "0",
            "--in-process", "-q", "--no-nvcc", "--no-cuda"]
    for r in _ROUND_RULES:
        args += ["--rule", ROOT / "rules" / f"{r}.yaml"]
    res = stp(*args, *extra, *(("--rounds", rounds) if rounds else ()))
    assert res.exit_code == 0, res.output
    return out


@pytest.fixture(scope="module")
def rounds_run(tmp_path_factory):
    return _rounds_run(tmp_path_factory.mktemp("rounds") / "out", 2)


def test_second_round_starts_from_verified_steps_of_the_first(rounds_run):
    entries = rows(rounds_run / "dictionary.jsonl")
    by_id = {e["id"]: e for e in entries}
    first = [e for e in entries if "derived_from" not in e]
    derived = [e for e in entries if "derived_from" in e]
    assert first and derived
    assert {e["strategy"]["id"] for e in first} == {"operator_fusion"}  # nothing else matches a translation
    # operator_fission and set_storage_scope need a fused nest: they occur only in round 2; a
    # fission of a two-nest fusion gives back the program it was derived from: no step (issue 50)
    assert "set_storage_scope" in {e["strategy"]["id"] for e in derived}
    attempts = rows(rounds_run / "attempts.jsonl")
    assert any(a["outcome"] == "reverts_parent" and a["rule"] == "operator_fission" for a in attempts)
    assert json.loads((rounds_run / "report.json").read_text())["labels"]["reverts_parent_skipped"] >= 1
    for e in derived:
        d = e["derived_from"]
        parent = by_id[d["id"]]
        assert d["round"] == 2 and d["chain"] == [parent["strategy"]["id"]]
        assert e["original"]["leir"] == parent["transformed"]["leir"]
        assert e["original_verification"]["against"] == "derived" and e["original_verification"]["equal"]
        assert e["verification"]["equal"] and e["source"] == parent["source"]
        assert e["transformed"]["leir"] != parent["original"]["leir"]
    # all rounds of a program are committed by its one state line
    states = rows(rounds_run / "state.jsonl")
    assert len(states) == 2 and sorted(i for s in states for i in s["ids"]) == sorted(by_id)


def test_one_round_is_the_default_and_writes_no_derived_entries(rounds_run, tmp_path):
    one = _rounds_run(tmp_path / "one", 1)
    plain = _rounds_run(tmp_path / "plain", None)
    for name in ("dictionary.jsonl", "attempts.jsonl", "run.json", "chat_single.jsonl", "chat_multi.jsonl"):
        assert (one / name).read_bytes() == (plain / name).read_bytes(), name
    assert "rounds" not in json.loads((plain / "run.json").read_text())
    first = [e for e in rows(rounds_run / "dictionary.jsonl") if "derived_from" not in e]
    assert rows(plain / "dictionary.jsonl") == first
    # another round count is another run: refused on resume
    res = stp("dataset", EXAMPLES / "scale_bias.leir", "-o", one, "--seed", "0", "--in-process", "-q", "--no-nvcc",
              "--no-cuda", *[x for r in _ROUND_RULES for x in ("--rule", ROOT / "rules" / f"{r}.yaml")],
              "--rounds", "2")
    assert res.exit_code == 2 and "rounds" in res.output


def test_rounds_resume_and_are_deterministic(rounds_run, tmp_path):
    out = tmp_path / "resume"
    shutil.copytree(rounds_run, out)
    state = (out / "state.jsonl").read_text().splitlines()
    (out / "state.jsonl").write_text("\n".join(state[:-1]) + "\n")  # the last program's rounds are not committed
    _rounds_run(out, 2)
    assert (out / "dictionary.jsonl").read_bytes() == (rounds_run / "dictionary.jsonl").read_bytes()
    assert sorted((out / "attempts.jsonl").read_text().splitlines()) == \
        sorted((rounds_run / "attempts.jsonl").read_text().splitlines())


def test_follow_ups_try_a_rule_on_the_output_of_the_strategies_it_follows(rounds_run, tmp_path):
    """--follow-ups (the paper profile's default): operator_fission and set_storage_scope name
    `follows: [operator_fusion]`; with one round they run, alone, on fused programs."""
    fu = _rounds_run(tmp_path / "fu", None, "--follow-ups")
    entries = rows(fu / "dictionary.jsonl")
    by_id = {e["id"]: e for e in entries}
    derived = [e for e in entries if "derived_from" in e]
    # (operator_fission's only candidates here undo the fusion: attempts 'reverts_parent', no entry)
    assert "set_storage_scope" in {e["strategy"]["id"] for e in derived}
    assert {e["strategy"]["id"] for e in derived} <= {"operator_fission", "set_storage_scope"}
    for e in derived:
        d = e["derived_from"]
        assert d["follow_up"] is True and d["round"] == 2
        parent = by_id[d["id"]]
        assert parent["strategy"]["id"] == "operator_fusion" and e["original"]["leir"] == parent["transformed"]["leir"]
        assert e["verification"]["equal"]
    # only the following rules ran on the follow-up originals
    tried = {a["rule"] for a in rows(fu / "attempts.jsonl") if "derived_from" in a}
    assert tried <= {"operator_fission", "set_storage_scope"}
    assert json.loads((fu / "run.json").read_text())["follow_ups"] is True
    # the paper profile turns them on; --no-follow-ups gives the plain run
    paper = _rounds_run(tmp_path / "paper", None, "--profile", "paper")
    assert rows(paper / "dictionary.jsonl") == entries
    off = _rounds_run(tmp_path / "off", None, "--profile", "paper", "--no-follow-ups")
    assert rows(off / "dictionary.jsonl") == [e for e in entries if "derived_from" not in e]


def test_follow_up_of_the_prefix_matmul_after_online_softmax(tmp_path):
    out = tmp_path / "sdpa"
    res = stp("dataset", EXAMPLES / "sdpa.leir", "-o", out, "--in-process", "-q", "--no-nvcc", "--no-cuda",
              "--rule", ROOT / "rules" / "online_softmax.yaml",
              "--rule", ROOT / "rules" / "normal_matmul_to_prefix_matmul_based_on_online_softmax.yaml", "--follow-ups")
    assert res.exit_code == 0, res.output
    got = {(e["strategy"]["id"], bool(e.get("derived_from"))) for e in rows(out / "dictionary.jsonl")}
    assert got == {("online_softmax", False), ("normal_matmul_to_prefix_matmul_based_on_online_softmax", True)}


def test_a_rule_cannot_follow_itself(tmp_path):
    from steptp.rules import RuleError, load_rule

    text = (ROOT / "rules" / "operator_fission.yaml").read_text().replace("follows: [operator_fusion]",
                                                                          "follows: [operator_fission]")
    (tmp_path / "operator_fission.yaml").write_text(text)
    with pytest.raises(RuleError, match="follows"):
        load_rule(tmp_path / "operator_fission.yaml")


def test_filters_group_derived_originals_as_programs_of_their_own(rounds_run):
    from steptp.dataset.difficulty import FilterPolicy
    from steptp.dataset.pipeline import filtered_sets

    entries = rows(rounds_run / "dictionary.jsonl")
    originals = {e["original"]["leir"] for e in entries}
    assert len(originals) > 2  # two source programs and their derived originals
    for profile in ("default", "paper"):
        singles, multis = filtered_sets(entries, FilterPolicy(seed=0, profile=profile, min_multi=2))
        for group in multis:
            assert len({e["original"]["leir"] for e in group}) == 1


def test_time_records_each_steps_speedup_and_the_report_tabulates_it(tmp_path):
    """--time (issue 20): every entry gets timing {original_us, transformed_us, speedup, ci,
    verdict, device} from the CPU performance build, timed interleaved; stp report shows
    speedups per strategy/level."""
    out = tmp_path / "timed"
    res = stp("dataset", EXAMPLES / "matmul.leir", "-o", out, "--seed", "0", "--in-process", "-q", "--time",
              "--rule", str(rules_dir() / "loop_reorder.yaml"), "--rule", str(rules_dir() / "loop_split.yaml"))
    assert res.exit_code == 0, res.output
    entries = rows(out / "dictionary.jsonl")
    keys = {"original_us", "transformed_us", "speedup", "ci", "verdict", "device"}
    assert entries and all(set(e["timing"]) == keys for e in entries)
    for e in entries:
        t = e["timing"]
        assert t["device"] == "cpu" and t["original_us"] > 0 and t["transformed_us"] > 0
        # interleaved timing (runner.timing.compare): the median of the paired ratios, in its interval
        assert t["ci"][0] - 1e-3 <= t["speedup"] <= t["ci"][1] + 1e-3
        assert t["verdict"] in ("faster", "slower", "same")
        lo, hi = sorted((t["speedup"], t["original_us"] / t["transformed_us"]))
        assert hi / lo < 1.5  # the medians of the same interleaved rounds tell the same story
    assert json.loads((out / "run.json").read_text())["time"] is True
    rep = stp("report", out, "--no-tokens")
    assert rep.exit_code == 0, rep.output
    text = (out / "report.md").read_text()
    assert "## Runtime: speedup of each step" in text and "loop_reorder" in text.split("## Runtime")[1]
    assert (out / "speedup.png").exists()
    # without --time nothing is timed and run.json has no time key (older runs resume)
    plain = tmp_path / "plain"
    assert stp("dataset", EXAMPLES / "matmul.leir", "-o", plain, "--seed", "0", "--in-process", "-q",
               "--rule", str(rules_dir() / "loop_split.yaml")).exit_code == 0
    assert all("timing" not in e for e in rows(plain / "dictionary.jsonl"))
    assert "time" not in json.loads((plain / "run.json").read_text())
