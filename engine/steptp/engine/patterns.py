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

Patterns are parsed into the LEIR AST (:mod:`steptp.leir.ast`) with :class:`PVar` holes,
so the same objects serve three purposes:

* :func:`to_sexp` compiles a pattern to an egglog query term (see
  :mod:`steptp.engine.egraph` for the encoding; egglog-notes Q6);
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

import json
import math
import re
from dataclasses import dataclass
from typing import Any, Iterator

from ..leir import ast as A


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
# Tokenizer
# ---------------------------------------------------------------------------

_TOKEN_RE = re.compile(r"""
    (?P<ws>\s+)
  | (?P<float>(?:\d+\.\d*|\.\d+)(?:[eE][+-]?\d+)?|\d+[eE][+-]?\d+)
  | (?P<int>\d+)
  | (?P<mvar>\?[A-Za-z](?:[A-Za-z0-9]|_(?!\{))*)
  | (?P<name>[A-Z][A-Za-z0-9]*)
  | (?P<word>[a-z](?:[a-z0-9]|_(?!\{))*)
  | (?P<str>"[^"]*"|'[^']*')
  | (?P<op>\*\*|//|<=|>=|==|!=|&&|\|\||[-+*/%<>=!&|(),;\[\]{}^_])
""", re.VERBOSE)


@dataclass(frozen=True)
class Tok:
    kind: str  # float int mvar name word str op eof
    text: str
    pos: int


def tokenize(src: str) -> list[Tok]:
    """Split pattern text into tokens; raises :class:`PatternError` on a stray character."""
    out: list[Tok] = []
    pos = 0
    while pos < len(src):
        m = _TOKEN_RE.match(src, pos)
        if not m:
            raise PatternError(f"unexpected character {src[pos]!r} at column {pos + 1} in {src!r}")
        kind = m.lastgroup
        if kind != "ws":
            out.append(Tok(kind, m.group(), pos))
        pos = m.end()
    out.append(Tok("eof", "", len(src)))
    return out


_CMP = {"<", "<=", ">", ">=", "==", "!="}
_LOOP_KINDS = set(A.LOOP_KINDS)


class _Parser:
    """Recursive-descent parser mirroring ``grammar.lark`` precedence, with metavariables."""

    def __init__(self, src: str, wild: str = "_w"):
        self.src = src
        self.toks = tokenize(src)
        self.k = 0
        self.n_wild = 0
        self.wild = wild

    # -- helpers ---------------------------------------------------------
    def peek(self, off: int = 0) -> Tok:
        return self.toks[min(self.k + off, len(self.toks) - 1)]

    def next(self) -> Tok:
        t = self.toks[self.k]
        self.k += 1
        return t

    def at(self, text: str, off: int = 0) -> bool:
        t = self.peek(off)
        return t.kind == "op" and t.text == text

    def expect(self, text: str) -> Tok:
        t = self.next()
        if not (t.kind == "op" and t.text == text):
            self.error(t, f"expected {text!r}")
        return t

    def error(self, t: Tok, msg: str):
        got = "end of input" if t.kind == "eof" else repr(t.text)
        raise PatternError(f"{msg}, got {got} at column {t.pos + 1} in {self.src!r}")

    def wildcard(self) -> PVar:
        self.n_wild += 1
        return PVar(f"{self.wild}{self.n_wild}")

    def at_splice(self) -> bool:
        """True at a list splice ``*?name``."""
        return self.at("*") and self.peek(1).kind == "mvar"

    def splice(self) -> PSplice:
        self.next()
        return PSplice(self.next().text[1:])

    def sub_item(self):
        """One subscript entry: an expression or a splice ``*?S``."""
        return self.splice() if self.at_splice() else self.expr()

    def done(self):
        if self.peek().kind != "eof":
            self.error(self.peek(), "unexpected trailing input")

    # -- expressions -----------------------------------------------------
    def expr(self):
        return self.or_()

    def or_(self):
        a = self.and_()
        while (self.peek().kind == "op" and self.peek().text in ("|", "||")) or \
                (self.peek().kind == "word" and self.peek().text == "or"):
            self.next()
            a = A.BoolOp("or", a, self.and_())
        return a

    def and_(self):
        a = self.cmp()
        while (self.peek().kind == "op" and self.peek().text in ("&", "&&")) or \
                (self.peek().kind == "word" and self.peek().text == "and"):
            self.next()
            a = A.BoolOp("and", a, self.cmp())
        return a

    def cmp(self):
        first = self.sum()
        operands, ops = [first], []
        while self.peek().kind == "op" and self.peek().text in _CMP:
            ops.append(self.next().text)
            operands.append(self.sum())
        if not ops:
            return first
        result = None
        for i, op in enumerate(ops):
            c = A.Compare(op, operands[i], operands[i + 1])
            result = c if result is None else A.BoolOp("and", result, c)
        return result

    def sum(self):
        a = self.product()
        while self.at("+") or self.at("-"):
            op = self.next().text
            a = A.BinOp(op, a, self.product())
        return a

    def product(self):
        a = self.unary()
        while self.peek().kind == "op" and self.peek().text in ("*", "/", "//", "%"):
            op = self.next().text
            a = A.BinOp(op, a, self.unary())
        return a

    def unary(self):
        if self.at("-"):
            self.next()
            return A.Neg(self.unary())
        if self.at("!"):
            self.next()
            return A.Not(self.unary())
        return self.power()

    def power(self):
        a = self.atom()
        if self.at("**"):
            self.next()
            return A.BinOp("**", a, self.unary())
        return a

    def atom(self):
        t = self.peek()
        if t.kind == "int":
            self.next()
            return A.Int(int(t.text))
        if t.kind == "float":
            self.next()
            return A.Float(float(t.text))
        if self.at("("):
            self.next()
            e = self.expr()
            self.expect(")")
            return e
        if t.kind == "word":
            self.next()
            if t.text == "inf":
                return A.Float(math.inf)
            if self.at("("):
                name = "if_then_else" if t.text == "ifthenelse" else t.text
                if name not in A.FUNCTIONS:
                    self.error(t, "unknown function")
                self.next()
                args = [self.expr()]
                while self.at(","):
                    self.next()
                    args.append(self.expr())
                self.expect(")")
                if len(args) != A.FUNCTIONS[name]:
                    self.error(t, f"{name} takes {A.FUNCTIONS[name]} argument(s), not {len(args)}")
                return A.Call(name, tuple(args))
            if t.text in ("and", "or"):
                self.error(t, "unexpected keyword")
            return A.Index(t.text)
        if t.kind in ("name", "mvar"):
            if self.at("^", 1) or self.at("_", 1):
                return self.tensor()
            self.next()
            if t.kind == "mvar":
                return PVar(t.text[1:])
            # bare tensor name: scalar access of any dtype/scope
            return A.Tensor(t.text, self.wildcard(), self.wildcard(), ())
        self.error(t, "expected an expression")

    def _meta_or_word(self, what: str):
        t = self.next()
        if t.kind == "mvar":
            return PVar(t.text[1:])
        if t.kind == "op" and t.text == "_":
            return self.wildcard()
        if t.kind in ("word", "name", "int"):
            return t.text
        self.error(t, f"expected {what}")

    def tensor(self):
        t = self.next()
        name = PVar(t.text[1:]) if t.kind == "mvar" else t.text
        dtype = scope = None
        indices: tuple = ()
        seen_sub = False
        for _ in range(2):
            if self.at("^") and dtype is None:
                self.next()
                self.expect("{")
                dtype = self._meta_or_word("a dtype")
                self.expect(",")
                scope = self._meta_or_word("a scope")
                self.expect("}")
            elif self.at("_") and not seen_sub:
                self.next()
                self.expect("{")
                items = [self.sub_entry()]
                while self.at(","):
                    self.next()
                    items.append(self.sub_entry())
                self.expect("}")
                indices = tuple(items)
                seen_sub = True
        if dtype is None:
            dtype, scope = self.wildcard(), self.wildcard()
        return A.Tensor(name, dtype, scope, indices)

    def at_splice(self) -> bool:
        """True at ``*?name`` (a list metavariable)."""
        return self.at("*") and self.peek(1).kind == "mvar"

    def splice(self) -> "PSplice":
        self.next()
        return PSplice(self.next().text[1:])

    def sub_entry(self):
        """One subscript entry: an index expression or a list splice ``*?s``."""
        return self.splice() if self.at_splice() else self.expr()

    # -- loops, equations, nests ------------------------------------------
    def at_loop(self) -> bool:
        """True when the next tokens start a loop descriptor (not a tensor access)."""
        if self.at_splice():
            return True
        t = self.peek()
        if not (t.kind == "mvar" or (t.kind == "name" and t.text in _LOOP_KINDS)):
            return False
        if self.at("^", 1) and self.at("{", 2):
            return not self._braces_have_comma(2)
        if self.at("_", 1) and self.at("{", 2):
            return self.at("=", 4)
        return False

    def _braces_have_comma(self, off: int) -> bool:
        # a tensor superscript is {dtype,scope}; a loop superscript {extent} has no comma
        depth, i = 0, off
        while True:
            t = self.peek(i)
            if t.kind == "eof":
                return False
            if t.kind == "op" and t.text == "{":
                depth += 1
            elif t.kind == "op" and t.text == "}":
                depth -= 1
                if depth == 0:
                    return False
            elif t.kind == "op" and t.text == "," and depth == 1:
                return True
            i += 1

    def loop(self):
        t = self.next()
        kind = PVar(t.text[1:]) if t.kind == "mvar" else t.text
        extent = var = None
        for _ in range(2):
            if self.at("^") and extent is None:
                self.next()
                self.expect("{")
                extent = self.sum()
                self.expect("}")
            elif self.at("_") and var is None:
                self.next()
                self.expect("{")
                v = self.next()
                if v.kind == "mvar":
                    var = PVar(v.text[1:])
                elif v.kind == "word":
                    var = v.text
                else:
                    self.error(v, "expected a loop index name")
                self.expect("=")
                z = self.next()
                if z.kind != "int" or z.text != "0":
                    self.error(z, "loop lower bound must be 0")
                self.expect("}")
        if extent is None or var is None:
            self.error(self.peek(), "a loop needs ^{extent} and _{index=0}")
        if isinstance(extent, A.Int):
            extent = extent.value
        return A.Loop(kind, extent, var)

    def loops(self) -> tuple:
        out = []
        while self.at_loop() or self.at_splice():
            out.append(self.splice() if self.at_splice() else self.loop())
        return tuple(out)

    def equation(self):
        target = self.atom()
        if not isinstance(target, (A.Tensor, PVar)):
            self.error(self.peek(), "an equation must start with a tensor")
        self.expect("=")
        return A.Assign(target, self.expr())

    def nest(self):
        loops = self.loops()
        self.expect("[")
        body = []
        while not self.at("]"):
            if self.at_loop() or self.at("[") or self.at_splice():
                body.append(self.nest())
            else:
                body.append(self.equation())
                self.expect(";")
        self.expect("]")
        if self.at_loop() or self.at_splice():  # correction form LOOPS1[..]LOOPS2[..];
            body.append(self.nest())
            return A.Nest(loops, tuple(body))
        self.expect(";")
        return A.Nest(loops, tuple(body))


def parse_expr_pattern(src: str, wild: str = "_w"):
    """Parse a value pattern / template, e.g. ``log(?a*?b)``."""
    p = _Parser(src, wild)
    e = p.expr()
    p.done()
    return e


def parse_loops_pattern(src: str, wild: str = "_w") -> tuple:
    """Parse a sequence of loop descriptors, e.g. ``?k^{?n/?f}_{?io=0}L^{?f}_{?ii=0}``."""
    p = _Parser(src, wild)
    ls = p.loops()
    if not ls:
        p.error(p.peek(), "expected a loop descriptor")
    p.done()
    return ls


def parse_equation_pattern(src: str, wild: str = "_w"):
    """Parse an equation pattern ``?X_{..}=...`` (a trailing ``;`` is allowed)."""
    p = _Parser(src, wild)
    eq = p.equation()
    if p.at(";"):
        p.next()
    p.done()
    return eq


def parse_nest_pattern(src: str, wild: str = "_w"):
    """Parse a nest template ``LOOPS[eq;eq;];``."""
    p = _Parser(src, wild)
    n = p.nest()
    p.done()
    return n


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
# egglog compilation (query side)
# ---------------------------------------------------------------------------


def sx_str(s: str) -> str:
    """egglog string literal."""
    return json.dumps(s)


def float_key(v: float) -> str:
    """Canonical text of a float literal as stored in the e-graph (``repr``)."""
    return repr(float(v))


def qvar(name: str) -> str:
    """egglog query variable of metavariable ``name``."""
    return "mv_" + name


_AUX = iter(range(1, 1 << 62))


def to_sexp(p, sorts: dict[str, str], aux: list | None = None) -> str:
    """Compile a value/tensor pattern to an egglog term with query variables.

    The encoding is the one of :mod:`steptp.engine.egraph` (``INT FLT IDX TNS NEG BIN
    CALL CMP BOOL NOT`` over ``TL`` cons lists). A subscript splice ``*?s`` binds the rest
    of the list; entries after it (``?F_{*?s,?a-1}``) are matched from the end with the
    ``tl_last`` relation, whose atoms are appended to ``aux`` (required then).
    """
    if isinstance(p, PVar):
        s = sorts.get(p.name, TERM)
        if s == STRING:
            return f"(IDX {qvar(p.name)})"
        if s == INT:
            return f"(INT {qvar(p.name)})"
        if s == LIST:
            raise PatternError(f"?{p.name} is a subscript list: write *?{p.name} inside a subscript")
        return qvar(p.name)
    if isinstance(p, A.Int):
        return f"(INT {p.value})"
    if isinstance(p, A.Float):
        return f"(FLT {sx_str(float_key(p.value))})"
    if isinstance(p, A.Index):
        return f"(IDX {sx_str(p.name)})"
    if isinstance(p, A.Tensor):
        return (f"(TNS {_str_slot(p.name)} {_str_slot(p.dtype)} {_str_slot(p.scope)} "
                f"{_subscript_sexp(p.indices, sorts, aux)})")
    if isinstance(p, A.Neg):
        return f"(NEG {to_sexp(p.operand, sorts, aux)})"
    if isinstance(p, A.Not):
        return f"(NOT {to_sexp(p.operand, sorts, aux)})"
    if isinstance(p, A.BinOp):
        return f"(BIN {sx_str(p.op)} {to_sexp(p.lhs, sorts, aux)} {to_sexp(p.rhs, sorts, aux)})"
    if isinstance(p, A.Compare):
        return f"(CMP {sx_str(p.op)} {to_sexp(p.lhs, sorts, aux)} {to_sexp(p.rhs, sorts, aux)})"
    if isinstance(p, A.BoolOp):
        return f"(BOOL {sx_str(p.op)} {to_sexp(p.lhs, sorts, aux)} {to_sexp(p.rhs, sorts, aux)})"
    if isinstance(p, A.Call):
        return f"(CALL {sx_str(p.func)} {list_sexp([to_sexp(a, sorts, aux) for a in p.args])})"
    if isinstance(p, PSplice):
        raise PatternError(f"*?{p.name} may only stand for subscript entries")
    raise PatternError(f"cannot compile {p!r} to egglog")


def _subscript_sexp(indices: tuple, sorts: dict[str, str], aux: list | None) -> str:
    """egglog list of a subscript pattern; at most one splice ``*?s``."""
    spl = [k for k, x in enumerate(indices) if isinstance(x, PSplice)]
    if not spl:
        return list_sexp([to_sexp(i, sorts, aux) for i in indices])
    if len(spl) > 1:
        raise PatternError("a subscript pattern may contain one list splice *?name")
    k = spl[0]
    head, after = indices[:k], indices[k + 1:]
    rest = qvar(indices[k].name)
    if after:
        if aux is None:
            raise PatternError(f"entries after *?{indices[k].name} are not supported here")
        whole = f"anon_tl{next(_AUX)}"
        cur = whole
        for j, y in enumerate(reversed(after)):
            nxt = rest if j == len(after) - 1 else f"anon_tl{next(_AUX)}"
            aux.append(f"(tl_last {cur} {nxt} {to_sexp(y, sorts, aux)})")
            cur = nxt
        rest = whole
    out = rest
    for it in reversed(head):
        out = f"(TCons {to_sexp(it, sorts, aux)} {out})"
    return out


def loop_sexp(p: A.Loop) -> str:
    """Compile a loop pattern ``(LOOP kind extent var)``."""
    if not (isinstance(p.extent, (int, PVar))):
        raise PatternError("a loop pattern's extent must be an integer or a metavariable")
    ext = qvar(p.extent.name) if isinstance(p.extent, PVar) else str(p.extent)
    return f"(LOOP {_str_slot(p.kind)} {ext} {_str_slot(p.var)})"


def _str_slot(x) -> str:
    return qvar(x.name) if isinstance(x, PVar) else sx_str(str(x))


def list_sexp(items: list[str], tail: str = "(TNil)") -> str:
    """egglog cons list ``(TCons a (TCons b (TNil)))`` of compiled items (``tail``: a
    ``TL`` query variable for a trailing splice)."""
    out = tail
    for it in reversed(items):
        out = f"(TCons {it} {out})"
    return out


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
    "PatternError", "TemplateError", "PVar", "PSplice", "SUBS", "LOOPS", "LIST", "Tok", "tokenize",
    "parse_expr_pattern", "parse_loops_pattern", "parse_equation_pattern", "parse_nest_pattern",
    "TERM", "STRING", "INT", "metavar_sorts", "metavars", "iter_nodes",
    "sx_str", "float_key", "qvar", "to_sexp", "loop_sexp", "list_sexp",
    "value_to_expr", "eval_int", "instantiate", "match_node",
]
