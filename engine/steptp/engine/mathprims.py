"""Registrations that let rule files use :mod:`steptp.engine.algebra` (generic, any rule).

sympy is imported on first use, so importing :mod:`steptp.engine` stays fast.

* rewrite primitive ``normal_form: {function: F, arg: ?x}`` - replaces the site's
  algebraic target (:func:`~steptp.engine.algebra.algebraic_target`: an ``expr`` site's
  subterm, or an equation's value minus its accumulator form) by the sympy normal form
  ``F`` (:data:`~steptp.engine.algebra.FUNCTIONS`); logs a change whose ``step`` names the
  algebraic step for the CoT.
* candidate filter ``normal_form: {function: F, arg: ?x, distinct_from: [G, ...]}`` - the
  site is a candidate only when ``F`` changes the target (not merely reformatting it), the
  equation is floating point, and no function ``G`` listed in ``distinct_from`` gives the
  same result (for every argument ``G`` can take): where two strategies would produce the
  same program, the one listed owns it, so one transformation never carries two labels.
* ``look_through: true`` (filter and primitive; ``look_through: F`` on ``atoms_of``) - when
  ``F`` does not change the equation's own target, the target seen through producer nests:
  reads of intermediates replaced by their element-wise definitions (the conditions of the
  value function ``definition``: single writer, an earlier single-equation nest with the same
  loops, same subscript, no accumulation, nothing in between overwriting its inputs), level by
  level up to :data:`steptp.engine.algebra.LOOK_THROUGH_DEPTH`, the fewest levels that ``F``
  changes; only small definitions that ``F`` does not change by themselves are substituted
  (:func:`_through`). The translator emits one nest per PyTorch operator, so no single
  equation holds ``x*y + x*z`` or ``exp(x)*exp(y)``.
* parameter domains ``atoms_of: ?eq`` (tensor accesses and exp/log/sqrt/tanh/erf calls of
  the target: what ``collect``/``apart``/``distribute`` may act on), ``exp_factors_of: ?eq``
  (``exp(u)`` and ``exp(-u)`` for each ``exp(u)``: non-zero common factors), and
  ``reusable_terms: ?site`` with ``identity`` (existing values a split may introduce:
  outputs of earlier sibling nests with the same loops, read at their written subscript,
  and guarded previous elements ``if_then_else(k<1, identity, T_{..,k-1})`` of the site's
  tensor accesses; see :func:`reusable_terms`; which are safe is the rule's ``filter:
  provably``, :mod:`steptp.engine.signs`).
* ``safe_operands: true`` (filter) - the normal form adds or removes no division, ``log``,
  ``sqrt`` or negative/fractional power of an operand the sign analysis does not prove safe
  (:func:`steptp.engine.signs.unsafe_operands`, the symbolic check's floating-point gate).
"""

from __future__ import annotations

from ..leir import ast as A
from ..leir.printer import format_expr
from .filters import candidate_filter, extra_domain
from .navigation import IdentityMemo, enclosing_loops
from .primitives import (Change, EqRef, EvalContext, RewriteContext, RewriteError, ValueExprError, eval_value,
                         get_item, primitive, replace_item)


def _equation(module, env) -> A.Assign:
    ref = env.get("eq")
    if not isinstance(ref, EqRef):
        raise ValueExprError("the math filters and domains need an equation or expr site (?eq)")
    return get_item(module.program, ref.path)


def _target_of(module, env, value=None, look_through=None, arg=None) -> A.Expr:
    """The algebraic target for the bindings: ``value`` if it is a term, the target of the
    equation ``value``/``?eq`` otherwise (expr sites: the site subterm). With
    ``look_through`` (a normal-form name) an equation's target may be seen through producer
    nests (:func:`_through`, for the argument ``arg``)."""
    from . import algebra as G

    if value is not None and not isinstance(value, EqRef):
        return value
    if value is None and "site" in env and not isinstance(env["site"], EqRef):
        return env["site"]
    ref = value if isinstance(value, EqRef) else env.get("eq")
    eq = get_item(module.program, value.path) if isinstance(value, EqRef) else _equation(module, env)
    target = G.algebraic_target(eq)[1]
    if look_through:
        return _through(module, ref, target, look_through, arg)
    return target


#: a producer's definition is substituted only when it has at most this many nodes (the
#: translator's one-operator nests; a hand-written multi-operator equation stays a read)
MAX_INLINE_NODES = 12


def _inlinable(function: str):
    """Which producer definitions a normal form ``function`` looks through: small ones
    (:data:`MAX_INLINE_NODES`) that ``function`` does not itself change (for any argument):
    a change inside one producer is that producer's own candidate, not this equation's."""
    from . import algebra as G

    takes = G.FUNCTIONS[function][1]

    def keep(d: A.Expr) -> bool:
        if G.count_nodes(d) > MAX_INLINE_NODES:
            return False
        return all(G.normal_form(d, function, a) is None for a in (_arg_domain(function, d) if takes else [None]))

    return keep


_THROUGH = IdentityMemo()


def _through_targets(module, ref, target: A.Expr, function: str) -> tuple[A.Expr, ...]:
    """:func:`steptp.engine.algebra.through_targets` for the equation ``ref``, memoised
    per program (by identity) and (nest, target, function): the look-through domain and
    filter ask it once per candidate argument of the same equation."""
    from . import algebra as G

    if not isinstance(ref, EqRef) or len(ref.path) != 2:
        return (target,)
    cache = _THROUGH.get((module.program, module.signature), dict)
    key = (ref.path[0], target, function)
    hit = cache.get(key)
    if hit is None:
        sig = frozenset(t.name for t in module.signature.tensors)
        hit = cache[key] = tuple(G.through_targets(module.program, ref.path[0], target, sig,
                                                   keep=_inlinable(function)))
    return hit


def _through(module, ref, target: A.Expr, function: str, arg=None) -> A.Expr:
    """The target a normal form with ``look_through`` rewrites: the equation's own target
    when ``function`` (with the argument ``arg``) changes it; else the first of its
    producer-inlined forms (:func:`steptp.engine.algebra.through_targets`: reads of
    intermediates replaced by their element-wise definitions, level by level, with the
    safety conditions of the value function ``definition``; only definitions of at most
    :data:`MAX_INLINE_NODES` nodes that ``function`` does not change by themselves) that it
    changes; else the equation's own target. Only for an equation directly in a top-level nest: the
    translator emits one nest per PyTorch operator, so ``x*y + x*z + y`` is ``G=x*y;
    H=x*z; I=G+H; J=I+y`` and no single equation holds the sum of products."""
    from . import algebra as G

    if function not in G.FUNCTIONS:
        raise RewriteError(f"look_through: unknown normal form {function!r}")
    for cand in _through_targets(module, ref, target, function):
        if G.normal_form(cand, function, arg) is not None:
            return cand
    return target


def _arg(module, env, arg):
    if arg is None:
        return None
    v = eval_value(arg, EvalContext(module, env))
    if isinstance(v, str):
        return A.Index(v)
    return v


def _arg_domain(function: str, target: A.Expr) -> list:
    from . import algebra as G

    if function == "expand_cancel":
        return G.exp_factors(target)
    return G.atoms(target)


@candidate_filter("normal_form", required=("function",), optional=("arg", "distinct_from", "look_through",
                                                                  "no_overflow", "safe_operands"))
def filter_normal_form(module, env, function, arg=None, distinct_from=(), look_through=False, no_overflow=False,
                       safe_operands=False):
    """Accept the site when the sympy normal form ``function`` (``factor``, ``expand``,
    ``cancel``, ``expand_cancel``, ``apart``, ``together``, ``powsimp``, ``expand_powsimp``,
    ``collect``, ``distribute``; in the variable ``arg`` for ``apart``/``collect``/``distribute``)
    really changes its algebraic target (not merely reformatting it), the equation is floating
    point, and no function listed in ``distinct_from`` gives the same result (that strategy owns
    the transformation). ``look_through: true``: the target seen through producer nests (reads of
    element-wise intermediates replaced by their definitions). ``no_overflow: true``: the normal
    form must also not introduce a subterm that may overflow the equation's dtype
    (:func:`steptp.engine.magnitude.introduces_overflow`). ``safe_operands: true``: the normal
    form must neither add nor remove a division, ``log``, ``sqrt`` or negative/fractional
    power of an operand that the sign analysis does not prove safe at the site
    (:func:`steptp.engine.signs.unsafe_operands`: ``cancel`` turning ``x*y/y`` into ``x``
    changes the nan of ``y = 0`` into a number; ``together`` over ``exp(2a)+1`` divides by
    ``inf``), so that what the rule proposes the symbolic check can prove in floating point."""
    from . import algebra as G
    from .magnitude import introduces_overflow

    eq = _equation(module, env)
    if eq.target.dtype not in G.FLOAT_DTYPES:
        return False
    x = _arg(module, env, arg)
    target = _target_of(module, env, look_through=function if look_through else None, arg=x)
    res = G.normal_form(target, function, x)
    if res is None:
        return False
    for other in distinct_from or ():
        if other not in G.FUNCTIONS:
            raise RewriteError(f"distinct_from: unknown normal form {other!r}")
        takes = G.FUNCTIONS[other][1]
        for a in (_arg_domain(other, target) if takes else [None]):
            if G.normal_form(target, other, a) == res:
                return False
    if no_overflow and isinstance(env.get("eq"), EqRef) and \
            introduces_overflow(module, enclosing_loops(module.program, env["eq"].path), eq.target.dtype, target, res):
        return False
    if safe_operands and isinstance(env.get("eq"), EqRef):
        from .signs import site_judge, unsafe_operands

        if unsafe_operands(target, res, site_judge(module.program, env["eq"].path, module.signature)):
            return False
    return True


@primitive("normal_form", required=("function",), optional=("arg", "look_through"))
def prim_normal_form(ctx: RewriteContext, function, arg=None, look_through=False):
    """Replace the site's algebraic target (an ``expr`` site's subterm; an equation's value
    without its accumulator form) by its sympy normal form ``function``
    (:data:`steptp.engine.algebra.FUNCTIONS`), tensor accesses kept apart by subscript."""
    from . import algebra as G

    s = ctx.site
    if s.equation is None:
        raise RewriteError("normal_form needs an equation or expr site")
    path = ctx.remap(s.equation)
    eq = get_item(ctx.program, path)
    epath, target = G.algebraic_target(eq, s.expr)
    own = target
    x = _arg(ctx.module, ctx.env, arg)
    if look_through and s.expr is None:
        target = _through(ctx.module, EqRef(path), target, function, x)
    is_chain = s.expr is None and G.accumulation(eq) is not None
    new = G.normal_form(target, function, x)
    if new is None:
        raise RewriteError(f"normal_form: {function} does not change '{format_expr(target)}'")
    ctx.program = replace_item(ctx.program, path, A.Assign(eq.target, G.replace_target(eq, s.expr, new)))
    ctx.changes.append(Change("normal_form", format_expr(target), format_expr(new), str(EqRef(path)),
                              {"function": function, "sympy": G.SYMPY_CALLS.get(function, function),
                               "arg": format_expr(x) if x is not None else "",
                               "part": "subterm" if s.expr is not None else
                               ("right-hand side" if not epath and not is_chain else "accumulated term"),
                               "step": G.describe(target, function, x),
                               **({"through": format_expr(own)} if target != own else {})}))


@extra_domain("atoms_of", modifiers=("look_through",))
def domain_atoms_of(spec: dict, ctx: EvalContext) -> list:
    """The distinct tensor accesses and exp/log/sqrt/tanh/erf calls of an equation's algebraic
    target (first-occurrence order): what ``collect``, ``apart`` and ``distribute`` may act on.
    With ``look_through: F`` also those of the target seen through producer nests (reads of
    element-wise intermediates replaced by their definitions), appended in order of depth (the
    ``normal_form`` filter keeps the ones ``F`` changes something for)."""
    from . import algebra as G

    value = eval_value(spec["atoms_of"], ctx)
    if not spec.get("look_through") or not (value is None or isinstance(value, EqRef)) \
            or (value is None and "site" in ctx.env and not isinstance(ctx.env["site"], EqRef)):
        return G.atoms(_target_of(ctx.module, ctx.env, value))
    ref = value if isinstance(value, EqRef) else ctx.env.get("eq")
    eq = get_item(ctx.module.program, value.path) if isinstance(value, EqRef) else _equation(ctx.module, ctx.env)
    out: list = []
    for t in _through_targets(ctx.module, ref, G.algebraic_target(eq)[1], spec["look_through"]):
        out += [a for a in G.atoms(t) if a not in out]
    return out


@extra_domain("exp_factors_of")
def domain_exp_factors_of(spec: dict, ctx: EvalContext) -> list:
    """``exp(u)`` and ``exp(-u)`` for every ``exp(u)`` of the target."""
    from . import algebra as G

    return G.exp_factors(_target_of(ctx.module, ctx.env, eval_value(spec["exp_factors_of"], ctx)))


_FACTS = IdentityMemo()


def _writers(prog: A.Program) -> dict[str, set[int]]:
    """Tensor name -> the top-level nests that write it (memoised by program identity)."""
    return _program_facts(prog)[0]


def _program_facts(prog: A.Program) -> tuple[dict[str, set[int]], dict[tuple, list[tuple[int, A.Tensor]]]]:
    """``(writers, outputs by loops)`` of a program, once per program (a split rule asks at
    every site: on 348 nests 976 recomputations cost 0.43 s). ``outputs by loops``: for
    each top-level loop tuple, ``(nest, target)`` of the floating-point targets written
    only by that nest at a subscript of its plain loop indices and integers, in order."""
    from . import algebra as G

    def compute():
        writers: dict[str, set[int]] = {}
        for n, nest in enumerate(prog.nests):
            for _, eq in nest.equations():
                writers.setdefault(eq.target.name, set()).add(n)
        by_loops: dict[tuple, list[tuple[int, A.Tensor]]] = {}
        for n0, nest in enumerate(prog.nests):
            vars0 = {l.var for l in nest.loops}
            for item in nest.body:
                if not isinstance(item, A.Assign):
                    continue
                x = item.target
                if x.dtype not in G.FLOAT_DTYPES or writers.get(x.name) != {n0}:
                    continue
                if all(isinstance(i, A.Int) or (isinstance(i, A.Index) and i.name in vars0) for i in x.indices):
                    by_loops.setdefault(nest.loops, []).append((n0, x))
        return writers, by_loops

    return _FACTS.get((prog,), compute)


def _value_tensors(e: A.Expr) -> list[A.Tensor]:
    out: list[A.Tensor] = []

    def rec(x):
        if isinstance(x, A.Tensor):
            if x not in out:
                out.append(x)
            return
        for c in A.children(x):
            rec(c)

    rec(e)
    return out


_CONDITION_TERMS = IdentityMemo()


def _in_condition(prog: A.Program, path: tuple, value: A.Expr, term: A.Expr) -> bool:
    """``term`` occurs inside a comparison or boolean operator of ``value``, the value of
    the equation at ``path`` of ``prog`` (the subterms under conditions are collected once
    per equation: a split rule asks at every subterm)."""
    cache = _CONDITION_TERMS.get((prog,), dict)
    inside = cache.get(path)
    if inside is None:
        inside = set()
        for x in A.walk(value):
            if isinstance(x, (A.Compare, A.BoolOp, A.Not)):
                inside.update(A.walk(x))
        cache[path] = inside
    return term in inside


_TAINTED = IdentityMemo()


def _tainted(prog: A.Program, avoid: set[str]) -> set[str]:
    """Tensors written by an equation that calls a function in ``avoid`` or reads a tensor
    already in the set (transitively: ``H = G*2`` inherits the exact zeros of
    ``G = 0.5*F*(1+tanh(..))``). Memoised for the last 32 (program, avoid) pairs by program
    identity: a split rule asks once per site (multiplicative_split on 348 nests: 17 s of
    its 19 s were this fixed point, recomputed 976 times)."""
    if not avoid:
        return set()
    return set(_TAINTED.get((prog,), lambda: frozenset(_tainted_uncached(prog, avoid)), frozenset(avoid)))


def _tainted_uncached(prog: A.Program, avoid: set[str]) -> set[str]:
    eqs = [eq for _, eq in prog.equations()]
    out = {eq.target.name for eq in eqs
           if any(isinstance(y, A.Call) and y.func in avoid for y in A.walk(eq.value))}
    changed = True
    while changed:
        changed = False
        for eq in eqs:
            if eq.target.name not in out and any(isinstance(y, A.Tensor) and y.name in out and y.name != eq.target.name
                                                 for y in A.walk(eq.value)):
                out.add(eq.target.name)
                changed = True
    return out


def reusable_terms(module, env: dict, term: A.Expr, identity: float, avoid=()) -> list[A.Expr]:
    """Existing values a split strategy may introduce at ``term`` (paper App. A.3:
    "introducing an existing variable"), deterministic order:

    1. guarded previous elements: for each floating-point tensor access ``T_{..,k}`` of
       ``term`` whose last subscript is a loop index ``k`` (extent >= 2) and that is not
       written in the site's nest or later, ``if_then_else(k<1, identity, T_{..,k-1})``;
    2. earlier outputs: ``X_{s}`` for each floating-point tensor written (only) by an
       earlier top-level sibling nest with the same loops, at a subscript of plain loop
       indices and integers.

    Tensors computed (directly or through other tensors) with one of the functions
    ``avoid`` are never used (floating-point honesty, chosen by the rule: ``[max, min, abs,
    if_then_else, tanh, erf, exp]`` keeps values that can be exactly zero - clamps, masks,
    saturated tanh/erf, underflowed exp - out of a divisor; ``[exp]`` keeps values that may
    be huge out of an exponent). ``avoid`` is a coarse first cut: inputs may be exactly 0
    and as large as 64, so which of the remaining values is safe for the rule's rewrite is
    decided by the sign analysis, the rule's ``filter: provably``
    (:mod:`steptp.engine.signs`: ``multiplicative_split`` divides only by a provably
    non-zero, finite ``c``; design.md §8).

    The site must lie in a floating-point equation, must not be or contain the equation's
    target (the accumulator of ``X = X + f`` or ``X = max(X, f)``), and must not occur inside
    a comparison; otherwise the list is empty."""
    from . import algebra as G

    prog = module.program
    ref = env.get("eq")
    if not isinstance(ref, EqRef):
        return []
    eq = get_item(prog, ref.path)
    if eq.target.dtype not in G.FLOAT_DTYPES or _in_condition(prog, ref.path, eq.value, term) \
            or any(x == eq.target for x in A.walk(term)):
        return []  # never the accumulator (nor a term containing it): X = max(X, f) keeps its form
    top = ref.path[0]
    loops = {l.var: l.extent for l in enclosing_loops(prog, ref.path)}
    writers = _writers(prog)
    avoided = _tainted(prog, set(avoid))
    out: list[A.Expr] = []
    for t in _value_tensors(term):
        if t.dtype not in G.FLOAT_DTYPES or not t.indices or t == eq.target:
            continue
        if any(n >= top for n in writers.get(t.name, ())) or t.name in avoided:
            continue
        k = t.indices[-1]
        if isinstance(k, A.Index) and loops.get(k.name, 0) >= 2:
            prev = t.with_indices(t.indices[:-1] + (A.BinOp("-", k, A.Int(1)),))
            c = A.Call("if_then_else", (A.Compare("<", k, A.Int(1)), A.Float(float(identity)), prev))
            if c not in out:
                out.append(c)
    seen = set(out)
    for n0, x in _program_facts(prog)[1].get(prog.nests[top].loops, ()):
        if n0 >= top:
            break
        if x == term or x.name in avoided:
            continue
        if x not in seen:
            seen.add(x)
            out.append(x)
    return out


@extra_domain("reusable_terms", modifiers=("identity", "avoid"))
def domain_reusable_terms(spec: dict, ctx: EvalContext) -> list:
    """Existing values a split may introduce at a site (:func:`reusable_terms`): outputs of
    earlier sibling nests with the same loops, read at their written subscript, and guarded
    previous elements ``if_then_else(k<1, identity, T_{..,k-1})`` of the site's tensor accesses;
    ``identity`` (default 0) fills the guarded first element, ``avoid`` lists functions whose
    outputs are never introduced (directly or through other tensors). Empty for a site that is
    or contains the equation's target."""
    term = eval_value(spec["reusable_terms"], ctx)
    if not isinstance(term, (A.Tensor, A.Call)) or (isinstance(term, A.Call) and term.func == "if_then_else"):
        return []
    return reusable_terms(ctx.module, ctx.env, term, float(spec.get("identity", 0)), tuple(spec.get("avoid", ())))


__all__ = ["filter_normal_form", "prim_normal_form", "domain_atoms_of", "domain_exp_factors_of", "reusable_terms",
           "domain_reusable_terms"]
