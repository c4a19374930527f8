"""One place that turns any failure of a broken rule file into ``FILE: field: message``.

Used by the command line (``stp apply``, ``stp rules test``) so that a rule that is
invalid YAML, a binary file, nested too deeply, names a missing CoT template, uses an
undefined Jinja variable, has a parameter domain that is too large, or whose rewrite
yields an invalid program is reported in one line naming the file, never as a traceback.
"""

from __future__ import annotations

import os

import jinja2


def rule_problem(e: BaseException, path: str | os.PathLike) -> str | None:
    """``FILE: field: message`` for an exception raised while loading or applying the
    rule at ``path``; ``None`` for :class:`~steptp.engine.apply.NoMatch` (not an error of
    the file: the rule does not apply) so the caller can treat it separately."""
    from ..engine.apply import NoMatch
    from ..engine.match import CompileError
    from ..engine.primitives import RewriteError, ValueExprError
    from .loader import display_path
    from .schema import RuleError

    if isinstance(e, NoMatch):
        return None
    src = display_path(path)
    if isinstance(e, RuleError):
        return str(e)
    if isinstance(e, CompileError):
        return f"{src}: {getattr(e, 'field', '') or '(rule)'}: {e}"
    if isinstance(e, jinja2.TemplateNotFound):
        return f"{src}: cot: template {e.name!r} not found"
    if isinstance(e, jinja2.UndefinedError):
        return f"{src}: cot: {e.message}"
    if isinstance(e, jinja2.TemplateError):
        where = f" (line {e.lineno})" if getattr(e, "lineno", None) else ""
        return f"{src}: cot: {e.message}{where}"
    if isinstance(e, RewriteError):
        return f"{src}: rewrite: {e}"
    if isinstance(e, ValueExprError):
        return f"{src}: params/let: {e}"
    if isinstance(e, UnicodeDecodeError):
        return f"{src}: (top level): not a UTF-8 text file (byte {e.start})"
    if isinstance(e, RecursionError):
        return f"{src}: (top level): nested too deeply"
    if isinstance(e, MemoryError):
        return f"{src}: (top level): needs too much memory (a parameter domain or value too large?)"
    if isinstance(e, OSError):
        return f"{src}: (top level): cannot read: {e.strerror or e}"
    if isinstance(e, Exception):
        return f"{src}: (rule): {type(e).__name__}: {e}"
    return None


__all__ = ["rule_problem"]
