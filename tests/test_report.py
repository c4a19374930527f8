"""`stp report`: composition, pass rates, token efficiency and plots of a dataset run."""

import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from steptp.cli import app
from steptp.dataset.report import (build_report, composition, load_token_counter, pass_rates, program_texts,
                                   reason_key, stage_of, token_stats)
from steptp.dataset.difficulty import FilterPolicy

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
runner = CliRunner()

pytest.importorskip("matplotlib")


def stp(*args):
    return runner.invoke(app, [str(a) for a in args])


def rows(path):
    return [json.loads(l) for l in Path(path).read_text().splitlines() if l.strip()]


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("rep") / "out"
    res = stp("dataset", EXAMPLES / "softmax.leir", EXAMPLES / "log_terms.leir", "-o", out, "--in-process", "-q",
              "--no-nvcc", "--rule", ROOT / "rules" / "loop_split.yaml", "--rule", ROOT / "rules" / "loop_reorder.yaml",
              "--rule", ROOT / "rules" / "logsimp.yaml")
    assert res.exit_code == 0, res.output
    return out


def _image_ok(path: Path) -> None:
    import matplotlib.image as mpimg

    img = mpimg.imread(path)
    assert img.ndim == 3 and img.shape[0] > 100 and img.shape[1] > 100
    assert img.std() > 0.01  # not a blank canvas


def test_report_command_writes_markdown_and_plots(run_dir):
    res = stp("report", run_dir)
    assert res.exit_code == 0, res.output
    md = (run_dir / "report.md").read_text()
    assert res.output == md
    entries = rows(run_dir / "dictionary.jsonl")
    stats = json.loads((run_dir / "report_stats.json").read_text())
    assert stats["composition"]["entries"] == len(entries)
    assert stats["composition"]["single"] == len(rows(run_dir / "chat_single.jsonl"))
    assert stats["composition"]["multi"] == len(rows(run_dir / "chat_multi.jsonl"))
    for section in ("Counts before and after filtering", "Per difficulty level", "Per category", "Per strategy",
                    "Strategy diversity", "Pass rates per stage", "Token efficiency"):
        assert f"## {section}" in md
    for name in ("counts", "strategy", "category_level", "diversity", "pass_rates", "tokens"):
        png = run_dir / stats["plots"][name]
        assert f"({png.name})" in md
        _image_ok(png)
    by_strategy = json.loads((run_dir / "report.json").read_text())["by_strategy"]
    assert stats["composition"]["before"]["strategy"] == by_strategy
    # issue 50: every entry carries the figures its reason states, and no reason claims an
    # effect its figures contradict
    assert all(e["figures"]["target"] and "static_ns" in e["figures"] for e in entries)
    claims = stats["reason_claims"]
    assert claims == {"checked": len(entries), "contradicted": 0, "without_figure": 0, "examples": []}
    assert json.loads((run_dir / "report.json").read_text())["reason_claims"] == claims
    assert f"Reason claims contradicted by the step's figures (design.md §8): 0 of {len(entries)}" in md


def test_token_table_counts_the_same_programs_with_qwen(run_dir):
    count, desc = load_token_counter()
    assert "Qwen" in desc and "151" in desc  # the Qwen2.5/Qwen3 byte-level BPE vocabulary
    assert count(["hello world", ""]) == [2, 0]
    entries = rows(run_dir / "dictionary.jsonl")
    tok = token_stats(entries, count)
    progs = program_texts(entries)
    assert tok["programs"] == len(progs) == len({e["original"]["leir"] for e in entries} |
                                                 {e["transformed"]["leir"] for e in entries})
    leir = count([p["leir"] for p in progs])
    assert tok["stats"]["leir"]["max"] == max(leir)
    assert tok["stats"]["leir"]["mean"] == pytest.approx(sum(leir) / len(leir), abs=0.05)
    # the paper's finding holds here too: LEIR < TIR < CUDA
    assert tok["stats"]["leir"]["mean"] < tok["stats"]["tir"]["mean"] < tok["stats"]["cuda"]["mean"]
    md = (run_dir / "report.md").read_text() if (run_dir / "report.md").exists() else build_report(run_dir)[0]
    assert f"| LEIR | {tok['stats']['leir']['mean']} |" in md
    # issue 51: rows per dtype, and LEIR's reduction against each form beside the paper's
    by = tok["by_dtype"]
    assert sum(v["programs"] for v in by.values()) == tok["programs"] and set(by) <= {"f16", "f32", "f64", "bf16"}
    for d, v in by.items():
        mine = [i for i, p in enumerate(p for p in progs) if p["dtype"] == d]
        assert v["mean"]["leir"] == pytest.approx(sum(leir[i] for i in mine) / len(mine), abs=0.05)
        assert v["leir_reduction_pct"]["tir"] == pytest.approx(100 * (1 - v["mean"]["leir"] / v["mean"]["tir"]), abs=0.1)
    assert 0 < tok["leir_reduction_pct"]["tir"] < tok["leir_reduction_pct"]["cuda"] < 100
    assert "| paper (§4.2) | - | 499.3 | 1244.2 | 2897.3 | 59.9 % | 82.8 % |" in md


def test_report_on_an_interrupted_run(run_dir, tmp_path):
    out = tmp_path / "partial"
    shutil.copytree(run_dir, out)
    for name in ("chat_single.jsonl", "chat_multi.jsonl", "report.json", "report.md"):
        (out / name).unlink(missing_ok=True)
    entries = rows(out / "dictionary.jsonl")
    with open(out / "dictionary.jsonl", "a") as f:
        f.write('{"id": "torn", "prog')  # killed mid-write
    text, stats = build_report(out)
    assert "did not finish" in text
    assert stats["composition"]["entries"] == len(entries)
    _image_ok(out / "counts.png")


def test_report_rejects_a_directory_without_a_run(tmp_path):
    res = stp("report", tmp_path)
    assert res.exit_code == 2 and "not a dataset output directory" in res.output
    res = stp("report", tmp_path / "nope")
    assert res.exit_code == 2 and "no such directory" in res.output


def test_pass_rates_follow_the_first_failing_stage():
    attempts = [
        {"rule": "a", "outcome": "equal", "reason": ""},
        {"rule": "a", "outcome": "failed", "reason": "build: GPU preflight: 2048 threads per block > 1024"},
        {"rule": "a", "outcome": "failed", "reason": "build: GPU preflight: 4096 threads per block > 1024"},
        {"rule": "b", "outcome": "failed", "reason": "exec: time limit of 60 s exceeded"},
        {"rule": "b", "outcome": "failed", "reason": "equal: output C differs in trial 1: max abs error 0.5"},
        {"rule": "b", "outcome": "apply_error", "reason": "ValueError: x"},
        {"rule": "c", "outcome": "match_error", "reason": "KeyError: y"},
    ]
    assert [stage_of(a) for a in attempts] == [None, "build", "build", "exec", "equal", "apply", "match"]
    r = pass_rates(attempts)
    st = r["stages"]
    assert r["tried"] == 7
    assert (st["match"]["passed"], st["apply"]["passed"], st["diff"]["passed"]) == (6, 5, 5)
    assert (st["build"]["passed"], st["exec"]["passed"], st["equal"]["passed"]) == (3, 2, 1)
    assert st["equal"]["rate"] == 0.5
    # reasons that differ only in numbers group together, most frequent first
    assert r["first_failures"][0] == ("build", "build: GPU preflight: N threads per block > N", 2)
    assert r["by_rule"]["a"] == {"tried": 3, "equal": 1, "rate": 0.3333}
    assert reason_key("exec: trial 2: x") == "exec: trial N: x"


def test_final_level_shares_count_multi_items_singly(run_dir):
    entries = rows(run_dir / "dictionary.jsonl")
    comp = composition(entries, FilterPolicy(seed=0))
    multis = rows(run_dir / "chat_multi.jsonl")
    assert comp["final_items"] == comp["single"] + sum(len(m["meta"]["strategies"]) for m in multis)
    assert sum(comp["after"]["level"].values()) == comp["final_items"]
    assert sum(comp["level_pct"].values()) == pytest.approx(100, abs=0.05)
