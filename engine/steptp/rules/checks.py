"""Static checks of a loaded rule, without a program (run by the loader on every rule file):
its patterns compile, every metavariable it uses is bound, its primitives exist, its CoT
template renders and its tests' LEIR parses."""

from __future__ import annotations

from ..engine.cot import check_template
from ..engine import patterns as P
from ..engine.apply import let_vars
from ..engine.filters import EXTRA_DOMAINS, check_filters
from ..engine.match import CompileError, check_in_egglog, compile_rule
from ..engine.primitives import (PRIMITIVES, RewriteError, is_expression, normalize_args, parse_template, parse_value,
                                 split_as, split_when, value_vars)
from ..engine.structural import parse_item_template
from ..leir.fileformat import parse_leir
from ..leir.parser import LeirSyntaxError, parse_program
from .schema import RuleError


def _raise(source: str, field_: str, msg: str):
    raise RuleError(source, field_, msg)


def _template_vars(kind: str, text: str) -> set[str]:
    return set(P.metavars(parse_template(kind, text)))


def check_rule(rule, source: str | None = None) -> None:
    """Check a rule without a program: patterns compile, every metavariable used by
    ``params``/``let``/``fresh``/``rewrite`` is bound, primitives and their arguments
    exist, the CoT template exists, and the tests' LEIR parses. Raises
    :class:`~steptp.rules.schema.RuleError` naming the field."""
    src = source or rule.display_source
    try:
        cr = compile_rule(rule)
        check_in_egglog(cr)
    except CompileError as e:
        _raise(src, e.field, str(e))
    bound = {n for n in cr.sorts if not n.startswith("_")}
    for name, spec in rule.params.items():
        keys = [k for k in spec if k in ("divisors_of", "choice", "range", "permutations_of") or k in EXTRA_DOMAINS]
        if len(keys) != 1:
            _raise(src, f"params.{name}", f"exactly one domain (divisors_of, choice, range, permutations_of) is "
                                          f"required, got {keys or 'none'}")
        for k, v in spec.items():
            vals = v if isinstance(v, list) else list(v.values()) if isinstance(v, dict) else [v]
            for x in vals:
                if is_expression(x):
                    try:
                        used = value_vars(parse_value(x))
                    except P.PatternError as e:
                        _raise(src, f"params.{name}.{k}", str(e))
                    free = used - bound - set(rule.let) - ({name} if k == "require" else set())
                    if free:
                        _raise(src, f"params.{name}.{k}", f"unbound metavariable(s) {sorted('?' + f for f in free)}")
        bound.add(name)
    for name, spec in rule.let.items():
        try:
            used = let_vars(spec)
        except P.PatternError as e:
            _raise(src, f"let.{name}", str(e))
        free = used - bound - set(rule.let) - set(rule.fresh)
        if free:
            _raise(src, f"let.{name}", f"unbound metavariable(s) {sorted('?' + f for f in free)}")
    bound |= set(rule.let)
    for name, spec in rule.fresh.items():
        if name in bound:
            _raise(src, f"fresh.{name}", f"?{name} is already bound")
        if isinstance(spec, dict):
            kind, opts = next(iter(spec.items()))
            for k, v in (opts or {}).items():
                if is_expression(v):
                    free = value_vars(parse_value(v)) - bound
                    if free:
                        _raise(src, f"fresh.{name}.{kind}.{k}", f"unbound metavariable(s) {sorted('?' + f for f in free)}")
    bound |= set(rule.fresh)
    site_kind = {"expr": "expr", "equation": "equation", "loop": "loops"}.get(rule.scope)
    as_names: set[str] = set()
    for i, (prim, raw) in enumerate(rule.rewrite):
        fld = f"rewrite[{i}].{prim}" if not (len(rule.rewrite) == 1 and isinstance(rule.raw.get("rewrite"), str)) \
            else "rewrite"
        spec = PRIMITIVES.get(prim)
        if spec is None:
            _raise(src, fld, f"unknown primitive {prim!r}; known: {', '.join(sorted(PRIMITIVES))}")
        try:
            _, when = split_when(raw)
            if when is not None:
                free = value_vars(parse_value(when)) - bound if is_expression(when) else set()
                if free:
                    _raise(src, f"{fld}.when", f"unbound metavariable(s) {sorted('?' + f for f in free)}")
            raw, as_name = split_as(raw)
            args = normalize_args(spec, raw)
        except RewriteError as e:
            _raise(src, fld, str(e))
        for a, v in args.items():
            kind = spec.template_args.get(a)
            afld = f"{fld}.{a}" if fld != "rewrite" else fld
            try:
                if kind == "site":
                    if site_kind is None:
                        _raise(src, afld, f"'{prim}' is not defined for the {rule.scope} scope")
                    used = _template_vars(site_kind, v)
                elif kind == "mapping":
                    if not isinstance(v, dict):
                        _raise(src, afld, "expected a mapping {index: expression}")
                    used = set()
                    for k2, v2 in v.items():
                        used |= (value_vars(parse_value(k2)) if is_expression(k2) else set())
                        used |= _template_vars("expr", str(v2))
                elif kind in ("expr", "loops", "equation", "nest"):
                    used = _template_vars(kind, v)
                    if prim == "replace_all" and a == "pattern":
                        continue
                    if prim == "replace_all" and a == "with":
                        used -= set(P.metavars(parse_template("expr", args["pattern"])))
                elif kind == "pattern":        # a match pattern: its metavariables bind, not use
                    parse_template("expr", v)
                    continue
                elif kind == "with":           # a template that may use the pattern's metavariables
                    used = _template_vars("expr", v) - set(P.metavars(parse_template("expr", args["pattern"])))
                elif kind == "subscript_fn":   # a value expression of ?sub (the access's subscript)
                    used = value_vars(parse_value(v)) - {str(args.get("var", "sub")).lstrip("?")}
                elif kind == "item":           # an equation or nest template
                    used = set(P.metavars(parse_item_template(v)))
                else:
                    vals = v if isinstance(v, list) else [v]
                    used = set()
                    for x in vals:
                        if is_expression(x):
                            used |= value_vars(parse_value(x))
            except P.PatternError as e:
                _raise(src, afld, str(e))
            free = {u for u in used if not u.startswith("_")} - bound
            if free:
                _raise(src, afld, f"unbound metavariable(s) {sorted('?' + f for f in free)}")
        if as_name is not None:
            if as_name in bound and as_name not in as_names:
                _raise(src, f"{fld}.as", f"?{as_name} is already bound")
            bound.add(as_name)
            as_names.add(as_name)   # a later step may rename (e.g. alternatives under when:)
    for fld, msg in check_filters(rule):
        _raise(src, fld, msg)
    try:
        check_template(rule)
    except Exception as e:  # noqa: BLE001 - any template problem is a rule error
        _raise(src, "cot", str(e))
    for t in rule.tests:
        try:
            parse_leir(t.before, f"{src} tests[{t.index}].before")
        except LeirSyntaxError as e:
            _raise(src, f"tests[{t.index}].before", str(e))
        if t.after is not None:
            try:
                parse_program(t.after, f"{src} tests[{t.index}].after")
            except LeirSyntaxError as e:
                _raise(src, f"tests[{t.index}].after", str(e))
        for k in (t.params or {}):
            if k not in rule.params:
                _raise(src, f"tests[{t.index}].params.{k}", f"the rule has no parameter {k!r}")


__all__ = ["check_rule"]
