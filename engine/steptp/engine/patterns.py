"""Rule pattern / template language: LEIR text with ``?metavariables``.

A pattern is ordinary LEIR syntax (the grammar of :mod:`steptp.leir.parser`) in which
any piece may be replaced by a metavariable ``?name``:

* value positions: ``log(?a*?b)`` - ``?a`` and ``?b`` match *whole subterms*
  (subscripts included: ``A_{tx,a}`` and ``A_{tx,c}`` are different subterms);
* tensors: ``?X^{?dt,?sc}_{?i,tx}`` (name, dtype, scope and each subscript entry may be
  metavariables; a tensor written without its ``^{dtype,scope}`` matches any dtype and
  scope);
* loops: ``?k^{?n}_{?i=0}`` (kind, extent and index name);
* in templates (rewrite right-hand sides) an extent may be integer arithmetic over
  metavariables, e.g. ``?k^{?n/?f}_{?io=0}``.

Patterns are parsed by the LEIR grammar itself: ``steptp/leir/pattern.lark`` imports
``grammar.lark`` and extends it with metavariables, wildcards and splices (through
:func:`steptp.leir.parser.parse_rule_text`; there is no second parser). They become the
LEIR AST (:mod:`steptp.leir.ast`) with :class:`PVar` holes, so the same objects serve
three purposes:

* :func:`to_sexp` compiles a pattern to an egglog query term with the constructor table
  of :mod:`steptp.engine.codec` (the one AST <-> egglog codec; egglog-notes Q6);
* :func:`instantiate` fills a template with bindings and returns a plain AST;
* :func:`match_node` matches a pattern against an AST in Python (used by generic
  primitives such as ``replace_all`` and to cross-check the egglog matcher).

Metavariable sorts are inferred from position: ``Term`` (a value subterm), ``String``
(tensor name, dtype, scope, loop kind, loop index name) or ``Int`` (loop extent). A
``String`` metavariable that names a loop index may also be used in a value position,
where it stands for that index (``A_{?i}`` with ``?i`` bound by ``_{?i=0}``); an ``Int``
metavariable in a value position stands for the integer literal.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, Iterator

from lark import Token, Transformer, v_args

from ..leir import ast as A
from ..leir.parser import LeirSyntaxError, LeirToAst, SemanticError, parse_rule_text
from .codec import BY_NODE, Encoder, cons_list, float_key, sx_str


class PatternError(ValueError):
    """Malformed pattern / template text (message names the offending token)."""


@dataclass(frozen=True)
class PVar:
    """A metavariable ``?name`` (a hole in a pattern or template)."""

    name: str

    def __str__(self) -> str:  # pragma: no cover - debugging aid
        return "?" + self.name


@dataclass(frozen=True)
class PSplice:
    """A list metavariable ``*?name``: in a tensor subscript it stands for a run of
    subscript entries (sort ``TL``: matched as a tuple of expressions, spliced in
    templates, e.g. ``?F_{*?s,?a}`` appends index ``?a`` to the list ``?s``); among a
    nest template's loops it splices a tuple of loops (``*?L[...]``, from ``loops_of``)."""

    name: str

    def __str__(self) -> str:  # pragma: no cover - debugging aid
        return "*?" + self.name


#: sort of a subscript-list metavariable (an egglog ``TL`` cons list)
LIST = "TL"


# ---------------------------------------------------------------------------
# Parsing: pattern.lark (grammar.lark extended with metavariables) via steptp.leir.parser
# ---------------------------------------------------------------------------


def _slot(tok):
    """A name slot (tensor name, dtype, scope, loop kind or index): a metavariable token
    becomes a :class:`PVar`, a wildcard stays one, any other token its text."""
    if isinstance(tok, Token):
        return PVar(tok[1:]) if tok.type == "PVAR" else str(tok)
    return tok


@v_args(inline=True)
class _PatternToAst(LeirToAst):
    """lark tree of ``pattern.lark`` -> LEIR AST with :class:`PVar` / :class:`PSplice`
    holes. Wildcards (``_`` for a dtype or scope, the dtype and scope of a tensor written
    without them) are numbered ``<wild>1, <wild>2, ...`` in text order, those of a tensor
    without superscript after its subscript."""

    def __init__(self, wild: str):
        super().__init__()
        self.prefix, self.n_wild = wild, 0

    def wildcard(self) -> PVar:
        self.n_wild += 1
        return PVar(f"{self.prefix}{self.n_wild}")

    def pattern_expr(self, e):
        return e

    def pattern_loops(self, loops):
        if not loops:
            raise SemanticError("expected a loop descriptor", None)
        return loops

    def pattern_equation(self, eq, *_semicolon):
        return eq

    pattern_nest = pattern_item = pattern_equation

    def pvar(self, tok):
        return PVar(tok[1:])

    def pvar_equation(self, tok, value):
        return A.Assign(PVar(tok[1:]), value)

    def wild(self):
        return self.wildcard()

    def t_sup(self, dtype, scope):
        return ("sup", _slot(dtype), _slot(scope))

    def t_sub(self, *entries):
        return ("sub", tuple(entries))

    def ptensor(self, name, *parts):
        got = dict((p[0], p[1:]) for p in parts)
        dtype, scope = got["sup"] if "sup" in got else (self.wildcard(), self.wildcard())
        return A.Tensor(_slot(name), dtype, scope, got["sub"][0] if "sub" in got else ())

    def splice(self, tok):
        return PSplice(tok[1:])

    def index(self, tok):
        if tok in ("and", "or"):  # a boolean word where a value must stand
            raise SemanticError(f"unexpected keyword {str(tok)!r}", tok)
        return A.Index(str(tok))

    def extent(self, e):
        return e.value if isinstance(e, A.Int) else e

    def ploop_sup_first(self, kind, extent, var, start):
        return self._pattern_loop(kind, extent, var, start)

    def ploop_sub_first(self, kind, var, start, extent):
        return self._pattern_loop(kind, extent, var, start)

    @staticmethod
    def _pattern_loop(kind, extent, var, start):
        if str(start) != "0":
            raise SemanticError("loop lower bound must be 0", start)
        return A.Loop(_slot(kind), extent, _slot(var))


@v_args(inline=True)
class _ValueToTree(Transformer):
    """lark tree of the ``value`` rule -> the nested tuples of :func:`domains.parse_value`."""

    def value(self, e):
        return e

    def v_orop(self, a, _op, b):
        return ("or", a, b)

    def v_andop(self, a, _op, b):
        return ("and", a, b)

    def v_not(self, _op, a):
        return ("not", a)

    def v_cmp(self, a, op, b):
        return ("cmp", str(op), a, b)

    def v_int(self, t):
        return ("lit", int(t))

    def v_decimal(self, t):
        return ("lit", Fraction(str(t)))  # exact: 0.1 is 1/10, not the nearest double

    def v_var(self, t):
        return ("var", t[1:])

    def v_str(self, t):
        return ("lit", t[1:-1])

    def v_word(self, t):
        return ("lit", str(t))

    def v_neg(self, a):
        return ("op", "-", ("lit", 0), a)

    def v_call(self, name, *args):
        return ("call", str(name), [a for a in args if a is not None])


for _op, _name in (("+", "add"), ("-", "sub"), ("*", "mul"), ("/", "div"), ("//", "floordiv"), ("%", "mod")):
    setattr(_ValueToTree, "v_" + _name, v_args(inline=True)(lambda self, a, b, _op=_op: ("op", _op, a, b)))


def _parse(src: str, start: str, transformer):
    """Parse ``src`` with the entry rule ``start`` of ``pattern.lark``; a syntax error is a
    :class:`PatternError` naming line, column and the expected tokens."""
    try:
        return parse_rule_text(src, start, transformer)
    except LeirSyntaxError as e:
        expected = f"; expected {' or '.join(e.expected)}" if e.expected else ""
        raise PatternError(f"{e.reason}{expected} at line {e.line}, column {e.column} in {src!r}") from None


@functools.lru_cache(maxsize=4096)
def _parse_pattern(src: str, start: str, wild: str):
    return _parse(src, start, _PatternToAst(wild))


def parse_expr_pattern(src: str, wild: str = "_w"):
    """Parse a value pattern / template, e.g. ``log(?a*?b)`` (entry rule ``pattern_expr``
    of ``steptp/leir/pattern.lark``). ``wild`` prefixes the names of wildcards. Raises
    :class:`PatternError` naming line and column. The result is immutable and cached."""
    return _parse_pattern(src, "pattern_expr", wild)


def parse_loops_pattern(src: str, wild: str = "_w") -> tuple:
    """Parse a sequence of loop descriptors and loop splices, e.g.
    ``?k^{?n/?f}_{?io=0}L^{?f}_{?ii=0}`` or ``*?pre L^{4}_{?i=0} *?post`` (entry rule
    ``pattern_loops``); at least one. Raises :class:`PatternError`."""
    return _parse_pattern(src, "pattern_loops", wild)


def parse_equation_pattern(src: str, wild: str = "_w"):
    """Parse an equation pattern ``?X_{..}=...`` (a trailing ``;`` is allowed; entry rule
    ``pattern_equation``). Raises :class:`PatternError`."""
    return _parse_pattern(src, "pattern_equation", wild)


def parse_nest_pattern(src: str, wild: str = "_w"):
    """Parse a nest template ``LOOPS[eq;eq;];`` (correction form included; entry rule
    ``pattern_nest``). Raises :class:`PatternError`."""
    return _parse_pattern(src, "pattern_nest", wild)


def parse_item_template(text: str):
    """Parse a body-item template: a nest (``LOOPS[...];``, ``*?L[...];``) or an equation
    (``?X_{..}=...``, ``;`` optional); entry rule ``pattern_item``. Raises
    :class:`PatternError`."""
    return _parse_pattern(text, "pattern_item", "_w")


@functools.lru_cache(maxsize=4096)
def parse_value_tree(src: str):
    """Parse a value expression of the rule language (``?n/?f``, ``loops_of(?N)``, ``3``,
    ``"s"``, bare words as string literals, one comparison, ``not``/``and``/``or``; entry
    rule ``value`` of ``pattern.lark``) into nested tuples ``("lit", v)``, ``("var", n)``,
    ``("op", o, a, b)``, ``("call", f, [args])``, ``("cmp", o, a, b)``, ``("and"|"or", a,
    b)``, ``("not", a)``. Raises :class:`PatternError`; cached per text."""
    return _parse(src, "value", _ValueToTree())


@v_args(inline=True)
class _WhereToTree(_ValueToTree):
    """lark tree of the ``where_clause`` rule -> nested tuples: the value-language nodes of
    :func:`parse_value_tree` plus ``("wild",)`` for ``_``, ``("neg", x)`` for ``-x`` (not
    ``0 - x``: ``-1`` is a literal argument) and ``("group", [items])`` for a
    parenthesised ``A and B ...``, under ``("item", x)``, ``("cmp", o, a, b)`` or ``("not",
    item)``."""

    def where_clause(self, item):
        return item

    def w_bare(self, a):
        return ("item", a)

    def w_cmp(self, a, op, b):
        return ("cmp", str(op), a, b)

    def w_not(self, _op, a):
        return ("not", self.w_bare(a))

    def w_not_cmp(self, _op, a, op, b):
        return ("not", self.w_cmp(a, op, b))

    def w_wild(self):
        return ("wild",)

    def v_neg(self, a):
        return ("neg", a)

    def w_group(self, *items):
        return ("group", [x for x in items if not isinstance(x, Token)])


@functools.lru_cache(maxsize=4096)
def parse_where_clause(src: str):
    """Parse one string item of a rule's ``where:`` list (entry rule ``where_clause`` of
    ``pattern.lark``): a relation atom ``rel(?a, _, 3, "L", name)``, a comparison
    ``item_count(?N) == 1`` / ``?ho + ?kk == ?hp + 1``, either one after ``not``, or a
    negated group ``not (A and B)``. Returns ``("item", x)``, ``("cmp", op, lhs, rhs)`` or
    ``("not", item)``, whose values are the tuples of :func:`parse_value_tree` plus
    ``("wild",)``, ``("neg", x)`` and ``("group", [items])``. Raises :class:`PatternError` naming line and
    column; cached per text."""
    return _parse(src, "where_clause", _WhereToTree())


# ---------------------------------------------------------------------------
# Metavariables and sorts
# ---------------------------------------------------------------------------

TERM, STRING, INT = "Term", "String", "Int"
#: Sorts of list splices: a subscript list (egglog ``TL``) and a loop list (templates only).
SUBS, LOOPS = "TL", "Loops"


def iter_nodes(p) -> Iterator[Any]:
    """Every node and leaf field of a pattern (pre-order)."""
    yield p
    if isinstance(p, A.Tensor):
        yield from iter_nodes(p.name)
        yield from iter_nodes(p.dtype)
        yield from iter_nodes(p.scope)
        for i in p.indices:
            yield from iter_nodes(i)
    elif isinstance(p, A.Loop):
        yield from iter_nodes(p.kind)
        yield from iter_nodes(p.extent)
        yield from iter_nodes(p.var)
    elif isinstance(p, A.Assign):
        yield from iter_nodes(p.target)
        yield from iter_nodes(p.value)
    elif isinstance(p, A.Nest):
        for l in p.loops:
            yield from iter_nodes(l)
        for b in p.body:
            yield from iter_nodes(b)
    elif isinstance(p, tuple):
        for x in p:
            yield from iter_nodes(x)
    else:
        for c in A.children(p) if not isinstance(p, (PVar, PSplice, str, int, float)) else ():
            yield from iter_nodes(c)


def metavar_sorts(p, sorts: dict[str, str] | None = None, where: str = "pattern") -> dict[str, str]:
    """Infer the sort of every metavariable of pattern ``p`` (added to ``sorts``).

    String positions (tensor name/dtype/scope, loop kind/var) and Int positions (loop
    extents) are strong; value positions are Term unless the variable already has a
    String or Int sort (then it is coerced: index name -> index, int -> literal).
    Raises :class:`PatternError` when one variable is used as both a name and an extent.
    """
    sorts = {} if sorts is None else sorts

    def declare(v, s):
        if isinstance(v, PVar):
            old = sorts.get(v.name)
            if old is None or old == TERM:
                sorts[v.name] = s
            elif old != s:
                raise PatternError(f"?{v.name} is used as {old} and as {s} in {where}")

    strong: list = []
    terms: list = []

    def visit(x, pos="term"):
        if isinstance(x, PVar):
            (terms if pos == "term" else strong).append((x, pos))
            return
        if isinstance(x, PSplice):
            strong.append((PVar(x.name), LOOPS if pos == LOOPS else SUBS))
            return
        if isinstance(x, A.Tensor):
            visit(x.name, STRING)
            visit(x.dtype, STRING)
            visit(x.scope, STRING)
            for i in x.indices:
                visit(i)
        elif isinstance(x, A.Loop):
            visit(x.kind, STRING)
            if isinstance(x.extent, PVar):
                visit(x.extent, INT)
            elif not isinstance(x.extent, int):
                for n in iter_nodes(x.extent):
                    if isinstance(n, PVar):
                        strong.append((n, INT))
            visit(x.var, STRING)
        elif isinstance(x, A.Assign):
            visit(x.target)
            visit(x.value)
        elif isinstance(x, A.Nest):
            for l in x.loops:
                visit(l, LOOPS)
            for b in x.body:
                visit(b)
        elif isinstance(x, tuple):
            for y in x:
                visit(y, LOOPS if isinstance(y, (A.Loop, PSplice)) else pos)
        elif isinstance(x, (str, int, float)) or x is None:
            return
        else:
            for c in A.children(x):
                visit(c)

    visit(p)
    for v, s in strong:
        declare(v, s)
    for v, _ in terms:
        if v.name not in sorts:
            sorts[v.name] = TERM
    return sorts


def metavars(p) -> list[str]:
    """Names of the metavariables of ``p`` in first-occurrence order (wildcards and list
    splices ``*?S`` included)."""
    seen: dict[str, None] = {}
    for n in iter_nodes(p):
        if isinstance(n, (PVar, PSplice)):
            seen.setdefault(n.name, None)
    return list(seen)


# ---------------------------------------------------------------------------
# egglog compilation (query side): the codec's encoder with metavariable holes
# ---------------------------------------------------------------------------


def qvar(name: str) -> str:
    """egglog query variable of metavariable ``name``."""
    return "mv_" + name


#: ``list_sexp(items, tail)``: the codec's cons list of compiled items (``tail``: a ``TL``
#: query variable for a trailing splice).
list_sexp = cons_list

_AUX = iter(range(1, 1 << 62))


class _QueryEncoder(Encoder):
    """The codec's encoder with holes: metavariables become query variables by their sort
    (``sorts``), a subscript splice ``*?s`` binds the rest of a list (entries after it are
    matched from the end with ``tl_last`` atoms appended to ``aux``)."""

    def __init__(self, sorts: dict[str, str], aux: list | None):
        super().__init__(memo=False)
        self.sorts, self.aux = sorts, aux

    def term(self, p) -> str:
        if isinstance(p, PVar):
            s = self.sorts.get(p.name, TERM)
            if s == STRING:
                return f"(IDX {qvar(p.name)})"
            if s == INT:
                return f"(INT {qvar(p.name)})"
            if s == LIST:
                raise PatternError(f"?{p.name} is a subscript list: write *?{p.name} inside a subscript")
            return qvar(p.name)
        if isinstance(p, PSplice):
            raise PatternError(f"*?{p.name} may only stand for subscript entries")
        c = BY_NODE.get(type(p))
        if c is None or c.sort != "Term":
            raise PatternError(f"cannot compile {p!r} to egglog")
        return super().term(p)

    def field(self, v, kind: str) -> str:
        if isinstance(v, PVar) and kind in ("String", "i64"):
            return qvar(v.name)
        return super().field(v, kind)

    def subscript(self, indices) -> str:
        """egglog list of a subscript pattern; at most one splice ``*?s``."""
        spl = [k for k, x in enumerate(indices) if isinstance(x, PSplice)]
        if not spl:
            return super().subscript(indices)
        if len(spl) > 1:
            raise PatternError("a subscript pattern may contain one list splice *?name")
        k = spl[0]
        head, after = indices[:k], indices[k + 1:]
        rest = qvar(indices[k].name)
        if after:
            if self.aux is None:
                raise PatternError(f"entries after *?{indices[k].name} are not supported here")
            whole = f"anon_tl{next(_AUX)}"
            cur = whole
            for j, y in enumerate(reversed(after)):
                nxt = rest if j == len(after) - 1 else f"anon_tl{next(_AUX)}"
                self.aux.append(f"(tl_last {cur} {nxt} {self.term(y)})")
                cur = nxt
            rest = whole
        out = rest
        for it in reversed(head):
            out = f"(TCons {self.term(it)} {out})"
        return out


def to_sexp(p, sorts: dict[str, str], aux: list | None = None) -> str:
    """Compile a value/tensor pattern to an egglog term with query variables, by the
    constructor table of :mod:`steptp.engine.codec` (``INT FLT IDX TNS NEG BIN CALL CMP
    BOOL NOT`` over ``TL`` cons lists). A subscript splice ``*?s`` binds the rest of the
    list; entries after it (``?F_{*?s,?a-1}``) are matched from the end with the
    ``tl_last`` relation, whose atoms are appended to ``aux`` (required then). Raises
    :class:`PatternError` for what no query can express."""
    return _QueryEncoder(sorts, aux).term(p)


def loop_sexp(p: A.Loop) -> str:
    """Compile a loop pattern ``(LOOP kind extent var)``; raises :class:`PatternError`
    when the extent is neither an integer nor a metavariable."""
    if not (isinstance(p.extent, (int, PVar))):
        raise PatternError("a loop pattern's extent must be an integer or a metavariable")
    return _QueryEncoder({}, None).loop(p)


# ---------------------------------------------------------------------------
# Instantiation (templates -> AST)
# ---------------------------------------------------------------------------


class TemplateError(ValueError):
    """A template refers to an unbound metavariable or yields an ill-formed node."""


def _lookup(env: dict, v: PVar):
    if v.name not in env:
        raise TemplateError(f"template uses ?{v.name}, which the rule does not bind")
    return env[v.name]


def value_to_expr(x) -> A.Expr:
    """Coerce a binding to a LEIR expression (str -> index, int -> literal)."""
    if isinstance(x, bool):
        raise TemplateError(f"cannot use the boolean {x} as an expression")
    if isinstance(x, int):
        return A.int_literal(x)
    if isinstance(x, float):
        return A.Float(x) if x >= 0 or math.isnan(x) else A.Neg(A.Float(-x))
    if isinstance(x, Fraction):  # a decimal of the value language: the nearest float literal
        return A.float_literal(float(x))
    if isinstance(x, str):
        return A.Index(x)
    if isinstance(x, (A.Int, A.Float, A.Index, A.Tensor, A.Neg, A.BinOp, A.Call, A.Compare, A.BoolOp, A.Not)):
        return x
    raise TemplateError(f"cannot use {x!r} as an expression")


def _as_str(x, what: str) -> str:
    if isinstance(x, A.Index):
        return x.name
    if isinstance(x, str):
        return x
    raise TemplateError(f"{what} must be a name, got {x!r}")


def eval_int(e, env: dict) -> int:
    """Evaluate integer arithmetic over bindings (``/`` must divide exactly)."""
    if isinstance(e, int):
        return e
    if isinstance(e, PVar):
        v = _lookup(env, e)
        if isinstance(v, A.Int):
            v = v.value
        if not isinstance(v, int) or isinstance(v, bool):
            raise TemplateError(f"?{e.name} must be an integer here, got {v!r}")
        return v
    if isinstance(e, A.Int):
        return e.value
    if isinstance(e, A.Neg):
        return -eval_int(e.operand, env)
    if isinstance(e, A.BinOp):
        a, b = eval_int(e.lhs, env), eval_int(e.rhs, env)
        if e.op == "+":
            return a + b
        if e.op == "-":
            return a - b
        if e.op == "*":
            return a * b
        if e.op == "/":
            if b == 0 or a % b:
                raise TemplateError(f"{a}/{b} is not an exact division")
            return a // b
        if e.op == "//":
            return a // b
        if e.op == "%":
            return a % b
    raise TemplateError(f"not an integer expression: {e!r}")


def _splice_items(v: PSplice, env: dict, what: str) -> tuple:
    x = _lookup(env, PVar(v.name))
    if what == "loops":
        if isinstance(x, A.Loop):
            return (x,)
        if isinstance(x, (tuple, list)) and all(isinstance(l, A.Loop) for l in x):
            return tuple(x)
        raise TemplateError(f"*?{v.name} must be a loop list here, got {x!r}")
    if isinstance(x, (tuple, list)):
        return tuple(value_to_expr(i) for i in x)
    raise TemplateError(f"*?{v.name} must be a subscript list here, got {x!r}")


def _instantiate_loops(items, env: dict) -> tuple:
    out: list = []
    for x in items:
        if isinstance(x, PSplice):
            out.extend(_splice_items(x, env, "loops"))
        else:
            out.append(instantiate(x, env))
    return tuple(out)


def instantiate(p, env: dict):
    """Fill template ``p`` (expression, tensor, loop, equation or nest) with ``env``.
    List splices ``*?S`` insert the items of a tuple binding (subscripts or loops)."""
    if isinstance(p, PVar):
        return value_to_expr(_lookup(env, p))
    if isinstance(p, PSplice):
        raise TemplateError(f"the splice *?{p.name} may only appear in a subscript or loop list")
    if isinstance(p, A.Tensor):
        name = _as_str(_lookup(env, p.name), "a tensor name") if isinstance(p.name, PVar) else p.name
        if isinstance(p.dtype, PVar) and p.dtype.name.startswith("_") or \
                isinstance(p.scope, PVar) and p.scope.name.startswith("_"):
            raise TemplateError(f"tensor {name} in a template needs an explicit ^{{dtype,scope}}")
        dt = _as_str(_lookup(env, p.dtype), "a dtype") if isinstance(p.dtype, PVar) else p.dtype
        sc = _as_str(_lookup(env, p.scope), "a scope") if isinstance(p.scope, PVar) else p.scope
        return A.Tensor(name, dt, sc, _instantiate_entries(p.indices, env, "subscript"))
    if isinstance(p, A.Loop):
        kind = _as_str(_lookup(env, p.kind), "a loop kind") if isinstance(p.kind, PVar) else p.kind
        var = _as_str(_lookup(env, p.var), "a loop index") if isinstance(p.var, PVar) else p.var
        ext = eval_int(p.extent, env)
        if kind not in A.LOOP_KINDS:
            raise TemplateError(f"unknown loop kind {kind!r}")
        if ext <= 0:
            raise TemplateError(f"loop extent must be positive, got {ext}")
        return A.Loop(kind, ext, var)
    if isinstance(p, A.Assign):
        t = instantiate(p.target, env)
        if not isinstance(t, A.Tensor):
            raise TemplateError("an equation target must be a tensor")
        return A.Assign(t, instantiate(p.value, env))
    if isinstance(p, A.Nest):
        return A.Nest(_instantiate_entries(p.loops, env, "loops"), tuple(instantiate(b, env) for b in p.body))
    if isinstance(p, tuple):
        if any(isinstance(x, (A.Loop, PSplice)) for x in p):
            return _instantiate_loops(p, env)
        return tuple(instantiate(x, env) for x in p)
    kids = A.children(p)
    if kids:
        return A.rebuild(p, tuple(instantiate(c, env) for c in kids))
    return p


def _instantiate_entries(items: tuple, env: dict, what: str) -> tuple:
    """Instantiate subscript entries or loops, splicing ``*?name`` tuples in place."""
    out: list = []
    for x in items:
        if isinstance(x, PSplice):
            v = _lookup(env, PVar(x.name))
            if not isinstance(v, tuple):
                raise TemplateError(f"*?{x.name} needs a list value, got {v!r}")
            if what == "loops":
                if not all(isinstance(l, A.Loop) for l in v):
                    raise TemplateError(f"*?{x.name} among loops needs a list of loops (e.g. loops_of(?N))")
                out.extend(v)
            else:
                out.extend(value_to_expr(e) for e in v)
        else:
            out.append(instantiate(x, env))
    return tuple(out)


# ---------------------------------------------------------------------------
# Python-side matching
# ---------------------------------------------------------------------------


def match_node(p, node, env: dict | None = None, sorts: dict[str, str] | None = None) -> dict | None:
    """Match pattern ``p`` against AST ``node``; return the extended bindings or ``None``.

    Semantics are those of the compiled egglog query: syntactic, non-linear (a repeated
    metavariable must bind identical subterms), no AC matching.
    """
    env = dict(env or {})
    sorts = sorts or {}
    return env if _match(p, node, env, sorts) else None


def _bind(env, v: PVar, value) -> bool:
    if v.name in env:
        old = env[v.name]
        if old == value:
            return True
        # a name / integer binding (loop index, extent) equals the index / literal node
        if isinstance(old, (str, int)) and not isinstance(old, bool) and isinstance(value, (A.Index, A.Int)):
            return value_to_expr(old) == value
        return False
    env[v.name] = value
    return True


def _match(p, n, env, sorts) -> bool:
    if isinstance(p, PVar):
        s = sorts.get(p.name, TERM)
        if s == STRING:
            return isinstance(n, A.Index) and _bind(env, p, n.name)
        if s == INT:
            return isinstance(n, A.Int) and _bind(env, p, n.value)
        return _bind(env, p, n)
    if isinstance(p, (str, int)) and not isinstance(p, bool):
        return p == n
    if type(p) is not type(n):
        return False
    if isinstance(p, A.Tensor):
        for a, b in ((p.name, n.name), (p.dtype, n.dtype), (p.scope, n.scope)):
            if isinstance(a, PVar):
                if not _bind(env, a, b):
                    return False
            elif a != b:
                return False
        spl = [k for k, x in enumerate(p.indices) if isinstance(x, PSplice)]
        if spl:
            k = spl[0]
            head, after = p.indices[:k], p.indices[k + 1:]
            if len(n.indices) < len(head) + len(after):
                return False
            mid = tuple(n.indices[k:len(n.indices) - len(after)])
            tail = n.indices[len(n.indices) - len(after):] if after else ()
            return (all(_match(a, b, env, sorts) for a, b in zip(head, n.indices[:k]))
                    and all(_match(a, b, env, sorts) for a, b in zip(after, tail))
                    and _bind(env, PVar(p.indices[k].name), mid))
        if len(p.indices) != len(n.indices):
            return False
        return all(_match(a, b, env, sorts) for a, b in zip(p.indices, n.indices))
    if isinstance(p, A.Loop):
        for a, b in ((p.kind, n.kind), (p.extent, n.extent), (p.var, n.var)):
            if isinstance(a, PVar):
                if not _bind(env, a, b):
                    return False
            elif a != b:
                return False
        return True
    if isinstance(p, A.Assign):
        return _match(p.target, n.target, env, sorts) and _match(p.value, n.value, env, sorts)
    if isinstance(p, (A.Int, A.Index)):
        return p == n
    if isinstance(p, A.Float):
        return float_key(p.value) == float_key(n.value)
    if isinstance(p, (A.BinOp, A.Compare, A.BoolOp)) and p.op != n.op:
        return False
    if isinstance(p, A.Call) and (p.func != n.func or len(p.args) != len(n.args)):
        return False
    pk, nk = A.children(p), A.children(n)
    if len(pk) != len(nk):
        return False
    return all(_match(a, b, env, sorts) for a, b in zip(pk, nk))


__all__ = [
    "PatternError", "TemplateError", "PVar", "PSplice", "SUBS", "LOOPS", "LIST",
    "parse_expr_pattern", "parse_loops_pattern", "parse_equation_pattern", "parse_nest_pattern",
    "parse_item_template", "parse_value_tree", "parse_where_clause",
    "TERM", "STRING", "INT", "metavar_sorts", "metavars", "iter_nodes",
    "sx_str", "float_key", "qvar", "to_sexp", "loop_sexp", "list_sexp",
    "value_to_expr", "eval_int", "instantiate", "match_node",
]
