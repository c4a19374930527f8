"""The rule language's values: value expressions (``let:``, ``params:`` and primitive
arguments such as ``?n/?f`` or ``loops_of(?N)``), their evaluator over the registry
:data:`VALUE_FUNCTIONS` (filled by :mod:`steptp.engine.values`), and parameter domains
(:data:`DOMAINS`: ``divisors_of``, ``choice``, ``range``, ``permutations_of`` with the
modifiers ``exclude``, ``exclude_identity``, ``keep_innermost_kinds``, ``innermost``,
``require``).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from fractions import Fraction
from typing import Callable, Iterable

from ..leir import ast as A
from ..leir.fileformat import LeirModule
from . import patterns as P


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
#: variadic. Defined in :mod:`steptp.engine.values`, :mod:`steptp.engine.tiling` and
#: :mod:`steptp.engine.signs`, which fill this registry on import through
#: :func:`register_value_functions` (the engine package imports them first).
VALUE_FUNCTIONS: dict[str, tuple[int, Callable]] = {}


def register_value_functions(functions: dict[str, tuple[int, Callable]]) -> None:
    """Add ``functions`` (name -> (arity, fn)) to :data:`VALUE_FUNCTIONS`. Raises
    ``RuntimeError`` when a name is already registered (one definition per value function)."""
    dup = sorted(set(functions) & set(VALUE_FUNCTIONS))
    if dup:
        raise RuntimeError(f"value function(s) defined twice: {', '.join(dup)}")
    VALUE_FUNCTIONS.update(functions)


def parse_value(src: str):
    """Parse a value expression (``?n/?f``, ``loops_of(?N)``, ``3``, ``"s"``, bare words as
    string literals, comparisons, ``not``/``and``/``or``) with the ``value`` rule of the
    rule grammar (``steptp/leir/pattern.lark``, see :func:`steptp.engine.patterns.parse_value_tree`);
    raises :class:`~steptp.engine.patterns.PatternError` naming line and column. The tree
    is immutable (nested tuples) and cached per text."""
    return P.parse_value_tree(src)


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
    ``(`` are value expressions, other strings are literals. An expression is compiled
    once per text into nested closures (:func:`_compile`)."""
    if isinstance(v, list):
        return tuple(eval_value(x, ctx) for x in v)
    if not isinstance(v, str):
        return v
    fn = _COMPILED.get(v)
    if fn is None:
        if not is_expression(v):
            return v
        fn = _COMPILED[v] = _compile(parse_value(v))
    return fn(ctx)


#: value-expression text -> compiled evaluator (texts come from the rules: bounded)
_COMPILED: dict[str, Callable] = {}


def _compile(t) -> Callable:
    """A parsed value tree (:func:`parse_value`) -> ``fn(ctx)`` evaluating it: ``and``/``or``
    short-circuit to booleans, comparisons of incomparable values, unbound metavariables,
    unknown functions, wrong arities, arithmetic on non-numbers and inexact integer ``/`` raise
    :class:`ValueExprError`; ``Int`` bindings read as Python ints. Compiled once per text
    (a domain's ``require:`` conditions are evaluated once per candidate value; walking the
    tree each time was a third of the time to list candidates)."""
    kind = t[0]
    if kind == "lit":
        v = t[1]
        return lambda ctx: v
    if kind == "and":
        a, b = _compile(t[1]), _compile(t[2])
        return lambda ctx: bool(a(ctx)) and bool(b(ctx))
    if kind == "or":
        a, b = _compile(t[1]), _compile(t[2])
        return lambda ctx: bool(a(ctx)) or bool(b(ctx))
    if kind == "not":
        a = _compile(t[1])
        return lambda ctx: not bool(a(ctx))
    if kind == "cmp":
        op, a, b = t[1], _compile(t[2]), _compile(t[3])
        return lambda ctx: _compare(op, a(ctx), b(ctx))
    if kind == "var":
        name = t[1]

        def f_var(ctx):
            try:
                v = ctx.env[name]
            except KeyError:
                raise ValueExprError(f"?{name} is not bound here") from None
            return v.value if isinstance(v, A.Int) else v
        return f_var
    if kind == "call":
        fname, args = t[1], [_compile(a) for a in t[2]]
        entry = VALUE_FUNCTIONS.get(fname)  # registered at import, never replaced
        if entry is not None and (entry[0] < 0 or entry[0] == len(args)):
            fn = entry[1]
            if len(args) == 1:
                a0 = args[0]
                return lambda ctx: fn(ctx, a0(ctx))
            if len(args) == 2:
                a0, a1 = args
                return lambda ctx: fn(ctx, a0(ctx), a1(ctx))
            return lambda ctx: fn(ctx, *[a(ctx) for a in args])

        def f_call(ctx):
            if fname not in VALUE_FUNCTIONS:
                raise ValueExprError(f"unknown function {fname}")
            arity, fn = VALUE_FUNCTIONS[fname]
            if arity >= 0 and len(args) != arity:  # arity -1: variadic, checked by fn
                raise ValueExprError(f"{fname} takes {arity} argument(s)")
            return fn(ctx, *[a(ctx) for a in args])
        return f_call
    op, a, b = t[1], _compile(t[2]), _compile(t[3])

    def f_op(ctx):
        x, y = a(ctx), b(ctx)
        if isinstance(x, int) and isinstance(y, int):
            return _arith(op, x, y)
        qx, qy = _rational(x), _rational(y)
        if qx is None or qy is None:
            raise ValueExprError(f"arithmetic on non-numbers {x!r} {op} {y!r}")
        return _arith(op, qx, qy)
    return f_op


def _rational(v) -> Fraction | None:
    """``v`` as an exact rational: an int, a decimal literal (a ``Fraction``) or a bound
    finite float constant of the program (``A.Float``, ``-A.Float``; a double is a dyadic
    rational); None for anything else."""
    if isinstance(v, (int, Fraction)):
        return Fraction(v)
    neg = isinstance(v, A.Neg)
    f = v.operand if neg else v
    if isinstance(f, A.Float) and math.isfinite(f.value):
        q = Fraction(f.value)
        return -q if neg else q
    return None


def _arith(op: str, a, b):
    """``a op b`` of a value expression: on two ints integer arithmetic (``/`` only where it
    divides exactly, else :class:`ValueExprError`); on exact rationals (an expression with a
    decimal or a float constant in it, ``Fraction``) ``/`` is exact, ``//`` floors to an int,
    and division by zero raises :class:`ValueExprError`."""
    if op == "+":
        return a + b
    if op == "-":
        return a - b
    if op == "*":
        return a * b
    exact = isinstance(a, Fraction) or isinstance(b, Fraction)
    if exact and b == 0:
        raise ValueExprError(f"{a} {op} 0: division by zero")
    if op == "/":
        if exact:
            return a / b
        if b == 0 or a % b:
            raise ValueExprError(f"{a}/{b} is not an exact division")
        return a // b
    if op == "//":
        return a // b
    return a % b


_CMP_FN = {"<": lambda a, b: a < b, "<=": lambda a, b: a <= b, ">": lambda a, b: a > b,
           ">=": lambda a, b: a >= b, "==": lambda a, b: a == b, "!=": lambda a, b: a != b}


def _compare(op: str, x, y) -> bool:
    """``x op y``; incomparable values raise :class:`ValueExprError`. With a decimal (a
    ``Fraction``) on one side, a bound float constant on the other is compared as the exact
    rational it is (``?c == 16.0``)."""
    if isinstance(x, Fraction) or isinstance(y, Fraction):
        qx, qy = _rational(x), _rational(y)
        if qx is not None and qy is not None:
            x, y = qx, qy
    try:
        return _CMP_FN[op](x, y)
    except TypeError:
        raise ValueExprError(f"cannot compare {x!r} {op} {y!r}") from None


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


def _domain_values(spec: dict, ctx: EvalContext, name: str | None = None) -> list:
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
    if spec.get("exclude"):
        ex = {_norm(eval_value(x, ctx)) for x in spec["exclude"]}
        vals = [v for v in vals if _norm(v) not in ex]
    req = spec.get("require")
    if req and vals:
        conds = req if isinstance(req, list) else [req]
        env = dict(ctx.env) if name else ctx.env
        sub = EvalContext(ctx.module, env)  # one context, ?name rebound for each value
        checks = [_require_fn(c, name) for c in conds]
        memo: dict = {}  # values of the subexpressions that do not read ?name
        kept = []
        for v in vals:
            if name:
                env[name] = v
            if all(bool(f(sub, memo)) for f in checks):
                kept.append(v)
        vals = kept
    return vals


_REQUIRE: dict[tuple, Callable] = {}


def _require_fn(cond, name: str | None) -> Callable:
    """``fn(ctx, memo)`` evaluating the ``require:`` condition ``cond`` of parameter ``name``
    like :func:`eval_value`, except that a subexpression not reading ``?name`` is evaluated
    once per domain (on first use, kept in ``memo``) instead of once per candidate value:
    value functions are pure, so every value sees the same result, in the same order of
    evaluation and with the same errors. Compiled once per (text, name)."""
    key = (cond, name)
    fn = _REQUIRE.get(key)
    if fn is None:
        if not is_expression(cond):
            fn = lambda ctx, memo, v=cond: v  # noqa: E731
        else:
            fn = _specialize(parse_value(cond), name)
        _REQUIRE[key] = fn
    return fn


def _specialize(t, name: str | None) -> Callable:
    if name is None or name not in value_vars(t):
        f = _compile(t)
        k = object()  # this subexpression's slot in the memo

        def constant(ctx, memo):
            if k in memo:
                return memo[k]
            v = memo[k] = f(ctx)
            return v
        return constant
    kind = t[0]
    if kind in ("and", "or"):
        a, b = _specialize(t[1], name), _specialize(t[2], name)
        if kind == "and":
            return lambda ctx, memo: bool(a(ctx, memo)) and bool(b(ctx, memo))
        return lambda ctx, memo: bool(a(ctx, memo)) or bool(b(ctx, memo))
    if kind == "not":
        a = _specialize(t[1], name)
        return lambda ctx, memo: not bool(a(ctx, memo))
    if kind == "cmp":
        op, a, b = t[1], _specialize(t[2], name), _specialize(t[3], name)
        return lambda ctx, memo: _compare(op, a(ctx, memo), b(ctx, memo))
    f = _compile(t)  # a call or arithmetic reading ?name: evaluated per value
    return lambda ctx, memo: f(ctx)


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
    return [_norm(v) for v in _domain_values(spec, ctx, name)]
