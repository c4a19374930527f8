"""Match-site enumeration: rules compiled to egglog candidate rules, rows mapped to sites.

A rule's ``match:`` (one scope) and ``where:`` clauses compile into one egglog rule
recording ``cand__<id>(bindings...)`` (union-free, no new terms: only bound values are
recorded). Negated clauses use stratified negation: candidates are first recorded as
``pre__<id>``, a bool flag ``blk__<id>`` is or-ed to true by each negated clause in a
later ruleset, and only unflagged rows become candidates (egglog-notes Q4).

Scopes and what a :class:`Site` locates:

=========  ==========================  ============================================
scope      implicit bindings           site
=========  ==========================  ============================================
expr       ?eq ?nest ?site             one occurrence of a value subterm (path)
equation   ?eq ?nest                   one equation
loop       ?nest ?pos                  one loop of one nest
nest       (the named ?N)              one nest (nested nests included)
nests      (the named ?n1 ?n2)         two consecutive sibling nests
tensor     (the named ?X)              every occurrence of one tensor
=========  ==========================  ============================================

Identical subterms share one e-class, so one ``expr`` row may stand for several
occurrences: each occurrence becomes its own site (egglog-notes Q2).
"""

from __future__ import annotations

import re
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from ..leir import ast as A
from ..leir.fileformat import LeirModule
from ..leir.printer import format_node
from . import patterns as P
from .egraph import EGG_SORT, RELATIONS, SCHEDULE, EggSession, ProgramIndex
from .primitives import EqRef, NestRef, value_occurrences


class CompileError(ValueError):
    """A rule's match / where clauses cannot be compiled. ``field`` is the YAML field path."""

    def __init__(self, field: str, message: str):
        self.field = field
        super().__init__(message)


# ---------------------------------------------------------------------------
# Sites
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Site:
    """One place where a rule applies.

    ``nest``/``equation`` are paths (see :mod:`steptp.engine.primitives`), ``expr`` a
    child-index path inside the equation's value, ``loop`` a loop position, ``nests`` the
    paths of matched consecutive nests, ``tensor`` a tensor name. ``bindings`` are the
    metavariable values (sorted ``(name, value)`` pairs; Term values are AST nodes,
    nests/equations are :class:`NestRef`/:class:`EqRef`).
    """

    rule: str
    scope: str
    nest: tuple[int, ...] | None = None
    nests: tuple[tuple[int, ...], ...] = ()
    equation: tuple[int, ...] | None = None
    expr: tuple[int, ...] | None = None
    loop: int | None = None
    tensor: str | None = None
    bindings: tuple[tuple[str, Any], ...] = field(default=(), compare=True)

    @property
    def env(self) -> dict:
        """Bindings as a dict (metavariable name without ``?`` -> value)."""
        return dict(self.bindings)

    @property
    def location(self) -> tuple:
        """The site without its bindings (hashable)."""
        return (self.scope, self.nest, self.nests, self.equation, self.expr, self.loop, self.tensor)

    def sort_key(self) -> tuple:
        """Deterministic order of sites: scope, equation, nest, loop, expression path, tensor."""
        return (self.scope, self.equation or (), self.nest or (), self.nests, self.loop if self.loop is not None else -1,
                self.expr or (), self.tensor or "", repr(self.bindings))

    def __str__(self) -> str:
        p = lambda t: "(" + ",".join(map(str, t)) + ")"  # noqa: E731
        if self.scope == "expr":
            return f"expr at eq{p(self.equation)} value{p(self.expr)}"
        if self.scope == "equation":
            return f"equation eq{p(self.equation)}"
        if self.scope == "loop":
            return f"loop {self.loop} of nest{p(self.nest)}"
        if self.scope == "nest":
            return f"nest{p(self.nest)}"
        if self.scope == "nests":
            return "nests " + "+".join(p(x) for x in self.nests)
        return f"tensor {self.tensor}"

    def describe(self) -> dict:
        """JSON-friendly description (paths as lists, bindings as LEIR text)."""
        d: dict[str, Any] = {"scope": self.scope}
        for k in ("nest", "equation", "expr", "loop", "tensor"):
            v = getattr(self, k)
            if v is not None:
                d[k] = list(v) if isinstance(v, tuple) else v
        if self.nests:
            d["nests"] = [list(x) for x in self.nests]
        d["bindings"] = {k: display(v) for k, v in self.bindings if not k.startswith("_")}
        return d

    def matches_spec(self, spec: dict) -> bool:
        """True when every key of a partial description (as in YAML tests) agrees."""
        for k, v in spec.items():
            cur = getattr(self, k, None)
            if k == "nests":
                if tuple(tuple(x) for x in v) != cur:
                    return False
            elif isinstance(v, list):
                if cur != tuple(v):
                    return False
            elif cur != v:
                return False
        return True


def display(v) -> str:
    """LEIR text of a binding value."""
    if isinstance(v, (NestRef, EqRef)):
        return str(v)
    if isinstance(v, tuple):
        if v and isinstance(v[0], A.Loop):
            return "".join(format_node(x) for x in v)
        return "(" + ",".join(display(x) for x in v) + ")"
    if isinstance(v, (str, int)):
        return str(v)
    return format_node(v)


# ---------------------------------------------------------------------------
# Compilation
# ---------------------------------------------------------------------------

IMPLICIT = {
    "expr": {"eq": "Eq", "nest": "Nest", "site": "Term"},
    "equation": {"eq": "Eq", "nest": "Nest"},
    "loop": {"nest": "Nest", "pos": "Int"},
    "nest": {},
    "nests": {},
    "tensor": {},
}


@dataclass
class CompiledRule:
    """egglog text and row layout of one rule."""

    rule_id: str
    key: str
    scope: str
    pattern: Any
    sorts: dict[str, str]
    columns: list[str]
    text: str
    relation: str
    negated: bool
    scope_vars: tuple[str, ...] = ()

    def column_sorts(self) -> list[str]:
        """Logical sort of each candidate-row column."""
        return [self.sorts[c] for c in self.columns]


_CMP_OPS = {"<": "<", "<=": "<=", ">": ">", ">=": ">=", "==": "=", "!=": "!="}


class _WhereCompiler:
    """Compiles ``where:`` items to egglog query atoms (positive / negated)."""

    def __init__(self, sorts: dict[str, str], rule_id: str):
        self.sorts = sorts
        self.n_tmp = 0
        self.rule_id = rule_id

    def tmp(self) -> str:
        self.n_tmp += 1
        return f"tmp_{self.n_tmp}"

    def declare(self, name: str, sort: str, field_: str):
        old = self.sorts.get(name)
        if old is None:
            self.sorts[name] = sort
        elif old != sort:
            raise CompileError(field_, f"?{name} is a {old} but this argument needs a {sort}")

    def compile_item(self, item, field_: str) -> tuple[list[str], list[str] | None]:
        """Return (positive atoms, negated atom group or None)."""
        if isinstance(item, dict):
            name = item["term"][1:]
            try:
                pat = P.parse_expr_pattern(item["pattern"], wild=f"_p{self.tmp()}_")
                P.metavar_sorts(pat, self.sorts, f"{field_}.pattern")
            except P.PatternError as e:
                raise CompileError(field_ + ".pattern", str(e)) from None
            if name not in self.sorts:
                raise CompileError(field_ + ".term", f"?{name} must be bound before it is checked against a pattern")
            return [f"(= {P.qvar(name)} {P.to_sexp(pat, self.sorts)})"], None
        toks = P.tokenize(item)
        k = 0

        def peek(o=0):
            return toks[min(k + o, len(toks) - 1)]

        negated = False
        if peek().kind == "word" and peek().text == "not":
            negated = True
            k += 1
        # relation / function atom
        if peek().kind == "word" and peek(1).kind == "op" and peek(1).text == "(":
            name = peek().text
            sig = RELATIONS.get(name)
            if sig is None:
                raise CompileError(field_, f"unknown relation {name!r}; known: {', '.join(sorted(RELATIONS))}")
            k += 2
            args: list[str] = []
            idx = 0
            while True:
                t = peek()
                if t.kind == "op" and t.text == ")":
                    k += 1
                    break
                if idx >= len(sig.args):
                    raise CompileError(field_, f"{name} takes {len(sig.args)} argument(s)")
                s = sig.args[idx]
                if t.kind == "mvar":
                    self.declare(t.text[1:], s, field_)
                    args.append(P.qvar(t.text[1:]))
                    k += 1
                elif t.kind == "op" and t.text == "_":
                    args.append(f"anon_{self.tmp()}")
                    k += 1
                elif t.kind == "int" or (t.kind == "op" and t.text == "-" and peek(1).kind == "int"):
                    neg = t.text == "-"
                    k += 2 if neg else 1
                    args.append(str(-int(peek(-1).text) if neg else int(t.text)))
                elif t.kind in ("str", "word", "name"):
                    args.append(P.sx_str(t.text[1:-1] if t.kind == "str" else t.text))
                    k += 1
                else:
                    raise CompileError(field_, f"bad argument {t.text!r} to {name}")
                idx += 1
                if peek().kind == "op" and peek().text == ",":
                    k += 1
            if idx != len(sig.args):
                raise CompileError(field_, f"{name} takes {len(sig.args)} argument(s), got {idx}")
            call = f"({name} {' '.join(args)})"
            if sig.result is None:
                atoms = [call]
                if peek().kind != "eof":
                    raise CompileError(field_, f"unexpected {peek().text!r} after {name}(...)")
            else:
                op = peek()
                if op.kind != "op" or op.text not in _CMP_OPS:
                    raise CompileError(field_, f"{name} is a function: compare it, e.g. '{name}(...) >= 2'")
                k += 1
                rhs, more = self.value(toks, k, field_)
                t = self.tmp()
                atoms = [f"(= {t} {call})"] + more + [f"({_CMP_OPS[op.text]} {t} {rhs})"]
            return (atoms, None) if not negated else ([], atoms)
        if negated:
            raise CompileError(field_, "'not' applies to a relation, e.g. 'not fuse_conflict(?n1, ?n2)'")
        # comparison of integer values
        lhs, more, k2 = self.value_until_cmp(toks, field_)
        op = toks[k2]
        rhs, more2 = self.value(toks, k2 + 1, field_)
        return more + more2 + [f"({_CMP_OPS[op.text]} {lhs} {rhs})"], None

    def value_until_cmp(self, toks, field_):
        k = 0
        while not (toks[k].kind == "op" and toks[k].text in _CMP_OPS):
            if toks[k].kind == "eof":
                raise CompileError(field_, "expected a relation atom or a comparison")
            k += 1
        sub = toks[:k] + [P.Tok("eof", "", toks[k].pos)]
        v, more = self._arith(sub, field_)
        return v, more, k

    def value(self, toks, k, field_):
        return self._arith(toks[k:], field_)

    def _arith(self, toks, field_):
        """Integer arithmetic over ints, metavariables and function calls -> (sexp, atoms)."""
        pos = 0
        atoms: list[str] = []

        def peek():
            return toks[pos]

        def atom():
            nonlocal pos
            t = toks[pos]
            pos += 1
            if t.kind == "int":
                return t.text
            if t.kind == "mvar":
                name = t.text[1:]
                if name not in self.sorts:
                    self.sorts[name] = "Int"
                return P.qvar(name)
            if t.kind == "op" and t.text == "-":
                return f"(- 0 {atom()})"
            if t.kind == "op" and t.text == "(":
                v = add()
                pos += 1
                return v
            if t.kind == "word" and toks[pos].kind == "op" and toks[pos].text == "(":
                sig = RELATIONS.get(t.text)
                if sig is None or sig.result is None:
                    raise CompileError(field_, f"{t.text} is not a function")
                pos += 1
                args = []
                while not (toks[pos].kind == "op" and toks[pos].text == ")"):
                    a = toks[pos]
                    if a.kind == "mvar":
                        args.append(P.qvar(a.text[1:]))
                    elif a.kind == "int":
                        args.append(a.text)
                    else:
                        raise CompileError(field_, f"bad argument {a.text!r}")
                    pos += 1
                    if toks[pos].kind == "op" and toks[pos].text == ",":
                        pos += 1
                pos += 1
                tmp = self.tmp()
                atoms.append(f"(= {tmp} ({t.text} {' '.join(args)}))")
                return tmp
            raise CompileError(field_, f"unexpected {t.text!r} in a comparison")

        def mul():
            nonlocal pos
            a = atom()
            while peek().kind == "op" and peek().text in ("*", "/", "%"):
                op = peek().text
                pos += 1
                a = f"({op} {a} {atom()})"
            return a

        def add():
            nonlocal pos
            a = mul()
            while peek().kind == "op" and peek().text in ("+", "-"):
                op = peek().text
                pos += 1
                a = f"({op} {a} {mul()})"
            return a

        v = add()
        if peek().kind != "eof":
            raise CompileError(field_, f"unexpected {peek().text!r}")
        return v, atoms


def _mvar_name(text: str, field_: str) -> str:
    if not (isinstance(text, str) and text.startswith("?")):
        raise CompileError(field_, f"expected a metavariable like ?N, got {text!r}")
    return text[1:]


def compile_rule(rule) -> CompiledRule:
    """Compile a :class:`~steptp.rules.loader.Rule` to egglog text (cached by ``rule.key``).

    Raises :class:`CompileError` (with the YAML field path) for bad patterns, unknown
    relations, sort clashes or unbound variables in negated/compared clauses.
    """
    hit = _COMPILED.get(rule.key)
    if hit is not None and hit.rule_id == rule.id:
        return hit
    scope = rule.scope
    sorts: dict[str, str] = dict(IMPLICIT[scope])
    atoms: list[str] = []
    pattern: Any = None
    scope_vars: tuple[str, ...] = ()
    fld = f"match.{scope}"
    try:
        if scope == "expr":
            pattern = P.parse_expr_pattern(rule.match, wild="_m")
            _check_reserved(pattern, sorts, fld)
            P.metavar_sorts(pattern, sorts, fld)
            atoms += ["(val_sub mv_eq mv_site)", "(eq_at mv_nest anon_p mv_eq)",
                      f"(= mv_site {P.to_sexp(pattern, sorts)})"]
        elif scope == "equation":
            pattern = P.parse_equation_pattern(rule.match, wild="_m")
            _check_reserved(pattern, sorts, fld)
            P.metavar_sorts(pattern, sorts, fld)
            atoms += ["(eq_at mv_nest anon_p mv_eq)",
                      f"(eq_def mv_eq {P.to_sexp(pattern.target, sorts)} {P.to_sexp(pattern.value, sorts)})"]
        elif scope == "loop":
            loops = P.parse_loops_pattern(rule.match, wild="_m")
            if len(loops) != 1:
                raise CompileError(fld, "a loop pattern describes exactly one loop")
            pattern = loops[0]
            _check_reserved(pattern, sorts, fld)
            P.metavar_sorts(pattern, sorts, fld)
            atoms.append(f"(loop_at mv_nest mv_pos {P.loop_sexp(pattern)})")
        elif scope == "nest":
            n = _mvar_name(rule.match, fld)
            sorts[n] = "Nest"
            scope_vars = (n,)
            atoms.append(f"(nest {P.qvar(n)})")
        elif scope == "nests":
            a, b = (_mvar_name(x, fld) for x in rule.match)
            if a == b:
                raise CompileError(fld, "the two nests need different names")
            sorts[a] = sorts[b] = "Nest"
            scope_vars = (a, b)
            atoms.append(f"(nest_next {P.qvar(a)} {P.qvar(b)})")
        elif scope == "tensor":
            n = _mvar_name(rule.match, fld)
            sorts[n] = "String"
            scope_vars = (n,)
            atoms.append(f"(tensor {P.qvar(n)})")
        else:  # pragma: no cover - schema prevents this
            raise CompileError("match", f"unknown scope {scope}")
    except P.PatternError as e:
        raise CompileError(fld, str(e)) from None

    wc = _WhereCompiler(sorts, rule.id)
    negs: list[list[str]] = []
    for i, item in enumerate(rule.where):
        pos_atoms, neg = wc.compile_item(item, f"where[{i}]")
        atoms += pos_atoms
        if neg is not None:
            negs.append(neg)
    columns = [c for c in sorts if not c.startswith("_")]
    # every column must be bound by a positive atom
    pos_text = " ".join(atoms)
    for c in columns:
        if P.qvar(c) not in _atom_vars(pos_text):
            raise CompileError("where", f"?{c} is only used in a negated clause or a comparison; bind it first")
    for group in negs:
        for v in _atom_vars(" ".join(group)):
            if v.startswith("mv_") and v[3:] not in columns:
                raise CompileError("where", f"{v[3:]} in a negated clause must be bound by the match or a positive clause")
    egg_sorts = " ".join(EGG_SORT[sorts[c]] for c in columns)
    cols = " ".join(P.qvar(c) for c in columns)
    rid = rule.id
    rel = f"cand__{rid}"
    lines = [f"(relation {rel} ({egg_sorts}))"]
    body = " ".join(atoms)
    if negs:
        lines += [f"(relation pre__{rid} ({egg_sorts}))",
                  f"(function blk__{rid} ({egg_sorts}) bool :merge (or old new))",
                  f"(rule ({body}) ((pre__{rid} {cols})) :ruleset cand :name \"{rid}\")",
                  f"(rule ((pre__{rid} {cols})) ((set (blk__{rid} {cols}) false)) :ruleset neg)"]
        for g in negs:
            lines.append(f"(rule ((pre__{rid} {cols}) {' '.join(g)}) ((set (blk__{rid} {cols}) true)) :ruleset neg)")
        lines.append(f"(rule ((pre__{rid} {cols}) (= (blk__{rid} {cols}) false)) ((cand__{rid} {cols})) :ruleset fin)")
    else:
        lines.append(f"(rule ({body}) (({rel} {cols})) :ruleset cand :name \"{rid}\")")
    cr = CompiledRule(rid, rule.key, scope, pattern, dict(sorts), columns, "\n".join(lines), rel, bool(negs),
                      scope_vars)
    _COMPILED[rule.key] = cr
    return cr


def check_in_egglog(cr: CompiledRule) -> None:
    """Load the compiled text into a scratch e-graph (schema + analyses) so egglog's own
    type checks run at rule-load time; raises ``CompileError`` with egglog's message."""
    global _SCRATCH
    if _SCRATCH is None:
        _SCRATCH = EggSession()
    _SCRATCH.run("(push)")
    try:
        _SCRATCH.run(cr.text)
    except Exception as e:  # noqa: BLE001 - egglog raises its own error types
        raise CompileError("where", f"egglog rejects the compiled rule: {e}") from None
    finally:
        _SCRATCH.run("(pop)")


_SCRATCH: EggSession | None = None


def _check_reserved(pattern, implicit: dict, fld: str):
    for n in P.metavars(pattern):
        if n in implicit:
            raise CompileError(fld, f"?{n} is reserved in this scope (implicit binding)")


def _atom_vars(text: str) -> set[str]:
    return set(re.findall(r"(?<![\w\"])((?:mv|tmp|anon)_[A-Za-z0-9_]+)", text))


_COMPILED: dict[str, CompiledRule] = {}


# ---------------------------------------------------------------------------
# Matching
# ---------------------------------------------------------------------------


class Matcher:
    """An e-graph loaded with a fixed list of rules; match programs with :meth:`sites`."""

    def __init__(self, rules: list):
        self.rules = list(rules)
        self.compiled = [compile_rule(r) for r in self.rules]
        self.session = EggSession("\n".join(c.text for c in self.compiled))
        self.timings: dict[str, float] = {}

    def sites(self, module: LeirModule) -> dict[str, list[Site]]:
        """Every match site of every rule (rule id -> sorted sites)."""
        t0 = time.perf_counter()
        s = self.session
        s.run("(push)")
        try:
            ix = s.load_program(module)
            t1 = time.perf_counter()
            s.run(SCHEDULE)
            t2 = time.perf_counter()
            out = {}
            for rule, cr in zip(self.rules, self.compiled):
                rows = s.rows(cr.relation)
                out[rule.id] = rows_to_sites(cr, rows, ix)
            t3 = time.perf_counter()
        finally:
            s.run("(pop)")
        self.timings = {"insert_ms": 1e3 * (t1 - t0), "run_ms": 1e3 * (t2 - t1), "list_ms": 1e3 * (t3 - t2)}
        return out


def rows_to_sites(cr: CompiledRule, rows: list[list], ix: ProgramIndex) -> list[Site]:
    """Decode candidate rows into sites (one site per subterm occurrence for ``expr``)."""
    out: list[Site] = []
    sorts = cr.column_sorts()
    for row in rows:
        env: dict[str, Any] = {}
        for name, s, v in zip(cr.columns, sorts, row):
            if s == "Nest":
                env[name] = NestRef(ix.nest_paths[v])
            elif s == "Eq":
                env[name] = EqRef(ix.eq_paths[v])
            else:
                env[name] = v
        b = tuple(sorted(env.items()))
        scope = cr.scope
        if scope == "expr":
            eq_path = env["eq"].path
            eq = ix.eqs[ix.eq_paths.index(eq_path)]
            for epath in value_occurrences(eq.value, env["site"]):
                out.append(Site(cr.rule_id, scope, nest=env["nest"].path, equation=eq_path, expr=epath, bindings=b))
        elif scope == "equation":
            out.append(Site(cr.rule_id, scope, nest=env["nest"].path, equation=env["eq"].path, bindings=b))
        elif scope == "loop":
            out.append(Site(cr.rule_id, scope, nest=env["nest"].path, loop=env["pos"], bindings=b))
        elif scope == "nest":
            n = env[cr.scope_vars[0]]
            out.append(Site(cr.rule_id, scope, nest=n.path, bindings=b))
        elif scope == "nests":
            a, bb = (env[x] for x in cr.scope_vars)
            out.append(Site(cr.rule_id, scope, nest=a.path, nests=(a.path, bb.path), bindings=b))
        else:
            out.append(Site(cr.rule_id, scope, tensor=env[cr.scope_vars[0]], bindings=b))
    out.sort(key=Site.sort_key)
    return out


_MATCHERS: "OrderedDict[tuple, Matcher]" = OrderedDict()
_SITES: "OrderedDict[tuple, list[Site]]" = OrderedDict()


def matcher_for(rules: list) -> Matcher:
    """A cached :class:`Matcher` for exactly these rules (by content key)."""
    key = tuple(r.key for r in rules)
    m = _MATCHERS.get(key)
    if m is None:
        m = Matcher(rules)
        _MATCHERS[key] = m
        while len(_MATCHERS) > 64:   # at least one per shipped rule (single-rule matchers) plus groups
            _MATCHERS.popitem(last=False)
    else:
        _MATCHERS.move_to_end(key)
    return m


def find_sites_many(rules: list, module: LeirModule) -> dict[str, list[Site]]:
    """Match several rules in one e-graph run (rule id -> sites); results are cached."""
    out = matcher_for(rules).sites(module)
    for r in rules:
        _remember((r.key, module), out[r.id])
    return out


def _remember(key, sites):
    _SITES[key] = sites
    while len(_SITES) > 512:
        _SITES.popitem(last=False)


#: Rules recently passed to :func:`find_sites` (key -> rule), matched together so a program
#: is inserted into one e-graph once for all of them (the dataset loop asks rule by rule).
_GROUP: "OrderedDict[str, Any]" = OrderedDict()
_GROUP_MAX = 64


def find_sites(rule, module: LeirModule) -> list[Site]:
    """Every match site of ``rule`` in ``module`` (deterministic order).

    Preconditions (``where:``) are evaluated by egglog on the program's facts; parameter
    domains are not (a site whose parameter domain is empty is still listed, see
    :func:`steptp.engine.apply.list_candidates`). Results are cached per (rule, program);
    on a miss, every rule recently passed here is matched in the same e-graph run and
    cached too, so asking rule after rule about one program inserts it only once.
    """
    key = (rule.key, module)
    hit = _SITES.get(key)
    if hit is not None:
        _SITES.move_to_end(key)
        return hit
    _GROUP[rule.key] = rule
    _GROUP.move_to_end(rule.key)
    while len(_GROUP) > _GROUP_MAX:
        _GROUP.popitem(last=False)
    group = sorted(_GROUP.values(), key=lambda r: r.key)
    if len({r.id for r in group}) != len(group):      # two versions of one rule id: match alone
        group = [rule]
    out = matcher_for(group).sites(module)
    for r in group:
        _remember((r.key, module), out[r.id])
    return out[rule.id]


def clear_caches() -> None:
    """Forget cached matchers, compiled rules and site lists."""
    _MATCHERS.clear()
    _SITES.clear()
    _COMPILED.clear()
    _GROUP.clear()


__all__ = ["CompileError", "Site", "display", "IMPLICIT", "CompiledRule", "compile_rule", "check_in_egglog", "Matcher",
           "rows_to_sites", "matcher_for", "find_sites", "find_sites_many", "clear_caches"]
