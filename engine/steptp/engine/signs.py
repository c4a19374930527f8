"""Signs and value ranges of a program's expressions: what is provably non-zero, positive,
finite (design.md §8 "The symbolic check proves in floating point"; paper App. A.3, the
multiplicative / exponential / additive splits).

A rewrite that is an identity over the reals can be wrong in floating point. ``t -> t/c*c``
gives ``0/0 = nan`` where ``c`` is exactly zero (an input of the verifier's zero trials, a
ReLU output); ``exp(x) -> exp(x-c)*exp(c)`` gives ``inf*0`` where ``exp(c)`` overflows;
``t -> t+c-c`` rounds ``t`` to the precision of ``c``. Real-number reasoning (sympy, the
egglog axioms) cannot see this; this module lets the symbolic check
(:func:`steptp.engine.algebra.symbolic_check_programs`) and the rules' candidate filters ask
the floating-point questions.

**The input model** (the verifier's trials, :mod:`steptp.runner.inputs`): a floating point
input, param or constant is anywhere in ``[-FLOAT_INPUT_BOUND, FLOAT_INPUT_BOUND]``
(:data:`steptp.engine.inputbounds.FLOAT_INPUT_BOUND`, 64: the large edge trial), *exactly 0
included* (the zero edge trials) and of either sign: an input is never provably non-zero
or of one sign. Integer inputs lie in ``[-b, b]`` with ``b = max(INT_INPUT_BOUND, largest
dimension)``, booleans in ``[0, 1]``, a loop index in ``[0, extent - 1]``.

**Ranges.** :meth:`Judge.range` gives a :class:`Range` ``(lo, hi, low)``: ``lo <= x <= hi``
and ``|x| >= low``, by interval rules in real arithmetic made float-aware at every node: a
bound past the dtype's largest finite value (:data:`steptp.engine.inputbounds.DTYPE_MAX`)
becomes infinite (the value may be ``inf``), and one closer to zero than twice the
smallest normal number (:data:`TINY`) becomes 0 (the value may underflow, or be flushed to
zero on a GPU). Rules: ``+ - * /`` by interval arithmetic (``a/b`` needs ``b`` non-zero,
else the range is unknown, ``(-inf, inf)``); ``x*x`` is non-negative; a sum of two terms of
one sign keeps the larger ``low`` (rounding is monotone); ``exp`` is monotone, so ``exp(x)``
is positive only while ``x >= ln(2 TINY)`` (f32/bf16 -86.6, f16 -9.01 with its normal minimum
``2**-14``, f64 -707.7; ``exp`` reaches the smallest normal number at -87.3, -9.70, -708.4)
and finite (``<= max/2``) only while ``x <= ln(max/2)`` (f32 88.0, f16 10.4, f64 709.1;
``exp`` overflows past 88.7, 11.09, 709.8); ``sqrt``/``log`` need a non-negative / positive argument (else
unknown); ``tanh``/``erf`` keep the sign; ``max``/``min``/``abs``/``if_then_else`` by their
monotonicity (the guard's branches are joined); literal powers by sign cases. Two
correlations are kept: a sum is evaluated as a linear combination of its terms (``x - c +
c`` has ``x``'s range), and a product of ``exp`` calls is bounded by the ``exp`` of the
summed exponents (``exp(x-c)*exp(c)`` by ``exp(x)``).

**Tensor facts**, in program order (as :func:`steptp.engine.magnitude.tensor_bounds`): each
top-level nest's equations are evaluated with the facts of the nests before it (a tensor
written in the same nest is unknown when another equation reads it: it may be half-done);
an accumulation ``X = X + e`` over reduction loops of total extent ``R`` adds ``R`` terms in
``range(e)`` to what ``X`` held (0 when nothing wrote it: implicit initialisation; ``*``
from 1, ``max``/``min`` from their identities), any other write joins the ranges of every
write of the tensor, and an equation reading its own tensor otherwise (a recurrence) gives
an unknown range. A read at a site sees the facts of the nests before the site's nest.

**One relation**: a tensor ``M`` written only by ``M = max(M, e)`` in one earlier nest (its
only writer, nothing written before it, every index of its subscript a plain loop index or an
integer) is at least every element it reduced: a read ``x - M`` where ``x`` is ``e`` with
``M``'s subscript substituted and each reduction index replaced by an index of no larger
extent (or an integer inside the reduced range) is ``<= 0`` (``>= 0`` for ``min``), provided
no nest from ``M``'s own to the reader's writes a tensor ``e`` reads. This is what makes the
softmax shift ``exp(A - max(A))`` bounded by 1.

**Questions** (each false when not provable; the dtype is the site equation's):
``nonzero`` (``|x| >= 2 TINY``), ``positive`` (``x >= 2 TINY``), ``nonneg``, ``finite`` (every
value subterm bounded by half the dtype's largest value), ``accurate`` (finite, and where a
factor of a product or the dividend of a quotient may underflow, the absolute error that
costs, ``TINY * |other factor|`` or ``TINY / |divisor|``, is at most half the dtype's
epsilon :data:`EPS`: below the rounding of a value of magnitude one, and so below every
dtype's absolute tolerance), ``keeps_precision`` (``a + b``: ``|b| <= PRECISION_RATIO * |a|``
by their bounds, both known; the rounding error of ``(a + b) - b`` is then at most
``u (2|a| + |b|) <= 5 eps |a|``, within every float dtype's relative tolerance: f16 1e-2
against 5 eps = 4.9e-3, bf16 4e-2 against 3.9e-2, f32 1e-4, f64 1e-9).

**Uses**: the candidate filter ``provably`` (below) that the split rules use, the value
functions ``provably(q, t, ...)`` and ``product(t1, t2)`` (``logsimp``/``expand_log``
``where:`` checks), the option ``safe_operands`` of the ``normal_form`` filter
(:mod:`steptp.engine.mathprims`), and
:func:`unsafe_operands`, the symbolic check's gate: a rewrite that divides by, takes
``log``/``sqrt`` or a negative or fractional power of an operand the original does not
already treat so is "proved" only where the operand is provably safe.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Iterator

from ..leir import ast as A
from ..leir.analysis import self_reference_kind
from .filters import candidate_filter
from .inputbounds import DTYPE_MAX, FLOAT_INPUT_BOUND, INT_INPUT_BOUND
from .inputbounds import finite_literal as _finite_literal, linear_form as _linear, literal_value as _literal
from .navigation import IdentityMemo, enclosing_loops, value_children
from .domains import register_value_functions
from .primitives import EqRef, RewriteError, ValueExprError, get_item

INF = math.inf
#: smallest positive *normal* number per float dtype (below it a value is subnormal, flushed
#: to zero by GPU fast paths, or zero): f16 2**-14 = 6.1e-5, bf16/f32 2**-126 = 1.18e-38,
#: f64 2**-1022 = 2.2e-308
TINY = {"f16": 2.0 ** -14, "bf16": 2.0 ** -126, "f32": 2.0 ** -126, "f64": 2.0 ** -1022}
#: machine epsilon per float dtype (spacing of the numbers just above 1)
EPS = {"f16": 2.0 ** -10, "bf16": 2.0 ** -7, "f32": 2.0 ** -23, "f64": 2.0 ** -52}
#: ``keeps_precision``: the added value's bound may exceed the term's by at most this factor
PRECISION_RATIO = 8.0
#: requirements an operand can have, and the ones each implies
_IMPLIES = {"positive": {"positive", "nonzero", "nonneg"}, "nonzero": {"nonzero"}, "nonneg": {"nonneg"}}


@dataclass(frozen=True)
class Range:
    """``lo <= x <= hi`` and ``|x| >= low`` (floats; ``lo``/``hi`` may be infinite)."""

    lo: float
    hi: float
    low: float = 0.0

    @property
    def mag(self) -> float:
        """Upper bound on ``|x|``."""
        return max(abs(self.lo), abs(self.hi))


#: nothing known
ANY = Range(-INF, INF, 0.0)


def _nz(x: float, default: float) -> float:
    return default if math.isnan(x) else x


def _make(lo: float, hi: float, low: float = 0.0) -> Range:
    lo, hi = _nz(lo, -INF), _nz(hi, INF)
    if lo > 0:
        low = max(low, lo)
    elif hi < 0:
        low = max(low, -hi)
    return Range(lo, hi, _nz(low, 0.0))


def _mul1(a: float, b: float) -> float:
    if a == 0.0 or b == 0.0:
        return 0.0
    return a * b


def _exp(x: float) -> float:
    try:
        return math.exp(x)
    except OverflowError:
        return INF


def _pow(x: float, p: float) -> float:
    try:
        return x ** p
    except OverflowError:
        return INF
    except ZeroDivisionError:
        return INF


def _add(a: Range, b: Range) -> Range:
    low = 0.0
    if (a.lo >= 0 and b.lo >= 0) or (a.hi <= 0 and b.hi <= 0):
        low = max(a.low, b.low)          # one sign: |a + b| >= max(|a|, |b|), rounding is monotone
    elif a.low > b.mag:
        low = a.low - b.mag
    elif b.low > a.mag:
        low = b.low - a.mag
    return _make(a.lo + b.lo, a.hi + b.hi, low)


def _neg(a: Range) -> Range:
    return Range(-a.hi, -a.lo, a.low)


def _mul(a: Range, b: Range) -> Range:
    ps = [_mul1(x, y) for x in (a.lo, a.hi) for y in (b.lo, b.hi)]
    return _make(min(ps), max(ps), _mul1(a.low, b.low))


def _square(a: Range) -> Range:
    lo2, hi2 = _mul1(a.lo, a.lo), _mul1(a.hi, a.hi)
    if a.lo >= 0 or a.hi <= 0:
        return _make(min(lo2, hi2), max(lo2, hi2), _mul1(a.low, a.low))
    return _make(0.0, max(lo2, hi2), _mul1(a.low, a.low))


def _recip(b: Range) -> Range:
    if b.low <= 0:
        return ANY
    inv_mag = 0.0 if b.mag == INF else 1.0 / b.mag
    if b.lo > 0 or b.hi < 0:
        lo = 0.0 if b.hi == INF else (-0.0 if b.hi == -INF else 1.0 / b.hi)
        hi = 0.0 if b.lo == -INF else (INF if b.lo == 0 else 1.0 / b.lo)
        lo, hi = min(lo, hi), max(lo, hi)
        return _make(lo, hi, inv_mag)
    return _make(-1.0 / b.low, 1.0 / b.low, inv_mag)


def _hull(a: Range, b: Range) -> Range:
    return _make(min(a.lo, b.lo), max(a.hi, b.hi), min(a.low, b.low))


def _ipow(x: float, n: int) -> float:
    """``x**n`` for an integer ``n >= 0``, infinite past the float range, with its sign."""
    m = INF if abs(x) == INF else _pow(abs(x), n)
    return -m if (x < 0 and n % 2 == 1) else m


def _int_pow(a: Range, n: int) -> Range:
    if n == 0:
        return Range(1.0, 1.0, 1.0)
    lo_n, hi_n, low = _ipow(a.lo, n), _ipow(a.hi, n), _ipow(a.low, n)
    if n % 2 == 1:
        return _make(lo_n, hi_n, low)
    if a.lo >= 0 or a.hi <= 0:
        return _make(min(lo_n, hi_n), max(lo_n, hi_n), low)
    return _make(0.0, max(lo_n, hi_n), low)


def _power(a: Range, p: float) -> Range:
    if p == int(p) and abs(p) <= 64:
        n = int(p)
        r = _int_pow(a, abs(n))
        return _recip(r) if n < 0 else r
    if p > 0:
        if a.lo < 0:
            return ANY
        return _make(_pow(a.lo, p), _pow(a.hi, p) if a.hi != INF else INF, _pow(a.low, p))
    if a.lo <= 0:
        return ANY
    return _recip(_power(a, -p))


def _fn(name: str, args: list[Range]) -> Range:
    if name == "exp":
        u = args[0]
        lo = _exp(u.lo) if u.lo != -INF else 0.0
        return _make(lo, _exp(u.hi) if u.hi != INF else INF, lo)
    if name == "log":
        u = args[0]
        if u.lo <= 0:
            return ANY
        lo, hi = math.log(u.lo), (math.log(u.hi) if u.hi != INF else INF)
        return _make(lo, hi)
    if name == "sqrt":
        u = args[0]
        if u.lo < 0:
            return ANY
        return _make(math.sqrt(u.lo), math.sqrt(u.hi) if u.hi != INF else INF, math.sqrt(u.low))
    if name == "abs":
        u = args[0]
        if u.lo >= 0:
            return u
        if u.hi <= 0:
            return _neg(u)
        return _make(0.0, u.mag, u.low)
    if name in ("tanh", "erf"):
        f = math.tanh if name == "tanh" else math.erf
        u = args[0]
        return _make(f(u.lo) if u.lo != -INF else -1.0, f(u.hi) if u.hi != INF else 1.0,
                     f(u.low) if u.low != INF else 1.0)
    if name == "max":
        a, b = args
        return _make(max(a.lo, b.lo), max(a.hi, b.hi))
    if name == "min":
        a, b = args
        return _make(min(a.lo, b.lo), min(a.hi, b.hi))
    return ANY


def _exp_exponents(e: A.Expr) -> list[A.Expr] | None:
    """``[u, v, ...]`` when ``e`` is ``exp(u)`` or a product of ``exp`` calls, else None."""
    if isinstance(e, A.Call) and e.func == "exp":
        return [e.args[0]]
    if isinstance(e, A.BinOp) and e.op == "*":
        a, b = _exp_exponents(e.lhs), _exp_exponents(e.rhs)
        if a and b:
            return a + b
    return None


def _float_aware(r: Range, dtype: str) -> Range:
    """``r`` as the dtype can hold it: past its largest value a bound is infinite, closer to
    zero than twice its smallest normal number it is 0 (underflow, flush to zero)."""
    big, tiny = DTYPE_MAX.get(dtype), TINY.get(dtype)
    if big is None:
        return r
    lo, hi, low = r.lo, r.hi, r.low
    if hi > big:
        hi = INF
    if lo < -big:
        lo = -INF
    if 0 < lo < 2 * tiny:
        lo = 0.0
    if -2 * tiny < hi < 0:
        hi = 0.0
    if low < 2 * tiny:
        low = 0.0
    if (lo, hi, low) == (r.lo, r.hi, r.low):
        return r
    return Range(lo, hi, low)


def value_subterms(e: A.Expr) -> Iterator[A.Expr]:
    """``e`` and its subterms in value positions, pre-order."""
    stack = [e]
    while stack:
        x = stack.pop()
        yield x
        stack.extend(reversed(value_children(x)))


# ---------------------------------------------------------------------------
# Program facts
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class _Extreme:
    """``X = max(X, term)`` (or ``min``): X's only write, in top-level nest ``nest``."""

    kind: str
    nest: int
    subscript: tuple
    term: A.Expr
    reduce: tuple            # ((index, extent), ...) of the reduction loops
    reads: frozenset         # tensor names ``term`` reads


def _accumulated(eq: A.Assign) -> tuple[str, list[tuple[A.Expr, int]]] | None:
    """``(kind, [(term, sign), ...])`` of an accumulation ``X = X op ...`` (kind as
    :func:`steptp.leir.analysis.self_reference_kind`); None otherwise or when X occurs again."""
    kind = self_reference_kind(eq)
    if kind is None:
        return None
    t, v = eq.target, eq.value
    if kind in ("max", "min"):
        others = [(a, 1) for a in v.args if a != t]
        if len(others) != 1:
            return None
    else:
        ops = ("+", "-") if kind == "sum" else ("*",)
        terms: list[tuple[A.Expr, int]] = []

        def rec(x, sg):
            if isinstance(x, A.BinOp) and x.op in ops:
                rec(x.lhs, sg)
                rec(x.rhs, -sg if x.op == "-" else sg)
            else:
                terms.append((x, sg))

        rec(v, 1)
        mine = [sg for x, sg in terms if x == t]
        if mine != [1]:
            return None
        others = [(x, sg) for x, sg in terms if x != t]
    if any(isinstance(y, A.Tensor) and y.name == t.name for o, _ in others for y in A.walk(o)):
        return None
    return kind, others


class ProgramFacts:
    """Ranges of every tensor of a program in program order (see the module docstring).

    ``program``: a :class:`~steptp.leir.ast.Program`; ``signature``: its
    :class:`~steptp.leir.fileformat.Signature` or None (then every tensor the program reads
    but never writes is an input). Build with :func:`program_facts` (memoised)."""

    def __init__(self, program: A.Program, signature=None):
        self.program = program
        tensors: dict[str, A.Tensor] = {}
        writers: dict[str, list[int]] = {}
        eqs_of: dict[str, list[A.Assign]] = {}
        largest = 1
        for k, nest in enumerate(program.nests):
            for loops, eq in nest.equations():
                writers.setdefault(eq.target.name, []).append(k)
                eqs_of.setdefault(eq.target.name, []).append(eq)
                largest = max([largest] + [lp.extent for lp in loops])
                for y in list(A.walk(eq.value)) + [eq.target]:
                    if isinstance(y, A.Tensor):
                        tensors.setdefault(y.name, y)
        self.writers = {n: sorted(set(ks)) for n, ks in writers.items()}
        decl = {}
        if signature is not None:
            for t in signature.tensors:
                decl[t.name] = t
                largest = max([largest] + list(t.shape))
        int_bound = max(INT_INPUT_BOUND, float(largest))
        self.inputs: dict[str, Range] = {}
        for name, t in tensors.items():
            d = decl.get(name)
            if d is not None and d.is_output:
                continue
            if d is None and name in writers:
                continue
            dtype = d.dtype if d is not None else t.dtype
            if dtype == "bool":
                self.inputs[name] = Range(0.0, 1.0, 0.0)
            elif dtype.startswith(("f", "bf")):
                self.inputs[name] = Range(-FLOAT_INPUT_BOUND, FLOAT_INPUT_BOUND, 0.0)
            else:
                self.inputs[name] = Range(-int_bound, int_bound, 0.0)
        self.extremes: dict[str, _Extreme] = {}
        for name, ks in self.writers.items():
            if len(ks) != 1 or len(eqs_of[name]) != 1 or name in self.inputs:
                continue
            self._extreme(name, ks[0])
        self.history: dict[str, list[tuple[int, Range]]] = {}
        self._run(program)

    def _extreme(self, name: str, k: int) -> None:
        for loops, eq in self.program.nests[k].equations():
            if eq.target.name != name:
                continue
            acc = _accumulated(eq)
            if acc is None or acc[0] not in ("max", "min"):
                return
            x = eq.target
            if not all(isinstance(i, (A.Index, A.Int)) for i in x.indices):
                return
            used = {i.name for i in x.indices if isinstance(i, A.Index)}
            reduce = tuple((lp.var, lp.extent) for lp in loops if lp.var not in used)
            term = acc[1][0][0]
            reads = frozenset(y.name for y in A.walk(term) if isinstance(y, A.Tensor))
            self.extremes[name] = _Extreme(acc[0], k, x.indices, term, reduce, reads)
            return

    def _run(self, program: A.Program) -> None:
        state: dict[str, Range] = dict(self.inputs)
        for k, nest in enumerate(program.nests):
            here = {eq.target.name for _, eq in nest.equations()}
            running: dict[str, Range] = {}

            def read(t: A.Tensor, _k=k, _here=here) -> Range:
                return ANY if t.name in _here else self.before(t.name, _k)

            for loops, eq in nest.equations():
                x = eq.target
                extents = {lp.var: lp.extent for lp in loops}
                judge = Judge(self, k, extents, x.dtype, read)
                prior = running.get(x.name, state.get(x.name))
                acc = _accumulated(eq)
                if acc is not None:
                    kind, terms = acc
                    used = {i.name for s in x.indices for i in A.walk(s) if isinstance(i, A.Index)}
                    reps = math.prod(lp.extent for lp in loops if lp.var not in used)
                    e = None
                    for term, sg in terms:  # the accumulated term f of X = X op f
                        r = judge.range(term)
                        r = _neg(r) if sg < 0 else r
                        if e is None:
                            e = r
                        elif kind == "sum":
                            e = _add(e, r)
                        elif kind == "prod":
                            e = _mul(e, r)
                    if e is None:
                        new = ANY
                    elif kind == "sum":
                        total = _make(reps * e.lo if e.lo else 0.0, reps * e.hi if e.hi else 0.0,
                                      e.low if (e.lo >= 0 or e.hi <= 0) else 0.0)
                        new = _add(prior, total) if prior is not None else total
                    elif kind == "prod":
                        p = _int_pow(e, reps) if reps <= 64 else (
                            _make(0.0, INF) if e.lo >= 0 else ANY)
                        new = _mul(prior, p) if prior is not None else p
                    else:
                        new = e if prior is None else _fn(kind, [prior, e])
                elif any(isinstance(y, A.Tensor) and y.name == x.name for y in A.walk(eq.value)):
                    new = ANY
                else:
                    v = judge.range(eq.value)
                    new = v if prior is None else _hull(prior, v)
                running[x.name] = _float_aware(new, x.dtype)
            for name, r in running.items():
                state[name] = r
                self.history.setdefault(name, []).append((k, r))

    def before(self, name: str, k: int) -> Range:
        """The range of tensor ``name`` as the nests before top-level nest ``k`` leave it."""
        hist = self.history.get(name)
        if hist:
            best = None
            for n, r in hist:
                if n >= k:
                    break
                best = r
            if best is not None:
                return best
        return self.inputs.get(name, ANY)

    def below_extreme(self, x: A.Expr, m: A.Tensor, k: int, extents: dict[str, int]) -> str | None:
        """``"max"`` when ``x <= m`` provably holds at a read in top-level nest ``k`` (``m``
        the running maximum of ``x``'s values, see the module docstring), ``"min"`` when
        ``x >= m``, else None."""
        ex = self.extremes.get(m.name)
        if ex is None or ex.nest >= k or len(ex.subscript) != len(m.indices):
            return None
        for name in ex.reads:
            if any(ex.nest <= n <= k for n in self.writers.get(name, ())):
                return None
        sigma: dict[str, A.Expr] = {}
        for w, r in zip(ex.subscript, m.indices):
            if isinstance(w, A.Index):
                if sigma.setdefault(w.name, r) != r:
                    return None
            elif w != r:
                return None
        reduce = dict(ex.reduce)
        bound: dict[str, A.Expr] = {}

        def match(p: A.Expr, e: A.Expr) -> bool:
            if isinstance(p, A.Index):
                if p.name in reduce:
                    if p.name in bound:
                        return bound[p.name] == e
                    if isinstance(e, A.Index) and 0 < extents.get(e.name, reduce[p.name] + 1) <= reduce[p.name]:
                        bound[p.name] = e
                        return True
                    if isinstance(e, A.Int) and 0 <= e.value < reduce[p.name]:
                        bound[p.name] = e
                        return True
                    return False
                return p.name in sigma and sigma[p.name] == e
            if type(p) is not type(e):
                return False
            if isinstance(p, A.Tensor):
                if (p.name, p.dtype, p.scope, len(p.indices)) != (e.name, e.dtype, e.scope, len(e.indices)):
                    return False
            elif isinstance(p, (A.Int, A.Float)):
                return p == e
            elif isinstance(p, (A.BinOp, A.Compare, A.BoolOp)):
                if p.op != e.op:
                    return False
            elif isinstance(p, A.Call):
                if p.func != e.func or len(p.args) != len(e.args):
                    return False
            return all(match(a, b) for a, b in zip(A.children(p), A.children(e)))

        return ex.kind if match(ex.term, x) else None


_FACTS = IdentityMemo()


def program_facts(program: A.Program, signature=None) -> ProgramFacts:
    """:class:`ProgramFacts` of ``program`` (with its ``signature``, or None), memoised per
    (program, signature) object."""
    return _FACTS.get((program, signature), lambda: ProgramFacts(program, signature))


# ---------------------------------------------------------------------------
# Questions at a site
# ---------------------------------------------------------------------------


class Judge:
    """Answers range questions about expressions read at one place of a program: in
    top-level nest ``k`` with loop ``extents`` (index -> extent), computing in ``dtype``.
    ``read(tensor) -> Range`` gives a tensor read's range (default: the facts of the nests
    before ``k``, a tensor written in nest ``k`` unknown). Build with :func:`site_judge` or
    :func:`context_free`."""

    def __init__(self, facts: ProgramFacts | None, k: int, extents: dict[str, int], dtype: str,
                 read: Callable[[A.Tensor], Range] | None = None):
        self.facts, self.k, self.extents, self.dtype = facts, k, extents, dtype
        self._read = read
        self._memo: dict[A.Expr, Range] = {}

    def read(self, t: A.Tensor) -> Range:
        if self._read is not None:
            return self._read(t)
        if self.facts is None:
            return ANY
        if self.k in self.facts.writers.get(t.name, ()):
            return ANY
        return self.facts.before(t.name, self.k)

    def range(self, e: A.Expr) -> Range:
        """The :class:`Range` of ``e`` (value position) in the judge's dtype."""
        r = self._memo.get(e)
        if r is None:
            r = self._memo[e] = _float_aware(self._range(e), self.dtype)
        return r

    def _range(self, e: A.Expr) -> Range:
        if isinstance(e, (A.Int, A.Float)):
            v = float(e.value)
            return Range(v, v, abs(v))
        if isinstance(e, A.Index):
            n = self.extents.get(e.name)
            return Range(0.0, float(n - 1) if n is not None else INF, 0.0)
        if isinstance(e, A.Tensor):
            return self.read(e)
        if isinstance(e, A.Neg):
            return self._linear_range(e)
        if isinstance(e, (A.Compare, A.BoolOp, A.Not)):
            return Range(0.0, 1.0, 0.0)
        if isinstance(e, A.BinOp):
            op = e.op
            if op == "*" and e.lhs == e.rhs:
                return _square(self.range(e.lhs))
            if op in ("+", "-"):
                return self._linear_range(e)
            a, b = self.range(e.lhs), self.range(e.rhs)
            if op == "*":
                r = _mul(a, b)
                fa, fb = _exp_exponents(e.lhs), _exp_exponents(e.rhs)
                if fa and fb:  # exp(u)*exp(v) is exp(u+v): x-c and c cancel
                    total = fa[0]
                    for u in fa[1:] + fb:
                        total = A.BinOp("+", total, u)
                    r = Range(r.lo, min(r.hi, self.range(A.Call("exp", (total,))).hi), r.low)
                return r
            if op == "/":
                return _mul(a, _recip(b))
            if op == "//":
                q = _mul(a, _recip(b))
                return _make(q.lo - 1.0, q.hi + 1.0)
            if op == "%":
                return _make(-b.mag, b.mag) if b.low > 0 else ANY
            if op == "**":
                p = _literal(e.rhs)
                return ANY if p is None else _power(a, p)
            return ANY
        if isinstance(e, A.Call):
            if e.func == "if_then_else":
                known = self._decide(e.args[0])
                if known is not None:  # a dead branch says nothing (softplus's x > 20 on tanh(x))
                    return self.range(e.args[1] if known else e.args[2])
                a, b = self.range(e.args[1]), self.range(e.args[2])
                return _hull(a, b)
            return _fn(e.func, [self.range(x) for x in e.args])
        return ANY

    def _decide(self, cond: A.Expr) -> bool | None:
        """True/False when the comparison ``cond`` (``<``, ``<=``, ``>``, ``>=`` of two value
        expressions) holds for every / no value of its operands' ranges, else None."""
        if not isinstance(cond, A.Compare) or cond.op not in ("<", "<=", ">", ">="):
            return None
        a, b = self.range(cond.lhs), self.range(cond.rhs)
        if cond.op in (">", ">="):
            a, b = b, a  # x > y is y < x
        strict = cond.op in ("<", ">")
        if (a.hi < b.lo) or (not strict and a.hi <= b.lo):
            return True
        if (a.lo > b.hi) or (strict and a.lo >= b.hi):
            return False
        return None

    def _linear_range(self, e: A.Expr) -> Range:
        """The range of a sum/difference/negation as a linear combination of its other
        terms (:func:`_linear`), so ``x - c + c`` has ``x``'s range; a pair ``k*x - k*M``
        with ``M`` a running maximum of ``x`` (:meth:`ProgramFacts.below_extreme`) is
        ``k*(x - M)`` with ``x - M <= 0`` (``>= 0`` for a minimum)."""
        terms, const = _linear(e)
        parts: list[Range] = []
        paired: set = set()
        if self.facts is not None:
            for m, km in terms.items():
                if not isinstance(m, A.Tensor) or m in paired or m.name not in self.facts.extremes:
                    continue
                for x, kx in terms.items():
                    if x in paired or x == m or kx != -km:
                        continue
                    kind = self.facts.below_extreme(x, m, self.k, self.extents)
                    if kind is None:
                        continue
                    d = _add(self.range(x), _neg(self.range(m)))
                    if kind == "max":
                        d = _make(min(d.lo, 0.0), min(d.hi, 0.0), d.low)
                    else:
                        d = _make(max(d.lo, 0.0), max(d.hi, 0.0), d.low)
                    parts.append(_mul(Range(kx, kx, abs(kx)), d))
                    paired.update((x, m))
                    break
        for x, k in terms.items():
            if x not in paired:
                r = self.range(x)
                parts.append(r if k == 1 else _mul(Range(k, k, abs(k)), r))
        total = Range(const, const, abs(const))
        for r in parts:
            total = _add(total, r)
        return total

    # -- questions -------------------------------------------------------------------

    def _float(self) -> bool:
        return self.dtype in TINY

    def nonzero(self, e: A.Expr) -> bool:
        """``e`` is provably non-zero: ``|e| >= 2 TINY`` (it cannot underflow to 0)."""
        return self._float() and self.range(e).low > 0

    def positive(self, e: A.Expr) -> bool:
        """``e`` is provably ``>= 2 TINY``."""
        return self._float() and self.range(e).lo > 0

    def nonneg(self, e: A.Expr) -> bool:
        """``e`` is provably ``>= 0``."""
        return self._float() and self.range(e).lo >= 0

    def finite(self, e: A.Expr) -> bool:
        """Every value subterm of ``e`` is bounded by half the dtype's largest value (no
        overflow, no infinity, nothing unknown)."""
        if not self._float():
            return False
        limit = DTYPE_MAX[self.dtype] / 2
        return all(self.range(s).mag <= limit for s in value_subterms(e))

    def accurate(self, e: A.Expr) -> bool:
        """:meth:`finite`, and no underflow inside ``e`` costs more than half the dtype's
        epsilon absolute: where a factor of a product may underflow (its ``low`` is below
        twice :data:`TINY`), ``TINY * bound(other factor) <= EPS/2``; where a dividend may,
        ``TINY / low(divisor) <= EPS/2``."""
        if not self.finite(e):
            return False
        tiny, budget = TINY[self.dtype], EPS[self.dtype] / 2
        for s in value_subterms(e):
            if not isinstance(s, A.BinOp) or s.op not in ("*", "/"):
                continue
            a, b = self.range(s.lhs), self.range(s.rhs)
            if s.op == "*":
                if (a.low == 0 and tiny * b.mag > budget) or (b.low == 0 and tiny * a.mag > budget):
                    return False
            elif a.low == 0 and (b.low == 0 or tiny / b.low > budget):
                return False
        return True

    def keeps_precision(self, a: A.Expr, b: A.Expr) -> bool:
        """Adding ``b`` to ``a`` keeps ``a``'s precision: both bounds known and finite,
        ``a``'s positive, ``bound(b) <= PRECISION_RATIO * bound(a)``."""
        if not self._float():
            return False
        ra, rb = self.range(a), self.range(b)
        return 0 < ra.mag < INF and rb.mag < INF and rb.mag <= PRECISION_RATIO * ra.mag

    def satisfies(self, e: A.Expr, requirement: str) -> bool:
        """``e`` is finite and meets ``requirement`` (``nonzero``, ``positive``, ``nonneg``)."""
        check = {"nonzero": self.nonzero, "positive": self.positive, "nonneg": self.nonneg}[requirement]
        return check(e) and self.finite(e)


def site_judge(program: A.Program, path: tuple[int, ...], signature=None) -> Judge:
    """The :class:`Judge` for expressions read by the equation at ``path`` of ``program``
    (its dtype; reads see the facts of the nests before its top-level nest)."""
    eq = get_item(program, path)
    loops = enclosing_loops(program, path)
    return Judge(program_facts(program, signature), path[0], {lp.var: lp.extent for lp in loops},
                 eq.target.dtype)


def context_free(dtype: str = "f32") -> Judge:
    """A :class:`Judge` that knows no program: every tensor read is unknown (any real or
    infinity), an index is non-negative."""
    return Judge(None, 0, {}, dtype)


# ---------------------------------------------------------------------------
# Operands of division, log, sqrt, powers
# ---------------------------------------------------------------------------


def operand_requirements(e: A.Expr) -> list[tuple[A.Expr, str]]:
    """``(operand, requirement)`` for every division, ``log``, ``sqrt`` and negative or
    fractional power in value positions of ``e``, first occurrence first: a divisor (``/``,
    ``//``, ``%``) and the base of a negative integer power must be ``nonzero``, a ``log``
    argument and the base of a negative fractional or non-literal power ``positive``, a
    ``sqrt`` argument and the base of a positive fractional power ``nonneg``."""
    out: list[tuple[A.Expr, str]] = []
    for s in value_subterms(e):
        item = None
        if isinstance(s, A.BinOp):
            if s.op in ("/", "//", "%"):
                item = (s.rhs, "nonzero")
            elif s.op == "**":
                p = _literal(s.rhs)
                if p is None:
                    item = (s.lhs, "positive")
                elif p != int(p):
                    item = (s.lhs, "nonneg" if p > 0 else "positive")
                elif p < 0:
                    item = (s.lhs, "nonzero")
        elif isinstance(s, A.Call) and s.func in ("log", "sqrt"):
            item = (s.args[0], "positive" if s.func == "log" else "nonneg")
        if item is not None and item not in out:
            out.append(item)
    return out


def factors(e: A.Expr) -> list[A.Expr]:
    """The multiplicative factors of ``e``: operands of a ``*`` chain, through negations,
    positive integer powers and the dividend of a quotient (``p/q`` is zero where ``p``
    is); non-zero literals are dropped. ``e`` itself when it is none of these."""
    out: list[A.Expr] = []

    def rec(x: A.Expr) -> None:
        v = _finite_literal(x)
        if v is not None and v != 0:
            return
        if isinstance(x, A.Neg):
            rec(x.operand)
        elif isinstance(x, A.BinOp) and x.op == "*":
            rec(x.lhs)
            rec(x.rhs)
        elif isinstance(x, A.BinOp) and x.op == "/":
            rec(x.lhs)
        elif isinstance(x, A.BinOp) and x.op == "**" and (_literal(x.rhs) or 0) >= 1 and \
                _literal(x.rhs) == int(_literal(x.rhs)):
            rec(x.lhs)
        elif x not in out:
            out.append(x)

    rec(e)
    return out


def _one_way(src: A.Expr, dst: A.Expr, judge: Judge) -> list[tuple[A.Expr, str]]:
    """The operands of ``dst`` (:func:`operand_requirements`) that ``src`` does not cover
    and ``judge`` does not prove safe (see :func:`unsafe_operands`)."""
    had: dict[A.Expr, set[str]] = {}
    for x, req in operand_requirements(src):
        had.setdefault(x, set()).update(_IMPLIES[req])
    zero_factors = {f for x, reqs in had.items() if "nonzero" in reqs for f in [x, *factors(x)]}
    out = []
    for x, req in operand_requirements(dst):
        if req in had.get(x, ()):
            continue
        if req == "nonzero" and judge.finite(x) and \
                all(f in zero_factors or judge.nonzero(f) for f in factors(x)):
            continue  # x is zero only where a factor is, and src divides by zero there too
        if not judge.satisfies(x, req):
            out.append((x, req))
    return out


def unsafe_operands(before: A.Expr, after: A.Expr, judge: Judge) -> list[tuple[A.Expr, str]]:
    """The floating-point hazards a rewrite ``before -> after`` adds or removes, as
    ``(operand, requirement)`` pairs; empty when there are none.

    *Added*: an operand ``after`` divides by, takes ``log``/``sqrt`` or a negative or
    fractional power of (:func:`operand_requirements`) that ``before`` does not already
    treat so (the same operand, by AST equality, with the same requirement or ``positive``,
    which implies the others), unless ``judge`` proves it finite and meeting the
    requirement. A new divisor each of whose :func:`factors` is a factor of a divisor of
    ``before`` (or provably non-zero) is covered when it is finite: it is zero only where
    ``before`` divides by zero too (``1/(a*(a+1)) -> 1/a - 1/(a+1)``; an underflow of a
    product of non-zero factors is not considered).
    *Removed*: the same, ``before`` and ``after`` exchanged: ``x*y/y -> x`` turns the nan of
    ``y = 0`` into a number, so it is a hazard unless ``y`` is provably non-zero.

    ``judge``: a :class:`Judge` for the place both expressions are read."""
    return _one_way(before, after, judge) + _one_way(after, before, judge)


# ---------------------------------------------------------------------------
# The candidate filter
# ---------------------------------------------------------------------------

_QUESTIONS = ("nonzero", "positive", "nonneg", "finite", "accurate")


@candidate_filter("provably", optional=_QUESTIONS + ("keeps_precision",))
def filter_provably(module, env, nonzero=(), positive=(), nonneg=(), finite=(), accurate=(), keeps_precision=()):
    """The site is a candidate only when every listed expression template (filled with the
    bindings, e.g. ``?t/?c*?c``), read at the site's equation in its dtype, is provably
    ``nonzero``, ``positive``, ``nonneg``, ``finite`` or ``accurate``
    (:class:`steptp.engine.signs.Judge`), and every ``keeps_precision`` template ``a + b``
    (or ``a - b``) adds a ``b`` whose bound is at most ``PRECISION_RATIO`` (8) times
    ``a``'s. Sites outside an equation are never candidates."""
    from .patterns import instantiate, parse_expr_pattern

    ref = env.get("eq")
    if not isinstance(ref, EqRef):
        return False
    judge = site_judge(module.program, ref.path, module.signature)
    for name, templates in zip(_QUESTIONS, (nonzero, positive, nonneg, finite, accurate)):
        ask = getattr(judge, name)
        for src in templates or ():
            if not ask(instantiate(parse_expr_pattern(src), env)):
                return False
    for src in keeps_precision or ():
        e = instantiate(parse_expr_pattern(src), env)
        if not isinstance(e, A.BinOp) or e.op not in ("+", "-"):
            raise RewriteError(f"provably.keeps_precision: {src!r} is not a sum or difference")
        if not judge.keeps_precision(e.lhs, e.rhs):
            return False
    return True


# ---------------------------------------------------------------------------
# Value functions (where: {check: ...}, let:, require:)
# ---------------------------------------------------------------------------


def _vf_provably(ctx, what, *terms) -> bool:
    """``provably(what, t1, t2, ...)``: every term, read at the site's equation (``?eq``), is
    provably ``what`` (``nonzero``, ``positive``, ``nonneg``, ``finite``, ``accurate``:
    :class:`Judge`); a term may also be a list of terms."""
    name = what if isinstance(what, str) else getattr(what, "name", None)
    if name not in _QUESTIONS:
        raise ValueExprError(f"provably: unknown question {what!r}; known: {', '.join(_QUESTIONS)}")
    ref = ctx.env.get("eq")
    if not isinstance(ref, EqRef):
        raise ValueExprError("provably needs an equation or expr site (?eq)")
    judge = site_judge(ctx.module.program, ref.path, ctx.module.signature)
    ask = getattr(judge, name)
    items: list = []
    for t in terms:
        items.extend(t if isinstance(t, (list, tuple)) else [t])
    if not items or not all(isinstance(t, (A.Int, A.Float, A.Index, A.Tensor, A.Neg, A.BinOp, A.Call)) for t in items):
        raise ValueExprError(f"provably: expected terms, got {terms!r}")
    return all(ask(t) for t in items)


def _vf_product(ctx, a, b) -> A.Expr:
    """``product(t1, t2)``: the term ``t1*t2``."""
    for t in (a, b):
        if not isinstance(t, (A.Int, A.Float, A.Index, A.Tensor, A.Neg, A.BinOp, A.Call)):
            raise ValueExprError(f"product: expected terms, got {t!r}")
    return A.BinOp("*", a, b)


SIGN_FUNCTIONS = {"provably": (-1, _vf_provably), "product": (2, _vf_product)}


register_value_functions(SIGN_FUNCTIONS)


__all__ = ["TINY", "EPS", "PRECISION_RATIO", "Range", "ANY", "ProgramFacts", "program_facts", "Judge", "site_judge",
           "context_free", "value_subterms", "operand_requirements", "factors", "unsafe_operands", "filter_provably"]
