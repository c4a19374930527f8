"""Structural rewrite primitives: edits away from the match site, items inserted into an
existing nest (TVM ``compute_at``), subscript rewrites.

Registered in :data:`steptp.engine.primitives.PRIMITIVES` (usable by any rule, no
strategy-specific code):

* ``insert_into`` - insert an equation or an inner nest into an existing nest's body, at
  a position or before/after a referenced item (TVM ``tvm.s_tir.Schedule.compute_at``:
  the producer runs inside the consumer's loops).
* ``move_nest`` - move an existing nest into another nest's body (``compute_at`` of a
  whole producer nest; its own loops are kept).
* ``replace_equation`` - replace any equation (``?e`` bound by ``eq_at``/``eq_def`` in
  ``where:``, or a name given with ``as:``), not only the match site.
* ``replace_terms`` - replace every occurrence of a pattern in one equation, one nest or
  the whole program, optionally inside subscripts and targets too.
* ``inline_reads`` - replace every read of a tensor by its producer's element-wise value,
  the producer's loop indices replaced by the read's subscript (TVM ``compute_inline``).
* ``permute_subscripts`` - reorder the subscript entries of every access of a tensor
  (a storage-layout transpose, TVM ``tvm.s_tir.Schedule.transform_layout``).
* ``map_subscripts`` - rewrite the subscript of every access of a tensor by a value
  expression of it (``permuted``, ``flattened``, ``split_entry``: a storage layout change).

Every step may carry ``as: name``: the item it creates (a nest or an equation) is bound to
``?name`` for the later steps of the same rule and follows their structural edits
(:class:`steptp.engine.primitives.CreatedRef`).

The value functions these primitives' arguments use (``permuted``, ``flattened``,
``split_entry``, ``target_of``, ...) live with all the others in :mod:`steptp.engine.values`.
"""

from __future__ import annotations

from ..leir import ast as A
from ..leir.printer import format_assign, format_expr, format_nest
from . import patterns as P
from .patterns import parse_item_template
from .primitives import (_instantiate, Change, CreatedRef, EqRef, get_item, get_nest, iter_tensors, NestRef,
                         primitive, replace_item, replace_items, RewriteContext, RewriteError, term_rewriter)


def _instantiate_item(ctx: RewriteContext, text: str):
    try:
        return P.instantiate(parse_item_template(text), ctx.env)
    except P.TemplateError as e:
        raise RewriteError(str(e)) from None
    except P.PatternError as e:
        raise RewriteError(str(e)) from None


def item_ref(ctx: RewriteContext, v) -> tuple[int, ...]:
    """Current path of a nest or equation: ``?e`` (EqRef), ``?N`` (NestRef), a name bound
    by ``as:`` or a path list."""
    x = ctx.value(v)
    if isinstance(x, CreatedRef):
        return ctx.created_path(x)
    if isinstance(x, (NestRef, EqRef)):
        return ctx.remap(x.path)
    if isinstance(x, (tuple, list)) and x and all(isinstance(i, int) for i in x):
        return ctx.remap(tuple(x))
    raise RewriteError(f"expected a nest or equation reference, got {x!r}")


def _body_position(ctx: RewriteContext, into, at, before, after, what: str) -> tuple[tuple[int, ...], int]:
    """(nest path, body index) where a new item goes."""
    given = [x is not None for x in (at, before, after)]
    if sum(given) > 1:
        raise RewriteError(f"{what}: give at most one of at/before/after")
    if before is not None or after is not None:
        ref = item_ref(ctx, before if before is not None else after)
        if len(ref) < 2:
            raise RewriteError(f"{what}: {ref} is a top-level nest, not an item of a nest body")
        parent, k = ref[:-1], ref[-1] + (1 if after is not None else 0)
        if into is not None and ctx.nest_ref(into) != parent:
            raise RewriteError(f"{what}: the referenced item is not in the 'into' nest")
        return parent, k
    parent = ctx.nest_ref(into) if into is not None else ctx.site_nest()
    n = get_nest(ctx.program, parent)
    k = ctx.value(at) if at is not None else 0
    if not isinstance(k, int) or isinstance(k, bool):
        raise RewriteError(f"{what}: at must be an integer, got {k!r}")
    if k < 0:
        k += len(n.body) + 1
    if not 0 <= k <= len(n.body):
        raise RewriteError(f"{what}: position {k} outside a body of {len(n.body)} item(s)")
    return parent, k


def _insert_body_item(ctx: RewriteContext, parent: tuple[int, ...], k: int, item) -> tuple[int, ...]:
    n = get_nest(ctx.program, parent)
    new = A.Nest(n.loops, n.body[:k] + (item,) + n.body[k:])
    ctx.program = replace_item(ctx.program, parent, new)
    path = parent + (k,)
    ctx.shift(path, +1)
    ctx.last_created = path
    return path


@primitive("insert_into", required=("item",), optional=("into", "at", "before", "after"),
           template_args={"item": "item"})
def prim_insert_into(ctx: RewriteContext, item, into=None, at=None, before=None, after=None):
    """Insert an equation or inner-nest template into an existing nest's body: at body
    position ``at`` (default 0, negative counts from the end) of ``into`` (default: the
    site's nest), or right before/after a referenced item. The new item runs inside every
    loop of that nest, once per iteration (TVM ``compute_at`` of a producer)."""
    parent, k = _body_position(ctx, into, at, before, after, "insert_into")
    new = _instantiate_item(ctx, item)
    path = _insert_body_item(ctx, parent, k, new)
    text = format_nest(new) if isinstance(new, A.Nest) else format_assign(new)
    ctx.changes.append(Change("insert_into", "", text, str(NestRef(parent)), {"position": path[-1]}))


@primitive("move_nest", required=("nest", "into"), optional=("at", "before", "after"))
def prim_move_nest(ctx: RewriteContext, nest, into, at=None, before=None, after=None):
    """Move an existing nest into another nest's body (it becomes an inner nest and keeps
    its own loops): TVM ``compute_at`` of a whole producer nest."""
    src = ctx.nest_ref(nest)
    moved = get_nest(ctx.program, src)
    ctx.program = replace_items(ctx.program, src, ())
    ctx.shift(src, -1)
    parent, k = _body_position(ctx, into, at, before, after, "move_nest")
    path = _insert_body_item(ctx, parent, k, moved)
    ctx.changes.append(Change("move", format_nest(moved), format_nest(get_nest(ctx.program, parent)),
                              str(NestRef(path))))


@primitive("replace_equation", required=("equation", "with"), template_args={"with": "equation"})
def prim_replace_equation(ctx: RewriteContext, equation, **kw):
    """Replace a referenced equation (not necessarily the match site) by a template."""
    path = item_ref(ctx, equation)
    old = get_item(ctx.program, path)
    if not isinstance(old, A.Assign):
        raise RewriteError(f"replace_equation: {path} is a nest, not an equation")
    new = _instantiate(ctx, "equation", kw["with"])
    ctx.program = replace_item(ctx.program, path, new)
    ctx.last_created = path
    ctx.changes.append(Change("equation", format_assign(old), format_assign(new), str(EqRef(path))))




@primitive("replace_terms", required=("pattern", "with"), optional=("nest", "equation", "subscripts", "targets"),
           template_args={"pattern": "pattern", "with": "with"})
def prim_replace_terms(ctx: RewriteContext, pattern, nest=None, equation=None, subscripts=False, targets=False,
                       **kw):
    """Replace every subterm matching ``pattern`` by the ``with`` template (the pattern's
    metavariables extend the bindings; bound ones must match exactly) in one equation
    (``equation:``), one nest (``nest:``, inner nests included) or the whole program.
    With ``subscripts: true`` subscript entries (of reads and of equation targets) are
    rewritten too, e.g. an index expression replaced by a precomputed index tensor; with
    ``targets: true`` an equation target matching the pattern is replaced as well (the
    template must give a tensor), e.g. every access of ``?X_{?l}`` redirected to a cache.
    Raises :class:`RewriteError` when nothing matches."""
    if nest is not None and equation is not None:
        raise RewriteError("replace_terms: give nest or equation, not both")
    fix, count = term_rewriter(ctx, pattern, kw["with"], bool(ctx.value(subscripts)), bool(ctx.value(targets)))
    if equation is not None or nest is not None:
        path = item_ref(ctx, equation) if equation is not None else ctx.nest_ref(nest)
        ctx.program = replace_item(ctx.program, path, fix(get_item(ctx.program, path)))
        where = str(EqRef(path)) if equation is not None else str(NestRef(path))
    else:
        ctx.program = A.Program(tuple(fix(n) for n in ctx.program.nests))
        where = "program"
    if count[0] == 0:
        raise RewriteError(f"replace_terms: nothing matches {pattern!r} in {where}")
    ctx.changes.append(Change("replace_terms", pattern, kw["with"], where, {"occurrences": count[0]}))


@primitive("inline_reads", required=("tensor", "value", "at"), optional=("after",))
def prim_inline_reads(ctx: RewriteContext, tensor, value, at, after=None):
    """Replace every read of tensor ``tensor`` (subscripts included) in the top-level nests
    after ``after`` (a nest; default: every nest) by the term ``value`` with the producer's
    loop indices replaced by the read's subscript entries: ``at`` is the producer's target
    subscript, distinct loop indices and integer literals (a read must have the same literal
    there: the producer wrote nothing else). TVM ``tvm.s_tir.Schedule.compute_inline``
    through the index map a read implies: a padding nest read at ``c+g`` inside a convolution
    becomes the guarded input read at ``c+g``. Raises :class:`RewriteError` when ``at`` has
    another entry or an index twice, a read disagrees with a literal, or nothing reads the
    tensor."""
    name, v, sub = ctx.value(tensor), ctx.value(value), ctx.value(at)
    idx = [e.name for e in sub if isinstance(e, A.Index)] if isinstance(sub, tuple) else []
    if not (isinstance(sub, tuple) and idx and all(isinstance(e, (A.Index, A.Int)) for e in sub)
            and len(set(idx)) == len(idx)):
        raise RewriteError(f"inline_reads: {sub!r} is not a subscript of distinct loop indices and literals")
    start = ctx.nest_ref(after)[0] + 1 if after is not None else 0
    count = [0]

    def read(x):
        if isinstance(x, A.Tensor) and x.name == name:
            if len(x.indices) != len(sub) or any(isinstance(w, A.Int) and r != w for r, w in zip(x.indices, sub)):
                raise RewriteError(f"inline_reads: {format_expr(x)} reads outside what the producer writes "
                                   f"({name} at {', '.join(format_expr(e) for e in sub)})")
            count[0] += 1
            m = {w.name: r for r, w in zip(x.indices, sub) if isinstance(w, A.Index)}
            return A.transform(v, lambda y: m.get(y.name, y) if isinstance(y, A.Index) else y)
        return x

    nests = ctx.program.nests
    later = A.map_program_exprs(A.Program(nests[start:]), lambda e: A.transform(e, read))  # targets: X is not one
    ctx.program = A.Program(nests[:start] + later.nests)
    if count[0] == 0:
        raise RewriteError(f"inline_reads: nothing reads {name} after the producer")
    ctx.changes.append(Change("inline", name, format_expr(v), "program", {"occurrences": count[0]}))


@primitive("permute_subscripts", required=("tensor", "order"))
def prim_permute_subscripts(ctx: RewriteContext, tensor, order):
    """Reorder the subscript entries of every access of a tensor: entry ``k`` of the new
    subscript is entry ``order[k]`` of the old one (a layout transpose; the shape is
    re-inferred from the writes). TVM: ``tvm.s_tir.Schedule.transform_layout``. Example: ``permute_subscripts:
    {tensor: "?X", order: [1, 0]}`` transposes a 2-D intermediate (``?order`` from a
    ``permutations_of`` domain for any rank)."""
    name = ctx.value(tensor)
    perm = tuple(ctx.value(order))
    first = next((t for t in iter_tensors(ctx.program) if t.name == name), None)
    if first is None:
        raise RewriteError(f"permute_subscripts: tensor {name} does not occur")
    if sorted(perm) != list(range(len(first.indices))):
        raise RewriteError(f"permute_subscripts: {perm} is not a permutation of the {len(first.indices)} "
                           f"subscript entries of {name}")

    def fn(e):
        if isinstance(e, A.Tensor) and e.name == name:
            return e.with_indices(tuple(e.indices[i] for i in perm))
        return e

    ctx.program = A.map_program_exprs(ctx.program, lambda e: A.transform(e, fn))
    ctx.changes.append(Change("layout", format_expr(first), format_expr(fn(first)), name,
                              {"order": list(perm)}))


@primitive("map_subscripts", required=("tensor", "to"), optional=("var",), template_args={"to": "subscript_fn"})
def prim_map_subscripts(ctx: RewriteContext, tensor, to, var="sub"):
    """Rewrite the subscript of every access of a tensor: for each access, ``?<var>``
    (default ``?sub``) is bound to its subscript list and the value expression ``to`` gives
    the new one (``permuted(?sub, ?order)``, ``flattened(?sub, ?X)``, ``split_entry(?sub,
    ?d, ?f)``). Every read and write of the tensor moves consistently (a storage layout
    change; the shape is re-inferred). TVM: ``tvm.s_tir.Schedule.transform_layout``."""
    from .primitives import EvalContext, ValueExprError, eval_value

    name = ctx.value(tensor)
    first = next((t for t in iter_tensors(ctx.program) if t.name == name), None)
    if first is None:
        raise RewriteError(f"map_subscripts: tensor {name} does not occur")
    memo: dict = {}

    def fn(e):
        if isinstance(e, A.Tensor) and e.name == name:
            new = memo.get(e.indices)
            if new is None:
                try:
                    new = eval_value(to, EvalContext(ctx.module, {**ctx.env, var: e.indices}))
                except ValueExprError as err:
                    raise RewriteError(f"map_subscripts: {err}") from None
                if not isinstance(new, tuple):
                    raise RewriteError(f"map_subscripts: {to!r} gives {new!r}, not a subscript list")
                new = tuple(P.value_to_expr(x) for x in new)
                memo[e.indices] = new
            return e.with_indices(new)
        return e

    ctx.program = A.map_program_exprs(ctx.program, lambda e: A.transform(e, fn))
    ctx.changes.append(Change("layout", format_expr(first), format_expr(fn(first)), name))


__all__ = ["parse_item_template", "item_ref", "prim_insert_into", "prim_move_nest", "prim_replace_equation",
           "prim_inline_reads",
           "prim_replace_terms", "prim_permute_subscripts", "prim_map_subscripts"]
