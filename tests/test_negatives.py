"""stp dataset --negatives (issue 28): labelled negatives, hard mutants, preference pairs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from steptp.dataset.chat import signature_of
from steptp.leir.fileformat import LeirModule, parse_leir
from steptp.verify import verify_pair

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
STP = Path(sys.executable).parent / "stp"


def rows(p: Path) -> list[dict]:
    return [json.loads(x) for x in p.read_text().splitlines() if x.strip()]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out = tmp_path_factory.mktemp("neg") / "ds"
    r = subprocess.run([STP, "dataset", EXAMPLES / "softmax.leir", EXAMPLES / "matmul.leir", "-o", out, "--negatives",
                        "-q", "--seed", "0"], capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr
    return out


def test_negatives_are_labelled_and_really_fail(run):
    negs = rows(run / "negatives.jsonl")
    assert negs
    for n in negs:
        assert {"original", "transformed", "strategy", "stage", "reason", "max_abs_err", "kind"} <= set(n)
        assert n["kind"] in ("rejected", "mutant") and n["stage"] in ("diff", "build", "exec", "equal", "symbolic")
    sig = {e["original"]["leir"]: e["signature"] for e in rows(run / "dictionary.jsonl")}
    # every negative fails verification (re-checked here, independently of the run)
    for n in negs[:: max(1, len(negs) // 8)]:
        head = signature_of(sig[n["original"]]).header() + "\n"
        orig = parse_leir(head + n["original"])
        try:
            cand = LeirModule(orig.signature, parse_leir(head + n["transformed"]).program)
        except Exception:  # noqa: BLE001 - a mutant that no longer parses with the header fails too
            continue
        assert not verify_pair(orig, cand, isolated=True, timeout_s=120).equal, n["transformed"]
    rep = json.loads((run / "report.json").read_text())
    assert rep["negatives"] == len(negs) and rep["mutants_tried"] >= rep["negatives_by_kind"].get("mutant", 0)
    # a mutant that passed is listed for review, never recorded as a negative
    passed = {p["transformed"] for p in rep["mutants_passed"]}
    assert not passed & {n["transformed"] for n in negs}


def test_preference_pairs_load_in_both_formats(run):
    from datasets import load_dataset

    trl = load_dataset("json", data_files=str(run / "chat_pairs.jsonl"), split="train")
    assert len(trl) > 0 and {"prompt", "chosen", "rejected"} <= set(trl.column_names)
    for rec in rows(run / "chat_pairs.jsonl"):
        assert rec["prompt"][0]["role"] == "user" and rec["chosen"][0]["role"] == rec["rejected"][0]["role"] == "assistant"
        assert rec["chosen"][0]["content"] != rec["rejected"][0]["content"]
        assert "<answer>" in rec["rejected"][0]["content"]
    swift = rows(run / "chat_pairs_swift.jsonl")
    assert len(swift) == len(trl) and all("rejected_response" in r and len(r["messages"]) == 2 for r in swift)


def test_rerun_resumes_to_the_same_files(run):
    before = {f: (run / f).read_bytes() for f in ("negatives.jsonl", "chat_pairs.jsonl", "attempts.jsonl")}
    r = subprocess.run([STP, "dataset", EXAMPLES / "softmax.leir", EXAMPLES / "matmul.leir", "-o", run, "--negatives",
                        "-q", "--seed", "0"], capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr
    assert {f: (run / f).read_bytes() for f in before} == before


def test_without_the_flag_nothing_changes(tmp_path):
    out = tmp_path / "plain"
    r = subprocess.run([STP, "dataset", EXAMPLES / "softmax.leir", "-o", out, "-q", "--per-rule", "1"],
                       capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr
    assert not (out / "negatives.jsonl").exists() and not (out / "chat_pairs.jsonl").exists()
    assert "negatives" not in json.loads((out / "run.json").read_text())
    assert all("negative" not in a for a in rows(out / "attempts.jsonl"))


def test_trl_reads_the_pairs_as_a_conversational_preference_dataset(run):
    data_utils = pytest.importorskip("trl.data_utils")
    from datasets import load_dataset

    ds = load_dataset("json", data_files=str(run / "chat_pairs.jsonl"), split="train")
    rec = ds[0]
    assert data_utils.is_conversational(rec)
    assert data_utils.maybe_extract_prompt(rec)["prompt"] == rec["prompt"]
    # TRL's own unpairing (to KTO-style rows) accepts the columns
    unpaired = data_utils.unpair_preference_dataset(ds.remove_columns(["meta"]))
    assert len(unpaired) == 2 * len(ds) and set(unpaired["label"]) == {True, False}
