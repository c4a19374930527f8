"""LEIR text -> AST, with errors that name the source, line, column and what was expected.

The grammar is ``grammar.lark`` beside this file (LALR(1), contextual lexer). Both
sub/superscript orders are accepted (``B^{8}_{tx=0}`` and ``B_{tx=0}^{8}``), as is the
"correction" form ``L1[x;]L2[y;];`` which means ``L1[x;L2[y;];];`` (reference-notes §1.1).
Comparison chains ``1<=c<7`` become ``1<=c & c<7``.

Rule text (patterns, templates, the value language of :mod:`steptp.engine.patterns`
and :mod:`steptp.engine.domains`, and the ``where:`` clauses of :mod:`steptp.engine.match`)
is parsed by ``pattern.lark``, which imports this
grammar and extends it (``%import`` / ``%extend`` / ``%override``): :func:`parse_rule_text`
returns the tree of one of its entry rules (:data:`RULE_TEXT_STARTS`) transformed by the
caller's :class:`LeirToAst` subclass, with the same errors as :func:`parse_program`.
"""

from __future__ import annotations

import math
from functools import lru_cache
from importlib import resources

from lark import Lark, Token, Transformer, Tree, v_args
from lark.exceptions import UnexpectedCharacters, UnexpectedEOF, UnexpectedInput, UnexpectedToken, VisitError

from . import ast as A
from .limits import MAX_EXPR_DEPTH, MAX_EXTENT, MAX_INT, MAX_NEST_DEPTH, MAX_SOURCE_CHARS

_TERMINAL_TEXT = {
    "LOOPKIND": "a loop kind (L, P, V, U, B)",
    "LOOPKIND_SUB": "a loop kind (L, P, V, U, B)",
    "NAME": "a tensor name",
    "IDX": "an index name",
    "DTYPE": "a dtype code (f16, f32, f64, i32, i64, bool, ...)",
    "SCOPE": "a storage scope (g, s, l, w)",
    "INT": "an integer",
    "FLOAT": "a number",
    "INF": "'inf'",
    "FUNC": "a function (exp, log, sqrt, abs, erf, tanh, max, min, if_then_else)",
    "CMPOP": "a comparison",
    "OR": "'|'",
    "AND": "'&'",
    "LSQB": "'['",
    "RSQB": "']'",
    "LBRACE": "'{'",
    "RBRACE": "'}'",
    "LPAR": "'('",
    "RPAR": "')'",
    "SEMICOLON": "';'",
    "COMMA": "','",
    "EQUAL": "'='",
    "CIRCUMFLEX": "'^'",
    "UNDERSCORE": "'_'",
    "PLUS": "'+'",
    "MINUS": "'-'",
    "STAR": "'*'",
    "SLASH": "'/'",
    "PERCENT": "'%'",
    "BANG": "'!'",
    "$END": "end of input",
    # pattern.lark (rule patterns and values)
    "PVAR": "a metavariable (?name)",
    "WORD": "a word",
    "STRING": "a quoted string",
    "V_AND": "'and'",
    "V_OR": "'or'",
    "V_NOT": "'not'",
}


class LeirSyntaxError(ValueError):
    """Malformed LEIR text.

    Attributes: ``source`` (file name or ``"<string>"``), ``line`` and ``column``
    (1-based), ``expected`` (sorted human-readable alternatives), ``context`` (the
    offending line with a caret).
    """

    def __init__(self, message: str, source: str, line: int, column: int,
                 expected: list[str] | None = None, context: str = ""):
        self.source, self.line, self.column = source, line, column
        self.expected = expected or []
        self.context = context
        self.reason = message
        text = f"{source}:{line}:{column}: {message}"
        if self.expected:
            text += "; expected " + " or ".join(self.expected)
        if context:
            text += "\n" + context
        super().__init__(text)


@lru_cache(maxsize=1)
def _lark() -> Lark:
    grammar = resources.files(__package__).joinpath("grammar.lark").read_text()
    return Lark(grammar, parser="lalr", lexer="contextual", propagate_positions=False,
                maybe_placeholders=True)


#: Entry rules of ``pattern.lark``: a value pattern, a loop list, an equation (``;``
#: optional), a nest, a body item (nest or equation), a value expression and one
#: ``where:`` clause of a rule.
RULE_TEXT_STARTS = ("pattern_expr", "pattern_loops", "pattern_equation", "pattern_nest", "pattern_item", "value",
                    "where_clause")


@lru_cache(maxsize=1)
def _rule_lark() -> Lark:
    return Lark.open_from_package(__package__, "pattern.lark", parser="lalr", lexer="contextual",
                                  start=list(RULE_TEXT_STARTS), propagate_positions=False,
                                  maybe_placeholders=True)


def _describe(names, lark: Lark | None = None) -> list[str]:
    """Human-readable names for lark terminal names (anonymous ones by their literal)."""
    literals = {t.name: t.pattern.value for t in (lark or _lark()).terminals}
    out = set()
    for n in names:
        if n in _TERMINAL_TEXT:
            out.add(_TERMINAL_TEXT[n])
        elif n in literals:
            out.add(repr(literals[n]))
        else:
            out.add(n)
    return sorted(out)


def _chain_compare(items):
    """``a < b <= c`` -> ``(a<b) & (b<=c)``."""
    operands = items[0::2]
    ops = [str(t) for t in items[1::2]]
    result = None
    for i, op in enumerate(ops):
        cmp = A.Compare(op, operands[i], operands[i + 1])
        result = cmp if result is None else A.BoolOp("and", result, cmp)
    return result


@v_args(inline=True)
class LeirToAst(Transformer):
    """lark tree of ``grammar.lark`` -> :mod:`steptp.leir.ast` nodes. Subclasses add the
    rules of grammar extensions; aliases of rules imported into another grammar
    (``grammar__add``) reach the method of their plain name (``add``)."""

    def __getattr__(self, name: str):
        head, sep, plain = name.rpartition("__")
        if sep and head and plain and not name.startswith("__") and hasattr(type(self), plain):
            return getattr(self, plain)
        raise AttributeError(name)

    def start(self, *nests):
        return A.Program(tuple(nests))

    def nest(self, loops, *rest):
        *items, end = rest
        body = tuple(items)
        if end is not None:  # correction form: the trailing nest sits inside this one
            body = body + (end,)
        return A.Nest(loops, body)

    def end_plain(self):
        return None

    def end_inner(self, nest):
        return nest

    def loops(self, *loops):
        return tuple(loops)

    def loop_sup_first(self, kind, extent, var, start):
        return self._loop(kind, extent, var, start)

    def loop_sub_first(self, kind, var, start, extent):
        return self._loop(kind, extent, var, start)

    @staticmethod
    def _loop(kind, extent, var, start):
        if _int_value(start) != 0:
            raise SemanticError("loop lower bound must be 0", start)
        if kind == "B" and not (len(var) >= 2 and var[0] in "tb" and var[1] in "xyz"):
            raise SemanticError(
                f"bound loop index '{var}' must start with tx/ty/tz (threadIdx) or bx/by/bz (blockIdx)", var)
        n = _int_value(extent)
        if n <= 0:
            raise SemanticError("loop extent must be positive", extent)
        if n > MAX_EXTENT:
            raise SemanticError(f"loop extent {n} exceeds the limit {MAX_EXTENT} (int32 loop variables)", extent)
        return A.Loop(str(kind), n, str(var))

    def item(self, x):
        return x

    def equation(self, target, value):
        return A.Assign(target, value)

    def tensor_sup_first(self, name, dtype, scope, indices):
        return A.Tensor(str(name), str(dtype), str(scope), tuple(indices or ()))

    def tensor_sub_first(self, name, indices, dtype, scope):
        return A.Tensor(str(name), str(dtype), str(scope), tuple(indices))

    def exprlist(self, *xs):
        return list(xs)

    def or_(self, a, _op, b):
        return A.BoolOp("or", a, b)

    def and_(self, a, _op, b):
        return A.BoolOp("and", a, b)

    def compare(self, *items):
        return _chain_compare(items)

    def add(self, a, b):
        return A.BinOp("+", a, b)

    def sub(self, a, b):
        return A.BinOp("-", a, b)

    def mul(self, a, b):
        return A.BinOp("*", a, b)

    def div(self, a, b):
        return A.BinOp("/", a, b)

    def floordiv(self, a, b):
        return A.BinOp("//", a, b)

    def mod(self, a, b):
        return A.BinOp("%", a, b)

    def pow(self, a, b):
        return A.BinOp("**", a, b)

    def neg(self, a):
        return A.Neg(a)

    def not_(self, a):
        return A.Not(a)

    def int(self, t):
        return A.Int(_int_value(t))

    def float(self, t):
        return A.Float(float(t))

    def inf(self, _t):
        return A.Float(math.inf)

    def index(self, t):
        return A.Index(str(t))

    def call(self, fn, args):
        name = "if_then_else" if str(fn) == "ifthenelse" else str(fn)
        arity = A.FUNCTIONS[name]
        if len(args) != arity:
            raise SemanticError(f"{name} takes {arity} argument(s), got {len(args)}", fn)
        return A.Call(name, tuple(args))


class SemanticError(Exception):
    """Raised by a :class:`LeirToAst` method for a slip the grammar cannot express (loop
    start != 0, wrong arity, ...); reported as a :class:`LeirSyntaxError` at ``token``."""

    def __init__(self, message: str, token):
        super().__init__(message)
        self.message = message
        self.token = token


def _int_value(tok) -> int:
    """Value of an INT token, refusing literals above :data:`~steptp.leir.limits.MAX_INT`
    (checked on the digit count first, so ``int()`` never sees thousands of digits)."""
    digits = str(tok).lstrip("0") or "0"
    if len(digits) > len(str(MAX_INT)) or int(digits) > MAX_INT:
        shown = digits if len(digits) <= 24 else f"{digits[:12]}...({len(digits)} digits)"
        raise SemanticError(f"integer literal {shown} exceeds the limit {MAX_INT}", tok)
    return int(digits)


def _first_token(tree):
    """The first token under ``tree`` (iterative), or None."""
    stack = [tree]
    while stack:
        x = stack.pop()
        if isinstance(x, Token):
            return x
        if isinstance(x, Tree):
            stack.extend(reversed([c for c in x.children if c is not None]))
    return None


def _check_depth(tree, expr_at_root: bool = False) -> None:
    """Refuse trees nested deeper than the limits (iterative walk: no recursion here).

    Expression depth counts every tree level inside an equation (from the root with
    ``expr_at_root``: rule text may be a bare expression); nest depth counts nests inside
    nests (the correction form included). Raises :class:`SemanticError` at the first token
    of the offending subtree."""
    stack = [(tree, 0, int(expr_at_root))]
    while stack:
        node, nests, expr = stack.pop()
        if not isinstance(node, Tree):
            continue
        if node.data == "nest":
            nests += 1
            if nests > MAX_NEST_DEPTH:
                raise SemanticError(f"nests are nested more than {MAX_NEST_DEPTH} levels deep", _first_token(node))
        elif node.data in ("equation",) or expr:
            expr += 1
            if expr > MAX_EXPR_DEPTH:
                raise SemanticError(f"expression nested more than {MAX_EXPR_DEPTH} levels deep",
                                     _first_token(node))
        for c in node.children:
            if isinstance(c, Tree):
                stack.append((c, nests, expr))


def _context(text: str, line: int, column: int) -> str:
    lines = text.splitlines() or [""]
    src = lines[line - 1] if 0 < line <= len(lines) else ""
    if len(src) > 160:  # keep the caret readable on one-line programs
        lo = max(0, column - 80)
        src, column = src[lo:lo + 160], column - lo
    return f"  {src}\n  {' ' * (column - 1)}^"


def _parse(lark: Lark, text: str, source: str, transformer: Transformer, start: str | None = None,
           depth_check: bool = False):
    """Parse ``text`` with ``lark`` (entry rule ``start``) and transform the tree; every
    lark error and :class:`SemanticError` becomes a :class:`LeirSyntaxError` naming
    ``source``, line, column and (for syntax errors) the expected tokens."""
    def error(message, line, col, expected=None):
        return LeirSyntaxError(message, source, line, col, expected, _context(text, line, col))

    def end_of_input():
        lines = text.splitlines() or [""]
        return len(lines), len(lines[-1]) + 1

    try:
        tree = lark.parse(text, start=start) if start else lark.parse(text)
        if depth_check:
            _check_depth(tree, expr_at_root=start is not None)
        return transformer.transform(tree)
    except (SemanticError, VisitError) as e:
        inner = e.orig_exc if isinstance(e, VisitError) else e
        if not isinstance(inner, SemanticError):
            raise
        line = getattr(inner.token, "line", 1) or 1
        col = getattr(inner.token, "column", 1) or 1
        raise error(inner.message, line, col) from None
    except UnexpectedEOF as e:
        raise error("unexpected end of input", *end_of_input(), _describe(e.expected, lark)) from None
    except UnexpectedToken as e:
        tok = e.token
        if tok.type == "$END":
            (line, col), msg = end_of_input(), "unexpected end of input"
        else:
            line, col, msg = e.line, e.column, f"unexpected {tok.value!r}"
        raise error(msg, line, col, _describe(e.expected, lark)) from None
    except UnexpectedCharacters as e:
        raise error(f"unexpected character {text[e.pos_in_stream]!r}", e.line, e.column,
                    _describe(e.allowed or [], lark)) from None
    except UnexpectedInput as e:  # pragma: no cover - other lark error kinds
        raise LeirSyntaxError(str(e), source, getattr(e, "line", 1), getattr(e, "column", 1)) from None


def parse_program(text: str, source: str = "<string>") -> A.Program:
    """Parse LEIR text into a :class:`~steptp.leir.ast.Program`.

    ``text`` may contain whitespace and newlines anywhere; ``%`` comment lines must be
    stripped first (see :func:`steptp.leir.fileformat.parse_leir`).

    Raises :class:`LeirSyntaxError` naming ``source``, line, column and the expected
    tokens on malformed input (also for semantic slips: loop start != 0, bad bound-loop
    names, wrong function arity).
    """
    if len(text) > MAX_SOURCE_CHARS:
        raise LeirSyntaxError(f"program text of {len(text)} characters exceeds the limit {MAX_SOURCE_CHARS}",
                              source, 1, 1)
    return _parse(_lark(), text, source, LeirToAst(), depth_check=True)


def parse_rule_text(text: str, start: str, transformer: LeirToAst, source: str = "<string>"):
    """Parse rule text (a pattern, template, value expression or ``where:`` clause) with
    the entry rule ``start`` of ``pattern.lark`` (one of :data:`RULE_TEXT_STARTS`; the
    grammar imports and extends ``grammar.lark``) and return ``transformer.transform(tree)``.

    Raises :class:`LeirSyntaxError` naming ``source``, line, column and the expected tokens
    on malformed text, or at the token a :class:`SemanticError` raised by the transformer
    names; ``ValueError`` for an unknown ``start``. Texts above
    :data:`~steptp.leir.limits.MAX_SOURCE_CHARS` are refused like programs.
    """
    if start not in RULE_TEXT_STARTS:
        raise ValueError(f"unknown entry rule {start!r}; known: {', '.join(RULE_TEXT_STARTS)}")
    if len(text) > MAX_SOURCE_CHARS:
        raise LeirSyntaxError(f"rule text of {len(text)} characters exceeds the limit {MAX_SOURCE_CHARS}",
                              source, 1, 1)
    return _parse(_rule_lark(), text, source, transformer, start, depth_check=True)


def parse_expr(text: str, source: str = "<string>") -> A.Expr:
    """Parse a single LEIR expression (e.g. ``log(A^{f32,g}_{tx})``)."""
    prog = parse_program(f"B^{{1}}_{{tx=0}}[Zz^{{f32,g}}={text};];", source)
    return prog.nests[0].body[0].value


__all__ = ["LeirSyntaxError", "SemanticError", "LeirToAst", "RULE_TEXT_STARTS", "parse_program", "parse_expr",
           "parse_rule_text"]
