"""Subscript-aware sympy normal forms of LEIR expressions (the math strategies' engine).

The paper's algebraic strategies (App. A.3: factorization, cancellation, apart, together,
powsimp, collect and their inverses) are named after sympy's normal-form functions. This
module is the one generic bridge between LEIR and sympy that every math rule uses:

* :func:`to_sympy` / :func:`from_sympy` convert both ways. **Every distinct tensor access
  (name and subscript together) is its own real symbol** (``A_{tx,a}`` and ``A_{tx,c}`` are
  two symbols; the paper's code merged them, which is unsound). ``exp abs max min erf
  tanh`` and ``**`` map to ``sympy.exp Abs Max Min erf tanh Pow``; ``sqrt`` and ``log``
  map to uninterpreted real functions (:data:`SQRT`, :data:`LOG`: their arguments stay as
  written and no domain-dependent identity fires); anything
  else (``if_then_else``, ``//``, ``%``, comparisons, ``inf``) becomes an *opaque* symbol
  that sympy treats as an unknown and that converts back to exactly the same LEIR.
  Decimal literals become exact rationals (``1e-05`` -> ``1/100000``), so a rewrite can
  never be a mere reformatting of a number. Small integer powers print back as products
  (``x**2`` -> ``x*x``), ``x**(1/2)`` as ``sqrt(x)``.
* :data:`FUNCTIONS` names the normal forms (``factor``, ``expand``, ``cancel``,
  ``expand_cancel``, ``apart``, ``together``, ``powsimp``, ``expand_powsimp``, ``collect``,
  ``distribute``); :func:`normal_form` applies one to a LEIR expression and returns the
  new LEIR expression, or ``None`` when the site is not a candidate: the function changes
  nothing, only reformats (the result prints like the unchanged round trip or like the
  input), leaves LEIR (e.g. produces ``sign``), or runs past the time limit.
* :func:`algebraic_target` picks what a site rewrites: an ``expr`` site's subterm, or an
  equation's value - only ``f`` of an accumulation ``X = X + f`` (also ``*``, ``-``,
  ``max``, ``min``), never the accumulator form.
* :func:`symbolic_check` tries to prove ``before == after`` (bounded egglog equality
  saturation first, :mod:`steptp.engine.equiv`; then sympy ``simplify(before - after) ==
  0``, bounded in time) and returns ``proved``,
  ``disproved`` (a high-precision evaluation at random points differs) or ``unknown``.
  Both provers reason over the reals, so "proved" is granted only where the identity also
  holds in floating point (design.md §8): a rewrite that divides by, takes ``log``/``sqrt``
  or a negative/fractional power of an operand the original does not already treat so (or
  drops such an operation of the original) is at best ``unknown`` unless
  :mod:`steptp.engine.signs` proves the operand safe (non-zero, positive, non-negative;
  finite).

Conversion is deterministic (symbols are named after the canonical LEIR text of what they
stand for, and terms are emitted in sympy's ordered-terms order) and bounded in time
(:data:`TIME_LIMIT_S` per call, enforced with ``SIGALRM`` in the main thread, plus a size
limit :data:`MAX_NODES`), so a pathological expression costs one candidate, not the run.

Sources: sympy 1.14 (``factor``, ``expand``, ``cancel``, ``apart``, ``together``,
``powsimp``, ``collect``, ``simplify``); paper App. A.3; reference-notes §6.1 (what the
paper's code did wrong and this module does not).
"""

from __future__ import annotations

import math
import random
from fractions import Fraction
from functools import lru_cache
from typing import Callable

import sympy as sp

from ..leir import ast as A
from ..leir.printer import format_expr
from ..timelimit import time_limit as _time_limit

#: Seconds one sympy call may take before the site is dropped.
TIME_LIMIT_S = 2.0
#: Largest expression (LEIR nodes, subscripts excluded) handed to sympy.
MAX_NODES = 400
#: dtypes whose equations the math rules may rewrite.
FLOAT_DTYPES = frozenset({"f16", "bf16", "f32", "f64"})


class AlgebraError(ValueError):
    """An expression cannot be converted (unsupported sympy construct, too large, time-out)."""


class AlgebraTimeout(AlgebraError):
    """A sympy call ran past :data:`TIME_LIMIT_S`."""


def time_limit(seconds: float = TIME_LIMIT_S):
    """Raise :class:`AlgebraTimeout` if the block runs longer than ``seconds`` (SIGALRM;
    only in the main thread - elsewhere the size limit :data:`MAX_NODES` is the bound).
    An outer limit keeps its deadline (:func:`steptp.timelimit.time_limit`)."""
    return _time_limit(seconds, "sympy", lambda: AlgebraTimeout(f"sympy took longer than {seconds:g} s"))


# ---------------------------------------------------------------------------
# LEIR -> sympy
# ---------------------------------------------------------------------------


class SymbolTable:
    """Symbols of one conversion: sympy symbol <-> the LEIR expression it stands for.

    A tensor access is named after its canonical text (``A^{f32,g}_{tx,a}``), an index
    used as a value after its name, an opaque subterm ``@`` + its text; equal texts give
    the same symbol, different subscripts different symbols."""

    def __init__(self):
        self.by_text: dict[str, sp.Symbol] = {}
        self.leir: dict[sp.Symbol, A.Expr] = {}

    def symbol(self, e: A.Expr, opaque: bool = False) -> sp.Symbol:
        text = ("@" if opaque else "") + format_expr(e)
        s = self.by_text.get(text)
        if s is None:
            s = sp.Symbol(text, real=True)
            self.by_text[text] = s
            self.leir[s] = e
        return s


#: ``sqrt`` and ``log`` are *uninterpreted* real functions for sympy: their arguments are
#: never rewritten (``together`` would otherwise turn ``sqrt(v+1e-05)`` into
#: ``sqrt(100000*v+1)/(100*sqrt(10))``) and no domain-dependent identity is applied
#: automatically (``log(exp(x)) -> x``, ``sqrt(x)*sqrt(x) -> x``).
SQRT = sp.Function("sqrt", real=True)
LOG = sp.Function("log", real=True)

_FN_TO_SYMPY: dict[str, Callable] = {
    "exp": sp.exp, "log": LOG, "sqrt": SQRT, "abs": sp.Abs, "erf": sp.erf, "tanh": sp.tanh,
    "max": sp.Max, "min": sp.Min,
}


def _number(v: float) -> sp.Expr:
    if math.isinf(v) or math.isnan(v):
        raise AlgebraError("non-finite literal")
    return sp.Rational(repr(float(v)))


def count_nodes(e: A.Expr) -> int:
    """Value-position nodes of ``e`` (a tensor access counts once)."""
    if isinstance(e, A.Tensor):
        return 1
    return 1 + sum(count_nodes(c) for c in A.children(e))


def to_sympy(e: A.Expr, table: SymbolTable, keep: bool = True) -> sp.Expr:
    """Convert a LEIR value expression to sympy (see the module docstring). With ``keep``
    a product ``c*(x+y)`` of a number and a sum stays as written (sympy would distribute
    it); ``keep=False`` gives sympy's fully evaluated form.

    Raises :class:`AlgebraError` when ``e`` has more than :data:`MAX_NODES` nodes."""
    if count_nodes(e) > MAX_NODES:
        raise AlgebraError(f"expression larger than {MAX_NODES} nodes")
    return _to(e, table, keep)


def _to(e: A.Expr, t: SymbolTable, keep: bool = True) -> sp.Expr:
    if isinstance(e, A.Int):
        return sp.Integer(e.value)
    if isinstance(e, A.Float):
        if math.isinf(e.value):
            return t.symbol(e, opaque=True)
        return _number(e.value)
    if isinstance(e, (A.Tensor, A.Index)):
        return t.symbol(e)
    if isinstance(e, A.Neg):
        return -_to(e.operand, t, keep)
    if isinstance(e, A.BinOp):
        if e.op in ("//", "%"):
            return t.symbol(e, opaque=True)
        a, b = _to(e.lhs, t, keep), _to(e.rhs, t, keep)
        if e.op == "+":
            return a + b
        if e.op == "-":
            return a - b
        if e.op == "*":
            if keep and ((a.is_Number and b.is_Add) or (b.is_Number and a.is_Add)):
                # keep c*(x+y) as written: sympy would distribute the number automatically,
                # rewriting e.g. a tanh argument that the named step never touches
                return sp.Mul(a, b, evaluate=False)
            return a * b
        if e.op == "/":
            return a / b
        return sp.Pow(a, b)
    if isinstance(e, A.Call) and e.func in _FN_TO_SYMPY:
        return _FN_TO_SYMPY[e.func](*[_to(x, t, keep) for x in e.args])
    return t.symbol(e, opaque=True)  # if_then_else, comparisons, boolean operators


# ---------------------------------------------------------------------------
# sympy -> LEIR
# ---------------------------------------------------------------------------


def _terminating(q: int) -> bool:
    for p in (2, 5):
        while q % p == 0:
            q //= p
    return q == 1


def _lit(v) -> A.Expr:
    f = float(v)
    if not math.isfinite(f):
        raise AlgebraError(f"constant {v} is not a finite float")
    return A.Float(f) if f >= 0 else A.Neg(A.Float(-f))


def _rational(r: sp.Rational) -> A.Expr:
    """A rational constant: a decimal literal when it terminates (0.5, 1e-05), else p/q."""
    if r.q == 1 or _terminating(int(r.q)):
        return _lit(r)
    num = A.BinOp("/", A.Float(float(abs(r.p))), A.Float(float(r.q)))
    return A.Neg(num) if r.p < 0 else num


def _product(items: list[A.Expr]) -> A.Expr:
    out = items[0]
    for x in items[1:]:
        out = A.BinOp("*", out, x)
    return out


def from_sympy(s: sp.Expr, table: SymbolTable) -> A.Expr:
    """Convert a sympy expression made of the table's symbols back to LEIR.

    Raises :class:`AlgebraError` for constructs LEIR lacks (``sign``, ``I``, ``Piecewise``,
    ``zoo``...)."""
    if isinstance(s, sp.Symbol):
        if s not in table.leir:
            raise AlgebraError(f"unknown symbol {s}")
        return table.leir[s]
    if s.is_Rational:
        return _rational(s)
    if s.is_Float:
        return _lit(s)
    if s.is_Number or s in (sp.pi, sp.E):
        return _lit(s.evalf(20))
    if s.is_Add:
        terms = s.as_ordered_terms()
        pos = [t for t in terms if not t.could_extract_minus_sign()]
        if pos and pos[0] is not terms[0]:  # start with a positive term: a+b-c rather than -c+a+b
            terms = [pos[0]] + [t for t in terms if t is not pos[0]]
        first = terms[0]
        out = A.Neg(from_sympy(-first, table)) if first.could_extract_minus_sign() and not first.is_Number \
            else from_sympy(first, table)
        for t in terms[1:]:
            if t.could_extract_minus_sign():
                out = A.BinOp("-", out, from_sympy(-t, table))
            else:
                out = A.BinOp("+", out, from_sympy(t, table))
        return out
    if s.is_Mul:
        coeff, rest = s.as_coeff_Mul()
        if coeff == -1:
            return A.Neg(from_sympy(-s, table))
        num: list[A.Expr] = []
        den: list[A.Expr] = []
        if coeff != 1:
            if coeff.is_Rational and coeff.q != 1 and not _terminating(int(coeff.q)):
                if coeff.p != 1:
                    num.append(_lit(coeff.p))
                den.append(_lit(coeff.q))
            else:
                num.append(from_sympy(coeff, table))
        for f in rest.as_ordered_factors():
            if f.is_Pow and f.exp.is_Rational and f.exp.is_negative:
                den.append(from_sympy(sp.Pow(f.base, -f.exp), table))
            else:
                num.append(from_sympy(f, table))
        top = _product(num) if num else A.Float(1.0)
        if not den:
            return top
        return A.BinOp("/", top, _product(den))
    if s.is_Pow:
        b, x = s.base, s.exp
        if b == sp.E:
            return A.Call("exp", (from_sympy(x, table),))
        if x.is_Rational and x.is_negative:
            return A.BinOp("/", A.Float(1.0), from_sympy(sp.Pow(b, -x), table))
        if x == sp.Rational(1, 2):
            return A.Call("sqrt", (from_sympy(b, table),))
        if x.is_Integer and 2 <= int(x) <= 4:
            base = from_sympy(b, table)
            return _product([base] * int(x))
        if x.is_Rational and x.q == 2:  # b**(k/2) = b**k' * sqrt(b)
            return A.BinOp("*", from_sympy(sp.Pow(b, (x.p - 1) // 2), table),
                           A.Call("sqrt", (from_sympy(b, table),)))
        return A.BinOp("**", from_sympy(b, table), from_sympy(x, table))
    fn = s.func
    names = {sp.exp: "exp", LOG: "log", SQRT: "sqrt", sp.Abs: "abs", sp.erf: "erf", sp.tanh: "tanh"}
    if fn in names and len(s.args) == 1:
        return A.Call(names[fn], (from_sympy(s.args[0], table),))
    if fn in (sp.Max, sp.Min):
        args = [from_sympy(a, table) for a in sorted(s.args, key=sp.default_sort_key)]
        name = "max" if fn is sp.Max else "min"
        out = args[0]
        for a in args[1:]:
            out = A.Call(name, (out, a))
        return out
    raise AlgebraError(f"sympy produced {fn.__name__}, which LEIR does not have")


def _fmt(s: sp.Expr, table: SymbolTable) -> str:
    return format_expr(from_sympy(s, table))


# ---------------------------------------------------------------------------
# Normal-form functions
# ---------------------------------------------------------------------------


def _factor(e, _x=None):
    """``sympy.factor`` (``sympy.factor_terms`` for a sum containing fractions, so that
    factorization never puts terms over a common denominator: that is ``together``), with a pulled-out numeric content pushed back into the first sum
    (``1e-05*(100000*x+1)`` is ``x+1e-05`` again): scaling by a constant is no factorization."""
    if sp.fraction(sp.together(e))[1] != 1 and e.is_Add:
        r = sp.factor_terms(e)  # a sum with fractions: pull out common factors, keep the fractions
    else:
        r = sp.factor(e)
    coeff, rest = r.as_coeff_Mul()
    if not e.is_Add:
        return r
    if coeff not in (1, -1) and rest.is_Mul:
        fs = list(rest.as_ordered_factors())
        for i, f in enumerate(fs):
            if f.is_Add:
                fs[i] = sp.expand_mul(coeff * f)
                return sp.Mul(*fs)
    if coeff not in (1, -1) and rest.is_Add:
        return sp.expand_mul(r)
    return r


def _expand(e, _x=None):
    """Multiply out products and integer powers of sums (sympy ``expand`` with ``mul`` and
    ``multinomial``) at the site itself: function calls are frozen, so an argument such as
    ``tanh(c*(x+y))`` is left as written."""
    calls = sorted({f for f in e.atoms(sp.Function)}, key=sp.default_sort_key)
    frozen = {f: sp.Dummy(f"f{i}") for i, f in enumerate(calls)}
    r = sp.expand(e.xreplace(frozen), power_exp=False, power_base=False, log=False, mul=True, multinomial=True)
    return r.xreplace({v: k for k, v in frozen.items()})


def _expand_powsimp(e, _x=None):
    return sp.expand(e, mul=False, multinomial=False, power_exp=True, power_base=True, log=False)


def _distribute(e, x):
    """Distribute ``x`` over the one sum it multiplies, in every top-level term ``x*(s1+s2)``
    (the inverse of ``collect(e, x)``); terms with two or more sum factors are left alone."""
    out = []
    changed = False
    for t in sp.Add.make_args(e):
        fs = sp.Mul.make_args(t)
        sums = [f for f in fs if f.is_Add]
        if t.is_Mul and x in fs and len(sums) == 1:
            s = sums[0]
            rest = sp.Mul(*[f for f in fs if f is not s])
            out.append(sp.Add(*[rest * a for a in s.args]))
            changed = True
        else:
            out.append(t)
    return sp.Add(*out) if changed else e


def _apart(e, x):
    """``sympy.apart(e, x)``, kept only when every partial fraction's denominator divides the
    original denominator: partial fractions in ``x`` with other symbols as parameters can
    introduce new poles (``1/(c-1)``) where the original is finite, and near them the
    rewrite loses all accuracy - such sites are not candidates (floating-point honesty)."""
    r = sp.apart(e, x)
    d0 = sp.fraction(sp.together(e))[1]
    f0 = {f for f, _ in sp.factor_list(d0)[1]}
    for t in sp.Add.make_args(r):
        d = sp.fraction(sp.together(t))[1]
        for f, _ in sp.factor_list(d)[1]:
            if f not in f0 and -f not in f0:
                return e
    return r


def _expand_cancel(e, c):
    """``n/d -> (n*c)/(d*c)`` with both products multiplied out and exponentials combined
    (the inverse of ``cancel``: the common factor ``c`` is put back)."""
    n, d = sp.fraction(e)
    if d == 1:
        return e
    n2 = sp.powsimp(sp.expand(n * c, power_exp=False, power_base=False, log=False), combine="exp")
    d2 = sp.powsimp(sp.expand(d * c, power_exp=False, power_base=False, log=False), combine="exp")
    return sp.Mul(n2, sp.Pow(d2, -1))


#: name -> (function(expr, arg) -> expr, takes an argument). The argument of ``apart``,
#: ``collect`` and ``distribute`` is a symbol-like subterm of the site (:func:`atoms`),
#: that of ``expand_cancel`` the common factor to put back (:func:`exp_factors`).
FUNCTIONS: dict[str, tuple[Callable, bool]] = {
    "factor": (_factor, False),
    "expand": (_expand, False),
    "cancel": (lambda e, _x=None: sp.cancel(e), False),
    "expand_cancel": (_expand_cancel, True),
    "apart": (_apart, True),
    "together": (lambda e, _x=None: sp.together(e), False),
    "powsimp": (lambda e, _x=None: sp.powsimp(e, combine="all"), False),
    "expand_powsimp": (_expand_powsimp, False),
    "collect": (lambda e, x: sp.collect(e, x), True),
    "distribute": (_distribute, True),
}


#: How each normal form is done in sympy terms (for the CoT).
SYMPY_CALLS: dict[str, str] = {
    "factor": "factor", "expand": "expand (mul, multinomial)", "cancel": "cancel",
    "expand_cancel": "fraction and expand (numerator and denominator times one factor)", "apart": "apart",
    "together": "together", "powsimp": "powsimp", "expand_powsimp": "expand (power_exp, power_base)",
    "collect": "collect", "distribute": "expand_mul (one factor over one sum)",
}


def atoms(e: A.Expr) -> list[A.Expr]:
    """Distinct symbol-like subterms of ``e`` usable as the argument of ``collect``,
    ``apart`` and ``distribute``: tensor accesses and calls of exp/log/sqrt/tanh/erf (in
    value positions, first-occurrence order)."""
    out: list[A.Expr] = []

    def rec(x):
        if isinstance(x, A.Tensor) or (isinstance(x, A.Call) and x.func in ("exp", "log", "sqrt", "tanh", "erf")):
            if x not in out:
                out.append(x)
        if isinstance(x, A.Tensor) or (isinstance(x, A.Call) and x.func == "if_then_else"):
            return
        for c in A.children(x):
            rec(c)

    rec(e)
    return out


def exp_factors(e: A.Expr) -> list[A.Expr]:
    """Common factors ``expand_cancel`` may put back: ``exp(u)`` and ``exp(-u)`` for every
    ``exp(u)`` of ``e`` (never zero, so no ``0/0`` is introduced)."""
    out: list[A.Expr] = []
    for x in atoms(e):
        if isinstance(x, A.Call) and x.func == "exp":
            u = x.args[0]
            if isinstance(u, A.Neg):
                neg = u.operand
            elif isinstance(u, A.BinOp) and u.op == "*" and isinstance(u.lhs, (A.Int, A.Float)):
                neg = A.BinOp("*", A.Neg(u.lhs), u.rhs)
            else:
                neg = A.Neg(u)
            for c in (x, A.Call("exp", (neg,))):
                if c not in out:
                    out.append(c)
    return out


def _apply(expr: A.Expr, function: str, arg: A.Expr | None) -> tuple[A.Expr, sp.Expr, sp.Expr, SymbolTable] | None:
    if function not in FUNCTIONS:
        raise AlgebraError(f"unknown normal form {function!r}; known: {sorted(FUNCTIONS)}")
    fn, takes = FUNCTIONS[function]
    table = SymbolTable()
    with time_limit():
        s = to_sympy(expr, table)
        x = None
        if takes:
            if arg is None:
                raise AlgebraError(f"{function} needs an argument")
            x = to_sympy(arg, table)
        r = fn(s, x)
        if r == s:
            return None
        new = from_sympy(r, table)
        same = from_sympy(s, table)
        evaluated = from_sympy(to_sympy(expr, table, keep=False), table)
    if new in (same, expr, evaluated):
        return None  # only a reformatting, or only sympy's automatic evaluation
    return new, s, r, table


@lru_cache(maxsize=4096)
def _normal_form_cached(expr: A.Expr, function: str, arg: A.Expr | None) -> A.Expr | None:
    try:
        res = _apply(expr, function, arg)
    except (AlgebraError, sp.PolynomialError, sp.SympifyError, ValueError, TypeError, NotImplementedError,
            RecursionError, ZeroDivisionError, AttributeError):
        return None
    return None if res is None else res[0]


def normal_form(expr: A.Expr, function: str, arg: A.Expr | None = None) -> A.Expr | None:
    """Apply the sympy normal form ``function`` (see :data:`FUNCTIONS`) to a LEIR value
    expression; ``arg`` is the subterm argument of ``apart``/``collect``/``distribute``/
    ``expand_cancel``.

    Returns the rewritten LEIR expression, or ``None`` when this is not a candidate: the
    function changes nothing or only reformats, the result leaves LEIR, or sympy fails /
    takes longer than :data:`TIME_LIMIT_S`. Deterministic and cached.

    Raises :class:`AlgebraError` only for an unknown function name."""
    if function not in FUNCTIONS:
        raise AlgebraError(f"unknown normal form {function!r}; known: {sorted(FUNCTIONS)}")
    return _normal_form_cached(expr, function, arg)


def describe(expr: A.Expr, function: str, arg: A.Expr | None = None) -> str:
    """One sentence naming the algebraic step ``function`` performs on ``expr`` (the common
    factor pulled out, the common denominator, the combined powers...), for the CoT."""
    try:
        res = _apply(expr, function, arg)
    except Exception:  # noqa: BLE001 - a description is best effort
        return ""
    if res is None:
        return ""
    new, s, r, t = res
    f = lambda x: "'" + _fmt(x, t) + "'"  # noqa: E731
    try:
        with time_limit():
            if function == "factor":
                parts = [p for p in sp.Mul.make_args(r) if not p.is_Number]
                return "it is written as the product of the factors " + ", ".join(f(p) for p in parts)
            if function == "expand":
                return "every product of sums is multiplied out into the " + str(len(sp.Add.make_args(r))) + \
                       " terms " + ", ".join(f(p) for p in sp.Add.make_args(r))
            if function == "cancel":
                n, d = sp.fraction(s)
                if d == 1:
                    n, d = sp.fraction(sp.together(s))
                g = sp.gcd(n, d)
                common = f"the common factor {f(g)} of numerator and denominator is cancelled" if g != 1 \
                    else "numerator and denominator are brought to lowest terms"
                n2, d2 = sp.fraction(r)
                return common + f", leaving numerator {f(n2)} over denominator {f(d2)}"
            if function == "expand_cancel":
                return f"numerator and denominator are both multiplied by the common factor {f(to_sympy(arg, t))}"
            if function == "together":
                n, d = sp.fraction(r)
                return f"the fractions are put over the common denominator {f(d)}, with numerator {f(n)}"
            if function == "apart":
                terms = sp.Add.make_args(r)
                return f"the rational function of {f(to_sympy(arg, t))} is split into the partial fractions " + \
                    ", ".join(f(p) for p in terms)
            if function == "powsimp":
                new_pows = [p for p in sp.preorder_traversal(r) if (p.is_Pow or isinstance(p, sp.exp))
                            and p not in set(sp.preorder_traversal(s))]
                return "powers with a common base are combined into " + ", ".join(f(p) for p in new_pows[:3])
            if function == "expand_powsimp":
                old_pows = [p for p in sp.preorder_traversal(s) if (p.is_Pow or isinstance(p, sp.exp))
                            and p not in set(sp.preorder_traversal(r))]
                return "the power(s) " + ", ".join(f(p) for p in old_pows[:3]) + \
                    " are split into a product of powers with the same base"
            if function == "collect":
                x = to_sympy(arg, t)
                coeff = sp.collect(s, x, evaluate=False)
                parts = [f"{f(k)} with coefficient {f(v)}" for k, v in coeff.items() if k != 1]
                return f"the terms containing {f(x)} are collected: " + "; ".join(parts)
            if function == "distribute":
                return f"the factor {f(to_sympy(arg, t))} is multiplied into the sum it multiplies"
    except Exception:  # noqa: BLE001
        return ""
    return ""


# ---------------------------------------------------------------------------
# Sites
# ---------------------------------------------------------------------------

_ACC_OPS = {"+", "-", "*"}


def _spine(v: A.Expr, ops: tuple[str, ...]) -> list[tuple[str, A.Expr]]:
    """Left spine of a chain ``((x op1 t1) op2 t2) ...`` as ``[("", x), (op1, t1), ...]``."""
    out = []
    while isinstance(v, A.BinOp) and v.op in ops:
        out.append((v.op, v.rhs))
        v = v.lhs
    out.append(("", v))
    return out[::-1]


def accumulation(eq: A.Assign) -> tuple[str, A.Expr] | None:
    """``(op, f)`` when ``eq`` is an accumulation ``X = X op f`` written as a chain
    ``X + t1 - t2 + ...`` (op ``+``, f = ``t1 - t2 + ...``) or ``X * t1 * t2`` (op ``*``),
    with more than one term; ``None`` otherwise (single-term forms are handled by
    :func:`algebraic_target` with a path)."""
    for ops, op in ((("+", "-"), "+"), (("*",), "*")):
        sp_ = _spine(eq.value, ops)
        if len(sp_) > 2 and sp_[0][1] == eq.target:
            first_op, f = sp_[1]
            if first_op == "-":
                f = A.Neg(f)
            for o, t in sp_[2:]:
                f = A.BinOp(o, f, t)
            return op, f
    return None


def replace_target(eq: A.Assign, epath: tuple[int, ...] | None, new: A.Expr) -> A.Expr:
    """The equation's value with its algebraic target (:func:`algebraic_target`) replaced by
    ``new``; a multi-term accumulation ``X + t1 + t2`` becomes ``X + (new)``."""
    from .primitives import replace_expr

    if epath is None:
        acc = accumulation(eq)
        if acc is not None:
            return A.BinOp(acc[0], eq.target, new)
    path, _ = algebraic_target(eq, epath)
    return replace_expr(eq.value, path, new)


def algebraic_target(eq: A.Assign, epath: tuple[int, ...] | None = None) -> tuple[tuple[int, ...], A.Expr]:
    """The part of an equation a math rewrite may change, as ``(value path, subterm)``.

    With ``epath`` (an ``expr`` site) it is that subterm. Otherwise it is the value, except
    for an accumulation ``X = X + f`` (``-``, ``*``, ``max(X, f)``, ``min(X, f)``, either
    order for the commutative ones) where it is ``f`` alone: the accumulator form stays.
    A chain ``X + t1 - t2`` gives ``f = t1 - t2`` (rebuilt by :func:`replace_target`)."""
    from .primitives import expr_at

    if epath is not None:
        return tuple(epath), expr_at(eq.value, epath)
    v, x = eq.value, eq.target
    acc = accumulation(eq)
    if acc is not None:
        return (), acc[1]  # path () is not used for a chain: see replace_target
    if isinstance(v, A.BinOp) and v.op in _ACC_OPS:
        if v.lhs == x:
            return (1,), v.rhs
        if v.rhs == x and v.op != "-":
            return (0,), v.lhs
    if isinstance(v, A.Call) and v.func in ("max", "min"):
        if v.args[0] == x:
            return (1,), v.args[1]
        if v.args[1] == x:
            return (0,), v.args[0]
    return (), v


# ---------------------------------------------------------------------------
# Looking through producer nests
# ---------------------------------------------------------------------------

#: at most this many levels of producer definitions are substituted into a target
LOOK_THROUGH_DEPTH = 3


def inline_definitions(prog: A.Program, k: int, expr: A.Expr, signature=frozenset(), keep=None) -> A.Expr:
    """``expr`` (read in top-level nest ``k``) with every tensor read in value position
    replaced by its element-wise definition
    (:func:`steptp.engine.values.element_definition`: the single equation of an earlier
    single-equation nest with the same loops, same subscript, no accumulation, nothing in
    between overwriting what it reads); one level. Reads of tensors in ``signature`` stay, and
    so does a read whose definition ``d`` fails ``keep(d)`` (when given)."""
    from .values import element_definition

    def rec(e: A.Expr) -> A.Expr:
        if isinstance(e, A.Tensor):
            d = element_definition(prog, e, k, signature)
            return d if keep is None or d is e or keep(d) else e
        kids = A.children(e)
        if not kids:
            return e
        new = tuple(rec(c) for c in kids)
        return e if new == kids else A.rebuild(e, new)

    return rec(expr)


def through_targets(prog: A.Program, k: int, expr: A.Expr, signature=frozenset(),
                    depth: int = LOOK_THROUGH_DEPTH, keep=None) -> list[A.Expr]:
    """``[expr, one level inlined, two levels, ...]`` (:func:`inline_definitions`), up to
    ``depth`` levels, stopping when nothing more is substituted or the term would exceed
    :data:`MAX_NODES`. The translator emits one nest per PyTorch operator, so
    ``exp(x)*y + exp(x)*z`` is ``F=exp(A); G=F*C; H=exp(A); I=H*D; E=G+I``: two levels
    give ``exp(A)*C+exp(A)*D`` at ``E``. ``keep``: see :func:`inline_definitions`."""
    out = [expr]
    for _ in range(depth):
        nxt = inline_definitions(prog, k, out[-1], signature, keep)
        if nxt == out[-1] or count_nodes(nxt) > MAX_NODES:
            break
        out.append(nxt)
    return out


# ---------------------------------------------------------------------------
# Symbolic check
# ---------------------------------------------------------------------------


#: Two values that differ by at most this much relative to the larger are taken to differ only
#: by the float64 rounding of a folded decimal constant (``0.3333333333333333`` for ``1/3``:
#: ``3.3e-17``); any larger difference is a disproof. A few ulps of float64, far below every
#: verification tolerance (f32: ``1e-4``), so a perturbed constant (``1.00001/c``) cannot hide.
FOLDED_ROUNDING = sp.Rational(1, 2**48)


def _differs(vb, va) -> bool:
    """True when ``vb`` and ``va`` (exact sympy numbers or 50-digit floats) differ by more than
    :data:`FOLDED_ROUNDING` relative to the larger magnitude (absolute below ``2**-48``)."""
    scale = max(abs(vb), abs(va), FOLDED_ROUNDING)
    return abs(vb - va) > FOLDED_ROUNDING * scale


def _points(symbols, trials: int):
    rng = random.Random(0)
    for _ in range(trials):
        yield {s: sp.Rational(Fraction(rng.uniform(0.2, 1.8)).limit_denominator(1000)) for s in symbols}


def _exact_disagree(b: sp.Expr, a: sp.Expr, symbols, trials: int = 4) -> bool | None:
    """For two *rational functions* of ``symbols`` with rational coefficients (every LEIR
    literal is an exact rational, :func:`_number`): evaluate both exactly (sympy ``Rational``
    arithmetic, no floating point) at seeded rational points in (0.2, 1.8). True when they
    differ by more than :data:`FOLDED_ROUNDING` at two points, False when they agree to it at
    every point where both are defined, None when either side is not a rational function
    (``exp``, ``log``, ``max``... : then :func:`_numeric_disagree` decides)."""
    if not (b.is_rational_function(*symbols) and a.is_rational_function(*symbols)):
        return None
    hits = 0
    for point in _points(symbols, trials):
        try:
            vb, va = b.subs(point), a.subs(point)
        except (TypeError, ValueError, ZeroDivisionError):
            continue
        if not (vb.is_Rational and va.is_Rational):
            continue  # a pole: not a value
        if _differs(vb, va):
            hits += 1
    return hits >= 2


def _numeric_disagree(b: sp.Expr, a: sp.Expr, symbols, trials: int = 4) -> bool:
    """Evaluate both sides at seeded random rational points (50 digits): True if they differ
    by more than :data:`FOLDED_ROUNDING` relative at two points where both are finite (a
    disproof: the evaluation error at 50 digits is ~1e-48). A difference at the level of a
    rounded folded constant (1e-16) does not count; a perturbed constant (1e-5) does."""
    hits = 0
    for point in _points(symbols, trials):
        try:
            vb, va = b.evalf(50, subs=point), a.evalf(50, subs=point)
        except (TypeError, ValueError, ZeroDivisionError):
            continue
        # 50-digit numbers (real or complex) stay sympy numbers: exp(1800) is finite there, not
        # in float64, and abs() of a complex one is its modulus
        if not (vb.is_number and va.is_number and vb.is_finite and va.is_finite):
            continue
        hits += bool(_differs(vb, va))
    return hits >= 2


def symbolic_check(before: A.Expr, after: A.Expr, seconds: float = TIME_LIMIT_S, judge=None) -> str:
    """Try to prove two LEIR value expressions equal (tensor accesses are symbols), in
    floating point as well as in the reals.

    Returns ``"proved"`` when bounded egglog equality saturation
    (:func:`steptp.engine.equiv.egglog_prove`) shows it, or else when
    ``sympy.simplify(before - after) == 0`` (or the difference already evaluates to 0),
    *and* the step neither adds nor removes a floating-point hazard: every operand ``after``
    divides by, takes ``log``/``sqrt`` or a negative/fractional power of that ``before``
    does not already treat so (AST equality; a new divisor whose factors ``before`` already
    divides by passes), and every such operand of ``before`` that ``after`` drops, is proved
    finite and non-zero (``log``, negative fractional powers: positive; ``sqrt``, positive
    fractional powers: non-negative) by ``judge`` (:func:`steptp.engine.signs.unsafe_operands`);
    otherwise such an equality is only ``"unknown"`` (``x -> x/A*A`` is 0/0 = nan where the
    input ``A`` is 0; ``x*A/A -> x`` turns that nan into a number). ``judge``: a
    :class:`steptp.engine.signs.Judge` for the place the expressions are read
    (:func:`symbolic_check_programs` passes one with the program's facts); None: a
    context-free one (every tensor read unknown, so only literal-built operands are safe).
    ``"disproved"`` when, at seeded random rational points in (0.2, 1.8), the two differ by
    more than :data:`FOLDED_ROUNDING` (``2**-48``) relative: evaluated exactly in rationals
    when both sides are rational functions (every literal is an exact rational, so
    ``x/c`` against ``x*(1.00001/c)`` is disproved whatever ``c``), else at 50 digits; else
    ``"unknown"`` (the two differ only by the float64 rounding of a folded decimal constant,
    a time-out, an unsupported construct). Bounded by ``seconds``.

    Opaque subterms (``if_then_else``, comparisons...) are symbols, so two *different*
    opaque subterms are not independent values: ``if_then_else(c, x, 0)`` against
    ``if_then_else(c, x + y - y, 0)`` is checked branch by branch (same condition on both
    sides: proved when both branches are, disproved when one is), and a difference that
    keeps an opaque subterm found on one side only is never a disproof.

    Overflow is not this check's concern (``exp(x) -> exp(x-c)*exp(c)`` is proved): the
    rules' filters (``no_overflow``, ``provably``) and the verifier's large-magnitude trial
    judge it."""
    r = _real_check(before, after, seconds, judge)
    if r == "proved":
        from .signs import context_free, unsafe_operands

        if judge is None:
            dts = [t.dtype for t in A.walk(after) if isinstance(t, A.Tensor) and t.dtype in FLOAT_DTYPES]
            judge = context_free(dts[0] if dts else "f32")
        if unsafe_operands(before, after, judge):
            return "unknown"
    return r


def _real_check(before: A.Expr, after: A.Expr, seconds: float, judge) -> str:
    """:func:`symbolic_check` over the reals (the floating-point gate is the caller's)."""
    from .equiv import egglog_prove

    try:
        if egglog_prove(before, after):
            return "proved"
    except Exception:  # noqa: BLE001 - the e-graph is only a fast path; sympy decides next
        pass
    if isinstance(before, A.Call) and isinstance(after, A.Call) and before.func == after.func == "if_then_else" \
            and before.args[0] == after.args[0]:
        sides = [symbolic_check(x, y, seconds, judge) for x, y in zip(before.args[1:], after.args[1:])]
        if "disproved" in sides:
            return "disproved"
        return "proved" if all(r == "proved" for r in sides) else "unknown"
    table = SymbolTable()
    try:
        with time_limit(seconds):
            b, a = to_sympy(before, table), to_sympy(after, table)
            d = b - a
            if d == 0 or sp.expand(d) == 0 or sp.simplify(d) == 0:
                return "proved"
            one_sided = {x for x in b.free_symbols ^ a.free_symbols if str(x).startswith("@")}
            if one_sided:
                return "unknown"
            symbols = sorted(b.free_symbols | a.free_symbols, key=str)
            exact = _exact_disagree(b, a, symbols)
            if exact is not None:
                return "disproved" if exact else "unknown"
            return "disproved" if _numeric_disagree(b, a, symbols) else "unknown"
    except Exception:  # noqa: BLE001 - any failure leaves the question open
        return "unknown"


def symbolic_check_programs(before: A.Program, after: A.Program, signature=None) -> str:
    """Symbolic check of a one-step rewrite: every equation that changed in place (same
    path, same target) must be proved equal (:func:`symbolic_check`). ``proved`` if all are,
    ``disproved`` if one is, ``unknown`` otherwise (including structural changes: nests
    added or removed).

    Floating point: each changed equation is judged with the sign/interval facts of the
    ``after`` program at that equation (:func:`steptp.engine.signs.site_judge`; inputs are
    taken as the verifier draws them, exact zeros included; ``signature``: the programs'
    signature, optional: without it every tensor the program never writes is an input), so
    a step that divides by (takes ``log``/``sqrt`` of...) a value the original did not and
    that is not provably non-zero (positive...) and finite there is at best ``unknown``:
    ``x -> x/A*A`` with ``A`` an input, or ``G = F/2.0`` of a matmul, is not proved, ``x ->
    x/D*D`` with ``D = A*A + 1.0`` from an earlier nest is. ``disproved`` is unaffected."""
    from ..leir.analysis import equation_instances
    from .signs import site_judge

    b = list(equation_instances(before))
    a = list(equation_instances(after))
    if len(a) != len(b):
        return "unknown"
    outcome = "proved"
    changed = 0
    for x, y in zip(b, a):
        ex, ey = x.eq, y.eq
        if ex == ey:
            continue
        if x.path != y.path or ex.target != ey.target:
            return "unknown"
        changed += 1
        judge = site_judge(after, y.path, signature)
        r = symbolic_check(ex.value, ey.value, judge=judge)
        if r == "disproved" and len(x.path) == 2:
            # a rewrite that looked through producer nests (math normal forms with
            # look_through, logsimp/expand_log): compare the equations with the producers'
            # element-wise definitions substituted on both sides (equal at every iteration)
            bx = through_targets(before, x.path[0], ex.value)[-1]
            ay = through_targets(after, y.path[0], ey.value)[-1]
            if (bx, ay) != (ex.value, ey.value):
                r = symbolic_check(bx, ay, judge=judge)
        if r == "disproved":
            return "disproved"
        if r == "unknown":
            outcome = "unknown"
    return outcome if changed else "unknown"


__all__ = ["TIME_LIMIT_S", "MAX_NODES", "FLOAT_DTYPES", "AlgebraError", "AlgebraTimeout", "time_limit",
           "SymbolTable", "to_sympy", "from_sympy", "count_nodes", "FUNCTIONS", "SYMPY_CALLS", "atoms", "exp_factors",
           "normal_form", "describe", "LOOK_THROUGH_DEPTH", "inline_definitions", "through_targets", "algebraic_target", "accumulation", "replace_target", "symbolic_check", "symbolic_check_programs", "FOLDED_ROUNDING"]
