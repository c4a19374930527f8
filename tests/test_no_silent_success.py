"""No silent success: ``stp dataset`` / ``stp eval`` / ``stp search`` count programs lost to an
internal error (an unexpected exception, a crashed worker) apart from bad input and rejected
candidates, and exit 1 when every program of the run failed so; and ``stp search --device``
(``--target`` kept as a deprecated alias).

Internal errors are driven through the real CLI with ``STP_FAULT_INJECT`` (steptp.faults: the
per-program processing of each command raises ``RuntimeError``), nothing of the project is
mocked. Programs are the smallest examples, one rule, one search iteration."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from steptp.cli import app

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
RULE = ROOT / "rules" / "loop_split.yaml"
runner = CliRunner()
ALL = {"STP_FAULT_INJECT": "internal"}


def _progs(tmp_path: Path, names=("scale_bias", "gelu", "softmax")) -> list[Path]:
    out = []
    for n in names:
        p = tmp_path / "progs" / f"{n}.leir"
        p.parent.mkdir(exist_ok=True)
        p.write_text((EXAMPLES / f"{n}.leir").read_text())
        out.append(p)
    return out


def _stp(*args, env=None):
    return runner.invoke(app, [str(a) for a in args], env=env or {"STP_FAULT_INJECT": ""})


def _rows(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines()]


# ---- stp dataset ----------------------------------------------------------------------------


def _dataset(progs, out, env=None):
    return _stp("dataset", *progs, "-o", out, "--rule", RULE, "--in-process", "--no-cuda", "--no-nvcc", "-q",
                env=env)


def test_dataset_all_internal_errors_exit_1_and_keep_the_output(tmp_path):
    out = tmp_path / "out"
    r = _dataset(_progs(tmp_path), out, env=ALL)
    assert r.exit_code == 1, r.output
    assert f"error: all 3 program(s) failed with internal errors; see {out / 'report.json'}" in r.stderr
    assert "Traceback" not in r.stderr
    report = json.loads((out / "report.json").read_text())
    assert report["programs"] == 3 and report["internal_errors"] == 3 and report["input_errors"] == 0
    assert all(f["error"].startswith("internal error: RuntimeError: injected internal fault")
               for f in report["programs_failed"])
    # everything a run writes is there: the resume record of every program, the derived files
    assert len(_rows(out / "state.jsonl")) == 3
    for name in ("run.json", "dictionary.jsonl", "attempts.jsonl", "chat_single.jsonl", "chat_multi.jsonl"):
        assert (out / name).exists(), name


def test_dataset_some_internal_errors_keep_exit_0_and_are_counted_apart_from_bad_input(tmp_path):
    bad = tmp_path / "bad.leir"  # a syntax error: bad input, not internal
    bad.write_text("% program: bad\n% input A: f32[4]\n% output C: f32[4]\n"
                   "B^{4}_{tx=0}[C^{f32,g}_{tx}=A^{f32,g}_{tx}+;];\n")
    progs = [bad, *_progs(tmp_path, ("scale_bias", "gelu"))]
    out = tmp_path / "out"
    r = _dataset(progs, out, env={"STP_FAULT_INJECT": "internal:gelu"})
    assert r.exit_code == 0, r.output
    assert f"1 of 3 program(s) failed with internal errors; see {out / 'report.json'}" in r.stderr
    report = json.loads((out / "report.json").read_text())
    assert (report["programs"], report["internal_errors"], report["input_errors"]) == (3, 1, 1)
    assert report["entries"] >= 1 and report["by_strategy"] == {"loop_split": report["entries"]}


def test_dataset_no_verified_candidate_is_not_an_internal_error(tmp_path):
    # powsimp does not match scale_bias: no entry, no error, exit 0
    out = tmp_path / "out"
    r = _stp("dataset", *_progs(tmp_path, ("scale_bias",)), "-o", out, "--rule", ROOT / "rules" / "powsimp.yaml",
             "--in-process", "--no-cuda", "--no-nvcc", "-q")
    assert r.exit_code == 0, r.output
    report = json.loads((out / "report.json").read_text())
    assert report["entries"] == 0 and report["programs_failed"] == []
    assert report["internal_errors"] == 0 and report["input_errors"] == 0
    assert "internal errors" not in r.stderr


def test_dataset_broken_rule_file_is_bad_input_not_an_internal_error(tmp_path):
    rule = tmp_path / "broken.yaml"
    rule.write_text("id: broken\nname: [\n")
    out = tmp_path / "out"
    r = _stp("dataset", *_progs(tmp_path, ("scale_bias",)), "-o", out, "--rule", rule, "--in-process", "-q")
    assert r.exit_code == 2, r.output
    assert str(rule) in r.stderr and "invalid YAML" in r.stderr
    assert not out.exists()  # refused before anything was written


# ---- stp eval -------------------------------------------------------------------------------


def _eval(progs, out, *extra, env=None):
    return _stp("eval", *progs, "-o", out, "--policy", "identity", "--no-recognise", "-q", "--trials", "1", *extra,
                env=env)


def test_eval_all_internal_errors_exit_1(tmp_path):
    out = tmp_path / "ev"
    r = _eval(_progs(tmp_path, ("scale_bias", "gelu")), out, "--verify-timeout", "30", env=ALL)
    assert r.exit_code == 1, r.output
    assert f"error: all 2 program(s) failed with internal errors; see {out / 'summary.json'}" in r.stderr
    s = json.loads((out / "summary.json").read_text())
    assert s["cases"] == 2 and s["internal_errors"] == 2 and s["internal_error_samples"] == 2
    assert s["request_errors"] == 0
    recs = _rows(out / "results.jsonl")
    assert len(recs) == 2 and all(x["error"] == "internal" and x["reason"].startswith("internal error:") for x in recs)
    assert "internal errors: 2 sample(s)" in (out / "report.md").read_text()


def test_eval_some_internal_errors_exit_0_and_timeouts(tmp_path):
    out = tmp_path / "ev"
    r = _eval(_progs(tmp_path, ("scale_bias", "gelu")), out, "--timeout", "30", "--request-timeout", "5",
              env={"STP_FAULT_INJECT": "internal:gelu"})
    assert r.exit_code == 0, r.output
    assert "1 of 2 program(s) failed with internal errors" in r.stderr
    s = json.loads((out / "summary.json").read_text())
    assert s["internal_errors"] == 1 and s["internal_error_samples"] == 1
    ok = [x for x in _rows(out / "results.jsonl") if x["error"] is None]
    assert len(ok) == 1 and ok[0]["stage"] == "parse" and not ok[0]["diff"]  # identity: parsed, Diff fails
    help_text = runner.invoke(app, ["eval", "--help"], env={"COLUMNS": "200"}).output
    flat = " ".join(help_text.split())
    assert "--request-timeout" in help_text and "Seconds: time limit of one verification check" in flat


# ---- stp search -----------------------------------------------------------------------------


def _search(progs, out, *extra, env=None):
    return _stp("search", *progs, "-o", out, "-n", "1", "--algorithm", "chain-no-parent", "-q", *extra, env=env)


def test_search_all_internal_errors_exit_1_then_rerun_with_device_cpu(tmp_path):
    progs = _progs(tmp_path, ("scale_bias", "gelu"))
    out = tmp_path / "s"
    r = _search(progs, out, "--device", "cpu", env=ALL)
    assert r.exit_code == 1, r.output
    assert f"error: all 2 program(s) failed with internal errors; see {out / 'run_summary.json'}" in r.stderr
    info = json.loads((out / "run_summary.json").read_text())
    assert (info["programs"], info["searched"], info["internal_errors"], info["input_errors"]) == (2, 0, 2, 0)
    assert all(f["internal"] and "injected internal fault" in f["error"] for f in info["failed"])
    assert not list(out.glob("*/summary.json"))
    assert "2 of 2 program(s) failed: 2 with an internal error" in (out / "report.md").read_text()

    # a single program: also exit 1 with the count (not a traceback)
    one = _search(progs[:1], tmp_path / "one", env=ALL)
    assert one.exit_code == 1 and "all 1 program(s) failed with internal errors" in one.stderr

    # the failed programs are searched again by a rerun (nothing of them was recorded as done)
    r = _search(progs[:1], out / "scale_bias", "--device", "cpu")
    assert r.exit_code == 0, r.output
    sm = json.loads((out / "scale_bias" / "summary.json").read_text())
    assert sm["device"] == "cpu" and sm["target"] == "cpu"
    assert json.loads((out / "scale_bias" / "run_summary.json").read_text())["internal_errors"] == 0


def test_search_target_is_a_deprecated_alias_of_device(tmp_path):
    out = tmp_path / "t"
    r = _search(_progs(tmp_path, ("scale_bias",)), out, "--target", "cpu")
    assert r.exit_code == 0, r.output
    sm = json.loads((out / "summary.json").read_text())
    assert sm["device"] == "cpu" and sm["target"] == "cpu"
    assert "| chain-no-parent | engine/random | cpu | 1 |" in (out / "report.md").read_text()
    bad = _stp("search", out / "root.leir", "-o", tmp_path / "x", "--target", "tpu")
    assert bad.exit_code == 2 and "--device tpu: expected cpu or cuda" in bad.stderr
