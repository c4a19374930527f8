"""MkDocs hooks of the stp documentation (``hooks:`` in ``mkdocs.yml``).

* ``on_files``: the files of ``benchmarks/results/`` become pages and files of the site
  under ``results/`` (reports as pages outside the navigation, JSON as downloads), so
  ``docs/results.md`` links them with relative links that ``mkdocs build --strict`` checks.
* ``on_page_markdown``: ``<!-- stp-commands -->`` in a page is replaced by the reference
  of every ``stp`` command, rendered from the CLI itself (typer/click: usage, help text,
  arguments, options with defaults), so the page can never disagree with ``--help``.
"""

from __future__ import annotations

import html
import re
from pathlib import Path

from mkdocs.structure.files import File, InclusionLevel

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results"
MARKER = "<!-- stp-commands -->"
RULES_MARKER = "<!-- stp-rules -->"
TABLE_MARKER = "<!-- stp-commands-table -->"


def on_files(files, config):
    """Add ``benchmarks/results/**`` as ``results/**`` (pages not in the navigation)."""
    for path in sorted(RESULTS.rglob("*")):
        if not path.is_file() or path.name.startswith("."):
            continue
        uri = "results/" + path.relative_to(RESULTS).as_posix()
        inclusion = InclusionLevel.NOT_IN_NAV if path.suffix == ".md" else InclusionLevel.UNDEFINED
        files.append(File.generated(config, uri, abs_src_path=str(path), inclusion=inclusion))
    return files


def on_page_markdown(markdown, page, config, files):
    """Expand the command reference marker."""
    if MARKER in markdown:
        markdown = markdown.replace(MARKER, commands_markdown())
    if TABLE_MARKER in markdown:
        markdown = markdown.replace(TABLE_MARKER, commands_table())
    if RULES_MARKER in markdown:
        markdown = markdown.replace(RULES_MARKER, rules_markdown())
    return markdown


def rules_markdown() -> str:
    """A table of the shipped rules: id, category, level (K, P, S) and description."""
    from steptp.rules import load_rules
    from steptp.rules.tools import EXTRA_STRATEGIES

    rows = ["| id | category | level (K, P, S) | what it does |", "|---|---|---|---|"]
    for r in sorted(load_rules(), key=lambda r: (r.category, r.id)):
        d = r.difficulty
        extra = " *(beyond the paper's list)*" if r.id in EXTRA_STRATEGIES else ""
        text = " ".join(r.description.split()).replace("|", "\\|")
        rows.append(f"| `{r.id}` | {r.category} | {r.level} ({d['K']}, {d['P']}, {d['S']}) | {text}{extra} |")
    return "\n".join(rows) + "\n"


def _text(s: str) -> str:
    """Plain help text as Markdown: HTML and emphasis/link characters escaped."""
    s = html.escape(s, quote=False)
    return re.sub(r"([*_\[\]`])", r"\\\1", s)


def _paragraphs(help_text: str) -> list[str]:
    out = []
    for p in re.split(r"\n\s*\n", (help_text or "").replace("\b", "").strip()):
        p = " ".join(line.strip() for line in p.splitlines() if line.strip())
        if p:
            out.append(_text(p))
    return out


def _commands(cmd, path):
    if hasattr(cmd, "commands"):
        for name, sub in cmd.commands.items():
            if not getattr(sub, "hidden", False):
                yield from _commands(sub, path + [name])
    else:
        yield path, cmd


def _root():
    import typer

    from steptp.cli import app

    return typer.main.get_command(app)


def commands_table() -> str:
    """A table of every ``stp`` command and the first paragraph of its help, linked to its
    section of the reference."""
    rows = ["| command | what it does |", "|---|---|"]
    for path, cmd in _commands(_root(), []):
        first = (_paragraphs(cmd.help or "") or [""])[0].replace("|", "\\|")
        name = "stp " + " ".join(path)
        rows.append(f"| [`{name}`](#{'stp-' + '-'.join(path)}) | {first} |")
    return "\n".join(rows) + "\n"


def commands_markdown() -> str:
    """Markdown reference of every ``stp`` command (in ``stp --help`` order)."""
    root = _root()
    out = []
    for path, cmd in _commands(root, []):
        name = "stp " + " ".join(path)
        ctx = cmd.context_class(cmd, info_name=name, terminal_width=10_000, max_content_width=10_000)
        out.append(f"## `{name}`\n")
        out.append("```text\n" + cmd.get_usage(ctx).strip() + "\n```\n")
        out += [p + "\n" for p in _paragraphs(cmd.help or "")]
        args, opts = [], []
        for p in cmd.get_params(ctx):
            if getattr(p, "hidden", False) or "--help" in getattr(p, "opts", ()):
                continue
            rec = p.get_help_record(ctx)
            if rec is None:
                continue
            names, helptext = rec
            line = f"* `{names}`" + (f": {' '.join(_paragraphs(helptext))}" if helptext.strip() else "")
            (opts if p.param_type_name == "option" else args).append(line)
        if args:
            out.append("Arguments:\n\n" + "\n".join(args) + "\n")
        if opts:
            out.append("Options:\n\n" + "\n".join(opts) + "\n")
    return "\n".join(out)
