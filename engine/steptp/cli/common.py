"""Helpers every ``stp`` command shares: error exits (code 2 bad input, 1 a failed check),
loading a .leir file with FILE:LINE:COLUMN errors, and printing a verification result."""

from __future__ import annotations

from pathlib import Path

import typer


def param_text(v) -> str:
    """JSON fallback for parameter values: LEIR subterms (math domains) as LEIR text."""
    from ..leir import ast as A
    from ..leir.printer import format_node

    if isinstance(v, (A.Int, A.Float, A.Index, A.Tensor, A.Neg, A.BinOp, A.Call, A.Compare, A.BoolOp, A.Not)):
        return format_node(v)
    return str(v)


def fail(msg: str, code: int = 2) -> None:
    """Print ``error: msg`` on stderr and exit with ``code`` (2 bad input, 1 a failed check)."""
    typer.echo(f"error: {msg}", err=True)
    raise typer.Exit(code)


def load(path: Path):
    """The parsed ``.leir`` file at ``path``; exits 2 with ``FILE:LINE:COLUMN: message`` for a
    syntax error and with one line for a missing or unreadable file."""
    from ..leir import LeirSyntaxError, load_leir

    if not path.exists():
        fail(f"{path}: no such file")
    try:
        return load_leir(path)
    except LeirSyntaxError as e:
        fail(str(e))
    except OSError as e:
        fail(f"{path}: cannot read: {e.strerror or e}")


def semantic(path: Path, m) -> None:
    """Exit 2 with ``FILE: message`` when the program is not meaningful (analysis)."""
    from ..leir.analysis import LeirSemanticError, analyze

    try:
        analyze(m.program, m.signature)
    except LeirSemanticError as e:
        fail(f"{locate(path, str(e))}: {e}")


def locate(path: Path, message: str) -> str:
    """``FILE:LINE:COLUMN`` of the first equation quoted in a semantic error message when
    it occurs verbatim in the file (canonical LEIR, as ``stp`` writes it), else ``FILE``."""
    import re

    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return str(path)
    for quoted in re.findall(r"'([^']*=[^']*;)'", message):
        pos = text.find(quoted)
        if pos >= 0:
            line = text.count("\n", 0, pos) + 1
            return f"{path}:{line}:{pos - (text.rfind(chr(10), 0, pos) + 1) + 1}"
    return str(path)


def print_verification(res) -> None:
    """Print a verification result: one pass/FAIL line per stage, the errors and the reason."""
    for name in ("diff", "build", "exec", "equal"):
        if hasattr(res, name):
            val = getattr(res, name)
            typer.echo(f"{name.capitalize():6} {'pass' if val else 'FAIL'}")
    def num(x) -> str:
        return "n/a" if x is None else f"{x:.3g}"

    typer.echo(f"max_abs_err {num(res.max_abs_err)}  max_rel_err {num(res.max_rel_err)}  trials {res.trials}")
    if res.reason:
        typer.echo(f"reason: {res.reason}")


def guard_rule(path: Path, fn):
    """Run ``fn`` (loading or applying a rule); a broken rule file becomes ``FILE: field:
    message`` and exit 2, never a traceback. :class:`NoMatch` passes through."""
    from ..rules.errors import rule_problem

    try:
        return fn()
    except FileNotFoundError:
        fail(f"{path}: no such rule file")
    except Exception as e:  # noqa: BLE001 - classified below; NoMatch is re-raised
        msg = rule_problem(e, path)
        if msg is None:
            raise
        fail(msg)


def internal_errors_exit(internal: int, programs: int, where) -> None:
    """No silent success: when every one of ``programs`` (> 0) failed for an internal reason
    (an unexpected exception, a crashed worker; not bad input, not merely no verified result),
    exit 1 with ``error: all N program(s) failed with internal errors; see WHERE``. When only
    some did, print how many on stderr and return (the exit code stays the command's own)."""
    if internal <= 0:
        return
    if internal >= programs:
        fail(f"all {programs} program(s) failed with internal errors; see {where}", 1)
    typer.echo(f"{internal} of {programs} program(s) failed with internal errors; see {where}", err=True)


#: Help of ``--rules`` (every command that uses rules).
RULES_HELP = ("A folder of your own rule files (*.yaml), used after the shipped rules; repeatable, added to "
              "$STP_RULES_PATH (':'-separated). A rule with a shipped rule's id replaces it (one line on stderr "
              "says so).")


def rules_option():
    """The ``--rules DIR`` option (repeatable) of the commands that use rules."""
    return typer.Option(None, "--rules", help=RULES_HELP, file_okay=False)


def use_rule_dirs(dirs, load: bool = True) -> list:
    """Put the user rule folders ``dirs`` (``--rules``) after those of ``$STP_RULES_PATH``
    in that variable, so that every worker process this command starts (engine service,
    process pools) loads them too; check that each is a directory and (``load``) that every
    user rule file loads (exit 2 with ``FILE:LINE:COL: field: message`` otherwise), and print
    one line on stderr for each user rule that replaces a shipped one. Returns the rule files
    in effect (:func:`steptp.rules.loader.rule_paths`)."""
    import os

    from ..rules import RuleError
    from ..rules.loader import RULES_PATH_ENV, default_rules_dir, load_rule, rule_paths, user_rule_dirs

    for d in dirs or ():
        if not Path(d).is_dir():
            fail(f"{d}: --rules needs a directory of rule files (*.yaml)")
    if dirs:
        have = [str(p) for p in user_rule_dirs()]
        new = [str(Path(d).resolve()) for d in dirs if str(Path(d).resolve()) not in have]
        os.environ[RULES_PATH_ENV] = os.pathsep.join(have + new)
    if not user_rule_dirs():
        return rule_paths()
    try:
        paths = rule_paths(report=lambda line: typer.echo(line, err=True))
    except RuleError as e:
        fail(str(e))
    shipped = default_rules_dir().resolve()
    for p in paths if load else ():
        if p.resolve().parent != shipped:
            guard_rule(p, lambda p=p: load_rule(p))
    if load:
        from ..engine.recipes import RecipeError, recipes_in_effect

        try:
            recipes_in_effect()  # the user folders' recipes/ too: FILE:LINE:COL before any work
        except RecipeError as e:
            fail(str(e))
    return paths
