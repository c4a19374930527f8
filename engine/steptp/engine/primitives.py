"""Rewrite primitives that rule YAML files name (``rewrite:``): no strategy-specific code
lives here. :data:`PRIMITIVES`: ``replace``, ``substitute_index``, ``permute_loops``,
``set_loop``, ``concat_nests``, ``split_nest``, ``insert_nest``, ``remove_nest``,
``swap_nests``, ``set_scope``, ``rename_tensor``, ``set_loops``, ``replace_all`` (the
structural ones in :mod:`steptp.engine.structural`, the algebraic ones in
:mod:`steptp.engine.mathprims`). Each takes a :class:`RewriteContext` and its YAML
arguments, returns nothing, updates ``ctx.program`` and logs a :class:`Change`.

The pieces primitives are made of live beside this module and are re-exported here:
references, navigation and fresh names in :mod:`steptp.engine.navigation`; value
expressions and parameter domains in :mod:`steptp.engine.domains`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from ..leir import ast as A
from ..leir.fileformat import LeirModule
from ..leir.indexarith import simplify_subscripts
from ..leir.printer import format_assign, format_expr, format_loops, format_nest
from . import patterns as P
from .domains import (DOMAIN_MODIFIERS, DOMAINS, MAX_DOMAIN_VALUES, VALUE_FUNCTIONS, EvalContext, ValueExprError,
                      divisors, domain_values, eval_let, eval_value, is_expression, parse_value, permutations,
                      value_vars)
from .navigation import (INDEX_ALPHABET, RESERVED_INDEX_NAMES, TENSOR_ALPHABET, CreatedRef, EqRef, NestRef,
                         RewriteError, _fmt_path, _shift_path, enclosing_loops, expr_at, fresh_index_name,
                         fresh_tensor_name, get_item, get_nest, iter_tensors, map_nest_exprs, nest_loop_vars,
                         program_names, replace_expr, replace_item, replace_items, value_children,
                         value_occurrences)


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
    the site's nest), inner nests included: ``{"?i": "?io*?f+?ii"}``. The nest's subscripts
    are then simplified with the loops' ranges (:func:`steptp.leir.indexarith.simplify_index`;
    TVM's ``arith.Analyzer`` does the same after ``split``): a read ``X[i//66]`` of a loop
    split by 66 becomes ``X[io]``, not ``X[(io*66+ii)//66]``."""
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
    outer = {lp.var: lp.extent for lp in enclosing_loops(ctx.program, path)} if len(path) > 1 else {}
    new = simplify_subscripts(new, outer)
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


def _loop_at(ctx: RewriteContext, nest, pos, prim: str) -> tuple[tuple[int, ...], int, A.Nest]:
    """``(path, position, nest)`` of the loop a step names (default: the site's nest and
    loop). Raises ``RewriteError`` naming primitive ``prim`` when there is no such loop."""
    path = ctx.nest_ref(nest) if nest is not None else ctx.site_nest()
    p = ctx.value(pos) if pos is not None else ctx.site.loop
    n = get_nest(ctx.program, path)
    if p is None or not 0 <= p < len(n.loops):
        raise RewriteError(f"{prim}: no loop at position {p}")
    return path, p, n


@primitive("set_loop", optional=("nest", "pos", "kind", "extent", "var"))
def prim_set_loop(ctx: RewriteContext, nest=None, pos=None, kind=None, extent=None, var=None):
    """Change one loop's kind, extent and/or index name (default: the site's loop). A new
    index name is substituted in the nest's equations. TVM: ``sch.parallel``,
    ``sch.vectorize``, ``sch.unroll``, ``sch.bind``."""
    path, p, n = _loop_at(ctx, nest, pos, "set_loop")
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


@primitive("concat_nests", positional="nests", required=("nests",), optional=("loops", "depth"))
def prim_concat_nests(ctx: RewriteContext, nests, loops=None, depth=None):
    """Fuse consecutive sibling nests into the first: the loops stay (they must be
    identical unless ``loops`` gives a template) and the bodies are concatenated in
    order, so one iteration runs every equation. TVM: ``sch.compute_at`` of the producer
    at the innermost shared loop.

    With ``depth`` k only the first k loops are shared (identical in every nest): the fused
    nest runs them once, and inside them each nest's remaining loops in turn, as an inner
    nest (a nest with no loops left contributes its body items). TVM: ``compute_at`` at the
    k-th loop, e.g. a blockIdx loop, each operator keeping its own thread loops (a phase)."""
    paths = [ctx.nest_ref(x) for x in nests]
    if len(paths) < 2 or not _siblings_consecutive(paths):
        raise RewriteError("concat_nests needs two or more consecutive sibling nests")
    ns = [get_nest(ctx.program, p) for p in paths]
    if depth is not None:
        k = ctx.value(depth)
        if loops is not None:
            raise RewriteError("concat_nests: give loops or depth, not both")
        if not isinstance(k, int) or isinstance(k, bool) or not 0 < k <= min(len(n.loops) for n in ns):
            raise RewriteError(f"concat_nests: depth {k!r} is not between 1 and every nest's loop count")
        if any(n.loops[:k] != ns[0].loops[:k] for n in ns):
            raise RewriteError(f"concat_nests: the nests' first {k} loops differ")
        body = tuple(item for n in ns
                     for item in ((A.Nest(n.loops[k:], n.body),) if len(n.loops) > k else n.body))
        fused = A.Nest(ns[0].loops[:k], body)
    else:
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


def _implicit_init(ctx: RewriteContext, path: tuple[int, ...]) -> float | None:
    """The identity that LEIR's implicit initialisation gives the one equation of the
    top-level nest at ``path`` (None: no implicit init, or a nest that is not top-level)."""
    from ..leir.analysis import analyze  # noqa: PLC0415 - the program's semantics, per call

    if len(path) != 1:
        return None
    info = analyze(ctx.program, ctx.module.signature, check_bounds=False)
    inits = [s.init for s in info.equations if s.inst.path[0] == path[0]]
    if all(i is None for i in inits):
        return None
    n = get_nest(ctx.program, path)
    if len(n.body) != 1 or not isinstance(n.body[0], A.Assign):
        raise RewriteError("partition_loop: a nest with an implicitly initialised accumulation must be one equation")
    return inits[0]


@primitive("partition_loop", required=("at",), optional=("nest", "pos"))
def prim_partition_loop(ctx: RewriteContext, at, nest=None, pos=None):
    """Index-set splitting: the nest (default: the site's) runs iterations ``[0, at)`` of its
    loop at ``pos`` (default: the site's loop) and a copy placed right after it runs
    ``[at, n)``, its index shifted by ``at`` (the copy's loop has extent ``n - at``; every
    other loop and the body are the same). TVM: ``tvm.tir.transform.LoopPartition``; the
    Halide/TVM "split with a tail" that peels the iterations a tile does not divide. Sound
    only where the loop's iterations are independent (the rule's preconditions say why).

    An accumulation that LEIR initialises implicitly (its target written by no earlier
    equation, :mod:`steptp.leir.analysis`) keeps that in the first nest; in the copy the
    target has been written already, so a nest over the copy's spatial loops (those its
    target subscript uses) first sets the copy's elements to the operator's identity
    (``0.0``, ``1.0``, ``-inf``, ``inf``), right before it. Raises ``RewriteError`` unless
    ``0 < at < n``, or for a top-level nest that is not one equation when an init is needed."""
    from ..leir.analysis import index_names  # noqa: PLC0415

    path, p, n = _loop_at(ctx, nest, pos, "partition_loop")
    lp = n.loops[p]
    k = ctx.value(at)
    if not isinstance(k, int) or not 0 < k < lp.extent:
        raise RewriteError(f"partition_loop: cannot partition {lp.extent} iterations at {k}")
    head = A.Nest(n.loops[:p] + (A.Loop(lp.kind, k, lp.var),) + n.loops[p + 1:], n.body)
    tail = A.Nest(n.loops[:p] + (A.Loop(lp.kind, lp.extent - k, lp.var),) + n.loops[p + 1:], n.body)
    tail = map_nest_exprs(tail, lambda e: A.substitute_indices(e, {lp.var: A.BinOp("+", A.Index(lp.var), A.Int(k))}))
    outer = {x.var: x.extent for x in enclosing_loops(ctx.program, path)} if len(path) > 1 else {}
    tail = simplify_subscripts(tail, outer)
    items = (head, tail)
    init = _implicit_init(ctx, path)
    if init is not None:
        eq = tail.body[0]
        used = set().union(*(index_names(i) for i in eq.target.indices)) if eq.target.indices else set()
        items = (head, A.Nest(tuple(x for x in tail.loops if x.var in used),
                              (A.Assign(eq.target, A.float_literal(init)),)), tail)
    ctx.program = replace_items(ctx.program, path, items)
    nxt = path[:-1] + (path[-1] + len(items) - 1,)
    ctx.shift(path[:-1] + (path[-1] + 1,), len(items) - 1)
    ctx.last_created = nxt
    ctx.changes.append(Change("partition", format_nest(n), "".join(format_nest(x) for x in items), str(NestRef(path))))


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
    """Give a tensor storage scope ``scope`` (g/s/l) at every occurrence; ``tensor`` may be
    a list of names (every one gets the scope; an empty list changes nothing). TVM:
    ``tvm.s_tir.Schedule.set_scope``."""
    names, sc = ctx.value(tensor), ctx.value(scope)
    if sc not in A.SCOPES:
        raise RewriteError(f"set_scope: unknown scope {sc!r}")
    for name in (names if isinstance(names, (tuple, list)) else (names,)):
        first = next((t for t in iter_tensors(ctx.program) if t.name == name), None)
        if first is None:
            raise RewriteError(f"set_scope: tensor {name} does not occur")
        ctx.program, n = _map_tensors(ctx.program, lambda t, name=name: t.with_scope(sc) if t.name == name else t)
        ctx.changes.append(Change("scope", format_expr(first), format_expr(first.with_scope(sc)), name,
                                  {"occurrences": n}))


@primitive("rename_tensor", required=("tensor", "to"))
def prim_rename_tensor(ctx: RewriteContext, tensor, to):
    """Rename a tensor at every occurrence, dtype, scope and subscripts kept (the new name must
    be unused). Example: ``rename_tensor: {tensor: "?X", to: "?T"}`` with ``fresh: {T: tensor}``."""
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
    "MAX_DOMAIN_VALUES", "ValueExprError",
]
