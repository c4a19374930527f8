"""The README and the documentation site (issue 46): the README stays a front page (at most 200
lines, none over 200 characters) whose tour and rule example run verbatim; the rule language
reference (``docs/rule-language.md``) is what the engine's registries generate now and names
every filter, value function and primitive; ``mkdocs build --strict`` passes and fails on a
broken link or a page missing from the navigation; the pages mention only flags that exist."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from steptp.cli import app
from steptp.rules import docgen

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
PAGE = DOCS / "rule-language.md"
BIN = Path(sys.executable).parent


def _section(text: str, heading: str) -> str:
    """The text of the README section ``## heading`` (up to the next ``## ``)."""
    m = re.search(rf"^## {re.escape(heading)}\n(.*?)(?=^## |\Z)", text, re.S | re.M)
    assert m, f"README has no section '## {heading}'"
    return m.group(1)


def _blocks(text: str, lang: str) -> list[str]:
    return re.findall(rf"^```{lang}\n(.*?)^```", text, re.S | re.M)


def _commands(block: str) -> list[str]:
    """The command lines of a shell block (comments after `#` kept: bash ignores them)."""
    return [ln for ln in block.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]


def _run(line: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}
    env.pop("STP_CUDA_SIM", None)
    return subprocess.run(["bash", "-c", line], cwd=cwd, env=env, capture_output=True, text=True, timeout=900)


def _workdir(tmp_path: Path) -> Path:
    """A fresh directory that sees the repository's examples/ and rules/ (as a clone's root)."""
    for name in ("examples", "rules"):
        (tmp_path / name).symlink_to(ROOT / name, target_is_directory=True)
    return tmp_path


# ---------------------------------------------------------------------------------------------
# README
# ---------------------------------------------------------------------------------------------


def test_readme_is_a_front_page():
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 200, f"README.md has {len(lines)} lines (at most 200: move reference into docs/)"
    long = [(k, len(ln)) for k, ln in enumerate(lines, 1) if len(ln) > 200]
    assert not long, f"README.md lines over 200 characters (line, length): {long}"
    text = "\n".join(lines)
    assert "make test" in text and "make demo" in text


def test_readme_links_resolve():
    text = README.read_text(encoding="utf-8")
    links = re.findall(r"\]\(([^)#\s]+)", text)
    assert links
    missing = [ln for ln in links if not re.match(r"[a-z]+://", ln) and not (ROOT / ln).exists()]
    assert not missing, f"README links to missing files: {missing}"


@pytest.mark.slow
def test_readme_tour_runs_verbatim(tmp_path):
    """Every command of the tour block, as written, in a fresh directory: exit 0 and the files
    the README says it writes (about 90 s)."""
    block = _blocks(_section(README.read_text(encoding="utf-8"), "Five-minute tour"), "sh")[0]
    cmds = _commands(block)
    assert [c.split()[1] for c in cmds] == ["translate", "apply", "verify", "dataset", "search"]
    cwd = _workdir(tmp_path)
    outputs = []
    for line in cmds:
        r = _run(line, cwd)
        assert r.returncode == 0, \
            f"README tour: `{line}` exited {r.returncode}:\n{r.stdout[-2000:]}\n{r.stderr[-2000:]}"
        outputs.append(r.stdout)
    assert "Equal  pass" in outputs[0] and "Equal  pass" in outputs[2]
    assert "Loop split" in outputs[1]
    assert (cwd / "tour" / "split.leir").read_text() != (cwd / "tour" / "softmax.leir").read_text()
    data = cwd / "tour" / "data"
    assert (data / "dictionary.jsonl").read_text().count("\n") >= 10
    for name in ("chat_single.jsonl", "chat_multi.jsonl", "rl_prompts.jsonl", "report.json"):
        assert (data / name).is_file(), name
    for name in ("summary.json", "best.leir", "tree.jsonl", "report.md"):
        assert (cwd / "tour" / "search" / name).is_file(), name
    assert "samples" in outputs[4] and "speedup" in outputs[4]


@pytest.mark.slow
def test_readme_rule_example_passes_its_own_tests(tmp_path):
    """The README's rule file, saved under its id, passes `stp rules test` and `stp rules lint`
    with the commands the README gives."""
    sec = _section(README.read_text(encoding="utf-8"), "Write a rule")
    rule = _blocks(sec, "yaml")[0]
    rid = re.search(r"^id: (\w+)$", rule, re.M).group(1)
    cwd = _workdir(tmp_path)
    (cwd / f"{rid}.yaml").write_text(rule, encoding="utf-8")
    cmds = _commands(_blocks(sec, "sh")[0])
    assert cmds and all(rid in c for c in cmds)
    out = ""
    for line in cmds:
        r = _run(line, cwd)
        assert r.returncode == 0, f"`{line}` exited {r.returncode}:\n{r.stdout}\n{r.stderr}"
        out += r.stdout
    assert "all passed" in out and "symbolic=proved" in out and "no warnings" in out


# ---------------------------------------------------------------------------------------------
# The generated rule language reference
# ---------------------------------------------------------------------------------------------


def test_rule_language_page_is_current():
    want = docgen.rule_language_page()
    have = PAGE.read_text(encoding="utf-8")
    assert have == want, "docs/rule-language.md is stale: regenerate with `stp rules docs -o docs/rule-language.md`"


def test_every_registry_name_is_in_the_page_in_backticks():
    from steptp.engine.domains import VALUE_FUNCTIONS
    from steptp.engine.egraph import RELATIONS
    from steptp.engine.filters import EXTRA_DOMAINS, FILTERS
    from steptp.engine.primitives import PRIMITIVES
    from steptp.rules.schema import RULE_SCHEMA

    page = docgen.rule_language_page()
    for kind, names in (("filter", FILTERS), ("value function", VALUE_FUNCTIONS), ("primitive", PRIMITIVES),
                        ("relation", RELATIONS), ("domain", EXTRA_DOMAINS), ("field", RULE_SCHEMA["properties"])):
        missing = sorted(n for n in names if f"`{n}`" not in page)
        assert not missing, f"{kind}(s) missing from the rule language page: {missing}"
    assert len(VALUE_FUNCTIONS) >= 70 and len(PRIMITIVES) >= 20 and FILTERS


def test_every_entry_has_a_meaning_and_shipped_examples():
    assert docgen.undocumented() == [], "add docstrings (or steptp.rules.docgen entries) for these"
    page = docgen.rule_language_page()
    assert docgen.UNDOCUMENTED not in page
    # every value function and primitive shows an example: a shipped rule's use where there is one
    body = page.split("## Value functions", 1)[1].split("## Chain of thought", 1)[0]
    sections = re.split(r"^### ", body, flags=re.M)[1:]
    assert len(sections) >= 90
    bare = [s.split("\n")[0] for s in sections if "Example" not in s]
    assert not bare, f"no example (a shipped use, or one in the docstring / docgen.VALUE_FUNCTION_EXAMPLES): {bare}"
    assert "Example (`loop_split`, `where[0]`): `factorizable(?n)`" in page
    assert "Example (`loop_split`):" in page.split("### `substitute_index`", 1)[1].split("###", 1)[0]


def test_value_function_examples_parse_and_name_their_function():
    from steptp.engine.domains import VALUE_FUNCTIONS, parse_value

    for name, (code, _note) in docgen.VALUE_FUNCTION_EXAMPLES.items():
        assert name in VALUE_FUNCTIONS, name
        parse_value(code)  # raises PatternError naming line and column
        assert re.search(rf"\b{name}\(", code), (name, code)


def test_an_undocumented_name_is_flagged(monkeypatch, tmp_path):
    """A primitive registered without a docstring, or a rule field without a description, is
    listed by `undocumented()` (which the test above requires empty), marked on the page and
    warned about by `stp rules docs`, so the committed page cannot silently lose a meaning."""
    from steptp.engine import primitives as P

    def prim_nothing(ctx):  # no docstring on purpose
        return None

    monkeypatch.setitem(P.PRIMITIVES, "do_nothing", P.PrimitiveSpec("do_nothing", prim_nothing))
    assert "primitive: do_nothing" in docgen.undocumented()
    page = docgen.rule_language_page()
    assert docgen.UNDOCUMENTED in page.split("### `do_nothing`", 1)[1].split("###", 1)[0]
    r = CliRunner().invoke(app, ["rules", "docs", "-o", str(tmp_path / "p.md")])
    assert r.exit_code == 0 and "no documentation for primitive: do_nothing" in r.output
    monkeypatch.setitem(P.PRIMITIVES, "do_nothing", P.PrimitiveSpec("do_nothing", prim_nothing, doc="Do nothing."))
    page = docgen.rule_language_page()
    assert "### `do_nothing`" in page and "No shipped rule uses it yet." in page
    monkeypatch.delitem(docgen.FIELD_DOCS, "cot")
    assert "field: cot" in docgen.undocumented()


def test_rules_docs_command_writes_and_checks(tmp_path):
    runner = CliRunner()
    out = tmp_path / "rl.md"
    r = runner.invoke(app, ["rules", "docs", "-o", str(out)])
    assert r.exit_code == 0, r.output
    assert out.read_text(encoding="utf-8") == PAGE.read_text(encoding="utf-8") or \
        out.read_text(encoding="utf-8") == docgen.rule_language_page()
    assert runner.invoke(app, ["rules", "docs", "-o", str(out), "--check"]).exit_code == 0
    out.write_text(out.read_text(encoding="utf-8").replace("`replace_all`", "`replace_everything`"), encoding="utf-8")
    r = runner.invoke(app, ["rules", "docs", "-o", str(out), "--check"])
    assert r.exit_code == 1 and "stale" in r.output
    r = runner.invoke(app, ["rules", "docs", "--check"])
    assert r.exit_code == 2 and "--check needs -o" in r.output


def test_md_turns_rst_docstrings_into_markdown():
    doc = """Replace ``x`` (see :func:`steptp.engine.algebra.atoms`)
    over two lines.

    * first item
      continued
    * second item"""
    assert docgen.md(doc) == ("Replace `x` (see `steptp.engine.algebra.atoms`) over two lines.\n\n"
                              "* first item continued\n* second item")


# ---------------------------------------------------------------------------------------------
# The site
# ---------------------------------------------------------------------------------------------


def _mkdocs(cwd: Path, site: Path) -> subprocess.CompletedProcess:
    pytest.importorskip("mkdocs", reason="mkdocs is not installed (pip install '.[docs]')")
    pytest.importorskip("material", reason="mkdocs-material is not installed (pip install '.[docs]')")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
                          cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


def test_mkdocs_build_strict_passes(tmp_path):
    r = _mkdocs(ROOT, tmp_path / "site")
    assert r.returncode == 0, r.stdout + r.stderr
    site = tmp_path / "site"
    commands = (site / "commands.html").read_text(encoding="utf-8")
    for cmd in ("stp translate", "stp search", "stp rules docs", "stp gpu pack", "stp costmodel train"):
        assert cmd in commands, cmd
    assert "--runner" in commands and "--candidates-per-rule" in commands
    assert "halve" not in commands  # nothing of the README leaks in
    assert "reduction_thread_binding" in (site / "shipped-rules.html").read_text(encoding="utf-8")
    assert (site / "results" / "gpu-search-h200.html").is_file()
    assert (site / "rule-language.html").is_file()


def test_mkdocs_strict_fails_on_a_broken_link_and_an_orphan_page(tmp_path):
    """The strictness the site relies on: a broken link and a page missing from `nav` abort."""
    pytest.importorskip("mkdocs", reason="mkdocs is not installed (pip install '.[docs]')")
    copy = tmp_path / "repo"
    shutil.copytree(DOCS, copy / "docs")
    shutil.copy(ROOT / "mkdocs.yml", copy / "mkdocs.yml")
    (copy / "benchmarks").mkdir()
    (copy / "benchmarks" / "results").symlink_to(ROOT / "benchmarks" / "results", target_is_directory=True)
    with open(copy / "docs" / "limits.md", "a", encoding="utf-8") as f:
        f.write("\nSee [nowhere](no-such-page.md).\n")
    (copy / "docs" / "orphan.md").write_text("# Orphan\n", encoding="utf-8")
    r = _mkdocs(copy, tmp_path / "site")
    assert r.returncode != 0
    assert "no-such-page.md" in r.stderr and "orphan.md" in r.stderr


# ---------------------------------------------------------------------------------------------
# No flag that does not exist
# ---------------------------------------------------------------------------------------------

#: flags of other tools that the pages quote (pip, the node's runner, mkdocs, pytest)
OTHER_TOOLS = {"--no-index", "--no-deps", "--target", "--strict", "--site-dir", "--help", "--update-all"}


def _known_flags() -> set[str]:
    import typer

    flags = set(OTHER_TOOLS)

    def walk(c):
        if hasattr(c, "commands"):
            for sub in c.commands.values():
                walk(sub)
            return
        for p in c.params:
            flags.update(getattr(p, "opts", ()))
            flags.update(getattr(p, "secondary_opts", ()))

    walk(typer.main.get_command(app))
    for d in (ROOT / "engine" / "steptp", ROOT / "benchmarks"):
        for f in d.rglob("*.py"):  # argparse flags of python -m steptp.gpu.run and the benchmark scripts
            flags.update(re.findall(r"[\"'](--[a-z][a-z0-9-]*)[\"']", f.read_text(encoding="utf-8")))
    return flags


def test_pages_mention_only_flags_that_exist():
    known = _known_flags()
    pages = [README, *sorted(DOCS.glob("*.md"))]
    unknown = {}
    for p in pages:
        for flag in re.findall(r"(?<![\w-])(--[a-z][a-z0-9-]*)", p.read_text(encoding="utf-8")):
            if flag not in known:
                unknown.setdefault(flag, p.name)
    assert not unknown, f"flags that no command has: {unknown}"
