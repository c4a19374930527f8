"""Rule authors outside the repository (issue 54): their own rule folders (``--rules DIR``,
``$STP_RULES_PATH``) used by the installed ``stp`` (apply, dataset, search, rules test/lint/list),
every name a rule uses checked at load with ``FILE:LINE:COL`` and ``did you mean``, lint that
runs the symbolic check, decimals in the value language and ``stp apply --all`` with each site's
text.

The commands run as subprocesses of the venv's ``stp`` from a temporary folder (outside the
repository), as a user of the installed package runs them."""

from __future__ import annotations

import json
import os
import pickle
import re
import subprocess
import sys
from fractions import Fraction
from pathlib import Path

import pytest

from steptp.leir import parse_leir
from steptp.rules import RuleError, load_rule_text
from steptp.rules.loader import RULES_PATH_ENV, default_rules_dir, rule_paths

ROOT = Path(__file__).resolve().parents[1]
STP = Path(sys.executable).parent / "stp"
DOC = ROOT / "docs" / "writing-rules.md"
RID = "sixteenth_by_multiplication"


def _section() -> str:
    text = DOC.read_text(encoding="utf-8")
    m = re.search(r"^## Your own rules.*?(?=^## )", text, re.S | re.M)
    assert m, "docs/writing-rules.md has no section '## Your own rules ...'"
    return m.group(0)


def _blocks(text: str, lang: str) -> list[str]:
    return re.findall(rf"^```{lang}\n(.*?)^```", text, re.S | re.M)


@pytest.fixture()
def author(tmp_path) -> Path:
    """A folder outside the repository holding the page's rule (my_rules/) and program."""
    sec = _section()
    (tmp_path / "my_rules").mkdir()
    (tmp_path / "my_rules" / f"{RID}.yaml").write_text(_blocks(sec, "yaml")[0], encoding="utf-8")
    (tmp_path / "scale.leir").write_text(_blocks(sec, "text")[0], encoding="utf-8")
    return tmp_path


def _env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in (RULES_PATH_ENV, "STP_CUDA_SIM")}
    env["PATH"] = f"{STP.parent}{os.pathsep}{env.get('PATH', '')}"
    env.update(extra)
    return env


def _run(args, cwd: Path, timeout: float = 600, **env) -> subprocess.CompletedProcess:
    return subprocess.run([str(STP), *map(str, args)], cwd=cwd, env=_env(**env), capture_output=True, text=True,
                          timeout=timeout)


# --------------------------------------------------------------------------- the documented example


def test_the_documented_example_runs_from_a_folder_outside_the_repository(author):
    """docs/writing-rules.md's commands, verbatim, from the temporary folder: lint, test and
    apply with --rules, apply / dataset with $STP_RULES_PATH, search with --rules; each uses the
    user's rule (the dataset's and the search's worker processes included)."""
    assert ROOT not in author.parents
    cmds = [ln for ln in _blocks(_section(), "sh")[0].splitlines() if ln.strip()]
    assert len(cmds) == 6
    out = []
    for line in cmds:
        r = subprocess.run(["bash", "-c", line], cwd=author, env=_env(), capture_output=True, text=True, timeout=900)
        assert r.returncode == 0, f"`{line}` exited {r.returncode}:\n{r.stdout}\n{r.stderr}"
        out.append(r.stdout)
    assert "1 rule file(s) load and validate" in out[0]
    assert "verified symbolic=proved" in out[1] and "all passed" in out[1]
    listing = next(ln for ln in _blocks(_section(), "text") if ln.startswith("[0]")).strip()
    assert out[2].strip() == listing  # the page shows what --all prints
    assert "*0.0625" in (author / "scale_fast.leir").read_text()
    report = json.loads((author / "data" / "report.json").read_text())
    assert report["entries"] == 1 and report["by_strategy"] == {RID: 1}, report
    tree = [json.loads(ln) for ln in (author / "search" / "tree.jsonl").read_text().splitlines()]
    assert any(n["strategy"] == RID and n["status"] == "equal" for n in tree), tree


def test_the_documented_lint_error_is_what_lint_prints(author):
    broken = author / "my_rules" / f"{RID}.yaml"
    broken.write_text(broken.read_text().replace('r: "1.0/?c"', 'r: "1.0/slise(?c)"'))
    r = _run(["rules", "lint", f"my_rules/{RID}.yaml"], author)
    assert r.returncode == 1, r.stdout + r.stderr
    shown = next(b for b in _blocks(_section(), "text") if "slise" in b).strip()
    assert r.stderr.strip() == shown, r.stderr
    assert "Traceback" not in r.stderr


# --------------------------------------------------------------------------- the rule folders


def test_rules_flag_and_environment_reach_rules_test_list_and_apply(author):
    folder = author / "my_rules"
    for how in ({"args": ["--rules", folder]}, {"env": {RULES_PATH_ENV: str(folder)}}):
        args, env = how.get("args", []), how.get("env", {})
        r = _run(["rules", "test", "--no-verify", *args, RID], author, **env)
        assert r.returncode == 0 and "all passed" in r.stdout, r.stdout + r.stderr
        r = _run(["rules", "list", *args], author, **env)
        assert r.returncode == 0 and re.search(rf"^{RID} .* easy\s+{re.escape(str(folder))}", r.stdout, re.M), r.stdout
        r = _run(["apply", *args, RID, "scale.leir"], author, **env)
        assert r.returncode == 0 and "/16.0" not in r.stdout.splitlines()[0] and "*0.0625" in r.stdout, r.stderr
    # a folder of rules given to `rules test` is tested by itself
    r = _run(["rules", "test", "--no-verify", folder], author)
    assert r.returncode == 0 and "1 test(s), all passed" in r.stdout, r.stdout + r.stderr
    # without the folder the id is unknown, and says where it was looked for
    r = _run(["apply", RID, "scale.leir"], author)
    assert r.returncode == 2 and f"{RID}: no such rule file, and no rule with that id" in r.stderr
    r = _run(["rules", "list", "--rules", author / "missing"], author)
    assert r.returncode == 2 and "--rules needs a directory" in r.stderr and "Traceback" not in r.stderr


def test_dataset_with_rules_flag_uses_the_rule_in_its_workers(author):
    r = _run(["dataset", "scale.leir", "-o", "data", "--rules", "my_rules", "--rule", RID, "-j", "2", "-q",
              "--no-nvcc"], author)
    assert r.returncode == 0, r.stdout + r.stderr
    assert json.loads((author / "data" / "report.json").read_text())["by_strategy"] == {RID: 1}


def test_a_user_rule_with_a_shipped_id_replaces_it_with_one_line(tmp_path):
    folder = tmp_path / "mine"
    folder.mkdir()
    text = (default_rules_dir() / "loop_split.yaml").read_text().replace("name: loop split", "name: my loop split")
    (folder / "loop_split.yaml").write_text(text)
    r = _run(["rules", "list", "--rules", folder], tmp_path)
    assert r.returncode == 0, r.stderr
    notes = [ln for ln in r.stderr.splitlines() if "replaces" in ln]
    assert notes == [f"note: rule 'loop_split' from {folder / 'loop_split.yaml'} replaces the shipped "
                     f"rules/loop_split.yaml"], r.stderr
    assert sum(ln.startswith("loop_split ") for ln in r.stdout.splitlines()) == 1
    shipped = len(list(default_rules_dir().glob("*.yaml")))
    assert f"{shipped} rule(s)" in r.stdout  # replaced, not added


def test_rule_paths_order_and_overrides(tmp_path, monkeypatch):
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    (a / "zz_new.yaml").write_text("x")
    (a / "loop_split.yaml").write_text("x")
    (b / "aa_new.yaml").write_text("x")
    monkeypatch.setenv(RULES_PATH_ENV, f"{a}{os.pathsep}{os.pathsep}{b}")
    lines: list[str] = []
    paths = rule_paths(report=lines.append)
    shipped = sorted(default_rules_dir().glob("*.yaml"))
    assert paths[: len(shipped)] == [a / "loop_split.yaml" if p.name == "loop_split.yaml" else p for p in shipped]
    assert paths[len(shipped):] == [a / "zz_new.yaml", b / "aa_new.yaml"]  # shipped first, then folders in order
    assert len(lines) == 1 and "loop_split" in lines[0]
    (b / "zz_new.yaml").write_text("x")
    with pytest.raises(RuleError, match="duplicate rule id 'zz_new'"):
        rule_paths()
    monkeypatch.setenv(RULES_PATH_ENV, str(tmp_path / "nowhere"))
    with pytest.raises(RuleError, match="not a rule directory"):
        rule_paths()


# --------------------------------------------------------------------------- names checked at load


def _misspelled(tmp_path: Path, rid: str, old: str, new: str) -> tuple[Path, int, int]:
    """The shipped rule ``rid`` with ``old`` replaced by ``new`` once, saved under its id in
    ``tmp_path``; with the line and column where ``new`` starts."""
    text = (default_rules_dir() / f"{rid}.yaml").read_text()
    assert old in text, (rid, old)
    text = text.replace(old, new, 1)
    p = tmp_path / f"{rid}.yaml"
    p.write_text(text)
    i = text.index(new)
    return p, text.count("\n", 0, i) + 1, i - (text.rfind("\n", 0, i) + 1) + 1


@pytest.mark.parametrize("rid, old, new, field, what, wrong, right", [
    ("block_fusion", "{check: \"len(block_prefix(", "{check: \"len(block_prefx(", "where[3].check", "value function",
     "block_prefx", "block_prefix"),
    ("block_fusion", 'd: "len(block_prefix(', 'd: "len(blok_prefix(', "let.d", "value function",
     "blok_prefix", "block_prefix"),
    ("additive_split", "- provably:", "- provabley:", "filter[0].provabley", "filter", "provabley", "provably"),
    ("common_subexpression_elimination", '"compound(?s)"', '"compund(?s)"', "where[4]", "relation", "compund",
     "compound"),
])
def test_a_misspelled_name_fails_lint_with_file_line_column_and_the_right_name(tmp_path, rid, old, new, field, what,
                                                                                  wrong, right):
    p, line, col = _misspelled(tmp_path, rid, old, new)
    col += new.index(wrong)
    r = _run(["rules", "lint", p.name], tmp_path)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "Traceback" not in r.stderr
    want = f"{p.name}:{line}:{col}: {field}: unknown {what} '{wrong}'; did you mean '{right}'"
    assert want in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1  # one line, not the whole registry


def test_lint_reports_every_broken_file_and_lints_the_others(tmp_path):
    bad, _, _ = _misspelled(tmp_path, "common_subexpression_elimination", '"compound(?s)"', '"compund(?s)"')
    good = tmp_path / "logsimp.yaml"
    good.write_text((default_rules_dir() / "logsimp.yaml").read_text())
    r = _run(["rules", "lint", bad.name, good.name], tmp_path)
    assert r.returncode == 1 and "1 rule file(s) load and validate; 1 do not" in r.stdout, r.stdout + r.stderr


def test_primitives_and_template_variables_are_named_with_their_position():
    text = (default_rules_dir() / "loop_split.yaml").read_text()
    bad = text.replace("- substitute_index:", "- substitue_index:", 1)
    with pytest.raises(RuleError) as e:
        load_rule_text(bad, "r.yaml")
    line = bad[: bad.index("substitue_index")].count("\n") + 1
    assert re.match(rf"r\.yaml:{line}:5: rewrite\[1\]\.substitue_index: unknown primitive 'substitue_index'; "
                    r"did you mean 'substitute_index'", str(e.value)), str(e.value)
    assert (e.value.line, e.value.column) == (line, 5)
    old = "The new inner loop of {{ params.f }}"
    assert old in text
    inline = text.replace(old, "The new inner loop of {{ loop_befor }}")
    with pytest.raises(RuleError, match=r"unknown template variable 'loop_befor'; did you mean 'loop_before'") as e:
        load_rule_text(inline, "r.yaml")
    i = inline.index("loop_befor")
    assert str(e.value).startswith(f"r.yaml:{inline.count(chr(10), 0, i) + 1}:{i - inline.rfind(chr(10), 0, i)}: "
                                   f"cot: "), str(e.value)
    # a variable a template only asks about ({% if x is defined %}) is not an error
    load_rule_text(text.replace(old, "{% if no_such is defined %}{{ no_such }}{% endif %}"), "r.yaml")
    # a rule error travels between processes (pickled) with its positions
    again = pickle.loads(pickle.dumps(e.value))
    assert str(again) == str(e.value) and again.positions == e.value.positions


def test_schema_errors_point_at_their_line():
    text = (default_rules_dir() / "loop_split.yaml").read_text().replace("category: operator", "category: bogus")
    with pytest.raises(RuleError) as e:
        load_rule_text(text, "r.yaml")
    line = text[: text.index("category: bogus")].count("\n") + 1
    assert str(e.value).startswith(f"r.yaml:{line}:11: category: 'bogus' is not one of"), str(e.value)


# --------------------------------------------------------------------------- lint: the symbolic check


WRONG = """\
id: wrong_reciprocal
name: wrong reciprocal
category: math
description: A division by a constant as a multiplication by the constant (wrong).
preconditions: [pattern_match]
difficulty: {K: 1, P: 1, S: 0}
match:
  expr: "?x/?c"
rewrite: "?x*?c"
cot: "We multiply."
tests:
  - before: |
      % program: scale
      % input A: f32[64]
      % output C: f32[64]
      B^{64}_{tx=0}[C^{f32,g}_{tx}=A^{f32,g}_{tx}/2.0;];
    after: "B^{64}_{tx=0}[C^{f32,g}_{tx}=A^{f32,g}_{tx}*2.0;];"
"""


def test_a_rewrite_the_symbolic_check_disproves_fails_lint(tmp_path):
    p = tmp_path / "wrong_reciprocal.yaml"
    p.write_text(WRONG)
    r = _run(["rules", "lint", p.name], tmp_path)
    assert r.returncode == 1, r.stdout + r.stderr
    assert ("wrong_reciprocal.yaml:9:1: rewrite: the symbolic check disproves the rewrite on tests[0] (test 0)"
            in r.stderr), r.stderr
    fixed = tmp_path / "fixed" / "wrong_reciprocal.yaml"
    fixed.parent.mkdir()
    fixed.write_text(WRONG.replace('rewrite: "?x*?c"', 'rewrite: "?x*(1.0/?c)"').replace("*2.0;]", "*(1.0/2.0);]"))
    r = _run(["rules", "lint", fixed], tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr


def test_lint_of_the_shipped_rules_has_no_false_positives(tmp_path):
    r = _run(["rules", "lint", default_rules_dir()], tmp_path)  # no examples/ here: loading and tests only
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"{len(list(default_rules_dir().glob('*.yaml')))} rule file(s) load and validate" in r.stdout


# --------------------------------------------------------------------------- decimals


DECIMAL = """\
id: sixteenth
name: sixteenth
category: math
description: A division by sixteen as a multiplication by one sixteenth.
preconditions: [pattern_match]
difficulty: {K: 1, P: 1, S: 0}
match:
  expr: "?x/16.0"
let:
  r: LET
rewrite: "?x*?r"
cot: "x"
tests:
  - before: |
      % program: scale
      % input A: f32[4]
      % output C: f32[4]
      B^{4}_{tx=0}[C^{f32,g}_{tx}=A^{f32,g}_{tx}/16.0;];
    after: "B^{4}_{tx=0}[C^{f32,g}_{tx}=A^{f32,g}_{tx}*0.0625;];"
"""


@pytest.mark.parametrize("let", ["0.0625", '"0.0625"', '"(0.0625)"', '"max(0.0625, 1.0/32)"', '"0.25 * 0.25"',
                                 '"1.0/16"', '"6.25e-2"'])
def test_a_decimal_parses_in_a_let_expression_as_an_exact_rational(let):
    from steptp.engine import apply_rule
    from steptp.leir.printer import format_program

    rule = load_rule_text(DECIMAL.replace("LET", let), "sixteenth.yaml")
    t = rule.tests[0]
    step = apply_rule(rule, parse_leir(t.before, "t"))
    assert format_program(step.after.program) == t.after


def test_decimal_arithmetic_is_exact():
    from steptp.engine.domains import EvalContext, eval_value
    from steptp.leir import ast as A

    ctx = EvalContext(None, {"c": A.Float(3.0), "n": A.Int(6)})
    assert eval_value("(0.1 + 0.2)", ctx) == Fraction(3, 10)
    assert eval_value("1.0/?c", ctx) == Fraction(1, 3)
    assert eval_value("?n * 0.5", ctx) == 3
    assert eval_value("?c == 3.0", ctx) is True
    assert eval_value("?n/3", ctx) == 2  # integers stay integers


# --------------------------------------------------------------------------- apply --all


def test_apply_all_prints_each_sites_text(tmp_path):
    r = _run(["apply", "loop_split", ROOT / "examples" / "matmul.leir", "--all"], tmp_path)
    assert r.returncode == 0, r.stderr
    first = r.stdout.splitlines()[0]
    assert re.match(r"\[0\] site=loop 0 of nest\(0\) params=\{\"f\": 2\}  B\^\{8\}_\{tx=0\} in B\^\{8\}_\{tx=0\}L", first), \
        first
    r = _run(["apply", "expression_splitting", ROOT / "examples" / "softmax.leir", "--all"], tmp_path)
    lines = r.stdout.splitlines()
    assert r.returncode == 0 and lines, r.stderr
    assert lines[0].endswith("  exp(A^{f32,g}_{tx,a}-D^{f32,g}_{tx})") and lines[1].endswith(
        "  A^{f32,g}_{tx,a}-D^{f32,g}_{tx}"), lines
