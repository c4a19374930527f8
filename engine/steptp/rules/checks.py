"""Static checks of a loaded rule, without a program (run by the loader on every rule file):
every name it uses is registered (relations of its ``where:`` clauses, filters, value
functions of its value expressions, rewrite primitives, CoT template variables; a misspelled
one is named with the closest registered names, :func:`~steptp.rules.positions.did_you_mean`),
its patterns compile, every metavariable it uses is bound, its CoT template renders and its
tests' LEIR parses."""

from __future__ import annotations

import jinja2

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
from .positions import did_you_mean
from .schema import RuleError


def _raise(source: str, field_: str, msg: str, name: str | None = None):
    raise RuleError(source, field_, msg, name=name)


def _calls(tree):
    """``(name, argument count)`` of every function call in a parsed value expression or
    ``where:`` clause (nested tuples of :func:`steptp.engine.patterns.parse_value_tree`)."""
    if isinstance(tree, list):
        for x in tree:
            yield from _calls(x)
        return
    if not isinstance(tree, tuple) or not tree:
        return
    if tree[0] == "call":
        yield tree[1], len(tree[2])
    for x in tree[1:]:
        if isinstance(x, (tuple, list)):
            yield from _calls(x)


def check_value_functions(src: str, fld: str, text) -> None:
    """Raise :class:`RuleError` when the value expression ``text`` (a ``let:``/``params:``/
    ``{check:}``/``when:`` string or primitive argument) calls a function that is not in
    :data:`~steptp.engine.primitives.VALUE_FUNCTIONS`, or calls one with the wrong number
    of arguments. Texts that are not expressions, or do not parse, are left to the other
    checks."""
    from ..engine.primitives import VALUE_FUNCTIONS

    if not is_expression(text):
        return
    try:
        tree = parse_value(text)
    except P.PatternError:
        return
    for name, n in _calls(tree):
        entry = VALUE_FUNCTIONS.get(name)
        if entry is None:
            _raise(src, fld, f"unknown value function {name!r}{did_you_mean(name, VALUE_FUNCTIONS)}", name)
        if entry[0] >= 0 and entry[0] != n:
            _raise(src, fld, f"{name} takes {entry[0]} argument(s), got {n}", name)


def _let_texts(spec) -> list:
    if isinstance(spec, dict):
        return [spec.get("lookup"), spec.get("default"), *spec.get("table", {}).values()]
    return [spec]


def _template_source(rule) -> str | None:
    from ..engine.cot import _loader_for

    if not rule.cot.endswith(".j2"):
        return rule.cot
    loader = _loader_for(rule)
    try:
        return loader.get_source(jinja2.Environment(loader=loader), rule.cot)[0]
    except jinja2.TemplateError:
        return None  # a missing file: check_template reports it


_COT_NAMES: frozenset | None = None


def cot_variables() -> frozenset:
    """The names a CoT template may use: the keys that
    :func:`steptp.engine.cot.cot_context` can put in the context (read from its source, so
    that a variable added there is known here) and Jinja's globals (``range``, ...)."""
    global _COT_NAMES
    if _COT_NAMES is None:
        import ast
        import inspect

        from ..engine import cot

        names = set(jinja2.Environment().globals)
        for node in ast.walk(ast.parse(inspect.getsource(cot.cot_context))):
            if isinstance(node, ast.Dict):
                names |= {k.value for k in node.keys if isinstance(k, ast.Constant) and isinstance(k.value, str)}
            elif isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Store) and \
                    isinstance(node.slice, ast.Constant) and isinstance(node.slice.value, str):
                names.add(node.slice.value)
        _COT_NAMES = frozenset(names)
    return _COT_NAMES


def check_names(rule, source: str | None = None) -> None:
    """Check every name the rule uses against the engine's registries: the relations and
    functions of its ``where:`` clauses, the value functions of its ``{check:}`` clauses,
    ``let:``, ``params:`` and ``fresh:`` expressions and ``when:`` conditions, its
    ``filter:`` steps, its rewrite primitives and the variables of its CoT template. Raises
    :class:`RuleError` naming the field, the unknown name and the closest known ones."""
    from ..engine.egraph import RELATIONS
    from ..engine.filters import FILTERS

    src = source or rule.display_source
    for i, item in enumerate(rule.where):
        if isinstance(item, str):
            try:
                tree = P.parse_where_clause(item)
            except P.PatternError:
                continue  # compile_rule names the syntax error
            for name, _ in _calls(tree):
                if name not in RELATIONS:
                    _raise(src, f"where[{i}]", f"unknown relation {name!r}{did_you_mean(name, RELATIONS)}", name)
        elif isinstance(item, dict) and "check" in item:
            check_value_functions(src, f"where[{i}].check", item["check"])
    for name, spec in rule.params.items():
        for k, v in spec.items():
            for x in (v if isinstance(v, list) else list(v.values()) if isinstance(v, dict) else [v]):
                check_value_functions(src, f"params.{name}.{k}", x)
    for name, spec in rule.let.items():
        for x in _let_texts(spec):
            check_value_functions(src, f"let.{name}", x)
    for name, spec in rule.fresh.items():
        if isinstance(spec, dict):
            kind, opts = next(iter(spec.items()))
            for k, v in (opts or {}).items():
                check_value_functions(src, f"fresh.{name}.{kind}.{k}", v)
    for i, step in enumerate(rule.raw.get("filter", ()) or ()):
        name = next(iter(step))
        if name not in FILTERS:
            _raise(src, f"filter[{i}].{name}", f"unknown filter {name!r}{did_you_mean(name, FILTERS)}", name)
    for i, (prim, raw) in enumerate(rule.rewrite):
        if prim not in PRIMITIVES:
            _raise(src, f"rewrite[{i}].{prim}", f"unknown primitive {prim!r}{did_you_mean(prim, PRIMITIVES)}", prim)
        if isinstance(raw, dict) and "when" in raw:
            check_value_functions(src, f"rewrite[{i}].{prim}.when", raw["when"])
    text = _template_source(rule)
    if text is not None:
        import jinja2.meta

        from jinja2 import nodes

        try:
            tree = jinja2.Environment().parse(text)
        except jinja2.TemplateSyntaxError:
            return  # check_template names it
        used = jinja2.meta.find_undeclared_variables(tree)
        # a name the template asks about ({% if detail is defined %}) may be absent
        known = cot_variables() | {t.node.name for t in tree.find_all(nodes.Test)
                                   if t.name in ("defined", "undefined") and isinstance(t.node, nodes.Name)}
        for name in sorted(used - known):
            _raise(src, "cot", f"unknown template variable {name!r}{did_you_mean(name, known)}", name)


def _template_vars(kind: str, text: str) -> set[str]:
    return set(P.metavars(parse_template(kind, text)))


def check_rule(rule, source: str | None = None) -> None:
    """Check a rule without a program: patterns compile, every metavariable used by
    ``params``/``let``/``fresh``/``rewrite`` is bound, primitives and their arguments
    exist, the CoT template exists, and the tests' LEIR parses. Raises
    :class:`~steptp.rules.schema.RuleError` naming the field."""
    src = source or rule.display_source
    check_names(rule, src)
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
            _raise(src, fld, f"unknown primitive {prim!r}{did_you_mean(prim, PRIMITIVES)}", prim)
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
                    check_value_functions(src, afld, v)
                    used = value_vars(parse_value(v)) - {str(args.get("var", "sub")).lstrip("?")}
                elif kind == "item":           # an equation or nest template
                    used = set(P.metavars(parse_item_template(v)))
                else:
                    vals = v if isinstance(v, list) else [v]
                    used = set()
                    for x in vals:
                        if is_expression(x):
                            check_value_functions(src, afld, x)
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


__all__ = ["check_rule", "check_names", "check_value_functions", "cot_variables"]
