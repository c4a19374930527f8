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
* ``permute_subscripts`` - reorder the subscript entries of every access of a tensor
  (a storage-layout transpose, TVM ``tvm.s_tir.Schedule.transform_layout``).

Every step may carry ``as: name``: the item it creates (a nest or an equation) is bound to
``?name`` for the later steps of the same rule and follows their structural edits
(:class:`steptp.engine.primitives.CreatedRef`).
"""

from __future__ import annotations

from ..leir import ast as A
from ..leir.printer import format_assign, format_expr, format_nest
from . import patterns as P
from .primitives import (VALUE_FUNCTIONS, Change, CreatedRef, EqRef, NestRef, RewriteContext, RewriteError, _instantiate, get_item,
                         get_nest, iter_tensors, primitive, replace_item, replace_items)


def parse_item_template(text: str):
    """Parse a body-item template: a nest (``LOOPS[...];``, ``?L[...];``) or an equation
    (``?X_{..}=...``). Raises :class:`~steptp.engine.patterns.PatternError`."""
    p = P._Parser(text)
    at_splice = p.at_splice
    if p.at_loop() or p.at("[") or at_splice():
        item = p.nest()
    else:
        item = p.equation()
        if p.at(";"):
            p.next()
    p.done()
    return item


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


def _rewriter(ctx: RewriteContext, pattern: str, template: str, subscripts: bool, targets: bool = False):
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
                    raise RewriteError(f"replace_terms: an equation target must stay a tensor, got {new}")
                return new
        if not subscripts:
            return t
        return t.with_indices(tuple(rewrite(i) for i in t.indices))

    def fix(item):
        if isinstance(item, A.Assign):
            return A.Assign(target(item.target), rewrite(item.value))
        return A.Nest(item.loops, tuple(fix(b) for b in item.body))

    return fix, count


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
    fix, count = _rewriter(ctx, pattern, kw["with"], bool(ctx.value(subscripts)), bool(ctx.value(targets)))
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


@primitive("permute_subscripts", required=("tensor", "order"))
def prim_permute_subscripts(ctx: RewriteContext, tensor, order):
    """Reorder the subscript entries of every access of a tensor: entry ``k`` of the new
    subscript is entry ``order[k]`` of the old one (a layout transpose; the shape is
    re-inferred from the writes). TVM: ``tvm.s_tir.Schedule.transform_layout``."""
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


def _target_of(ctx, eq) -> str:
    """Name of the tensor an equation (``?e``, an EqRef) writes."""
    from .primitives import ValueExprError

    if not isinstance(eq, EqRef):
        raise ValueExprError(f"target_of expects an equation, got {eq!r}")
    item = get_item(ctx.module.program, eq.path)
    if not isinstance(item, A.Assign):
        raise ValueExprError(f"target_of: {eq} is not an equation")
    return item.target.name


def _rank_of(ctx, name) -> int:
    """Number of subscript entries of a tensor (its rank; 0 for a scalar)."""
    from .primitives import ValueExprError

    decl = ctx.module.signature.get(name)
    if decl:
        return len(decl.shape)
    t = next((t for t in iter_tensors(ctx.module.program) if t.name == name), None)
    if t is None:
        raise ValueExprError(f"unknown tensor {name!r}")
    return len(t.indices)


def _names_thread_indices(ctx, nest, sub) -> bool:
    """True when the subscript ``sub`` (a tuple of index terms) has, as plain entries, the
    index of every threadIdx-bound loop (``B`` loop named tx.., ty.., tz..) of ``nest``:
    each thread of a block then touches its own elements of a shared buffer (no race)."""
    from .primitives import NestRef, ValueExprError

    if not isinstance(nest, NestRef) or not isinstance(sub, tuple):
        raise ValueExprError(f"names_thread_indices expects a nest and a subscript list, got {nest!r}, {sub!r}")
    loops = get_nest(ctx.module.program, nest.path).loops
    plain = {x.name for x in sub if isinstance(x, A.Index)}
    return all(l.var in plain for l in loops if l.kind == "B" and l.var.startswith("t"))


def _permuted(ctx, items, order) -> tuple:
    """``items`` (a subscript list or any tuple) reordered: entry k is ``items[order[k]]``."""
    from .primitives import ValueExprError

    if not isinstance(items, tuple) or sorted(order) != list(range(len(items))):
        raise ValueExprError(f"permuted: {order!r} is not a permutation of {items!r}")
    return tuple(items[i] for i in order)


def _vf_error(msg):
    from .primitives import ValueExprError

    return ValueExprError(msg)


def _index_name(x, what: str) -> str:
    if isinstance(x, A.Index):
        return x.name
    if isinstance(x, str):
        return x
    raise _vf_error(f"{what} must be a loop index name, got {x!r}")


def _index_of(ctx, nest, pos) -> str:
    """Index name of loop ``pos`` of a nest (same meaning as feat/ops' ``index_of``)."""
    from .primitives import NestRef

    if not isinstance(nest, NestRef):
        raise _vf_error(f"index_of expects a nest, got {nest!r}")
    loops = get_nest(ctx.module.program, nest.path).loops
    if not (isinstance(pos, int) and 0 <= pos < len(loops)):
        raise _vf_error(f"index_of: no loop at position {pos!r}")
    return loops[pos].var


def _indices_of(ctx, loops) -> tuple:
    """Index names of a loop list (``_{*?I}`` with ``?I = indices_of(loops_of(?N))``)."""
    if not (isinstance(loops, tuple) and all(isinstance(l, A.Loop) for l in loops)):
        raise _vf_error(f"indices_of expects a loop list, got {loops!r}")
    return tuple(l.var for l in loops)


def _set_extent(ctx, loops, index, extent) -> tuple:
    """A loop list with the extent of the loop of index ``index`` set to ``extent`` (same
    meaning as feat/ops' ``set_extent``)."""
    if not (isinstance(loops, tuple) and all(isinstance(l, A.Loop) for l in loops)):
        raise _vf_error(f"set_extent expects a loop list, got {loops!r}")
    name = _index_name(index, "set_extent's second argument")
    if not isinstance(extent, int) or isinstance(extent, bool) or extent <= 0:
        raise _vf_error(f"set_extent: the extent must be a positive integer, got {extent!r}")
    if name not in {l.var for l in loops}:
        raise _vf_error(f"set_extent: no loop with index {name!r}")
    return tuple(A.Loop(l.kind, extent, l.var) if l.var == name else l for l in loops)


def _subst_index(ctx, term, *pairs):
    """A term or subscript list with indices replaced simultaneously, ``pairs = (i1, e1,
    ...)`` (same meaning as feat/ops' ``subst_index``)."""
    if len(pairs) % 2 or not pairs:
        raise _vf_error("subst_index takes a term and index/replacement pairs")
    mapping = {_index_name(pairs[k], "subst_index's index argument"): P.value_to_expr(pairs[k + 1])
               for k in range(0, len(pairs), 2)}
    if isinstance(term, tuple):
        return tuple(A.substitute_indices(P.value_to_expr(t), mapping) for t in term)
    return A.substitute_indices(P.value_to_expr(term), mapping)


def _shifted(ctx, index, offset):
    """The index expression ``index+offset`` (``index`` for 0; same meaning as feat/ops')."""
    name = _index_name(index, "shifted's first argument")
    if not isinstance(offset, int) or isinstance(offset, bool):
        raise _vf_error(f"shifted: the offset must be an integer, got {offset!r}")
    if offset == 0:
        return A.Index(name)
    return A.BinOp("+", A.Index(name), A.Int(offset)) if offset > 0 else A.BinOp("-", A.Index(name), A.Int(-offset))


def _renamed(ctx, term, old, new):
    """A term with every access of tensor ``old`` renamed to ``new`` (dtype, scope and
    subscripts kept)."""
    def fn(e):
        return A.Tensor(new, e.dtype, e.scope, e.indices) if isinstance(e, A.Tensor) and e.name == old else e

    return A.transform(P.value_to_expr(term), fn)


def _reads_only(ctx, term, name) -> bool:
    """True when every tensor the term reads (subscripts included) is ``name``."""
    return all(e.name == name for e in A.walk(P.value_to_expr(term)) if isinstance(e, A.Tensor))


def _index_outside(ctx, term, name, var) -> bool:
    """True when loop index ``var`` occurs in the term outside the accesses of tensor
    ``name`` (as a value, or in another tensor's subscript)."""
    def visit(e) -> bool:
        if isinstance(e, A.Tensor) and e.name == name:
            return False
        if isinstance(e, A.Index):
            return e.name == var
        return any(visit(c) for c in A.children(e))

    return visit(P.value_to_expr(term))


def _plain_in(ctx, sub, var) -> bool:
    """True when loop index ``var`` is a plain entry of the subscript list ``sub``."""
    return isinstance(sub, tuple) and any(isinstance(e, A.Index) and e.name == var for e in sub)


def _shape(ctx, name) -> tuple:
    """Shape of a tensor: the signature's, else the one inferred from the program's writes
    (:func:`steptp.leir.analysis.analyze`)."""
    decl = ctx.module.signature.get(name)
    if decl is not None:
        return tuple(decl.shape)
    from ..leir.analysis import analyze

    info = analyze(ctx.module.program, ctx.module.signature, check_bounds=False)
    if name not in info.shapes:
        raise _vf_error(f"unknown tensor {name!r}")
    return tuple(info.shapes[name])


def _shape_of(ctx, name, d) -> int:
    """Extent of dimension ``d`` of a tensor (signature or inferred shape)."""
    shape = _shape(ctx, name)
    if not (isinstance(d, int) and 0 <= d < len(shape)):
        raise _vf_error(f"shape_of: {name} has no dimension {d!r}")
    return shape[d]


def _split_entry(ctx, sub, d, f) -> tuple:
    """A subscript list with entry ``d`` split in two, ``(e//f, e%f)``: the element's
    address in a copy whose dimension d (extent n) is reshaped to (n/f, f)."""
    if not isinstance(sub, tuple) or not (isinstance(d, int) and 0 <= d < len(sub)) or not isinstance(f, int) \
            or f <= 0:
        raise _vf_error(f"split_entry: bad arguments {sub!r}, {d!r}, {f!r}")
    e = P.value_to_expr(sub[d])
    return tuple(sub[:d]) + (A.BinOp("//", e, A.Int(f)), A.BinOp("%", e, A.Int(f))) + tuple(sub[d + 1:])


def _flattened(ctx, sub, name) -> tuple:
    """A one-entry subscript addressing the same element of a row-major copy of tensor
    ``name`` (signature or inferred shape): ``(i0*s0+i1*s1+...,)`` with ``s_k`` the product
    of the later extents (``A_{tx,c}`` of an [8,12] tensor -> ``(tx*12+c,)``)."""
    shape = _shape(ctx, name)
    if not isinstance(sub, tuple) or len(sub) != len(shape):
        raise _vf_error(f"flattened: subscript {sub!r} does not match the rank of {name}")
    out = None
    for k, e in enumerate(sub):
        stride = 1
        for x in shape[k + 1:]:
            stride *= x
        term = P.value_to_expr(e)
        if stride != 1:
            term = A.BinOp("*", term, A.Int(stride))
        out = term if out is None else A.BinOp("+", out, term)
    return (out if out is not None else A.Int(0),)


def _is_identity(ctx, order) -> bool:
    """True for the identity permutation ``(0, 1, ...)``."""
    return tuple(order) == tuple(range(len(order)))


def _is_bound_name(name: str) -> bool:
    return len(name) >= 2 and name[0] in "tb" and name[1] in "xyz"


def _has_bound_index(ctx, t) -> bool:
    """True when a term or subscript list uses a thread/block-bound loop index (``tx..``,
    ``by..``): the GPU preflight cannot prove ``tx//f, tx%f`` race-free, so a reshape must
    leave such entries alone."""
    items = t if isinstance(t, tuple) else (t,)
    return any(isinstance(x, A.Index) and _is_bound_name(x.name)
               for e in items for x in A.walk(P.value_to_expr(e)))


def _dim_has_bound_index(ctx, name, d) -> bool:
    """True when some access of tensor ``name`` has a thread/block-bound index in entry ``d``."""
    for t in iter_tensors(ctx.module.program):
        if t.name == name and 0 <= d < len(t.indices) and _has_bound_index(ctx, t.indices[d]):
            return True
    return False


def _item(ctx, items, k):
    """Item ``k`` of a list (negative from the end; same meaning as feat/ops' ``item``)."""
    if not isinstance(items, tuple) or not isinstance(k, int) or not -len(items) <= k < len(items):
        raise _vf_error(f"item: no item {k!r} in {items!r}")
    return items[k]


# value functions for let:/params: (setdefault: a definition elsewhere with the same name wins)
VALUE_FUNCTIONS.setdefault("has_bound_index", (1, _has_bound_index))
VALUE_FUNCTIONS.setdefault("dim_has_bound_index", (2, _dim_has_bound_index))
VALUE_FUNCTIONS.setdefault("item", (2, _item))
VALUE_FUNCTIONS.setdefault("flattened", (2, _flattened))
VALUE_FUNCTIONS.setdefault("shape_of", (2, _shape_of))
VALUE_FUNCTIONS.setdefault("split_entry", (3, _split_entry))
VALUE_FUNCTIONS.setdefault("is_identity", (1, _is_identity))
VALUE_FUNCTIONS.setdefault("not_identity", (1, lambda ctx, order: not _is_identity(ctx, order)))
VALUE_FUNCTIONS.setdefault("index_of", (2, _index_of))
VALUE_FUNCTIONS.setdefault("indices_of", (1, _indices_of))
VALUE_FUNCTIONS.setdefault("set_extent", (3, _set_extent))
VALUE_FUNCTIONS.setdefault("subst_index", (-1, _subst_index))   # arity -1: variadic
VALUE_FUNCTIONS.setdefault("shifted", (2, _shifted))
VALUE_FUNCTIONS.setdefault("renamed", (3, _renamed))
VALUE_FUNCTIONS.setdefault("reads_only", (2, _reads_only))
VALUE_FUNCTIONS.setdefault("plain_in", (2, _plain_in))
VALUE_FUNCTIONS.setdefault("index_outside", (3, _index_outside))
VALUE_FUNCTIONS.setdefault("permuted", (2, _permuted))
VALUE_FUNCTIONS.setdefault("names_thread_indices", (2, _names_thread_indices))
VALUE_FUNCTIONS.setdefault("target_of", (1, _target_of))
VALUE_FUNCTIONS.setdefault("rank_of", (1, _rank_of))

__all__ = ["parse_item_template", "item_ref", "prim_insert_into", "prim_move_nest", "prim_replace_equation",
           "prim_replace_terms", "prim_permute_subscripts", "prim_map_subscripts"]
