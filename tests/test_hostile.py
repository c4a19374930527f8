"""Hostile input (issue 10): each defect found by fuzzing has a regression test here.

Every case asserts the real behaviour: exit code, that the message names the file and the
place, and that nothing raises a Python traceback. Shapes are tiny (extents 4..8)."""

import json
import os
import shutil
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from steptp.cli import app
from steptp.dataset.chat import AnswerError, parse_answer
from steptp.dataset.pipeline import DatasetError, generate_dataset
from steptp.dataset.generate import Options
from steptp.leir import parse_leir
from steptp.leir.analysis import LeirSemanticError, analyze
from steptp.leir.parser import LeirSyntaxError, parse_program

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
RULES = ROOT / "rules"
runner = CliRunner()

HEAD = "% program: p\n% input A: f32[8]\n% output C: f32[8]\n"
BASE = HEAD + "B^{8}_{tx=0}[C^{f32,g}_{tx}=A^{f32,g}_{tx}*2.0;];\n"


def stp(*args):
    res = runner.invoke(app, [str(a) for a in args])
    # never a Python traceback: either a clean exit or typer's own SystemExit
    assert res.exception is None or isinstance(res.exception, SystemExit), repr(res.exception)
    return res


def write(tmp_path, name, text):
    p = tmp_path / name
    p.write_text(text)
    return p


# -- defect 4: parser limits, reported with file, line and column, exit 2 -------------------------

@pytest.mark.parametrize("body,needle", [
    ("B^{8}_{tx=0}[C^{f32,g}_{tx}=" + "-" * 1000 + "A^{f32,g}_{tx};];", "nested more than 128"),
    ("B^{8}_{tx=0}[C^{f32,g}_{tx}=" + "+".join(["A^{f32,g}_{tx}"] * 1000) + ";];", "nested more than 128"),
    ("B^{8}_{tx=0}" + "L^{1}_{a=0}[" * 300 + "C^{f32,g}_{tx}=A^{f32,g}_{tx};" + "];" * 300, "nests are nested"),
    ("B^{8}_{tx=0}[C^{f32,g}_{tx}=A^{f32,g}_{tx}+" + "9" * 4301 + ";];", "exceeds the limit"),
    ("B^{8}_{tx=0}[C^{f32,g}_{tx}=A^{f32,g}_{tx+1" + "0" * 400 + "};];", "exceeds the limit"),
    ("B^{99999999999}_{tx=0}[C^{f32,g}_{tx}=A^{f32,g}_{tx};];", "loop extent"),
])
def test_parser_limits_are_leir_errors_with_position(tmp_path, body, needle):
    f = write(tmp_path, "x.leir", HEAD + body + "\n")
    for cmd in ("parse", "lower"):
        res = stp(cmd, f)
        assert res.exit_code == 2, res.output
        assert f"{f}:4:" in res.output and needle in res.output


@pytest.mark.parametrize("decl,needle", [("f32[4,]", "empty tensor dimension"), ("f32[10000000000]", "exceeds"),
                                         ("f32[100000,100000]", "elements exceeds")])
def test_header_shapes_are_checked(decl, needle):
    with pytest.raises(LeirSyntaxError, match=needle) as e:
        parse_leir(f"% program: p\n% input A: {decl}\n% output C: f32[4]\n")
    assert e.value.line == 2


def test_deep_but_legal_expressions_still_parse():
    prog = parse_program("B^{8}_{tx=0}[C^{f32,g}_{tx}=" + "+".join(["A^{f32,g}_{tx}"] * 100) + ";];")
    assert len(prog.nests) == 1


# -- defect 9: exit codes, division by zero --------------------------------------------------------

def test_lower_exits_2_on_semantic_errors(tmp_path):
    f = write(tmp_path, "s.leir", HEAD + "B^{8}_{tx=0}[C^{f32,g}_{tx}=A^{f32,g}_{tx,tx};];\n")
    res = stp("lower", f)
    assert res.exit_code == 2 and "rank" in res.output


@pytest.mark.parametrize("expr", ["A^{f32,g}_{tx}/0.0", "A^{f32,g}_{tx}//0", "A^{f32,g}_{tx}%(0)"])
def test_literal_division_by_zero_is_named(tmp_path, expr):
    f = write(tmp_path, "z.leir", HEAD + "B^{8}_{tx=0}[C^{f32,g}_{tx}=" + expr + ";];\n")
    res = stp("lower", f)
    assert res.exit_code == 2 and "division by zero" in res.output and "C^{f32,g}_{tx}=" in res.output
    if "(" not in expr:  # canonical text: semantic errors carry line and column
        assert f"{f}:4:14:" in res.output


# -- defect 2 and 3: verify never crashes, traps are rejected with a reason ------------------------

def test_verify_prints_build_failures_without_crashing():
    res = stp("verify", EXAMPLES / "softmax.leir", EXAMPLES / "gelu.leir")
    assert res.exit_code == 1
    assert "max_abs_err n/a" in res.output and "reason: build: known tensors differ" in res.output


TRAPS = {
    # a read under a guard that does not protect it (static: exact by enumeration)
    "oob_guard": "B^{8}_{tx=0}[C^{f32,g}_{tx}=if_then_else(tx>=0,A^{f32,g}_{tx+100000000},0.0);];",
    "oob_guard_else": "B^{8}_{tx=0}[C^{f32,g}_{tx}=if_then_else(tx<2,0.0,A^{f32,g}_{tx-3});];",
    # a read of an intermediate before anything writes it
    "uninit": "B^{8}_{tx=0}[C^{f32,g}_{tx}=T^{f32,g}_{tx}*2.0;];B^{8}_{tx=0}[T^{f32,g}_{tx}=A^{f32,g}_{tx};];",
    # an intermediate written at odd positions only, read everywhere (poisoned run)
    "partial": "B^{4}_{tx=0}[T^{f32,g}_{tx*2+1}=A^{f32,g}_{tx*2+1};];"
               "B^{8}_{tx=0}[C^{f32,g}_{tx}=T^{f32,g}_{tx}*2.0+0.0*A^{f32,g}_{tx};];",
    # half of the output never written (poisoned run)
    "half_output": "B^{4}_{tx=0}[C^{f32,g}_{tx}=A^{f32,g}_{tx}*2.0;];",
}


@pytest.mark.parametrize("name", sorted(TRAPS))
def test_semantic_traps_are_rejected_with_a_reason(tmp_path, name):
    base = write(tmp_path, "base.leir", BASE)
    trap = write(tmp_path, f"{name}.leir", HEAD + TRAPS[name] + "\n")
    res = stp("verify", base, trap)
    assert res.exit_code == 1, res.output
    assert "Equal  pass" not in res.output
    reason = res.output.split("reason: ", 1)[1]
    assert any(w in reason for w in ("out-of-bounds", "uninitialised", "never written")), reason
    # as the original, a trap is reported as a failed original, never as Equal
    res = stp("verify", trap, base)
    assert res.exit_code == 1 and ("original program failed" in res.output or "build:" in res.output)


def test_legitimate_guards_recurrences_and_accumulations_still_verify(tmp_path):
    # prefix recurrence under a guard, implicit-init reduction, a buffer accumulated across nests
    head = "% program: p\n% input A: f32[4,8]\n% input Bv: f32[4]\n% output C: f32[4,8]\n% output S: f32[4]\n"
    orig = head + ("B^{4}_{tx=0}L^{8}_{a=0}[F^{f32,g}_{tx,a}=if_then_else(a-1<0,A^{f32,g}_{tx,a},"
                   "F^{f32,g}_{tx,a-1}+A^{f32,g}_{tx,a});];"
                   "B^{4}_{tx=0}L^{8}_{a=0}[C^{f32,g}_{tx,a}=F^{f32,g}_{tx,a};];"
                   "B^{4}_{tx=0}L^{8}_{a=0}[S^{f32,g}_{tx}=S^{f32,g}_{tx}+A^{f32,g}_{tx,a};];"
                   "B^{4}_{tx=0}[S^{f32,g}_{tx}=S^{f32,g}_{tx}+Bv^{f32,g}_{tx};];\n")
    new = orig.replace("C^{f32,g}_{tx,a}=F^{f32,g}_{tx,a};", "C^{f32,g}_{tx,a}=F^{f32,g}_{tx,a}*1.0;")
    a, b = write(tmp_path, "a.leir", orig), write(tmp_path, "b.leir", new)
    res = stp("verify", a, b)
    assert res.exit_code == 0 and "Equal  pass" in res.output, res.output


def test_mismatch_names_the_element_that_fails_the_tolerance():
    import numpy as np

    from steptp.verify import _mismatch_detail

    ref = np.array([1000.0, 0.0], dtype=np.float64)
    out = np.array([1000.05, 0.01], dtype=np.float64)  # 0.05 at a large value is within rtol; 0.01 at 0 is not
    msg = _mismatch_detail("C", 0, ref, out, "f32")
    assert "worst at (1,)" in msg and "1 element(s) outside" in msg


# -- defect 5: bounded work ------------------------------------------------------------------------

def test_huge_programs_are_refused_up_front(tmp_path):
    big = "% program: p\n% input A: f32[2000000000]\n% output C: f32[2000000000]\n" \
          "B^{1024}_{tx=0}L^{1953125}_{a=0}[C^{f32,g}_{tx*1953125+a}=A^{f32,g}_{tx*1953125+a};];\n"
    a = write(tmp_path, "big.leir", big)
    b = write(tmp_path, "big2.leir", big.replace("A^{f32,g}_{tx*1953125+a};", "A^{f32,g}_{tx*1953125+a}*1.0;"))
    t0 = time.perf_counter()
    res = stp("verify", a, b)
    assert res.exit_code == 1 and "verification limit" in res.output
    assert time.perf_counter() - t0 < 30


def test_parameter_domains_are_fast_and_capped():
    from steptp.engine.primitives import MAX_DOMAIN_VALUES, divisors

    t0 = time.perf_counter()
    assert divisors(10**12)[:4] == [1, 2, 4, 5] and divisors(10**12)[-1] == 10**12
    assert divisors(36) == [1, 2, 3, 4, 6, 9, 12, 18, 36]
    assert time.perf_counter() - t0 < 1.0
    assert MAX_DOMAIN_VALUES <= 10**6


# -- defect 6: model answers -----------------------------------------------------------------------

IR = "B^{8}_{tx=0}[C^{f32,g}_{tx}=A^{f32,g}_{tx}*2.0;];"


def _answer(ir=IR):
    return "<answer>" + json.dumps({"transformed_IR": ir, "applied_strategy": "s"}) + "</answer>"


@pytest.mark.parametrize("text,needle", [
    ("<answer>{" + " " * 300000 + "x</answer>", "not valid JSON"),
    ("<answer>" + " " * 300000 + "```</answer", "not closed"),
    ("<answer>" + "[" * 5000 + "]" * 5000 + "</answer>", "nested too deeply"),
    ('<answer>{"transformed_IR": ' + "9" * 4301 + "}</answer>", "not valid JSON"),
    (_answer("not LEIR at all"), "not LEIR"),
    ("x" * 3_000_000, "above the limit"),
])
def test_parse_answer_is_linear_capped_and_checks_the_ir(text, needle):
    t0 = time.perf_counter()
    with pytest.raises(AnswerError, match=needle):
        parse_answer(text)
    assert time.perf_counter() - t0 < 2.0


def test_parse_answer_checks_the_signature():
    sig = parse_leir(BASE).signature
    assert parse_answer(_answer(), signature=sig)[0]["transformed_IR"] == IR
    other = "B^{8}_{tx=0}[D^{f32,g}_{tx}=A^{f32,g}_{tx};];"
    with pytest.raises(AnswerError, match="never written"):
        parse_answer(_answer(other), signature=sig)
    with pytest.raises(AnswerError, match="other tensors"):
        parse_answer(_answer("% program: p\n% input A: f32[4]\n% output C: f32[8]\n" + IR), signature=sig)


# -- defect 7: broken rule files -------------------------------------------------------------------

def _rule_variant(tmp_path, name, edit):
    text = (RULES / "loop_split.yaml").read_text()
    new = edit(text)
    assert new != text
    p = tmp_path / name
    p.write_text(new)
    return p


@pytest.mark.parametrize("edit,needle", [
    (lambda t: t.replace("cot: ", "cot: missing_template.j2 #", 1) if "cot: |" not in t else
     t.replace("cot: |", "cot: missing_template.j2\nxcot: |", 1), "cot"),
    (lambda t: t + "\nid: loop_split\n", "duplicate key"),
    (lambda t: t.replace('{divisors_of: "?n", exclude: [1, "?n"]}', "{range: [1, 1000000000000]}", 1), "limit"),
    (lambda t: "\x00\x01\x02" + t, "not a text file"),
    (lambda t: "a: " + "[" * 5000 + "]" * 5000 + "\n" + t, "(top level)|YAML|nested"),
])
def test_broken_rule_files_are_one_line_errors(tmp_path, edit, needle):
    import re

    p = _rule_variant(tmp_path, "loop_split.yaml", edit)
    for args in (("apply", p, EXAMPLES / "matmul.leir"), ("rules", "test", p, "--no-verify")):
        res = stp(*args)
        assert res.exit_code == 2, res.output
        assert str(p.name) in res.output and re.search(needle, res.output), res.output
        assert "Traceback" not in res.output


def test_undefined_jinja_variable_names_the_file(tmp_path):
    p = _rule_variant(tmp_path, "loop_split.yaml", lambda t: t.replace("{{", "{{ no_such_variable ~", 1))
    res = stp("apply", p, EXAMPLES / "matmul.leir")
    assert res.exit_code == 2 and "loop_split.yaml" in res.output and "no_such_variable" in res.output


def test_modulo_by_zero_in_where_is_a_rule_error(tmp_path):
    text = (RULES / "loop_split.yaml").read_text()
    bad = text.replace("\nwhere:\n", '\nwhere:\n  - "?n % 0 == 0"\n', 1)
    assert bad != text
    p = tmp_path / "loop_split.yaml"
    p.write_text(bad)
    res = stp("apply", p, EXAMPLES / "matmul.leir")
    assert res.exit_code == 2 and "divides by zero" in res.output and "where" in res.output, res.output


# -- defect 8 and 1: dataset output directory and resume -------------------------------------------

@pytest.fixture(scope="module")
def one_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("hostile") / "out"
    opts = Options(seed=0, rule_paths=[str(RULES / "loop_split.yaml"), str(RULES / "loop_reorder.yaml")],
                   isolated=False, nvcc=False, with_cuda=False)
    srcs = [str(EXAMPLES / "scale_bias.leir"), str(EXAMPLES / "gelu.leir")]
    generate_dataset(srcs, out, opts, progress=False)
    return out, srcs, opts


FINAL = ("dictionary.jsonl", "chat_single.jsonl", "chat_multi.jsonl", "report.json")


def _final_bytes(out):
    return {n: (out / n).read_bytes() for n in FINAL}


@pytest.mark.parametrize("damage", ["torn_valid_json", "torn_half", "cut_last_entry_of_finished_run",
                                    "lost_state_and_torn_attempts", "truncate_middle"])
def test_resume_after_damage_is_byte_identical(one_run, tmp_path, damage):
    out0, srcs, opts = one_run
    want = _final_bytes(out0)
    out = tmp_path / "o"
    shutil.copytree(out0, out)
    d = out / "dictionary.jsonl"
    data = d.read_bytes()
    lines = data.splitlines(keepends=True)
    assert len(lines) >= 2
    if damage == "torn_valid_json":  # a whole last record without its newline
        d.write_bytes(data[:-1])
    elif damage == "torn_half":
        d.write_bytes(b"".join(lines[:-1]) + lines[-1][: len(lines[-1]) // 2])
    elif damage == "cut_last_entry_of_finished_run":
        d.write_bytes(b"".join(lines[:-1]))
    elif damage == "lost_state_and_torn_attempts":
        s = (out / "state.jsonl").read_bytes().splitlines(keepends=True)
        (out / "state.jsonl").write_bytes(b"".join(s[:-1]))
        a = (out / "attempts.jsonl").read_bytes()
        (out / "attempts.jsonl").write_bytes(a[:-7])
    else:
        d.write_bytes(b"".join(lines[: len(lines) // 2]))
    generate_dataset(srcs, out, opts, progress=False)
    assert _final_bytes(out) == want


def test_sigkill_mid_run_then_resume_is_byte_identical(one_run, tmp_path):
    import subprocess
    import sys

    out0, srcs, opts = one_run
    want = _final_bytes(out0)
    out = tmp_path / "k"
    code = ("import sys, os, signal\n"
            "from steptp.dataset.pipeline import generate_dataset\n"
            "from steptp.dataset.generate import Options\n"
            f"opts = Options(**{opts.__dict__!r})\n"
            "n = [0]\n"
            "def kill(res):\n"
            "    os.kill(os.getpid(), signal.SIGKILL)\n"
            f"generate_dataset({srcs!r}, {str(out)!r}, opts, progress=False, on_result=kill)\n")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=300)
    assert p.returncode == -9
    assert (out / "state.jsonl").read_text().count("\n") == 1  # killed after the first program
    generate_dataset(srcs, out, opts, progress=False)
    assert _final_bytes(out) == want


def _processes_with(marker: str) -> list[int]:
    """PIDs of live processes whose environment holds ``marker`` (children inherit it)."""
    pids = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                if marker.encode() in (d / "environ").read_bytes():
                    pids.append(int(d.name))
            except OSError:
                pass
    return pids


def test_sigterm_stops_workers_summarises_and_resumes_byte_identical(tmp_path):
    """``stp dataset -j 2`` sent SIGTERM mid-run: exit 130 naming how far it got, its worker
    processes gone, report.json and the chat sets rebuilt from the programs recorded (a
    partial summary), and the same command then finishes with the files of an uninterrupted
    run."""
    import signal
    import subprocess
    import sys
    import uuid

    # Programs are recorded in the order of their paths: a quick first program (recorded after
    # ~0.2 s) and five that take 0.5-2 s each, so the signal lands while most are still in
    # flight, however quickly the test reacts (with six tiny programs, all could be recorded
    # before the signal arrived).
    names = ("scale_bias", "conv_pool", "layernorm_tanh", "sdpa", "softmax_4d", "fused_rmsnorm")
    srcs = []
    for i, n in enumerate(names):
        shutil.copy(EXAMPLES / f"{n}.leir", tmp_path / f"p{i}_{n}.leir")
        srcs.append(str(tmp_path / f"p{i}_{n}.leir"))
    args = ["dataset", *srcs, "-q", "--no-cuda", "--no-nvcc", "-j", "2", "--programs-per-task", "1"]
    cmd = [sys.executable, "-c", "from steptp.cli import app; app()"]
    whole = tmp_path / "whole"
    assert subprocess.run(cmd + args + ["-o", str(whole)], capture_output=True, timeout=600).returncode == 0
    marker = f"STP_TEST_MARK={uuid.uuid4().hex}"
    out = tmp_path / "cut"
    env = {**os.environ, marker.split("=")[0]: marker.split("=")[1]}
    proc = subprocess.Popen(cmd + args + ["-o", str(out)], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    state = out / "state.jsonl"
    deadline = time.time() + 300
    while time.time() < deadline and proc.poll() is None and not (state.exists() and state.read_text().strip()):
        time.sleep(0.05)
    assert proc.poll() is None, "the run ended before it could be interrupted"
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    done = state.read_text().count("\n")
    assert proc.returncode == 130 and f"interrupted after {done} of 6 programs" in err, err
    assert "Traceback" not in err and 1 <= done < 6, (done, err)
    report = json.loads((out / "report.json").read_text())
    assert report["programs"] == done and (out / "chat_single.jsonl").exists()
    time.sleep(1)
    assert _processes_with(marker) == []
    assert subprocess.run(cmd + args + ["-o", str(out)], capture_output=True, timeout=600).returncode == 0
    assert _final_bytes(out) == _final_bytes(whole)


@pytest.mark.parametrize("line", ["{}", "[1,2]", '{"id": 3}', '"text"'])
def test_foreign_lines_are_clear_errors_and_change_nothing(one_run, tmp_path, line):
    out0, srcs, opts = one_run
    out = tmp_path / "f"
    shutil.copytree(out0, out)
    with open(out / "dictionary.jsonl", "a") as f:
        f.write(line + "\n")
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    res = stp("dataset", *srcs, "-o", out, "--in-process", "-q", "--no-cuda", "--no-nvcc",
              "--rule", RULES / "loop_split.yaml", "--rule", RULES / "loop_reorder.yaml")
    assert res.exit_code == 2 and "dictionary.jsonl:" in res.output, res.output
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before


def test_read_only_output_directory_is_a_clear_error(one_run, tmp_path, monkeypatch):
    out0, srcs, opts = one_run
    out = tmp_path / "ro"
    shutil.copytree(out0, out)
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    for p in out.iterdir():
        p.chmod(0o444)
    out.chmod(0o555)
    if hasattr(os, "geteuid") and os.geteuid() == 0:  # root ignores permissions: deny as the OS would
        real = os.access
        monkeypatch.setattr(os, "access", lambda path, mode, **kw: False if mode & os.W_OK else real(path, mode))
    try:
        with pytest.raises(DatasetError, match="cannot write") as e:
            generate_dataset(srcs, out, opts, progress=False)
        assert str(out) in str(e.value)
        assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    finally:
        out.chmod(0o755)
        for p in out.iterdir():
            p.chmod(0o644)


def test_output_path_that_is_a_file_is_a_clear_error(tmp_path):
    f = write(tmp_path, "notadir", "x")
    res = stp("dataset", EXAMPLES / "gelu.leir", "-o", f, "--in-process", "-q")
    assert res.exit_code == 2 and "not a directory" in res.output and f.read_text() == "x"


def test_full_disk_is_a_clear_error(one_run, tmp_path, monkeypatch):
    import errno

    from steptp import io as writers

    out0, srcs, opts = one_run
    out = tmp_path / "full"

    def no_space(self, records):
        raise OSError(errno.ENOSPC, "No space left on device", str(self.path))

    monkeypatch.setattr(writers.JsonlAppender, "write_many", no_space)
    with pytest.raises(DatasetError, match="No space left on device") as e:
        generate_dataset(srcs, out, opts, progress=False)
    assert ".jsonl" in str(e.value)


# -- defect 10: translate --eval -------------------------------------------------------------------

def test_translate_eval_turns_dropout_off(tmp_path):
    model = write(tmp_path, "drop.py", (
        "import torch\n"
        "class Model(torch.nn.Module):\n"
        "    def __init__(self):\n"
        "        super().__init__()\n"
        "        self.d = torch.nn.Dropout(0.5)\n"
        "    def forward(self, x):\n"
        "        return self.d(x) * 2.0\n"
        "def get_inputs():\n"
        "    return [torch.randn(4, 8)]\n"
        "def get_init_inputs():\n"
        "    return []\n"))
    res = stp("translate", model)
    assert res.exit_code == 1 and "--eval" in res.output
    res = stp("translate", model, "--eval", "--verify")
    assert res.exit_code == 0 and "Equal  pass" in res.output, res.output


# -- defect 11: KernelBench report shrinks consistently and groups by real error classes -----------

def _kb():
    import importlib.util

    spec = importlib.util.spec_from_file_location("kb_report", ROOT / "benchmarks" / "kernelbench_report.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_kernelbench_shrinking_is_consistent(tmp_path):
    kb = _kb()
    src = write(tmp_path, "m.py", (
        "import torch\n"
        "class Model(torch.nn.Module):\n"
        "    def __init__(self, c, g, f):\n"
        "        super().__init__()\n"
        "        self.gn = torch.nn.GroupNorm(g, c)\n"
        "        self.ln = torch.nn.LayerNorm(f)\n"
        "    def forward(self, x, y):\n"
        "        return self.gn(x).sum() + self.ln(y).sum()\n"
        "batch_size = 512\n"
        "channels = 128\n"
        "num_groups = 8\n"
        "height = width = 2048\n"
        "height, width = 64, 64\n"
        "normalized_shape = (channels, 4096)\n"
        "def get_inputs():\n"
        "    return [torch.rand(batch_size, channels, height, width), torch.rand(batch_size, channels, 4096)]\n"
        "def get_init_inputs():\n"
        "    return [channels, num_groups, normalized_shape]\n"))
    mod, plan = kb._shrunk_module(src, 16)
    assert mod.height == mod.width <= 32 and mod.batch_size <= 32
    assert mod.channels % mod.num_groups == 0 and mod.channels // mod.num_groups >= 2  # > 1 channel per group
    x, y = mod.get_inputs()
    assert y.shape[-1] == mod.normalized_shape[-1] <= 32 and x.shape[1] == mod.channels
    model = mod.Model(*mod.get_init_inputs())
    assert model(x, y).isfinite()
    assert kb.shrink_plan([96, 3, 6, 7], 16) == {96: 12}  # one scale (/8), still divisible by 3 and 6
    assert kb.shrink_plan([64, 32, 16], 16) == {64: 16, 32: 8}  # out_channels = 2 * width stays
    assert kb.shrink_plan([512, 64, 8], 16) == {512: 16, 64: 16}  # 64 channels keep 2 per group of 8


def test_kernelbench_failures_group_by_translator_error_class():
    kb = _kb()
    rs = [{"stage": "translate", "reason": "TranslationError: op aten.foo.default, graph node %foo_1: no lowering for "
                                          "this operator\n  node: ..."},
          {"stage": "translate", "reason": "op aten.bar.default, graph node %bar: no lowering for this operator"},
          {"stage": "translate", "reason": "op aten.dropout.default, argument 'train', graph node %d: dropout in "
                                          "training mode with p > 0 is random"},
          {"stage": "verify", "reason": "equal: output C differs in trial 0: 3 element(s) outside the tolerance"},
          {"stage": "verify", "reason": "equal: output D differs in trial 2: 1 element(s) outside the tolerance"}]
    keys = [kb.reason_key(r) for r in rs]
    assert keys[0] == "translate: no lowering for aten.foo.default"
    assert keys[1] == "translate: no lowering for aten.bar.default"
    assert keys[2].startswith("translate: aten.dropout.default (train): dropout in training mode")
    assert keys[3] == keys[4] == "verify: outputs differ from PyTorch"


def test_time_limit_interrupts_python_work():
    from steptp.timelimit import WorkTimeout, time_limit

    t0 = time.perf_counter()
    with pytest.raises(WorkTimeout, match="spin exceeded"):
        with time_limit(0.2, "spin"):
            while True:
                pass
    assert time.perf_counter() - t0 < 2.0
    with time_limit(0, "none"):  # no limit
        pass


def test_reduction_chains_get_their_implicit_init(tmp_path):
    # E = E + a*b + c: a sum reduction over a and c (E occurs once with a plus sign)
    head = "% program: p\n% input A: f32[4,8]\n% output E: f32[4]\n"
    from steptp.leir.analysis import self_reference_kind

    m = parse_leir(head + "B^{4}_{tx=0}L^{8}_{a=0}[E^{f32,g}_{tx}=E^{f32,g}_{tx}+A^{f32,g}_{tx,a}*2.0-1.0;];\n")
    info = analyze(m.program, m.signature)
    assert info.equations[0].init == 0.0
    e = parse_leir(head + "B^{4}_{tx=0}L^{8}_{a=0}[E^{f32,g}_{tx}=A^{f32,g}_{tx,a}-E^{f32,g}_{tx}+1.0;];\n")
    assert self_reference_kind(e.program.nests[0].body[0]) is None  # minus sign: not a reduction
    a = write(tmp_path, "a.leir", head + "B^{4}_{tx=0}L^{8}_{a=0}[E^{f32,g}_{tx}=E^{f32,g}_{tx}+A^{f32,g}_{tx,a}+1.0;];\n")
    b = write(tmp_path, "b.leir", head + "B^{4}_{tx=0}L^{8}_{a=0}[E^{f32,g}_{tx}=E^{f32,g}_{tx}+(A^{f32,g}_{tx,a}+1.0);];\n")
    res = stp("verify", a, b)
    assert res.exit_code == 0, res.output
