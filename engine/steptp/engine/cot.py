"""Chain-of-thought rendering from the actual change (paper §3.2 "CoT Construction").

A rule's ``cot:`` is either a template file name (``cot_loop_change.j2``, looked up
beside the rule file, in a ``templates/`` directory next to it, then in the shipped
templates = repo-root ``templates/``) or an inline Jinja string. Every quoted LEIR
fragment in the context is cut from the real ``before``/``after`` programs at the
site's paths, or taken from the primitives' change log, never written after the fact.

Context variables (all strings unless noted):

* ``strategy`` (rule name), ``strategy_id``, ``category``, ``description`` (the rule's
  fixed description sentence)
* ``params`` (dict name -> text), ``param_text`` (``f=4, ...``), ``bindings`` (dict
  metavariable -> LEIR text), ``site`` (text), ``scope``
* ``before``/``after`` (whole programs), ``removed_nests``/``added_nests`` (lists of nest
  texts present only in one of them), ``changes`` (list of dicts: kind, before, after,
  where, ...)
* per scope, from the real programs:
  ``equation_before``/``equation_after``, ``site_before``/``site_after`` (expr),
  ``nest_before``/``nest_after``, ``loops_before``/``loops_after``, ``loop_before``
  (loop), ``nests_before`` (list, nests), ``tensor``, ``tensor_before``/
  ``tensor_after``, ``occurrences``, ``scope_before``/``scope_after`` (tensor), ``substitutions`` (list of
  ``{index, expr}``), ``fresh`` / ``let`` (dicts: the rule's fresh names and let values as
  LEIR text).
* the step's figures (design.md §8, :mod:`steptp.engine.figures`): ``figures`` (dict: each
  figure as ``[before, after]``, see :func:`~steptp.engine.figures.step_figures`),
  ``figures_text`` (the changed figures, ``threads per launch 8 → 4; ...``, empty when none
  changed), ``figures_scope`` (what they are counted over, ``the kernel it changes``),
  ``effects`` (list of sentences: the effects the figures show, and the cost of a step that
  pays now for a later one), ``unchanged_text`` (the main figures of a step that changes none,
  ``threads per launch 4 → 4; ...``), ``no_figures_text`` (the sentence for a step that changes no
  counted figure); with a nest site also ``read_reuse`` (dict tensor -> reads per element, for
  the global tensors the nest reads more than once) and ``reuse_exact`` (whether a tensor not
  in it is read once per element).

Every shipped template ends with ``{% include "_figures.j2" %}``, the instance part's
figures; a template that does not include it gets that text appended by :func:`render_cot`.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

import jinja2

from ..leir import ast as A
from ..leir.fileformat import LeirModule
from ..leir.printer import format_assign, format_expr, format_loops, format_nest
from .match import Site, display
from .navigation import nest_diff
from .primitives import Change, expr_at, get_item, iter_tensors


def _loader_for(rule) -> jinja2.BaseLoader:
    from ..resources import templates_dir

    dirs = []
    if getattr(rule, "path", None):
        d = Path(rule.path).resolve().parent
        dirs += [d, d / "templates", d.parent / "templates"]
    dirs.append(templates_dir())
    seen, uniq = set(), []
    for d in dirs:
        if str(d) not in seen and d.is_dir():
            seen.add(str(d))
            uniq.append(str(d))
    return jinja2.FileSystemLoader(uniq)


@lru_cache(maxsize=64)
def _env(dirs_key: tuple) -> jinja2.Environment:
    return jinja2.Environment(loader=jinja2.FileSystemLoader(list(dirs_key)), undefined=jinja2.StrictUndefined,
                              trim_blocks=True, lstrip_blocks=True, autoescape=False, keep_trailing_newline=False)


def _template(rule) -> jinja2.Template:
    loader = _loader_for(rule)
    return _compiled(tuple(loader.searchpath), rule.cot)


@lru_cache(maxsize=256)
def _compiled(dirs_key: tuple, cot: str) -> jinja2.Template:
    env = _env(dirs_key)
    if cot.endswith(".j2"):
        return env.get_template(cot)
    return env.from_string(cot)


def check_template(rule) -> None:
    """Raise if the rule's CoT template is missing or does not parse."""
    _template(rule)


def _nest_diff(before: A.Program, after: A.Program) -> tuple[list[str], list[str]]:
    """Top-level nest texts only in ``before`` / only in ``after``
    (:func:`~steptp.engine.navigation.nest_diff`)."""
    ib, ia = nest_diff(before, after)
    return [format_nest(before.nests[i]) for i in ib], [format_nest(after.nests[i]) for i in ia]


def _fmt_param(v) -> str:
    if isinstance(v, (A.Int, A.Float, A.Index, A.Tensor, A.Neg, A.BinOp, A.Call, A.Compare, A.BoolOp, A.Not)):
        return format_expr(v)
    if isinstance(v, tuple):
        return "(" + ", ".join(map(str, v)) + ")"
    return str(v)


def cot_context(rule, before: LeirModule, after: LeirModule, site: Site, params: dict, env: dict,
                changes: list[Change], figures: dict | None = None) -> dict:
    """The Jinja context for one step (see the module docstring); ``figures``: the step's
    :func:`~steptp.engine.figures.step_figures`, computed here when not given."""
    from .figures import (NO_FIGURE_SENTENCE, figure_effects, figures_scope, read_reuse, render_figures,
                          render_unchanged, step_figures)

    bp, ap = before.program, after.program
    if figures is None:
        figures = step_figures(before, after)
    rem, add = _nest_diff(bp, ap)
    ctx: dict = {
        "strategy": rule.name, "strategy_id": rule.id, "category": rule.category, "description": rule.description,
        "params": {k: _fmt_param(v) for k, v in params.items()},
        "param_text": ", ".join(f"{k}={_fmt_param(v)}" for k, v in params.items()),
        "bindings": {k: display(v) for k, v in site.bindings if not k.startswith("_")
                     and k not in ("eq", "nest", "site", "pos")},
        "site": str(site), "scope": site.scope,
        "before": format_nest_list(bp), "after": format_nest_list(ap),
        "removed_nests": rem, "added_nests": add,
        "changes": [c.as_dict() for c in changes],
        "substitutions": [{"index": c.before, "expr": c.after} for c in changes if c.kind == "substitute"],
        "fresh": {k: display(env[k]) for k in getattr(rule, "fresh", {}) if k in env},
        "let": {k: display(env[k]) for k in getattr(rule, "let", {}) if k in env},
        "figures": figures, "figures_text": render_figures(figures), "figures_scope": figures_scope(figures),
        "effects": figure_effects(figures), "no_figures_text": NO_FIGURE_SENTENCE,
        "unchanged_text": render_unchanged(figures),
    }
    if site.equation is not None:
        eb = get_item(bp, site.equation)
        ea = _after_item(ap, site.equation, A.Assign)
        ctx["equation_before"], ctx["equation_after"] = format_assign(eb), format_assign(ea) if ea else ""
        if site.expr is not None:
            ctx["site_before"] = format_expr(expr_at(eb.value, site.expr))
            try:
                ctx["site_after"] = format_expr(expr_at(ea.value, site.expr)) if ea else ""
            except (IndexError, TypeError):
                ctx["site_after"] = ""
    if site.nest is not None:
        nb = get_item(bp, site.nest)
        na = _after_item(ap, site.nest, A.Nest)
        ctx["nest_before"], ctx["nest_after"] = format_nest(nb), format_nest(na) if na else ""
        ctx["loops_before"], ctx["loops_after"] = format_loops(nb.loops), format_loops(na.loops) if na else ""
        if site.loop is not None:
            ctx["loop_before"] = format_loops((nb.loops[site.loop],))
        ctx["read_reuse"], ctx["reuse_exact"] = read_reuse(nb)
    if site.nests:
        ctx["nests_before"] = [format_nest(get_item(bp, p)) for p in site.nests]
        ctx["shared_loops"] = format_loops(get_item(bp, site.nests[0]).loops)
    if site.tensor is not None:
        tb = [t for t in iter_tensors(bp) if t.name == site.tensor]
        ta = [t for t in iter_tensors(ap) if t.name == site.tensor]
        ctx["tensor"] = site.tensor
        ctx["tensor_before"] = format_expr(tb[0]) if tb else ""
        ctx["tensor_after"] = format_expr(ta[0]) if ta else ""
        ctx["occurrences"] = len(ta)
        ctx["scope_before"] = tb[0].scope if tb else ""
        ctx["scope_after"] = ta[0].scope if ta else ""
    return ctx


def _after_item(prog: A.Program, path, kind):
    """The item at ``path`` of the transformed program, or None when a structural rewrite
    left no item of that kind there (the *_after variables are then empty)."""
    try:
        item = get_item(prog, path)
    except ValueError:
        return None
    return item if isinstance(item, kind) else None


def format_nest_list(p: A.Program) -> str:
    return "".join(format_nest(n) for n in p.nests)


def _normalise(text: str) -> list[str]:
    lines = [" ".join(l.split()) for l in text.splitlines()]
    return [l for l in lines if l]


#: The shared partial that states a step's figures (the instance part's last lines).
FIGURES_PARTIAL = "_figures.j2"


def render_cot(rule, before: LeirModule, after: LeirModule, site: Site, params: dict, env: dict,
               changes: list[Change], figures: dict | None = None) -> str:
    """Render the rule's CoT template for one step; whitespace is normalised to single
    spaces within lines and blank lines are dropped. ``figures``: the step's
    :func:`~steptp.engine.figures.step_figures` (computed when not given). When the template
    does not include :data:`FIGURES_PARTIAL`, its rendering is appended, so every reason
    states the figures of its step (design.md §8)."""
    ctx = cot_context(rule, before, after, site, params, env, changes, figures)
    tpl = _template(rule)
    lines = _normalise(tpl.render(**ctx))
    tail = _normalise(tpl.environment.get_template(FIGURES_PARTIAL).render(**ctx))
    if tail and "\n".join(tail) not in "\n".join(lines):
        lines += tail
    return "\n".join(lines)


__all__ = ["cot_context", "render_cot", "check_template"]
