"""Index arithmetic on LEIR subscripts: simplification of integer index expressions given
each loop index's range, as TVM's ``arith.Analyzer`` does after ``split``/``fuse``
(``(io*f+ii)//f -> io`` when ``0 <= ii < f``). Used by the PyTorch translator (reshape views'
linear indices) and by the rule engine's ``substitute_index`` (a loop split of a loop whose
index is divided by the split factor). No torch, no TVM."""

from __future__ import annotations

from . import ast as A
from .analysis import LeirSemanticError, interval


def _linear(e: A.Expr):
    """``e`` as (ordered {atom: coefficient}, constant) for + - unary- and *constant;
    ``(x//k)*k + x%k`` is folded back into ``x``."""
    terms, const = _linear_raw(e)
    return _fold_divmod(terms), const


def _linear_raw(e: A.Expr):
    if isinstance(e, A.Int):
        return {}, e.value
    if isinstance(e, A.Neg):
        t, c = _linear_raw(e.operand)
        return {k: -v for k, v in t.items()}, -c
    if isinstance(e, A.BinOp) and e.op in ("+", "-"):
        t1, c1 = _linear_raw(e.lhs)
        t2, c2 = _linear_raw(e.rhs)
        s = 1 if e.op == "+" else -1
        out = dict(t1)
        for k, v in t2.items():
            out[k] = out.get(k, 0) + s * v
        return {k: v for k, v in out.items() if v != 0}, c1 + s * c2
    if isinstance(e, A.BinOp) and e.op == "*":
        for num, other in ((e.rhs, e.lhs), (e.lhs, e.rhs)):
            if isinstance(num, A.Int):
                t, c = _linear_raw(other)
                return {k: v * num.value for k, v in t.items() if v * num.value}, c * num.value
    return {e: 1}, 0


def _fold_divmod(terms: dict) -> dict:
    """Replace ``(x//k)*(c*k) + (x%k)*c`` by ``x*c`` (x linearised again)."""
    changed = True
    while changed:
        changed = False
        for atom, coef in list(terms.items()):
            if not (isinstance(atom, A.BinOp) and atom.op == "%" and isinstance(atom.rhs, A.Int)):
                continue
            k = atom.rhs.value
            q = A.BinOp("//", atom.lhs, A.Int(k))
            if terms.get(q) != coef * k:
                continue
            inner, c0 = _linear_raw(atom.lhs)
            if c0 != 0:
                continue
            del terms[atom], terms[q]
            for a, c in inner.items():
                terms[a] = terms.get(a, 0) + c * coef
            terms = {a: c for a, c in terms.items() if c != 0}
            changed = True
            break
    return terms


def _build(terms: dict, const: int) -> A.Expr:
    out: A.Expr | None = None
    for atom, c in terms.items():
        t = atom if abs(c) == 1 else A.BinOp("*", atom, A.Int(abs(c)))
        if out is None:
            out = t if c > 0 else A.Neg(t)
        else:
            out = A.BinOp("+" if c > 0 else "-", out, t)
    if out is None:
        return A.int_literal(const)
    if const > 0:
        out = A.BinOp("+", out, A.Int(const))
    elif const < 0:
        out = A.BinOp("-", out, A.Int(-const))
    return out


def _range(terms: dict, const: int, ranges: dict[str, int]):
    lo = hi = float(const)
    for atom, c in terms.items():
        a, b = interval(atom, ranges)
        if c >= 0:
            lo, hi = lo + c * a, hi + c * b
        else:
            lo, hi = lo + c * b, hi + c * a
    return lo, hi


def _divisors_desc(d: int) -> list[int]:
    return [g for g in range(d, 0, -1) if d % g == 0]


def _divmod_simplify(terms: dict, const: int, d: int, op: str, ranges: dict[str, int]) -> A.Expr | None:
    """``(sum c_i*x_i + c0) // d`` or ``% d`` for non-negative terms, or ``None``.

    Finds the largest ``g | d`` such that the terms whose coefficient ``g`` does not divide
    (the *low* part ``L``) satisfy ``0 <= L < g``; then with ``E = g*E' + L``:
    ``E//d = E'//(d/g)`` and ``E%d = (E' % (d/g))*g + L``. In ``E'`` the terms divisible by
    ``d' = d/g`` leave the division (``(Q*d'+R)//d' = Q + R//d'``, ``(Q*d'+R)%d' = R%d'``),
    and ``R//d'``/``R%d'`` vanish when ``0 <= R < d'``."""
    for g in _divisors_desc(d):
        high = {a: c // g for a, c in terms.items() if c % g == 0}
        low = {a: c for a, c in terms.items() if c % g != 0}
        hc, lc = (const // g, 0) if const % g == 0 else (0, const)
        lo, hi = _range(low, lc, ranges)
        if lo < 0 or hi >= g:
            continue
        dp = d // g
        q = {a: c // dp for a, c in high.items() if c % dp == 0}
        r = {a: c for a, c in high.items() if c % dp != 0}
        qc, rc = hc // dp, hc % dp
        rlo, rhi = _range(r, rc, ranges)
        r_small = 0 <= rlo and rhi < dp
        if op == "//":
            if r_small:
                return _build(q, qc)
            if not q:  # nothing leaves the division: keep the constant inside
                return A.BinOp("//", _build(r, hc), A.Int(dp)) if g > 1 else None
            return _build({**q, A.BinOp("//", _build(r, rc), A.Int(dp)): 1}, qc)
        # modulo
        rem = _build(r, rc) if r_small else A.BinOp("%", _build(r, rc), A.Int(dp))
        if not (r or rc):
            rem = A.Int(0)
        if r_small is False and not q and not qc and g == 1:
            return None  # nothing to gain
        out_terms = {} if rem == A.Int(0) else {rem: g}
        for a, c in low.items():
            out_terms[a] = out_terms.get(a, 0) + c
        return _build(out_terms, lc)
    return None


def simplify_index(e: A.Expr, ranges: dict[str, int]) -> A.Expr:
    """Simplify an integer index expression, given each loop index ``i`` ranges over
    ``0 .. ranges[i]-1``: ``(x*k+y)//k -> x`` and ``(x*k+y)%k -> y`` when ``0 <= y < k``,
    ``x % n -> x`` when ``0 <= x < n``, ``(x*5+y)//20 -> x//4`` when ``0 <= y < 5``,
    ``(x//k)*k + x%k -> x``. Only non-negative operands are rewritten (floor division and
    modulo then agree with C semantics); anything else is left unchanged."""

    def fn(x: A.Expr) -> A.Expr:
        if isinstance(x, A.BinOp) and x.op in ("+", "-"):
            raw, const = _linear_raw(x)
            folded = _fold_divmod(dict(raw))
            return _build(folded, const) if folded != raw else x
        if not (isinstance(x, A.BinOp) and x.op in ("//", "%") and isinstance(x.rhs, A.Int) and x.rhs.value > 0):
            return x
        terms, const = _linear(x.lhs)
        try:
            lo, _ = _range(terms, const, ranges)
            if lo < 0 or const < 0 or any(c < 0 for c in terms.values()) or any(
                    interval(a, ranges)[0] < 0 for a in terms):
                return x
            out = _divmod_simplify(terms, const, x.rhs.value, x.op, ranges)
        except LeirSemanticError:
            return x
        return x if out is None else out

    return A.transform(e, fn)


def simplify_subscripts(nest: A.Nest, outer: dict[str, int] | None = None) -> A.Nest:
    """Apply :func:`simplify_index` to every tensor subscript of a nest (nested nests too)."""
    ranges = dict(outer or {})
    ranges.update({l.var: l.extent for l in nest.loops})

    def fix(x: A.Expr) -> A.Expr:
        if isinstance(x, A.Tensor) and x.indices:
            return x.with_indices(tuple(simplify_index(i, ranges) for i in x.indices))
        return x

    body = []
    for item in nest.body:
        if isinstance(item, A.Assign):
            t = A.transform(item.target, fix)
            body.append(A.Assign(t, A.transform(item.value, fix)))
        else:
            body.append(simplify_subscripts(item, ranges))
    return A.Nest(nest.loops, tuple(body))


__all__ = ["simplify_index", "simplify_subscripts"]
