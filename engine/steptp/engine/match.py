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
nests      (the named ?n1 ?n2 ...)     2-4 consecutive sibling nests
tensor     (the named ?X)              every occurrence of one tensor
=========  ==========================  ============================================

Identical subterms share one e-class, so one ``expr`` row may stand for several
occurrences: each occurrence becomes its own site (egglog-notes Q2).
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import re
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

from ..leir import ast as A
from ..leir.fileformat import LeirModule
from ..leir.printer import format_node
from . import patterns as P
from .egraph import ANALYSIS_SCHEDULE, EGG_SORT, OPTIONAL_FACTS, RELATIONS, EggSession, ProgramIndex
from .primitives import EqRef, NestRef, value_children


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
        """Deterministic order of sites: scope, equation, nest, loop, expression path,
        tensor, then the bindings' text (see :func:`sort_sites`)."""
        return self._location_key() + (repr(self.bindings),)

    def _location_key(self) -> tuple:
        return (self.scope, self.equation or (), self.nest or (), self.nests, self.loop if self.loop is not None else -1,
                self.expr or (), self.tensor or "")

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
    if isinstance(v, Fraction):  # a decimal of the value language, as the literal a rewrite writes
        return format_node(A.float_literal(float(v)))
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
    schedule: str = ""                 # egglog schedule running only this rule (after the analyses)
    checks: tuple[str, ...] = ()       # ``{check: ...}`` value conditions, evaluated in Python per site

    def column_sorts(self) -> list[str]:
        """Logical sort of each candidate-row column."""
        return [self.sorts[c] for c in self.columns]

    @functools.cached_property
    def query_key(self) -> tuple:
        """What the egglog query computes, without the rule's name: two rules with the same
        key (e.g. the ten normal-form rules, each matching every equation ``?X = ?v``) have
        the same candidate rows on any program, so a matcher runs the query once."""
        tag = self.relation[len("cand__"):]
        text = self.text.replace(tag, "R").replace(f':name "{self.rule_id}"', ':name "R"')
        return (text, self.scope, tuple(self.columns), tuple(sorted(self.sorts.items())), self.scope_vars)


_CMP_OPS = {"<": "<", "<=": "<=", ">": ">", ">=": ">=", "==": "=", "!=": "!="}


class _WhereCompiler:
    """Compiles ``where:`` items to egglog query atoms (positive / negated). String items
    are parsed by the grammar (:func:`~steptp.engine.patterns.parse_where_clause`, entry
    rule ``where_clause`` of ``pattern.lark``); this class walks the parsed clause."""

    def __init__(self, sorts: dict[str, str], rule_id: str):
        self.sorts = sorts
        self.n_tmp = 0
        self.rule_id = rule_id
        self.group_vars: list[set[str]] = []

    def tmp(self) -> str:
        """A fresh temporary variable name (``tmp_1``, ``tmp_2``, ... in allocation order)."""
        self.n_tmp += 1
        return f"tmp_{self.n_tmp}"

    def declare(self, name: str, sort: str, field_: str):
        """Record the sort of ``?name``; raises :class:`CompileError` on a clash."""
        old = self.sorts.get(name)
        if old is None:
            self.sorts[name] = sort
        elif old != sort:
            raise CompileError(field_, f"?{name} is a {old} but this argument needs a {sort}")

    def compile_group(self, items: list, field_: str) -> list[str]:
        """``not (A and B and ...)``: the conjunction of several positive items (parsed
        clauses), negated as a whole. Metavariables first declared inside the group and bound
        nowhere else are existential ("there is no ?M such that ..."); see :func:`compile_rule`."""
        before = set(self.sorts)
        atoms: list[str] = []
        for part in items:
            pos, neg = self.clause(part, field_)
            if neg is not None:
                raise CompileError(field_, "a 'not ( ... )' group cannot contain another negation")
            atoms += pos
        self.group_vars.append(set(self.sorts) - before)
        return atoms

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
            aux: list[str] = []
            sx = P.to_sexp(pat, self.sorts, aux)
            return [f"(= {P.qvar(name)} {sx})"] + aux, None
        try:
            clause = P.parse_where_clause(item)
        except P.PatternError as e:
            raise CompileError(field_, str(e)) from None
        return self.clause(clause, field_)

    def clause(self, c: tuple, field_: str) -> tuple[list[str], list[str] | None]:
        """One parsed clause (``("item", x)``, ``("cmp", op, a, b)`` or ``("not", clause)``)
        -> (positive atoms, negated atom group or None)."""
        negated = c[0] == "not"
        if negated:
            c = c[1]
            if c[0] == "item" and c[1][0] == "group":
                return [], self.compile_group(c[1][1], field_)
        lhs = c[1] if c[0] == "item" else c[2]
        if lhs[0] == "call":
            atoms = self.atom(lhs, c, field_)
            return (atoms, None) if not negated else ([], atoms)
        if negated:
            raise CompileError(field_, "'not' applies to a relation, e.g. 'not fuse_conflict(?n1, ?n2)'")
        if c[0] != "cmp":
            raise CompileError(field_, "expected a relation atom or a comparison")
        _, op, a, b = c
        lhs_sx, more = self.arith(a, field_)
        rhs_sx, more2 = self.arith(b, field_)
        return more + more2 + [f"({_CMP_OPS[op]} {lhs_sx} {rhs_sx})"], None

    def atom(self, call: tuple, c: tuple, field_: str) -> list[str]:
        """A relation atom ``rel(...)`` (``c`` is ``("item", call)``) or a function atom
        compared, ``f(...) >= rhs`` (``c`` is the comparison); the rhs's temporaries are
        allocated before the function's own."""
        _, name, args = call
        sig = RELATIONS.get(name)
        if sig is None:
            raise CompileError(field_, f"unknown relation {name!r}; known: {', '.join(sorted(RELATIONS))}")
        if len(args) != len(sig.args):
            raise CompileError(field_, f"{name} takes {len(sig.args)} argument(s), got {len(args)}")
        sx = [self.relation_arg(a, s, f"argument {k + 1} of {name}", field_)
              for k, (a, s) in enumerate(zip(args, sig.args))]
        call_sx = f"({name} {' '.join(sx)})"
        if sig.result is None:
            if c[0] != "item":
                raise CompileError(field_, f"unexpected {c[1]!r} after {name}(...)")
            return [call_sx]
        if c[0] != "cmp":
            raise CompileError(field_, f"{name} is a function: compare it, e.g. '{name}(...) >= 2'")
        rhs, more = self.arith(c[3], field_)
        t = self.tmp()
        return [f"(= {t} {call_sx})"] + more + [f"({_CMP_OPS[c[1]]} {t} {rhs})"]

    def relation_arg(self, a: tuple, sort: str, what: str, field_: str) -> str:
        """One argument of a relation or compared function: ``?x`` (declared with the
        argument's sort), ``_`` (an anonymous variable), an integer or a string/name."""
        if a[0] == "var":
            self.declare(a[1], sort, field_)
            return P.qvar(a[1])
        if a[0] == "wild":
            return f"anon_{self.tmp()}"
        if a[0] == "neg" and a[1][0] == "lit" and isinstance(a[1][1], int):
            return str(-a[1][1])
        if a[0] == "lit":
            return str(a[1]) if isinstance(a[1], int) else P.sx_str(a[1])
        raise CompileError(field_, f"bad {what}: expected a metavariable, '_', an integer or a name")

    def arith(self, v: tuple, field_: str) -> tuple[str, list[str]]:
        """Integer arithmetic over ints, metavariables and function calls -> (sexp, atoms);
        temporaries are allocated left to right. A metavariable seen first here is an Int."""
        atoms: list[str] = []

        def walk(v):
            kind = v[0]
            if kind == "lit" and isinstance(v[1], int):
                return str(v[1])
            if kind == "var":
                self.sorts.setdefault(v[1], "Int")
                return P.qvar(v[1])
            if kind == "neg":
                return f"(- 0 {walk(v[1])})"
            if kind == "op":
                a, b = walk(v[2]), walk(v[3])
                if v[1] in ("/", "%") and b == "0":
                    raise CompileError(field_, f"'{v[1]} 0' divides by zero")
                return f"({v[1]} {a} {b})"
            if kind == "group" and len(v[1]) == 1 and v[1][0][0] == "item":
                return walk(v[1][0][1])
            if kind == "call":
                return function(v[1], v[2])
            shown = repr(v[1]) if kind == "lit" else "'_'" if kind == "wild" else "a parenthesised clause"
            raise CompileError(field_, f"unexpected {shown} in a comparison")

        def function(name, args):
            sig = RELATIONS.get(name)
            if sig is None or sig.result is None:
                raise CompileError(field_, f"{name} is not a function")
            if len(args) != len(sig.args):
                raise CompileError(field_, f"{name} takes {len(sig.args)} argument(s), got {len(args)}")
            sx = []
            for k, a in enumerate(args):
                if a[0] == "var":
                    sx.append(P.qvar(a[1]))
                elif a[0] == "lit" and isinstance(a[1], int):
                    sx.append(str(a[1]))
                else:
                    raise CompileError(field_, f"bad argument {k + 1} of {name}: expected a metavariable or an integer")
            tmp = self.tmp()
            atoms.append(f"(= {tmp} ({name} {' '.join(sx)}))")
            return tmp

        return walk(v), atoms


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
            aux: list[str] = []
            atoms += ["(val_sub mv_eq mv_site)", "(eq_at mv_nest anon_p mv_eq)",
                      f"(= mv_site {P.to_sexp(pattern, sorts, aux)})"] + aux
        elif scope == "equation":
            pattern = P.parse_equation_pattern(rule.match, wild="_m")
            _check_reserved(pattern, sorts, fld)
            P.metavar_sorts(pattern, sorts, fld)
            aux = []
            atoms += ["(eq_at mv_nest anon_p mv_eq)",
                      f"(eq_def mv_eq {P.to_sexp(pattern.target, sorts, aux)} {P.to_sexp(pattern.value, sorts, aux)})"]
            atoms += aux
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
            names = [_mvar_name(x, fld) for x in rule.match]
            if len(set(names)) != len(names):
                raise CompileError(fld, "the nests need different names")
            if not 2 <= len(names) <= 4:
                raise CompileError(fld, "a nests match names 2, 3 or 4 consecutive nests")
            for n in names:
                sorts[n] = "Nest"
            scope_vars = tuple(names)
            atoms += [f"(nest_next {P.qvar(a)} {P.qvar(b)})" for a, b in zip(names, names[1:])]
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
    checks: list[tuple[str, str]] = []
    for i, item in enumerate(rule.where):
        if isinstance(item, dict) and "check" in item:
            checks.append((f"where[{i}].check", item["check"]))
            continue
        pos_atoms, neg = wc.compile_item(item, f"where[{i}]")
        atoms += pos_atoms
        if neg is not None:
            negs.append(neg)
    # variables first declared inside a 'not ( ... )' group and bound by no positive atom
    # are existential inside that group
    pos_vars = _atom_vars(" ".join(atoms))
    for gi, names in enumerate(wc.group_vars):
        for name in names:
            if P.qvar(name) in pos_vars:
                continue
            sorts.pop(name, None)
            pat = re.compile(r"(?<![\w\"])" + re.escape(P.qvar(name)) + r"(?![\w])")
            negs = [[pat.sub(f"anon_ex{gi}_{name}", a) for a in g] for g in negs]
    bad = [c for c in sorts if sorts[c] == P.LOOPS]
    if bad:
        raise CompileError(fld, f"*?{bad[0]} (a loop-list splice) is only allowed in templates")
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
    for cf, ctext in checks:
        from .primitives import is_expression, parse_value, value_vars

        try:
            used = value_vars(parse_value(ctext)) if is_expression(ctext) else set()
        except P.PatternError as e:
            raise CompileError(cf, str(e)) from None
        free = used - set(columns)
        if free:
            raise CompileError(cf, f"unbound metavariable(s) {sorted('?' + f for f in free)}; a check may only use "
                                   f"what the match and the egglog clauses bind")
    egg_sorts = " ".join(EGG_SORT[sorts[c]] for c in columns)
    cols = " ".join(P.qvar(c) for c in columns)
    rid = rule.id
    # relations and rulesets are named per rule *version* (id + content key), so every rule
    # runs in its own schedule and two versions of one id can share an e-graph
    tag = f"{rid}__{rule.key}"
    rel = f"cand__{tag}"
    rs = {k: f"{k}_rs__{tag}" for k in ("cand", "neg", "fin")}
    lines = [f"(ruleset {rs['cand']})", f"(ruleset {rs['neg']})", f"(ruleset {rs['fin']})",
             f"(relation {rel} ({egg_sorts}))"]
    stage_lines, atoms = _staged(atoms, sorts, columns, tag, rs["cand"])
    lines += stage_lines
    body = " ".join(atoms)
    if negs:
        lines += [f"(relation pre__{tag} ({egg_sorts}))",
                  f"(function blk__{tag} ({egg_sorts}) bool :merge (or old new))",
                  f"(rule ({body}) ((pre__{tag} {cols})) :ruleset {rs['cand']} :name \"{rid}\")",
                  f"(rule ((pre__{tag} {cols})) ((set (blk__{tag} {cols}) false)) :ruleset {rs['neg']})"]
        for g in negs:
            lines.append(f"(rule ((pre__{tag} {cols}) {' '.join(g)}) ((set (blk__{tag} {cols}) true)) "
                         f":ruleset {rs['neg']})")
        lines.append(f"(rule ((pre__{tag} {cols}) (= (blk__{tag} {cols}) false)) ((cand__{tag} {cols})) "
                     f":ruleset {rs['fin']})")
    else:
        lines.append(f"(rule ({body}) (({rel} {cols})) :ruleset {rs['cand']} :name \"{rid}\")")
    schedule = (f"(run-schedule (saturate (run {rs['cand']})) (saturate (run {rs['neg']})) "
                f"(saturate (run {rs['fin']})))")
    cr = CompiledRule(rid, rule.key, scope, pattern, dict(sorts), columns, "\n".join(lines), rel, bool(negs),
                      scope_vars, schedule, tuple(c for _, c in checks))
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


#: egglog primitives: an atom made of these only binds no variable (egglog: "ungrounded")
_PRIMITIVE_HEADS = frozenset({"+", "-", "*", "/", "%", "<", ">", "<=", ">=", "!=", "min", "max", "abs", "not", "and",
                              "or", "neg", "<<", ">>", "&", "|", "^"})


def _head(text: str) -> str | None:
    text = text.strip()
    return text[1:].split(None, 1)[0].rstrip(")") if text.startswith("(") else None


def _grounded(atom: str) -> set[str]:
    """Variables that ``atom`` binds: all of its variables when it applies a relation,
    function or constructor (also as one side of ``=``), none when it only compares or
    computes with primitives (``(>= mv_k 2)``, ``(= (+ mv_a 1) mv_b)``)."""
    head = _head(atom)
    if head == "=":
        inner = atom.strip()[2:-1].strip()
        depth, parts, cur = 0, [], ""
        for ch in inner:
            if ch == "(":
                depth += 1
            elif ch == ")":
                depth -= 1
            if ch == " " and depth == 0:
                if cur:
                    parts.append(cur)
                cur = ""
            else:
                cur += ch
        parts.append(cur)
        if any(_head(p) not in (None, *_PRIMITIVE_HEADS) for p in parts):
            return _atom_vars(atom)
        return set()
    return set() if head in _PRIMITIVE_HEADS else _atom_vars(atom)


#: a positive rule body with more atoms than this is joined in stages of about this many
#: atoms, in the written order of the clauses (see :func:`_staged`)
STAGE_ATOMS = 10


def _staged(atoms: list[str], sorts: dict[str, str], columns: list[str], tag: str,
            ruleset: str) -> tuple[list[str], list[str]]:
    """Split a long conjunctive body into a chain of egglog rules, each materialising the
    rows of its prefix in a relation ``stg<k>__<tag>`` over the metavariables that later
    atoms or the output still need; returns ``(declarations and stage rules, final body)``.

    egglog plans one rule's join by itself; for a body of 40 atoms over four nests
    (``partially_equivalent_then_correct``) its plan grew as about n^3.5 with the program
    (87 nests 0.2 s, 348 nests 29 s). Stages fix a left-deep order that follows the rule
    author's clause order (the structural clauses first), so each stage joins a small
    relation with a few atoms. The rows are the same (a conjunctive query is the join of its
    stages); sites are sorted afterwards, so the output does not change. A cut is made only
    where every variable that crosses it is a metavariable of known sort (``tmp_`` and
    ``anon_`` variables stay inside one stage)."""
    if len(atoms) <= STAGE_ATOMS:
        return [], atoms
    var_sets = [_atom_vars(a) for a in atoms]
    out_vars = {"mv_" + c for c in columns}
    lines: list[str] = []
    carried: list[str] = []   # variables of the previous stage's relation, in order
    prev: str | None = None
    start, k = 0, 0
    n = len(atoms)
    while n - start > STAGE_ATOMS + 2:
        cut, keep = None, []
        for c in range(start + STAGE_ATOMS, n - 2):
            before = set(carried).union(*var_sets[start:c])
            cross = before & out_vars.union(*var_sets[c:])
            grounded = set(carried).union(*(_grounded(a) for a in atoms[start:c]))
            if before <= grounded and all(v.startswith("mv_") and v[3:] in sorts for v in cross):
                cut, keep = c, sorted(cross)
                break
        if cut is None:
            break
        k += 1
        rel = f"stg{k}__{tag}"
        lines.append(f"(relation {rel} ({' '.join(EGG_SORT[sorts[v[3:]]] for v in keep)}))")
        head = ([f"({prev} {' '.join(carried)})"] if prev else []) + atoms[start:cut]
        lines.append(f"(rule ({' '.join(head)}) (({rel} {' '.join(keep)})) :ruleset {ruleset})")
        prev, carried, start = rel, keep, cut
    if prev is None:
        return [], atoms
    return lines, [f"({prev} {' '.join(carried)})"] + atoms[start:]


_COMPILED: dict[str, CompiledRule] = {}


# ---------------------------------------------------------------------------
# Matching
# ---------------------------------------------------------------------------


class Matcher:
    """One e-graph holding the analyses and a growing set of compiled rules.

    A program is loaded once (facts + the analysis strata ``a1``/``a2``) and stays loaded
    until another program is asked for; each rule then runs in **its own schedule**
    (rulesets ``cand_rs/neg_rs/fin_rs__<id>__<key>``) only when its sites are asked for, so the
    cost of one rule's query never adds to another rule's (the old shared ``cand``
    ruleset made every rule wait for the slowest one). :attr:`timings` holds the last
    program's ``insert_ms``/``analysis_ms`` and per-rule ``rule_ms`` (rule id -> ms).
    """

    def __init__(self, rules: list = ()):
        self.session = EggSession()
        self.compiled: dict[str, CompiledRule] = {}
        self.rules: list = []
        self._loaded: LeirModule | None = None
        self._ix: ProgramIndex | None = None
        self._done: dict[str, list[Site]] = {}
        self._skip_facts: frozenset = frozenset(OPTIONAL_FACTS)  # optional facts no loaded rule reads
        self.timings: dict[str, Any] = {"rule_ms": {}}
        self.add(rules)

    def add(self, rules) -> None:
        """Load the compiled text of rules not yet in the e-graph (unloads the program)."""
        new = [r for r in rules if r.key not in self.compiled]
        if not new:
            return
        self._unload()
        for r in new:
            cr = compile_rule(r)
            self.session.run(cr.text)
            self.compiled[r.key] = cr
            self._skip_facts = frozenset(f for f in self._skip_facts if f"({f} " not in cr.text)
            self.rules.append(r)

    def _unload(self) -> None:
        if self._loaded is not None:
            self.session.run("(pop)")
            self._loaded, self._ix, self._done = None, None, {}

    def _load(self, module: LeirModule) -> ProgramIndex:
        if self._loaded is not None and (self._loaded is module or self._loaded == module):
            return self._ix
        self._unload()
        t0 = time.perf_counter()
        self.session.run("(push)")
        ix = self.session.load_program(module, skip=self._skip_facts)
        t1 = time.perf_counter()
        self.session.run(ANALYSIS_SCHEDULE)
        t2 = time.perf_counter()
        self._loaded, self._ix, self._done = module, ix, {}
        self.timings = {"insert_ms": 1e3 * (t1 - t0), "analysis_ms": 1e3 * (t2 - t1), "rule_ms": {}}
        return ix

    def sites_of(self, rule, module: LeirModule) -> list[Site]:
        """Sites of one rule (its own schedule; program facts and analyses are reused)."""
        self.add([rule])
        ix = self._load(module)
        hit = self._done.get(rule.key)
        if hit is not None:
            return hit
        cr = self.compiled[rule.key]
        t0 = time.perf_counter()
        qk = ("query", cr.query_key)
        if qk not in self._done:
            self.session.run(cr.schedule)
            self._done[qk] = rows_to_sites(cr, self.session.rows(cr.relation), ix)
        return self._finish(rule, cr, module, t0)

    def _finish(self, rule, cr: CompiledRule, module: LeirModule, t0: float) -> list[Site]:
        """The rule's sites from its query's (relabelled when another rule ran the same
        query), its ``{check:}`` conditions applied; recorded in ``timings``."""
        sites = self._done[("query", cr.query_key)]
        if sites and sites[0].rule != cr.rule_id:
            sites = [_relabelled(x, cr.rule_id) for x in sites]
        if cr.checks:
            sites = [x for x in sites if _checks_hold(cr, x, module)]
        self.timings["rule_ms"][rule.id] = self.timings["rule_ms"].get(rule.id, 0.0) + 1e3 * (time.perf_counter() - t0)
        self._done[rule.key] = sites
        return sites

    def prefetch(self, module: LeirModule, rules: list | None = None) -> None:
        """Run the queries of ``rules`` (default: every loaded rule) not yet run on
        ``module`` together: their schedules in one egglog call, then one snapshot of the
        e-graph decodes every rule's rows (one ``print-function`` per rule cost ~0.3 ms plus
        ~6 µs per term cell). Later :meth:`sites_of` calls are lookups. Each rule still runs
        its own schedule, in order, so a rule's sites are the same as from :meth:`sites_of`;
        but none is ready before the slowest has run: callers that list one rule (or bound
        each rule's time) use :meth:`sites_of`. ``timings["batch_ms"]`` is this call's wall
        time; each rule's ``rule_ms`` starts with its share of decoding and checks."""
        rules = self.rules if rules is None else list(rules)
        self.add(rules)
        t0 = time.perf_counter()
        ix = self._load(module)
        todo, seen = [], set()
        for r in rules:
            cr = self.compiled[r.key]
            qk = ("query", cr.query_key)
            if r.key not in self._done and qk not in self._done and qk not in seen:
                seen.add(qk)
                todo.append(cr)
        if todo:
            self.session.run("\n".join(cr.schedule for cr in todo))
            snap = self.session.snapshot()
            for cr in todo:
                t1 = time.perf_counter()
                self._done[("query", cr.query_key)] = rows_to_sites(cr, snap.rows(cr.relation), ix)
                self.timings["rule_ms"][cr.rule_id] = 1e3 * (time.perf_counter() - t1)
        for r in rules:
            if r.key not in self._done:
                self._finish(r, self.compiled[r.key], module, time.perf_counter())
        self.timings["batch_ms"] = 1e3 * (time.perf_counter() - t0)

    def sites(self, module: LeirModule, rules: list | None = None) -> dict[str, list[Site]]:
        """Every match site of every rule (rule id -> sorted sites)."""
        return {r.id: self.sites_of(r, module) for r in (self.rules if rules is None else rules)}


_SITE_DEFAULTS = {f.name: f.default for f in dataclasses.fields(Site) if f.name not in ("rule", "scope")}


def _site_maker(rule_id: str, scope: str):
    """``make(**fields)`` building :class:`Site` objects of one rule and scope without the
    frozen dataclass's per-field ``__init__`` (rows_to_sites builds thousands; the values
    come decoded from the rule's own rows)."""
    base = {"rule": rule_id, "scope": scope, **_SITE_DEFAULTS}

    return lambda **fields: _site_from({**base, **fields})


def _relabelled(site: Site, rule_id: str) -> Site:
    """``site`` with another rule id (``dataclasses.replace`` without re-running the frozen
    dataclass's ``__init__``: the fields are already checked)."""
    return _site_from({**site.__dict__, "rule": rule_id})


def _site_from(fields: dict) -> Site:
    """A :class:`Site` holding ``fields`` (every field, by name), built without the frozen
    dataclass's per-field ``__init__``."""
    out = object.__new__(Site)
    out.__dict__.update(fields)
    return out


def _checks_hold(cr: CompiledRule, site: Site, module: LeirModule) -> bool:
    """Evaluate a rule's ``{check: ...}`` conditions on one site (Python, after egglog)."""
    from .primitives import EvalContext, ValueExprError, eval_value

    ctx = EvalContext(module, site.env)
    for c in cr.checks:
        try:
            if not eval_value(c, ctx):
                return False
        except ValueExprError:
            return False
    return True


def rows_to_sites(cr: CompiledRule, rows: list[list], ix: ProgramIndex) -> list[Site]:
    """Decode candidate rows into sites (one site per subterm occurrence for ``expr``)."""
    out: list[Site] = []
    sorts = cr.column_sorts()
    columns = cr.columns
    order = sorted(range(len(columns)), key=columns.__getitem__)  # bindings sorted by name
    refs: dict[tuple, Any] = {}  # one NestRef / EqRef per id

    def ref(kind, v):
        r = refs.get((kind, v))
        if r is None:
            r = refs[(kind, v)] = NestRef(ix.nest_paths[v]) if kind == "Nest" else EqRef(ix.eq_paths[v])
        return r

    occurrences: dict[tuple, dict] = {}  # equation path -> subterm -> its value paths (pre-order)
    rid, scope = cr.rule_id, cr.scope
    site = _site_maker(rid, scope)
    for row in rows:
        vals = [ref(s, v) if s in ("Nest", "Eq") else v for s, v in zip(sorts, row)]
        env = dict(zip(columns, vals))
        b = tuple([(columns[k], vals[k]) for k in order])
        if scope == "expr":
            eq_path = env["eq"].path
            occ = occurrences.get(eq_path)
            if occ is None:
                occ = occurrences[eq_path] = _subterm_paths(ix.eqs[ix.eq_paths.index(eq_path)].value)
            nest = env["nest"].path
            for epath in occ.get(env["site"], ()):
                out.append(site(nest=nest, equation=eq_path, expr=epath, bindings=b))
        elif scope == "equation":
            out.append(site(nest=env["nest"].path, equation=env["eq"].path, bindings=b))
        elif scope == "loop":
            out.append(site(nest=env["nest"].path, loop=env["pos"], bindings=b))
        elif scope == "nest":
            out.append(site(nest=env[cr.scope_vars[0]].path, bindings=b))
        elif scope == "nests":
            paths = tuple(env[x].path for x in cr.scope_vars)
            out.append(site(nest=paths[0], nests=paths, bindings=b))
        else:
            out.append(site(tensor=env[cr.scope_vars[0]], bindings=b))
    return sort_sites(out)


def _subterm_paths(e: A.Expr) -> dict:
    """Every subterm of ``e`` in value positions -> the paths of its occurrences, in
    pre-order (:func:`~steptp.engine.primitives.value_occurrences` for all subterms at once)."""
    out: dict = {}
    stack = [(e, ())]
    while stack:
        x, path = stack.pop()
        out.setdefault(x, []).append(path)
        kids = value_children(x)
        stack.extend((kids[i], path + (i,)) for i in range(len(kids) - 1, -1, -1))
    return out


def sort_sites(sites: list[Site]) -> list[Site]:
    """``sites`` in :meth:`Site.sort_key` order. The bindings' text, the last key, is
    computed only within runs of equal locations (printing every site's bindings was a
    fifth of the time to list the candidates of the expression rules)."""
    keyed = sorted(((s._location_key(), s) for s in sites), key=lambda p: p[0])
    out: list[Site] = []
    for _, run in itertools.groupby(keyed, key=lambda p: p[0]):
        run = [s for _, s in run]
        out.extend(run if len(run) == 1 else sorted(run, key=lambda x: repr(x.bindings)))
    return out


_SITES: "OrderedDict[tuple, list[Site]]" = OrderedDict()
_MATCHER: Matcher | None = None


def shared_matcher() -> Matcher:
    """The process-wide :class:`Matcher` (rules are added on first use)."""
    global _MATCHER
    if _MATCHER is None:
        _MATCHER = Matcher()
    elif len(_MATCHER.compiled) > 256:      # bound the e-graph's rule set
        _MATCHER = Matcher()
    return _MATCHER


def matcher_for(rules: list) -> Matcher:
    """The shared :class:`Matcher`, with ``rules`` loaded."""
    m = shared_matcher()
    m.add(rules)
    return m


def find_sites_many(rules: list, module: LeirModule) -> dict[str, list[Site]]:
    """Sites of several rules on one program (rule id -> sites): the program is inserted
    and analysed once, each rule runs in its own schedule; results are cached."""
    m = matcher_for(rules)
    prefetch_sites(rules, module, m)
    out = {}
    for r in rules:
        out[r.id] = find_sites(r, module, m)
    return out


def _remember(key, sites):
    _SITES[key] = sites
    while len(_SITES) > 512:
        _SITES.popitem(last=False)


def find_sites(rule, module: LeirModule, matcher: Matcher | None = None) -> list[Site]:
    """Every match site of ``rule`` in ``module`` (deterministic order).

    Preconditions (``where:``) are evaluated by egglog on the program's facts, then the
    ``{check: ...}`` conditions in Python; parameter domains are not (a site whose
    parameter domain is empty is still listed, see
    :func:`steptp.engine.apply.list_candidates`). Results are cached per (rule, program).
    The program's facts and analyses are shared by every rule asked about it in a row;
    each rule's own query runs in its own schedule, so one slow rule costs only itself.
    """
    key = (rule.key, module)
    hit = _SITES.get(key)
    if hit is not None:
        _SITES.move_to_end(key)
        return hit
    sites = (matcher or shared_matcher()).sites_of(rule, module)
    _remember(key, sites)
    return sites


def prefetch_sites(rules: list, module: LeirModule, matcher: Matcher | None = None) -> None:
    """Run the queries of every rule in ``rules`` on ``module`` in one batch
    (:meth:`Matcher.prefetch`), so that the :func:`find_sites` calls that follow are
    lookups. For callers that list the candidates of many rules on one program (the engine
    service's counts behind the search's expansion, ``stp dataset``, :func:`find_sites_many`,
    ``benchmarks/bench_matching.py``); the sites are the same as rule by rule."""
    todo = [r for r in rules if (r.key, module) not in _SITES]
    if todo:
        (matcher or shared_matcher()).prefetch(module, todo)


def clear_caches() -> None:
    """Forget the shared matcher, compiled rules and site lists."""
    global _MATCHER
    _MATCHER = None
    _SITES.clear()
    _COMPILED.clear()


__all__ = ["CompileError", "Site", "sort_sites", "display", "IMPLICIT", "CompiledRule", "compile_rule", "check_in_egglog", "Matcher",
           "rows_to_sites", "matcher_for", "shared_matcher", "find_sites", "find_sites_many", "prefetch_sites", "clear_caches"]
