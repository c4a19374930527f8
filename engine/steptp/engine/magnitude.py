"""Magnitude bounds of a program's values, and the ``no_overflow`` precondition built on them.

A rewrite that is exact in real numbers can still be wrong in floating point when it
introduces an intermediate that overflows: ``exp(x) -> exp(x-c)*exp(c)`` with ``c`` a row
maximum of ~1e3 gives ``exp(c) = inf`` and ``0*inf = nan`` where the original was finite
(paper App. A.3 strategies exponential split, expand power simplification, factorization;
on 630 corpus candidates 17 of 24 exponential splits failed this way). The verifier would
reject such a step; this module lets the rule engine not propose it.

**The bound.** :func:`tensor_bounds` gives, for every tensor of a program, an upper bound on
``|value|`` under the verifier's inputs (:func:`steptp.verify.random_inputs`: uniform on
[-2, 2] or [0.1, 2], standard normal; :func:`steptp.verify.ordered_inputs`: [0.1, 2]; the
edge-case trials of design.md §8, :func:`steptp.runner.inputs.edge_arrays`: zeros, scattered
zeros, uniform(-2, -0.1), and the large trial uniform(-2, 2) times 32), by interval
reasoning on magnitudes in program order:

* inputs, params and constants: :data:`FLOAT_INPUT_BOUND` (64, the large edge trial's
  largest magnitude, :data:`steptp.runner.inputs.LARGEST_INPUT`; a standard normal draw
  exceeds it with probability ~0), or :data:`FALLBACK_INPUT_BOUND` (40, the trial's smaller
  scale 20) for a program one of whose outputs has a bound past its dtype's largest value
  at 64: the verifier scales the trial down only where the *original's* outputs are not
  finite, and a worst-case overflow of the original is taken as the sign that they are not
  (a heuristic: this module is a pre-filter; :mod:`steptp.engine.signs`, which proves, always
  uses 64); integer tensors :data:`INT_INPUT_BOUND`;
* an accumulation ``X = X + e`` over reduction loops of total extent ``R`` (the enclosing
  loops whose index is not in ``X``'s subscript) adds ``R * |e|``; ``X = max(X, e)`` /
  ``min`` takes ``|e|``; ``X = X * e`` multiplies by ``|e|**R``; any other equation gives
  ``|value|`` (the maximum with earlier writes of the same tensor);
* expressions: ``|a+b| <= |a|+|b|``, ``|a*b| <= |a||b|``, ``exp`` of a bound ``B`` is
  ``e**B`` (``inf`` past the float range), ``tanh``/``erf`` are 1, a loop index is
  its extent, ``-inf`` is ``inf``; a quotient is ``|a| / low`` where the divisor has a
  provable positive lower bound ``low`` (a literal, ``sqrt(var + eps)`` with ``var`` a sum of
  squares: :func:`positive_lower_bound`), else, like ``log`` and other functions, it has an
  *unknown* bound (``nan``), and so has everything computed from it.

The bounds are worst cases, not estimates; with the verifier's all-positive trials a sum of
``R`` products really does reach a good fraction of ``R * |a| * |b|``, so they are rarely far
off. A bound is ``inf`` when the worst case overflows even a Python float, ``nan`` when it
is unknown (normalised values, ``x/sum(...)``, are usually small: a quotient gives no
evidence of overflow either way).

**The precondition.** :func:`introduces_overflow` is true when a new expression has a
subterm that is not a subterm of the old one whose known bound exceeds the largest finite
value of the equation's dtype (:data:`DTYPE_MAX`): a new term that may overflow, or new
arithmetic on a value that may already be infinite (``-inf`` literals have bound ``inf``:
a causal mask's ``-inf`` as ``c`` gives ``exp(-inf - -inf) = nan``). A new product of
``exp`` factors equal in real numbers to a product the old expression has (same other
factors, exponents summing to the same linear combination: ``exp(a)*exp(b)`` for
``exp(a+b)``) overflows where the old one does and is not counted; its factors are. An
unknown bound does not reject: the filter removes the rewrites with demonstrable overflow, and the
verifier stays the judge of the rest. Rules use it as the candidate filter
``no_overflow: {terms: [...]}`` (templates filled with the site's bindings, e.g.
``["exp(?c)", "exp(?x-?c)"]``) or as the option ``no_overflow: true`` of the
``normal_form`` filter (the normal form itself is the new expression).
"""

from __future__ import annotations

import math

from ..leir import ast as A
from ..leir.analysis import self_reference_kind
from ..leir.printer import format_expr
from .filters import candidate_filter
from .navigation import IdentityMemo, enclosing_loops
from .inputbounds import DTYPE_MAX, FALLBACK_INPUT_BOUND, FLOAT_INPUT_BOUND, INT_INPUT_BOUND, linear_form
from .primitives import EqRef, get_item

#: the bound "unknown" (see the module docstring)
UNKNOWN = math.nan

_BOUNDED_ONE = {"tanh", "erf"}


def _mul(a: float, b: float) -> float:
    if a == 0.0 or b == 0.0:
        return 0.0
    return a * b


def _max(xs) -> float:
    xs = list(xs)
    return UNKNOWN if any(math.isnan(x) for x in xs) else max(xs)


def _exp(b: float) -> float:
    try:
        return math.exp(b)
    except OverflowError:
        return math.inf


def _pow(b: float, p: float) -> float:
    if p < 0:
        return UNKNOWN
    try:
        return b ** p
    except OverflowError:
        return math.inf


def is_nonneg(e: A.Expr, nonneg: frozenset | set = frozenset()) -> bool:
    """True when ``e`` is provably >= 0: a non-negative literal, a loop index, a tensor in
    ``nonneg``, ``exp``/``sqrt``/``abs``, ``x*x``, and sums, products, quotients,
    ``max``/``min`` of non-negative terms."""
    if isinstance(e, (A.Int, A.Float)):
        return e.value >= 0
    if isinstance(e, A.Index):
        return True
    if isinstance(e, A.Tensor):
        return e.name in nonneg
    if isinstance(e, A.BinOp):
        if e.op == "*" and e.lhs == e.rhs:
            return True
        if e.op in ("+", "*", "/"):
            return is_nonneg(e.lhs, nonneg) and is_nonneg(e.rhs, nonneg)
        return False
    if isinstance(e, A.Call):
        if e.func in ("exp", "sqrt", "abs"):
            return True
        if e.func in ("max", "min"):
            return all(is_nonneg(a, nonneg) for a in e.args)
        if e.func == "if_then_else":
            return all(is_nonneg(a, nonneg) for a in e.args[1:])
    return False


def positive_lower_bound(e: A.Expr, bounds: dict[str, float], extents: dict[str, int],
                         nonneg: frozenset | set = frozenset()) -> float:
    """A lower bound ``> 0`` on ``e`` when one is provable, else 0: positive literals,
    ``a + b`` with both non-negative (``var + eps``), products and literal quotients of such,
    ``sqrt`` of one, ``exp(x)`` as ``e**-|x|``. It turns ``x / sqrt(var + 1e-5)`` into a finite
    bound ``|x| / sqrt(1e-5)``, so values after a normalisation stay bounded."""
    if isinstance(e, (A.Int, A.Float)):
        return float(e.value) if e.value > 0 else 0.0
    if isinstance(e, A.BinOp):
        if e.op == "+" and is_nonneg(e.lhs, nonneg) and is_nonneg(e.rhs, nonneg):
            return positive_lower_bound(e.lhs, bounds, extents, nonneg) + \
                positive_lower_bound(e.rhs, bounds, extents, nonneg)
        if e.op == "*":
            return positive_lower_bound(e.lhs, bounds, extents, nonneg) * \
                positive_lower_bound(e.rhs, bounds, extents, nonneg)
        if e.op == "/" and isinstance(e.rhs, (A.Int, A.Float)) and e.rhs.value > 0:
            return positive_lower_bound(e.lhs, bounds, extents, nonneg) / e.rhs.value
        return 0.0
    if isinstance(e, A.Call):
        if e.func == "sqrt":
            return math.sqrt(positive_lower_bound(e.args[0], bounds, extents, nonneg))
        if e.func == "exp":
            b = expr_bound(e.args[0], bounds, extents, nonneg)
            return math.exp(-b) if math.isfinite(b) else 0.0
    return 0.0


def expr_bound(e: A.Expr, bounds: dict[str, float], extents: dict[str, int],
               nonneg: frozenset | set = frozenset()) -> float:
    """Upper bound on ``|e|`` (a float; ``inf``: overflows a Python float, ``nan``: unknown)
    given ``bounds`` (tensor name -> bound on its elements), ``extents`` (loop index ->
    extent, so an index is at most ``extent - 1``) and ``nonneg`` (tensors known to be
    >= 0, for divisors: :func:`positive_lower_bound`). Rules in the module docstring."""
    if isinstance(e, A.Int):
        return float(abs(e.value))
    if isinstance(e, A.Float):
        return abs(e.value)
    if isinstance(e, A.Index):
        n = extents.get(e.name)
        return float(n - 1) if n is not None else UNKNOWN
    if isinstance(e, A.Tensor):
        return bounds.get(e.name, UNKNOWN)
    if isinstance(e, A.Neg):
        return expr_bound(e.operand, bounds, extents, nonneg)
    if isinstance(e, (A.Compare, A.BoolOp, A.Not)):
        return 1.0
    if isinstance(e, A.BinOp):
        a = expr_bound(e.lhs, bounds, extents, nonneg)
        if e.op == "%":
            return expr_bound(e.rhs, bounds, extents, nonneg)
        if e.op in ("/", "//"):
            r = e.rhs
            if isinstance(r, (A.Int, A.Float)) and r.value != 0:
                return a / abs(r.value) + (1.0 if e.op == "//" else 0.0)
            low = positive_lower_bound(r, bounds, extents, nonneg) if e.op == "/" else 0.0
            return a / low if low > 0 else UNKNOWN
        b = expr_bound(e.rhs, bounds, extents, nonneg)
        if e.op in ("+", "-"):
            return a + b
        if e.op == "*":
            return _mul(a, b)
        if e.op == "**":
            if isinstance(e.rhs, (A.Int, A.Float)):
                return _pow(a, float(e.rhs.value))
            return UNKNOWN
        return UNKNOWN
    if isinstance(e, A.Call):
        f = e.func
        args = [expr_bound(x, bounds, extents, nonneg) for x in (e.args[1:] if f == "if_then_else" else e.args)]
        if f == "exp":
            return _exp(args[0])
        if f == "sqrt":
            return math.sqrt(args[0])
        if f in ("abs", "max", "min", "if_then_else"):
            return _max(args)
        if f in ("floor", "ceil", "round"):
            return args[0] + 1.0
        if f in _BOUNDED_ONE:
            return 1.0
        return UNKNOWN
    return UNKNOWN


def _accumulation(eq: A.Assign) -> tuple[str, A.Expr] | None:
    """``(kind, e)`` for an accumulation ``X = X op e``: ``kind`` as
    :func:`steptp.leir.analysis.self_reference_kind` (``sum``, ``prod``, ``max``, ``min``)
    and ``e`` the accumulated term (:func:`steptp.engine.algebra.algebraic_target`); None
    otherwise, and when ``X`` cannot be separated from the term (``a - b + X``)."""
    from .algebra import algebraic_target  # sympy is imported on first use

    kind = self_reference_kind(eq)
    if kind is None:
        return None
    e = algebraic_target(eq)[1]
    return None if any(y == eq.target for y in A.walk(e)) else (kind, e)


def _analyse(module) -> tuple[dict[str, float], frozenset]:
    """(bounds, non-negative tensors) of :func:`tensor_bounds`: at :data:`FLOAT_INPUT_BOUND`,
    or at :data:`FALLBACK_INPUT_BOUND` where an output's bound then exceeds its dtype's
    largest value (the verifier's large trial falls back to its smaller scale where the
    original's outputs are not finite)."""
    out = _analyse_at(module, FLOAT_INPUT_BOUND)
    bounds = out[0]
    for t in module.signature.tensors:
        if t.is_output and bounds.get(t.name, 0.0) > DTYPE_MAX.get(t.dtype, math.inf):
            return _analyse_at(module, FALLBACK_INPUT_BOUND)
    return out


def input_bound(module) -> float:
    """The bound on ``|x|`` of a floating point input that :func:`tensor_bounds` uses for
    ``module``: :data:`FLOAT_INPUT_BOUND`, or :data:`FALLBACK_INPUT_BOUND` where the
    program's outputs may overflow at the former."""
    bounds = tensor_bounds(module)
    for t in module.signature.tensors:
        if not t.is_output and t.dtype.startswith(("f", "bf")):
            return bounds[t.name]
    return FLOAT_INPUT_BOUND


def _analyse_at(module, float_input: float) -> tuple[dict[str, float], frozenset]:
    """(bounds, non-negative tensors) with floating point inputs bounded by ``float_input``."""
    sig = module.signature
    largest_dim = max((d for t in sig.tensors for d in t.shape), default=1)
    bounds: dict[str, float] = {}
    nonneg: set[str] = set()
    written: set[str] = set()
    for t in sig.tensors:
        if t.is_output:
            continue
        floating = t.dtype.startswith(("f", "bf"))
        bounds[t.name] = float_input if floating else max(INT_INPUT_BOUND, float(largest_dim))
    for loops, eq in module.program.equations():
        x = eq.target
        extents = {l.var: l.extent for l in loops}
        used = {i.name for s in x.indices for i in A.walk(s) if isinstance(i, A.Index)}
        reduce_extent = math.prod(l.extent for l in loops if l.var not in used)
        prev = bounds.get(x.name, 0.0)
        acc = _accumulation(eq)
        if acc is not None:
            op, e = acc
            b = expr_bound(e, bounds, extents, nonneg)
            if op == "sum":
                new = prev + _mul(float(reduce_extent), b)
            elif op in ("max", "min"):
                new = _max((prev, b))
            else:  # X = X * e: the running product over the reduction
                new = _mul(_max((prev, 1.0)), _pow(b, float(reduce_extent)))
            keeps_sign = is_nonneg(e, nonneg) and (x.name in nonneg or x.name not in written)
        elif any(isinstance(y, A.Tensor) and y.name == x.name for y in A.walk(eq.value)):
            new = expr_bound(eq.value, bounds, extents, nonneg) if reduce_extent == 1 else UNKNOWN
            keeps_sign = False
        else:
            new = _max((prev, expr_bound(eq.value, bounds, extents, nonneg)))
            keeps_sign = is_nonneg(eq.value, nonneg) and (x.name in nonneg or x.name not in written)
        bounds[x.name] = new
        if keeps_sign:
            nonneg.add(x.name)
        else:
            nonneg.discard(x.name)
        written.add(x.name)
    return bounds, frozenset(nonneg)


_BOUNDS = IdentityMemo()
#: the subterms of an equation's value (by identity): every candidate of a site asks
_SUBTERMS = IdentityMemo()


def _analysis(module) -> tuple[dict[str, float], frozenset]:
    return _BOUNDS.get((module.program, module.signature), lambda: _analyse(module))


def tensor_bounds(module) -> dict[str, float]:
    """Upper bound on ``|x|`` for every element of every tensor of ``module`` (a
    :class:`~steptp.leir.fileformat.LeirModule`) under the verifier's inputs, as
    ``{name: float}`` (``inf``: overflows a Python float, ``nan``: unknown); rules in the
    module docstring. Intermediates (zero-initialised) are tracked as non-negative where
    every write is (sums of squares, exponentials), which gives a normalisation's divisor
    ``sqrt(var + eps)`` a positive lower bound. Memoised per (program, signature) object: a
    rule asks once per candidate."""
    return _analysis(module)[0]


def introduces_overflow(module, loops: tuple[A.Loop, ...], dtype: str, old: A.Expr, new: A.Expr) -> bool:
    """True when ``new`` has a subterm that ``old`` does not have whose known magnitude
    bound (:func:`expr_bound` with :func:`tensor_bounds`, loop indices bounded by ``loops``)
    exceeds :data:`DTYPE_MAX` of ``dtype`` (a LEIR float dtype code; other dtypes: always
    False): it may overflow, or it computes with a value that may be infinite (a ``-inf``
    mask or running-max start, whose bound is ``inf``), where real-number identities fail
    (``inf - inf``, ``0 * inf``). An unknown (``nan``) bound never exceeds it; subterms
    ``old`` already has are the original program's business."""
    limit = DTYPE_MAX.get(dtype)
    if limit is None:
        return False
    bounds, nonneg = _analysis(module)
    extents = {l.var: l.extent for l in loops}
    seen = _SUBTERMS.get((old,), lambda: frozenset(A.walk(old)))
    same: set | None = None
    for t in A.walk(new):
        if t in seen or not expr_bound(t, bounds, extents, nonneg) > limit:
            continue
        if same is None:
            same = {k for k in map(_exp_product_key, A.walk(old)) if k is not None}
        if _exp_product_key(t) not in same:
            return True
    return False


def _exp_product_key(e: A.Expr):
    """A key equal for two products with ``exp`` factors that are equal in real numbers
    because their non-``exp`` factors are the same and their exponents sum to the same
    linear combination (``exp(a)*exp(b)`` and ``exp(a+b)``; ``w*exp(2a)*exp(w)`` and
    ``exp(2a+w)*w``); None for anything else. Such a new product overflows exactly where
    the old one does (up to rounding), which is the original's business."""

    items: list[A.Expr] = []

    def rec(x):
        if isinstance(x, A.BinOp) and x.op == "*":
            rec(x.lhs)
            rec(x.rhs)
        else:
            items.append(x)

    rec(e)
    exps = [x.args[0] for x in items if isinstance(x, A.Call) and x.func == "exp"]
    if not exps:
        return None
    others = sorted(format_expr(x) for x in items if not (isinstance(x, A.Call) and x.func == "exp"))
    total = exps[0]
    for u in exps[1:]:
        total = A.BinOp("+", total, u)
    terms, const = linear_form(total)
    return tuple(others), tuple(sorted((format_expr(x), k) for x, k in terms.items())), const


@candidate_filter("no_overflow", required=("terms",))
def filter_no_overflow(module, env, terms):
    """The site is a candidate only when none of ``terms`` (expression templates filled with
    the bindings, e.g. ``exp(?c)``) has a new subterm that may overflow the equation's dtype
    for the program's value ranges (:func:`introduces_overflow`, old = the equation's value)."""
    from .patterns import instantiate, parse_expr_pattern

    ref = env.get("eq")
    if not isinstance(ref, EqRef):
        return True
    eq = get_item(module.program, ref.path)
    loops = enclosing_loops(module.program, ref.path)
    for src in terms:
        new = instantiate(parse_expr_pattern(src), env)
        if introduces_overflow(module, loops, eq.target.dtype, eq.value, new):
            return False
    return True


__all__ = ["UNKNOWN", "FLOAT_INPUT_BOUND", "FALLBACK_INPUT_BOUND", "INT_INPUT_BOUND", "input_bound", "DTYPE_MAX",
           "expr_bound", "is_nonneg", "positive_lower_bound", "tensor_bounds", "introduces_overflow",
           "filter_no_overflow"]
