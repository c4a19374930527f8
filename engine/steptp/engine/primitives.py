"""Generic primitives that rule YAML files name: no strategy-specific code lives here.

Four families, each usable by any rule:

* **Program navigation** - :func:`get_item`, :func:`replace_items`, :func:`expr_at`,
  :func:`replace_expr`, :func:`value_occurrences`, :func:`map_nest_exprs`.
* **Names** - :func:`program_names`, :func:`fresh_index_name`, :func:`fresh_tensor_name`
  (never collide with a name of the program or its signature, nor with reserved words).
* **Parameter domains** (``params:`` in YAML) - :data:`DOMAINS`: ``divisors_of``,
  ``choice``, ``range``, ``permutations_of`` with the modifiers ``exclude``,
  ``exclude_identity``, ``keep_innermost_kinds``, ``innermost``; and the value functions
  usable in ``let:``/``params:`` expressions (the registry :data:`VALUE_FUNCTIONS` and its
  evaluator; the functions themselves are defined in :mod:`steptp.engine.values`).
* **Rewrite primitives** (``rewrite:`` in YAML) - :data:`PRIMITIVES`: ``replace``,
  ``substitute_index``, ``permute_loops``, ``set_loop``, ``concat_nests``,
  ``split_nest``, ``insert_nest``, ``remove_nest``, ``swap_nests``, ``set_scope``,
  ``rename_tensor``, ``replace_all``. Each takes a :class:`RewriteContext` and its YAML
  arguments, returns nothing, updates ``ctx.program`` and logs a :class:`Change`.

Paths: a nest/equation path is ``(n, i, j, ...)`` (top-level nest ``n``, then body item
indices), as in :func:`steptp.leir.analysis.equation_instances`. An expression path is a
tuple of child indices (:func:`steptp.leir.ast.children`) inside an equation's value,
through value positions only (tensor subscripts are not entered).
"""

from __future__ import annotations

import functools
import itertools
import math
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator

from ..leir import ast as A
from ..leir.fileformat import LeirModule
from ..leir.printer import format_assign, format_expr, format_loops, format_nest
from . import patterns as P


class RewriteError(ValueError):
    """A rewrite primitive cannot be applied (bad arguments, illegal result)."""


# ---------------------------------------------------------------------------
# References to nests / equations (bindings of Nest- and Eq-sorted metavariables)
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class NestRef:
    """A nest of the program by path (``(n,)`` top level, ``(n, i)`` nested...)."""

    path: tuple[int, ...]

    def __str__(self) -> str:
        return "nest" + _fmt_path(self.path)


@dataclass(frozen=True)
class EqRef:
    """An equation of the program by path (its last element is the body index)."""

    path: tuple[int, ...]

    def __str__(self) -> str:
        return "eq" + _fmt_path(self.path)


def _fmt_path(p) -> str:
    return "(" + ",".join(map(str, p)) + ")"


@dataclass(frozen=True)
class CreatedRef:
    """A nest or equation created by an earlier rewrite step of the same rule and named
    with ``as: name``; resolved to its current path by :class:`RewriteContext`."""

    name: str

    def __str__(self) -> str:
        return "?" + self.name


def _shift_path(path, parent: tuple, pos: int, delta: int):
    """``path`` after ``delta`` items were inserted (+) / removed (-) at ``parent + (pos,)``;
    ``None`` when the path itself was removed."""
    if path is None:
        return None
    k = len(parent)
    if len(path) > k and path[:k] == parent:
        if delta < 0 and pos <= path[k] < pos - delta:
            return None
        if path[k] >= pos + (0 if delta > 0 else -delta):
            return path[:k] + (path[k] + delta,) + path[k + 1:]
    return path


# ---------------------------------------------------------------------------
# Program navigation
# ---------------------------------------------------------------------------


def get_item(prog: A.Program, path: tuple[int, ...]):
    """The nest or equation at ``path``. Raises :class:`RewriteError` if absent."""
    try:
        node: Any = prog.nests[path[0]]
        for i in path[1:]:
            node = node.body[i]
        return node
    except (IndexError, AttributeError, TypeError):
        raise RewriteError(f"no nest or equation at path {_fmt_path(path)}") from None


def get_nest(prog: A.Program, path: tuple[int, ...]) -> A.Nest:
    """The nest at ``path``; :class:`RewriteError` if absent or an equation."""
    n = get_item(prog, path)
    if not isinstance(n, A.Nest):
        raise RewriteError(f"path {_fmt_path(path)} is an equation, not a nest")
    return n


def replace_items(prog: A.Program, path: tuple[int, ...], new: tuple) -> A.Program:
    """Replace the item at ``path`` by the items ``new`` (zero, one or several)."""
    new = tuple(new)

    def rec(items: tuple, rest: tuple[int, ...]) -> tuple:
        i = rest[0]
        if not 0 <= i < len(items):
            raise RewriteError(f"no item at path {_fmt_path(path)}")
        if len(rest) == 1:
            return items[:i] + new + items[i + 1:]
        node = items[i]
        if not isinstance(node, A.Nest):
            raise RewriteError(f"path {_fmt_path(path)} goes through an equation")
        return items[:i] + (A.Nest(node.loops, rec(node.body, rest[1:])),) + items[i + 1:]

    nests = rec(prog.nests, tuple(path))
    for n in nests:
        if not isinstance(n, A.Nest):
            raise RewriteError("a top-level item must be a nest")
    return A.Program(nests)


def replace_item(prog: A.Program, path: tuple[int, ...], new) -> A.Program:
    """Replace the nest or equation at ``path`` by ``new``."""
    return replace_items(prog, path, (new,))


def value_children(e: A.Expr) -> tuple:
    """Children of ``e`` in value positions (a tensor's subscripts are not values)."""
    return () if isinstance(e, A.Tensor) else A.children(e)


def expr_at(e: A.Expr, epath: tuple[int, ...]) -> A.Expr:
    """The subterm of ``e`` at value path ``epath``."""
    for i in epath:
        e = value_children(e)[i]
    return e


def replace_expr(e: A.Expr, epath: tuple[int, ...], new: A.Expr) -> A.Expr:
    """``e`` with the subterm at value path ``epath`` replaced by ``new`` (only there)."""
    if not epath:
        return new
    kids = list(value_children(e))
    kids[epath[0]] = replace_expr(kids[epath[0]], epath[1:], new)
    return A.rebuild(e, tuple(kids))


def value_occurrences(e: A.Expr, target: A.Expr, prefix: tuple[int, ...] = ()) -> list[tuple[int, ...]]:
    """Paths of every occurrence of ``target`` in value positions of ``e`` (pre-order)."""
    out = []
    if e == target:
        out.append(prefix)
    for i, c in enumerate(value_children(e)):
        out.extend(value_occurrences(c, target, prefix + (i,)))
    return out


def map_nest_exprs(nest: A.Nest, fn: Callable[[A.Expr], A.Expr]) -> A.Nest:
    """Apply ``fn`` to every equation target and value inside ``nest`` (inner nests too)."""
    body = []
    for item in nest.body:
        if isinstance(item, A.Assign):
            t = fn(item.target)
            if not isinstance(t, A.Tensor):
                raise RewriteError("an equation target must stay a tensor")
            body.append(A.Assign(t, fn(item.value)))
        else:
            body.append(map_nest_exprs(item, fn))
    return A.Nest(nest.loops, tuple(body))


def nest_loop_vars(nest: A.Nest) -> set[str]:
    """Loop indices of a nest and of its inner nests."""
    out = {l.var for l in nest.loops}
    for item in nest.body:
        if isinstance(item, A.Nest):
            out |= nest_loop_vars(item)
    return out


def iter_tensors(prog: A.Program) -> Iterator[A.Tensor]:
    """Every tensor occurrence (targets, values, subscripts) in program order."""
    for _, eq in prog.equations():
        for x in A.walk(eq.target):
            if isinstance(x, A.Tensor):
                yield x
        for x in A.walk(eq.value):
            if isinstance(x, A.Tensor):
                yield x


# ---------------------------------------------------------------------------
# Names
# ---------------------------------------------------------------------------

#: Words an index name may not take (they lex as keywords / functions / dtypes).
RESERVED_INDEX_NAMES = frozenset({"inf", "and", "or", "ifthenelse"} | set(A.FUNCTIONS) | set(A.DTYPES))
#: Loop-index alphabet of the translator (reference-notes §1.3): a..z minus t b v x y z e.
INDEX_ALPHABET = tuple("acdfghijklmnopqrsuw")
#: Tensor-name alphabet (reference-notes §1.4): A..Z minus the loop kinds L P V B U and T.
TENSOR_ALPHABET = tuple("ACDEFGHIJKMNOQRSWXYZ")
_BOUND_RE = re.compile(r"^[tb][xyz]")


def program_names(module: LeirModule | A.Program) -> set[str]:
    """Every name in use: tensors (program and signature) and loop indices of all nests."""
    prog = module.program if isinstance(module, LeirModule) else module
    names: set[str] = set()
    if isinstance(module, LeirModule):
        names |= set(module.signature.names)
    for t in iter_tensors(prog):
        names.add(t.name)

    def rec(n: A.Nest):
        for l in n.loops:
            names.add(l.var)
        for item in n.body:
            if isinstance(item, A.Nest):
                rec(item)
            else:
                for x in itertools.chain(A.walk(item.target), A.walk(item.value)):
                    if isinstance(x, A.Index):
                        names.add(x.name)

    for n in prog.nests:
        rec(n)
    return names


def _index_candidates() -> Iterator[str]:
    yield from INDEX_ALPHABET
    for a in INDEX_ALPHABET:
        for b in INDEX_ALPHABET:
            yield a + b
    for k in itertools.count(1):
        for a in INDEX_ALPHABET:
            yield f"{a}{k}"


def fresh_index_name(taken: set[str], kind: str | None = None, like: str | None = None,
                     prefix: str | None = None) -> str:
    """A new loop-index name not in ``taken`` (which is updated).

    For ``kind == "B"`` the name must encode the thread/block axis: it starts with
    ``prefix`` (e.g. ``"tx"``), or with the first two letters of ``like`` when ``like``
    is itself a bound name (``tx`` -> ``txa``). Otherwise names follow the translator's
    alphabet (``a c d f ...``, then ``aa ac ...``), skipping every taken or reserved word
    and every name that starts like a bound index.
    """
    if kind == "B":
        if prefix is None:
            if like is None or not _BOUND_RE.match(like):
                raise RewriteError(f"a bound (B) loop index needs a tx/ty/tz/bx/by/bz prefix (like={like!r})")
            prefix = like[:2]
        if not _BOUND_RE.match(prefix):
            raise RewriteError(f"bad bound-loop prefix {prefix!r}")
        for c in _index_candidates():
            name = prefix + c
            if name not in taken and name not in RESERVED_INDEX_NAMES:
                taken.add(name)
                return name
    for c in _index_candidates():
        if c not in taken and c not in RESERVED_INDEX_NAMES and not _BOUND_RE.match(c):
            taken.add(c)
            return c
    raise AssertionError("unreachable")  # pragma: no cover


def fresh_tensor_name(taken: set[str]) -> str:
    """A new tensor name not in ``taken`` (updated): ``A C D ...`` then ``Aa Ac ...``."""
    lower = INDEX_ALPHABET
    cands = itertools.chain(TENSOR_ALPHABET, (a + b for a in TENSOR_ALPHABET for b in lower),
                            (f"{a}{k}" for k in itertools.count(1) for a in TENSOR_ALPHABET))
    for c in cands:
        if c not in taken:
            taken.add(c)
            return c
    raise AssertionError("unreachable")  # pragma: no cover


# ---------------------------------------------------------------------------
# Value expressions (let:, params:, primitive arguments)
# ---------------------------------------------------------------------------


class ValueExprError(ValueError):
    """A ``let``/``params`` value expression cannot be evaluated."""


@dataclass
class EvalContext:
    """What value functions may look at: the program and the bindings."""

    module: LeirModule
    env: dict


#: Functions usable in value expressions: name -> (arity, fn(ctx, *args)); arity -1 =
#: variadic. All of them are defined in :mod:`steptp.engine.values`, which fills this
#: registry on import (the engine package imports it first).
VALUE_FUNCTIONS: dict[str, tuple[int, Callable]] = {}


class _ValueParser:
    """``?n/?f``, ``loops_of(?N)``, ``3``, ``"s"``, bare words (string literals)."""

    def __init__(self, src: str):
        self.p = P._Parser(src)

    def parse(self):
        e = self.or_()
        self.p.done()
        return e

    def or_(self):
        a = self.and_()
        while self.p.peek().kind == "word" and self.p.peek().text == "or":
            self.p.next()
            a = ("or", a, self.and_())
        return a

    def and_(self):
        a = self.cmp()
        while self.p.peek().kind == "word" and self.p.peek().text == "and":
            self.p.next()
            a = ("and", a, self.cmp())
        return a

    def cmp(self):
        if self.p.peek().kind == "word" and self.p.peek().text == "not":
            self.p.next()
            return ("not", self.cmp())
        a = self.sum()
        t = self.p.peek()
        if t.kind == "op" and t.text in ("<", "<=", ">", ">=", "==", "!="):
            self.p.next()
            return ("cmp", t.text, a, self.sum())
        return a

    def sum(self):
        a = self.prod()
        while self.p.at("+") or self.p.at("-"):
            a = ("op", self.p.next().text, a, self.prod())
        return a

    def prod(self):
        a = self.atom()
        while self.p.peek().kind == "op" and self.p.peek().text in ("*", "/", "//", "%"):
            a = ("op", self.p.next().text, a, self.atom())
        return a

    def atom(self):
        t = self.p.next()
        if t.kind == "int":
            return ("lit", int(t.text))
        if t.kind == "mvar":
            return ("var", t.text[1:])
        if t.kind == "str":
            return ("lit", t.text[1:-1])
        if t.kind == "op" and t.text == "-":
            return ("op", "-", ("lit", 0), self.atom())
        if t.kind == "op" and t.text == "(":
            e = self.sum()
            self.p.expect(")")
            return e
        if t.kind in ("word", "name"):
            if self.p.at("("):
                self.p.next()
                args = []
                if not self.p.at(")"):
                    args.append(self.sum())
                    while self.p.at(","):
                        self.p.next()
                        args.append(self.sum())
                self.p.expect(")")
                return ("call", t.text, args)
            return ("lit", t.text)
        self.p.error(t, "expected a value")


@functools.lru_cache(maxsize=4096)
def parse_value(src: str):
    """Parse a value expression (see :class:`_ValueParser`); raises PatternError. The
    tree is immutable (nested tuples) and cached per text."""
    return _ValueParser(src).parse()


def value_vars(tree) -> set[str]:
    """Metavariables used by a parsed value expression."""
    kind = tree[0]
    if kind == "var":
        return {tree[1]}
    if kind == "op":
        return value_vars(tree[2]) | value_vars(tree[3])
    if kind == "call":
        return set().union(*[value_vars(a) for a in tree[2]]) if tree[2] else set()
    if kind in ("and", "or"):
        return value_vars(tree[1]) | value_vars(tree[2])
    if kind == "not":
        return value_vars(tree[1])
    if kind == "cmp":
        return value_vars(tree[2]) | value_vars(tree[3])
    return set()


def is_expression(v) -> bool:
    """True for a YAML string that is a value expression (contains ``?`` or ``(``)."""
    return isinstance(v, str) and ("?" in v or "(" in v)


def eval_value(v, ctx: EvalContext):
    """Evaluate a YAML value: ints/bools stay, lists map, strings containing ``?`` or
    ``(`` are value expressions, other strings are literals."""
    if isinstance(v, list):
        return tuple(eval_value(x, ctx) for x in v)
    if not is_expression(v):
        return v
    return _eval_tree(parse_value(v), ctx)


_CMP_FN = {"<": lambda a, b: a < b, "<=": lambda a, b: a <= b, ">": lambda a, b: a > b,
           ">=": lambda a, b: a >= b, "==": lambda a, b: a == b, "!=": lambda a, b: a != b}


def _eval_tree(t, ctx: EvalContext):
    kind = t[0]
    if kind == "lit":
        return t[1]
    if kind == "and":
        return bool(_eval_tree(t[1], ctx)) and bool(_eval_tree(t[2], ctx))
    if kind == "or":
        return bool(_eval_tree(t[1], ctx)) or bool(_eval_tree(t[2], ctx))
    if kind == "not":
        return not bool(_eval_tree(t[1], ctx))
    if kind == "cmp":
        a, b = _eval_tree(t[2], ctx), _eval_tree(t[3], ctx)
        try:
            return _CMP_FN[t[1]](a, b)
        except TypeError:
            raise ValueExprError(f"cannot compare {a!r} {t[1]} {b!r}") from None
    if kind == "var":
        if t[1] not in ctx.env:
            raise ValueExprError(f"?{t[1]} is not bound here")
        v = ctx.env[t[1]]
        return v.value if isinstance(v, A.Int) else v
    if kind == "call":
        if t[1] not in VALUE_FUNCTIONS:
            raise ValueExprError(f"unknown function {t[1]}")
        arity, fn = VALUE_FUNCTIONS[t[1]]
        if arity >= 0 and len(t[2]) != arity:  # arity -1: variadic, checked by fn
            raise ValueExprError(f"{t[1]} takes {arity} argument(s)")
        return fn(ctx, *[_eval_tree(a, ctx) for a in t[2]])
    a, b = _eval_tree(t[2], ctx), _eval_tree(t[3], ctx)
    if not (isinstance(a, int) and isinstance(b, int)):
        raise ValueExprError(f"arithmetic on non-integers {a!r} {t[1]} {b!r}")
    op = t[1]
    if op == "+":
        return a + b
    if op == "-":
        return a - b
    if op == "*":
        return a * b
    if op == "/":
        if b == 0 or a % b:
            raise ValueExprError(f"{a}/{b} is not an exact division")
        return a // b
    if op == "//":
        return a // b
    return a % b


def eval_let(spec, ctx: EvalContext):
    """``let:`` entry: a value, or ``{lookup: v, table: {...}, default: d}``."""
    if isinstance(spec, dict) and "lookup" in spec:
        key = eval_value(spec["lookup"], ctx)
        table = spec.get("table", {})
        if str(key) in table:
            return eval_value(table[str(key)], ctx)
        if "default" not in spec:
            raise ValueExprError(f"lookup: no entry for {key!r} and no default")
        return eval_value(spec["default"], ctx)
    return eval_value(spec, ctx)


# ---------------------------------------------------------------------------
# Parameter domains
# ---------------------------------------------------------------------------


#: Largest number of values one parameter domain may have (a larger ``range`` or
#: permutation set is a rule error, not a stall).
MAX_DOMAIN_VALUES = 100_000


def divisors(n: int, exclude: Iterable = ()) -> list[int]:
    """Every divisor of ``n`` (ascending) not in ``exclude``: trial division up to
    ``sqrt(n)`` (O(sqrt n): 32k steps for ``n = 2**30``)."""
    ex = set(exclude)
    small, large = [], []
    d = 1
    while d * d <= n:
        if n % d == 0:
            small.append(d)
            if d * d != n:
                large.append(n // d)
        d += 1
    return [x for x in small + large[::-1] if x not in ex]


def permutations(items: tuple, exclude_identity: bool = True, keep_innermost_kinds: Iterable[str] = (),
                 innermost: int | None = None) -> list:
    """Permutations of ``range(len(items))`` as index tuples (lexicographic order).

    ``keep_innermost_kinds``: loops of these kinds (e.g. ``V``) must stay at the
    innermost positions they occupy (vectorized loops stay innermost).
    ``innermost``: only the innermost ``innermost`` movable items are permuted; the outer
    ones keep their places (a 9-loop 3-D convolution nest has 9! = 362,880 orders; with
    ``innermost: 7`` it has 7! = 5,040).
    """
    n = len(items)
    keep = set(keep_innermost_kinds)
    fixed = []
    if keep:
        for i in range(n - 1, -1, -1):
            if isinstance(items[i], A.Loop) and items[i].kind in keep:
                fixed.append(i)
            else:
                break
    free = [i for i in range(n) if i not in fixed]
    outer: list[int] = []
    if innermost is not None and len(free) > innermost:
        outer, free = free[:len(free) - innermost], free[len(free) - innermost:]
    out = []
    for perm in itertools.permutations(free):
        full = tuple(outer) + tuple(perm) + tuple(sorted(fixed))
        if exclude_identity and full == tuple(range(n)):
            continue
        out.append(full)
    return out


def _domain_values(spec: dict, ctx: EvalContext) -> list:
    if "divisors_of" in spec:
        n = eval_value(spec["divisors_of"], ctx)
        if not isinstance(n, int) or n <= 0:
            raise ValueExprError(f"divisors_of needs a positive integer, got {n!r}")
        vals = divisors(n)
    elif "choice" in spec:
        vals = list(eval_value(spec["choice"], ctx))
    elif "range" in spec:
        r = spec["range"]
        lo, hi = (eval_value(r[0], ctx), eval_value(r[1], ctx)) if isinstance(r, list) else \
            (eval_value(r["from"], ctx), eval_value(r["to"], ctx))
        if not (isinstance(lo, int) and isinstance(hi, int)):
            raise ValueExprError(f"range bounds must be integers, got {lo!r} and {hi!r}")
        if hi - lo + 1 > MAX_DOMAIN_VALUES:
            raise ValueExprError(f"range [{lo}, {hi}] has {hi - lo + 1} values, above the limit {MAX_DOMAIN_VALUES}")
        vals = list(range(lo, hi + 1))
    elif "permutations_of" in spec:
        items = eval_value(spec["permutations_of"], ctx)
        inner = spec.get("innermost")
        if inner is not None and (not isinstance(inner, int) or isinstance(inner, bool) or inner < 1):
            raise ValueExprError(f"innermost must be a positive integer, got {inner!r}")
        if isinstance(items, int):
            if items > 9:  # before building the items: innermost: does not make a huge count cheap
                raise ValueExprError(f"permutations of {items} items exceed the limit {MAX_DOMAIN_VALUES}")
            items = tuple(range(items))
        moved = min(len(tuple(items)), inner or len(tuple(items)))
        if math.factorial(moved) > MAX_DOMAIN_VALUES:
            raise ValueExprError(f"permutations of {moved} items exceed the limit {MAX_DOMAIN_VALUES} "
                                 "(the innermost: modifier permutes only the innermost N)")
        vals = permutations(tuple(items), bool(spec.get("exclude_identity", True)),
                            spec.get("keep_innermost_kinds", ()), inner)
    else:
        from .filters import EXTRA_DOMAINS  # Python-computed domains (e.g. steptp.engine.mathprims)

        key = next((k for k in spec if k in EXTRA_DOMAINS), None)
        if key is None:
            raise ValueExprError(f"unknown domain {spec!r}")
        vals = list(EXTRA_DOMAINS[key](spec, ctx))
    ex = {_norm(eval_value(x, ctx)) for x in spec.get("exclude", [])}
    vals = [v for v in vals if _norm(v) not in ex]
    req = spec.get("require")
    if req:
        conds = req if isinstance(req, list) else [req]
        name = spec.get("_name")
        kept = []
        for v in vals:
            sub = EvalContext(ctx.module, {**ctx.env, name: v} if name else ctx.env)
            if all(bool(eval_value(c, sub)) for c in conds):
                kept.append(v)
        vals = kept
    return vals


def _norm(v):
    if isinstance(v, list):
        return tuple(_norm(x) for x in v)
    return v


#: Domain keys the YAML may use (``params.<name>.<key>``).
DOMAINS = ("divisors_of", "choice", "range", "permutations_of")
DOMAIN_MODIFIERS = ("exclude", "exclude_identity", "keep_innermost_kinds", "innermost", "require")


def domain_values(spec: dict, ctx: EvalContext, name: str | None = None) -> list:
    """All admissible values of one parameter, deterministic order (see :data:`DOMAINS`).

    ``require`` conditions are evaluated with the candidate value bound to ``?name``."""
    if name is not None:
        spec = {**spec, "_name": name}
    return [_norm(v) for v in _domain_values(spec, ctx)]


# ---------------------------------------------------------------------------
# Rewrite primitives
# ---------------------------------------------------------------------------


@dataclass
class Change:
    """One logged edit: ``kind``, texts ``before``/``after`` and where it happened."""

    kind: str
    before: str
    after: str
    where: str = ""
    extra: dict = field(default_factory=dict)

    def as_dict(self) -> dict:
        return {"kind": self.kind, "before": self.before, "after": self.after, "where": self.where, **self.extra}


@dataclass
class RewriteContext:
    """State threaded through a rule's rewrite primitives.

    ``program`` is updated by each primitive; ``site`` is the match site (duck-typed:
    ``scope``, ``nest``, ``nests``, ``equation``, ``expr``, ``loop``, ``tensor``);
    ``env`` holds every binding (match, where, params, let, fresh); ``taken`` the names
    in use. Structural primitives record how they shifted sibling positions so later
    nest references stay valid (:meth:`remap`).
    """

    module: LeirModule
    program: A.Program
    site: Any
    env: dict
    taken: set[str]
    changes: list[Change] = field(default_factory=list)
    shifts: list[tuple[tuple[int, ...], int, int]] = field(default_factory=list)
    #: items created by earlier steps and named with ``as:`` (name -> current path)
    created: dict = field(default_factory=dict)
    #: path of the nest/equation the last primitive created (set by creating primitives)
    last_created: tuple[int, ...] | None = None

    def remap(self, path: tuple[int, ...]) -> tuple[int, ...]:
        """Translate a path of the original program into the current program."""
        path = tuple(path)
        for parent, pos, delta in self.shifts:
            k = len(parent)
            if len(path) > k and path[:k] == parent:
                if delta < 0 and pos <= path[k] < pos - delta:
                    raise RewriteError(f"path {_fmt_path(path)} refers to a removed item")
                if path[k] >= pos + (0 if delta > 0 else -delta):
                    path = path[:k] + (path[k] + delta,) + path[k + 1:]
        return path

    def shift(self, path: tuple[int, ...], delta: int):
        """Record that ``delta`` items were inserted (+) / removed (-) at ``path``."""
        self.shifts.append((tuple(path[:-1]), path[-1], delta))
        for name, cur in list(self.created.items()):
            self.created[name] = _shift_path(cur, tuple(path[:-1]), path[-1], delta)

    def value(self, v):
        """Evaluate a YAML value with the step's bindings."""
        return eval_value(v, EvalContext(self.module, self.env))

    def nest_ref(self, v) -> tuple[int, ...]:
        """Current path of a nest given as ``?N`` (a :class:`NestRef`), a name bound by
        ``as:`` in an earlier step (:class:`CreatedRef`) or a path list."""
        x = self.value(v)
        if isinstance(x, CreatedRef):
            return self.created_path(x)
        if isinstance(x, NestRef):
            return self.remap(x.path)
        if isinstance(x, (tuple, list)) and all(isinstance(i, int) for i in x):
            return self.remap(tuple(x))
        raise RewriteError(f"expected a nest reference, got {x!r}")

    def created_path(self, ref: "CreatedRef") -> tuple[int, ...]:
        """Current path of an item created earlier in this rewrite (named with ``as:``)."""
        p = self.created.get(ref.name)
        if p is None:
            raise RewriteError(f"?{ref.name} names an item that a later step removed")
        return p

    def site_nest(self) -> tuple[int, ...]:
        """Current path of the site's nest (the first nest for a ``nests`` site)."""
        s = self.site
        if s.nest is not None:
            return self.remap(s.nest)
        if s.nests:
            return self.remap(s.nests[0])
        raise RewriteError(f"a {s.scope} site has no nest; pass 'nest:' explicitly")


@dataclass(frozen=True)
class PrimitiveSpec:
    """A rewrite primitive: its function and the YAML argument shape it accepts.

    ``template_args`` maps argument names to the template kind they hold (``expr``,
    ``loops``, ``equation``, ``nest``, ``mapping``) so rules can be checked at load time.
    """

    name: str
    fn: Callable
    required: tuple[str, ...] = ()
    optional: tuple[str, ...] = ()
    positional: str | None = None  # argument filled by a scalar/list YAML value
    template_args: dict = field(default_factory=dict)
    doc: str = ""


PRIMITIVES: dict[str, PrimitiveSpec] = {}


def primitive(name: str, required=(), optional=(), positional=None, template_args=None):
    """Register a rewrite primitive under ``name`` (decorator)."""

    def deco(fn):
        PRIMITIVES[name] = PrimitiveSpec(name, fn, tuple(required), tuple(optional), positional,
                                         dict(template_args or {}), (fn.__doc__ or "").strip())
        return fn

    return deco


def normalize_args(spec: PrimitiveSpec, raw) -> dict:
    """YAML value of a rewrite step -> keyword dict (a scalar, a list or, for a mapping
    argument, a dict with other keys fills the ``positional`` argument)."""
    allowed = spec.required + spec.optional
    if isinstance(raw, dict) and set(raw) <= set(allowed):
        args = dict(raw)
    elif spec.positional is not None and (not isinstance(raw, dict)
                                          or spec.template_args.get(spec.positional) == "mapping"):
        args = {spec.positional: raw}
    else:
        raise RewriteError(f"{spec.name}: unknown argument(s) {sorted(set(raw) - set(allowed))}; "
                           f"allowed {list(allowed)}" if isinstance(raw, dict)
                           else f"{spec.name} takes named arguments {list(allowed)}")
    missing = [a for a in spec.required if a not in args]
    if missing:
        raise RewriteError(f"{spec.name}: missing argument(s) {missing}")
    return args


_TEMPLATE_PARSERS = {
    "expr": P.parse_expr_pattern,
    "loops": P.parse_loops_pattern,
    "equation": P.parse_equation_pattern,
    "nest": P.parse_nest_pattern,
}


def parse_template(kind: str, text: str):
    """Parse a template of kind ``expr``, ``loops``, ``equation`` or ``nest``."""
    return _TEMPLATE_PARSERS[kind](text)


def _instantiate(ctx: RewriteContext, kind: str, text: str):
    try:
        return P.instantiate(parse_template(kind, text), ctx.env)
    except P.TemplateError as e:
        raise RewriteError(str(e)) from None


@primitive("replace", positional="template", required=("template",), template_args={"template": "site"})
def prim_replace(ctx: RewriteContext, template: str):
    """Replace the match site by the instantiated template: an expression (``expr``
    scope), an equation (``equation`` scope) or one or more loops (``loop`` scope).
    With ``substitute_index`` this is TVM's ``sch.split`` (and ``fuse``) on one loop."""
    s = ctx.site
    prog = ctx.program
    if s.scope == "expr":
        path = ctx.remap(s.equation)
        eq = get_item(prog, path)
        old = expr_at(eq.value, s.expr)
        new = _instantiate(ctx, "expr", template)
        ctx.program = replace_item(prog, path, A.Assign(eq.target, replace_expr(eq.value, s.expr, new)))
        ctx.changes.append(Change("expr", format_expr(old), format_expr(new), str(EqRef(path))))
    elif s.scope == "equation":
        path = ctx.remap(s.equation)
        old = get_item(prog, path)
        new = _instantiate(ctx, "equation", template)
        ctx.program = replace_item(prog, path, new)
        ctx.changes.append(Change("equation", format_assign(old), format_assign(new), str(EqRef(path))))
    elif s.scope == "loop":
        path = ctx.remap(s.nest)
        nest = get_nest(prog, path)
        new = _instantiate(ctx, "loops", template)
        loops = nest.loops[:s.loop] + tuple(new) + nest.loops[s.loop + 1:]
        ctx.program = replace_item(prog, path, A.Nest(loops, nest.body))
        ctx.changes.append(Change("loops", format_loops((nest.loops[s.loop],)), format_loops(new),
                                  str(NestRef(path))))
    else:
        raise RewriteError(f"replace is not defined for a {s.scope} site")


@primitive("substitute_index", positional="mapping", required=("mapping",), optional=("nest",),
           template_args={"mapping": "mapping"})
def prim_substitute_index(ctx: RewriteContext, mapping: dict, nest=None):
    """Replace loop indices by index expressions in every equation of a nest (default:
    the site's nest), inner nests included: ``{"?i": "?io*?f+?ii"}``."""
    path = ctx.nest_ref(nest) if nest is not None else ctx.site_nest()
    n = get_nest(ctx.program, path)
    sub: dict[str, A.Expr] = {}
    for k, v in mapping.items():
        name = ctx.value(k)
        if isinstance(name, A.Index):
            name = name.name
        if not isinstance(name, str):
            raise RewriteError(f"substitute_index: {k!r} is not an index name")
        sub[name] = _instantiate(ctx, "expr", str(v))
    new = map_nest_exprs(n, lambda e: A.substitute_indices(e, sub))
    ctx.program = replace_item(ctx.program, path, new)
    for name, e in sub.items():
        ctx.changes.append(Change("substitute", name, format_expr(e), str(NestRef(path))))


@primitive("permute_loops", positional="order", required=("order",), optional=("nest",))
def prim_permute_loops(ctx: RewriteContext, order, nest=None):
    """Reorder the loops of a nest (default: the site's nest): ``order[k]`` is the old
    position of the loop that goes to position ``k`` (kinds and extents move along).
    TVM: ``tvm.s_tir.Schedule.reorder``."""
    path = ctx.nest_ref(nest) if nest is not None else ctx.site_nest()
    n = get_nest(ctx.program, path)
    perm = tuple(ctx.value(order))
    if sorted(perm) != list(range(len(n.loops))):
        raise RewriteError(f"permute_loops: {perm} is not a permutation of {len(n.loops)} loops")
    loops = tuple(n.loops[i] for i in perm)
    ctx.program = replace_item(ctx.program, path, A.Nest(loops, n.body))
    ctx.changes.append(Change("loops", format_loops(n.loops), format_loops(loops), str(NestRef(path))))


@primitive("set_loop", optional=("nest", "pos", "kind", "extent", "var"))
def prim_set_loop(ctx: RewriteContext, nest=None, pos=None, kind=None, extent=None, var=None):
    """Change one loop's kind, extent and/or index name (default: the site's loop). A new
    index name is substituted in the nest's equations. TVM: ``sch.parallel``,
    ``sch.vectorize``, ``sch.unroll``, ``sch.bind``."""
    path = ctx.nest_ref(nest) if nest is not None else ctx.site_nest()
    p = ctx.value(pos) if pos is not None else ctx.site.loop
    n = get_nest(ctx.program, path)
    if p is None or not 0 <= p < len(n.loops):
        raise RewriteError(f"set_loop: no loop at position {p}")
    old = n.loops[p]
    k = ctx.value(kind) if kind is not None else old.kind
    e = ctx.value(extent) if extent is not None else old.extent
    v = ctx.value(var) if var is not None else old.var
    if k not in A.LOOP_KINDS or not isinstance(e, int) or e <= 0:
        raise RewriteError(f"set_loop: bad loop {k}^{{{e}}}")
    new = A.Loop(k, e, v)
    nest2 = A.Nest(n.loops[:p] + (new,) + n.loops[p + 1:], n.body)
    if v != old.var:
        nest2 = map_nest_exprs(nest2, lambda x: A.substitute_indices(x, {old.var: A.Index(v)}))
    ctx.program = replace_item(ctx.program, path, nest2)
    ctx.changes.append(Change("loops", format_loops((old,)), format_loops((new,)), str(NestRef(path))))


def _siblings_consecutive(paths: list[tuple[int, ...]]) -> bool:
    return all(a[:-1] == b[:-1] and b[-1] == a[-1] + 1 for a, b in zip(paths, paths[1:]))


@primitive("concat_nests", positional="nests", required=("nests",), optional=("loops",))
def prim_concat_nests(ctx: RewriteContext, nests, loops=None):
    """Fuse consecutive sibling nests into the first: the loops stay (they must be
    identical unless ``loops`` gives a template) and the bodies are concatenated in
    order, so one iteration runs every equation. TVM: ``sch.compute_at`` of the producer
    at the innermost shared loop."""
    paths = [ctx.nest_ref(x) for x in nests]
    if len(paths) < 2 or not _siblings_consecutive(paths):
        raise RewriteError("concat_nests needs two or more consecutive sibling nests")
    ns = [get_nest(ctx.program, p) for p in paths]
    if loops is None:
        if any(n.loops != ns[0].loops for n in ns):
            raise RewriteError("concat_nests: the nests' loops differ")
        new_loops = ns[0].loops
    else:
        new_loops = tuple(_instantiate(ctx, "loops", loops))
    fused = A.Nest(new_loops, tuple(item for n in ns for item in n.body))
    prog = replace_item(ctx.program, paths[0], fused)
    for p in reversed(paths[1:]):
        prog = replace_items(prog, p, ())
    ctx.program = prog
    ctx.shift(paths[1], -(len(paths) - 1))
    ctx.last_created = paths[0]
    ctx.changes.append(Change("fuse", " ".join(format_nest(n) for n in ns), format_nest(fused),
                              str(NestRef(paths[0]))))


@primitive("split_nest", required=("at",), optional=("nest",))
def prim_split_nest(ctx: RewriteContext, at, nest=None):
    """Operator fission: body items ``[0, at)`` stay, ``[at, ...)`` go to a new nest with
    the same loops placed right after it."""
    path = ctx.nest_ref(nest) if nest is not None else ctx.site_nest()
    n = get_nest(ctx.program, path)
    k = ctx.value(at)
    if not isinstance(k, int) or not 0 < k < len(n.body):
        raise RewriteError(f"split_nest: cannot split {len(n.body)} item(s) at {k}")
    a, b = A.Nest(n.loops, n.body[:k]), A.Nest(n.loops, n.body[k:])
    ctx.program = replace_items(ctx.program, path, (a, b))
    ctx.shift(path[:-1] + (path[-1] + 1,), +1)
    ctx.last_created = path[:-1] + (path[-1] + 1,)
    ctx.changes.append(Change("fission", format_nest(n), format_nest(a) + format_nest(b), str(NestRef(path))))


@primitive("insert_nest", required=("nest",), optional=("before", "after"), template_args={"nest": "nest"})
def prim_insert_nest(ctx: RewriteContext, nest, before=None, after=None):
    """Insert the instantiated nest template before or after a referenced nest."""
    if (before is None) == (after is None):
        raise RewriteError("insert_nest needs exactly one of before/after")
    ref = ctx.nest_ref(before if before is not None else after)
    new = _instantiate(ctx, "nest", nest)
    pos = ref if before is not None else ref[:-1] + (ref[-1] + 1,)
    cur = get_item(ctx.program, ref)
    items = (new, cur) if before is not None else (cur, new)
    ctx.program = replace_items(ctx.program, ref, items)
    ctx.shift(pos, +1)
    ctx.last_created = pos
    ctx.changes.append(Change("insert", "", format_nest(new), str(NestRef(pos))))


@primitive("remove_nest", positional="nest", required=("nest",))
def prim_remove_nest(ctx: RewriteContext, nest):
    """Remove a nest (the program must stay valid: checked after the rewrite)."""
    ref = ctx.nest_ref(nest)
    old = get_nest(ctx.program, ref)
    ctx.program = replace_items(ctx.program, ref, ())
    ctx.shift(ref, -1)
    ctx.changes.append(Change("remove", format_nest(old), "", str(NestRef(ref))))


@primitive("swap_nests", positional="nests", required=("nests",))
def prim_swap_nests(ctx: RewriteContext, nests):
    """Exchange two sibling nests (expression reorder)."""
    a, b = (ctx.nest_ref(x) for x in nests)
    if a[:-1] != b[:-1]:
        raise RewriteError("swap_nests needs sibling nests")
    na, nb = get_item(ctx.program, a), get_item(ctx.program, b)
    prog = replace_item(ctx.program, a, nb)
    ctx.program = replace_item(prog, b, na)
    ctx.changes.append(Change("swap", format_nest(na) + format_nest(nb), format_nest(nb) + format_nest(na),
                              f"{NestRef(a)},{NestRef(b)}"))


def _map_tensors(prog: A.Program, fn) -> tuple[A.Program, int]:
    count = 0

    def f(e):
        nonlocal count
        if isinstance(e, A.Tensor):
            r = fn(e)
            if r is not e:
                count += 1
            return r
        return e

    return A.map_program_exprs(prog, lambda e: A.transform(e, f)), count


@primitive("set_scope", required=("tensor", "scope"))
def prim_set_scope(ctx: RewriteContext, tensor, scope):
    """Give a tensor storage scope ``scope`` (g/s/l) at every occurrence. TVM:
    ``tvm.s_tir.Schedule.set_scope``."""
    name, sc = ctx.value(tensor), ctx.value(scope)
    if sc not in A.SCOPES:
        raise RewriteError(f"set_scope: unknown scope {sc!r}")
    first = next((t for t in iter_tensors(ctx.program) if t.name == name), None)
    if first is None:
        raise RewriteError(f"set_scope: tensor {name} does not occur")
    ctx.program, n = _map_tensors(ctx.program, lambda t: t.with_scope(sc) if t.name == name else t)
    ctx.changes.append(Change("scope", format_expr(first), format_expr(first.with_scope(sc)), name,
                              {"occurrences": n}))


@primitive("rename_tensor", required=("tensor", "to"))
def prim_rename_tensor(ctx: RewriteContext, tensor, to):
    """Rename a tensor at every occurrence (the new name must be unused)."""
    name, new = ctx.value(tensor), ctx.value(to)
    if new in program_names(ctx.module) - {name}:
        raise RewriteError(f"rename_tensor: {new} is already used")
    ctx.program, n = _map_tensors(
        ctx.program, lambda t: A.Tensor(new, t.dtype, t.scope, t.indices) if t.name == name else t)
    ctx.changes.append(Change("rename", name, new, name, {"occurrences": n}))


@primitive("set_loops", positional="loops", required=("loops",), optional=("nest",), template_args={"loops": "loops"})
def prim_set_loops(ctx: RewriteContext, loops, nest=None):
    """Replace a nest's whole loop list (default: the site's nest) by a loops template,
    which may splice loop-list values: ``"*?pre L^{?n/?f}_{?co=0}L^{?f}_{?ci=0} *?post"``
    with ``?pre``/``?post`` from ``slice(loops_of(?nest), ...)``. Equations are not
    touched (combine with ``substitute_index``)."""
    path = ctx.nest_ref(nest) if nest is not None else ctx.site_nest()
    n = get_nest(ctx.program, path)
    new = tuple(_instantiate(ctx, "loops", loops))
    if not new:
        raise RewriteError("set_loops: a nest needs at least one loop")
    vars_ = [l.var for l in new]
    if len(set(vars_)) != len(vars_):
        raise RewriteError(f"set_loops: duplicate loop index in {format_loops(new)}")
    ctx.program = replace_item(ctx.program, path, A.Nest(new, n.body))
    ctx.changes.append(Change("loops", format_loops(n.loops), format_loops(new), str(NestRef(path))))


def term_rewriter(ctx: RewriteContext, pattern: str, template: str, subscripts: bool, targets: bool = False):
    """The rewriting behind ``replace_all`` and ``replace_terms``: returns ``(fix, count)``
    where ``fix(item)`` rewrites an equation or nest (inner nests included), replacing every
    subterm matching the expression ``pattern`` by the ``template`` instantiated with the
    match (the pattern's metavariables extend ``ctx.env``; bound ones must match exactly),
    and ``count[0]`` counts the replacements. ``subscripts``: also inside tensor subscripts
    (of reads and of equation targets); ``targets``: an equation target matching the
    pattern is replaced too (the template must give a tensor). Raises :class:`RewriteError`
    when an instantiation fails or a target would stop being a tensor."""
    pat = P.parse_expr_pattern(pattern)
    sorts = P.metavar_sorts(pat)
    tpl = P.parse_expr_pattern(template)
    count = [0]

    def rewrite(e):
        env = P.match_node(pat, e, ctx.env, sorts)
        if env is not None:
            count[0] += 1
            try:
                return P.instantiate(tpl, env)
            except P.TemplateError as err:
                raise RewriteError(str(err)) from None
        if isinstance(e, A.Tensor) and not subscripts:
            return e
        kids = A.children(e)
        return A.rebuild(e, tuple(rewrite(c) for c in kids)) if kids else e

    def target(t: A.Tensor) -> A.Tensor:
        if targets:
            env = P.match_node(pat, t, ctx.env, sorts)
            if env is not None:
                count[0] += 1
                try:
                    new = P.instantiate(tpl, env)
                except P.TemplateError as err:
                    raise RewriteError(str(err)) from None
                if not isinstance(new, A.Tensor):
                    raise RewriteError(f"an equation target must stay a tensor, got {new}")
                return new
        if not subscripts:
            return t
        return t.with_indices(tuple(rewrite(i) for i in t.indices))

    def fix(item):
        if isinstance(item, A.Assign):
            return A.Assign(target(item.target), rewrite(item.value))
        return A.Nest(item.loops, tuple(fix(b) for b in item.body))

    return fix, count


@primitive("replace_all", required=("pattern", "with"), optional=("nest", "in_subscripts"),
           template_args={"pattern": "expr", "with": "expr"})
def prim_replace_all(ctx: RewriteContext, pattern, nest=None, in_subscripts=False, **kw):
    """Replace every value-position subterm matching ``pattern`` (in the whole program or
    one nest) by the ``with`` template; the pattern's metavariables extend the bindings.
    ``in_subscripts: true`` also rewrites inside tensor subscripts (index arithmetic such
    as ``?o*?f+?i``), equation targets included."""
    template = kw["with"]
    fix, count = term_rewriter(ctx, pattern, template, subscripts=bool(in_subscripts))
    if nest is not None:
        path = ctx.nest_ref(nest)
        ctx.program = replace_item(ctx.program, path, fix(get_nest(ctx.program, path)))
    else:
        ctx.program = A.Program(tuple(fix(n) for n in ctx.program.nests))
    ctx.changes.append(Change("replace_all", pattern, template, "", {"occurrences": count[0]}))


def split_when(raw_args):
    """``(args without 'when', condition or None)``: ``when: "?dir == read"`` runs the step
    only when the value expression is true (one rule, several rewrite variants)."""
    if isinstance(raw_args, dict) and "when" in raw_args:
        return {k: v for k, v in raw_args.items() if k != "when"}, raw_args["when"]
    return raw_args, None


def split_as(raw_args):
    """``(args without 'as', name or None)``: ``as: name`` (or ``?name``) on a creating step
    names the nest/equation it creates, for later steps of the same rule."""
    raw_args, _ = split_when(raw_args)
    if isinstance(raw_args, dict) and "as" in raw_args:
        rest = {k: v for k, v in raw_args.items() if k != "as"}
        name = raw_args["as"]
        if not isinstance(name, str) or not name.lstrip("?").isidentifier():
            raise RewriteError(f"as: expects a name, got {name!r}")
        return rest, name.lstrip("?")
    return raw_args, None


def run_primitive(ctx: RewriteContext, name: str, raw_args) -> None:
    """Run one rewrite step ``{name: args}``; ``as: new`` binds ``?new`` to the item the
    step created (a :class:`CreatedRef` that follows later structural edits)."""
    spec = PRIMITIVES.get(name)
    if spec is None:
        raise RewriteError(f"unknown rewrite primitive {name!r}; known: {sorted(PRIMITIVES)}")
    raw_args, when = split_when(raw_args)
    if when is not None and not ctx.value(when):
        return
    raw_args, as_name = split_as(raw_args)
    args = normalize_args(spec, raw_args)
    ctx.last_created = None
    spec.fn(ctx, **args)
    if as_name is not None:
        if ctx.last_created is None:
            raise RewriteError(f"{name} creates no nest or equation to name with as: {as_name}")
        ctx.created[as_name] = ctx.last_created
        ctx.env[as_name] = CreatedRef(as_name)


__all__ = [
    "RewriteError", "NestRef", "EqRef", "get_item", "get_nest", "replace_items", "replace_item",
    "value_children", "expr_at", "replace_expr", "value_occurrences", "map_nest_exprs", "nest_loop_vars",
    "iter_tensors", "RESERVED_INDEX_NAMES", "INDEX_ALPHABET", "TENSOR_ALPHABET", "program_names",
    "fresh_index_name", "fresh_tensor_name", "EvalContext", "VALUE_FUNCTIONS", "parse_value", "value_vars",
    "is_expression", "eval_value", "eval_let", "divisors", "permutations", "DOMAINS", "DOMAIN_MODIFIERS",
    "domain_values", "Change", "RewriteContext", "PrimitiveSpec", "PRIMITIVES", "primitive", "normalize_args",
    "parse_template", "run_primitive", "split_as", "split_when", "CreatedRef", "term_rewriter",
]

from . import structural  # noqa: E402,F401  (registers the structural primitives)
