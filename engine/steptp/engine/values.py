"""Rule-language value functions: every function usable in value expressions.

A value expression appears in ``let:``, ``params:`` domains and ``require:``, ``where:``
value checks, primitive arguments and ``{check: ...}`` preconditions. The evaluator and
the registry :data:`steptp.engine.primitives.VALUE_FUNCTIONS` live in
:mod:`steptp.engine.primitives`; every function is defined here, once, and added to the
registry on import (the engine package imports this module first; a name registered twice
raises). They are generic: no rule
is named here. Documented in ``rules/README.md`` ("Values"); tested in
``tests/test_rule_language.py``, ``tests/test_structural_primitives.py`` and
``tests/test_online_softmax.py``.

Families:

* **Core**: ``loops_of``, ``loop_count``, ``extent_of``, ``item_count``, ``eq_count``,
  ``scope_of``, ``dtype_of``, ``tensor_bytes``, ``shared_limit``, ``min``, ``max``.
* **Lists** (loop lists such as ``loops_of(?N)``, subscript lists bound by a ``*?S``
  pattern splice, index-name lists): ``len``, ``item``, ``slice``, ``drop``,
  ``replace_at``, ``insert_at``, ``concat``, ``contains``, ``index_in``, ``permuted``,
  ``is_identity``, ``not_identity``.
* **Loops** (an :class:`~steptp.leir.ast.Loop` value, e.g. ``loop(?N, ?pos)``, or a loop
  list): ``loop``, ``kind_of``, ``index_of``, ``axis_of``, ``with_kind``, ``with_extent``,
  ``with_index``, ``indices_of``, ``keep_loops``, ``loop_pos``, ``loops_without``,
  ``set_extent``, ``loops_used_by``, ``loops_unused_by``.
* **Terms and subscripts**: ``subscripts_of``, ``free_indices``, ``index_only_in``,
  ``tensor_name``, ``tensors_of``, ``subst_index``, ``shifted``, ``renamed``,
  ``reads_only``, ``index_outside``, ``plain_in``, ``plain_subscript``, ``has_bound_index``,
  ``target_of``, ``definition`` (a read's element-wise definition in a producer nest),
  ``head_of``, ``operand``.
* **Shapes and layouts**: ``shape_of``, ``rank_of``, ``flattened``, ``split_entry``,
  ``dim_has_bound_index``.
* **Counts**: ``readers`` / ``writers`` (equations reading / writing a tensor).
* **GPU**: ``bound_axes``, ``threads_per_block``, ``axis_limit``, ``is_thread_axis``,
  ``max_threads_per_block`` (:mod:`steptp.backend.hardware`), ``names_thread_indices``.

Nest arguments are :class:`~steptp.engine.primitives.NestRef` bindings (``?N``,
``?nest``), equation arguments :class:`~steptp.engine.primitives.EqRef` bindings (``?e``);
every function raises :class:`~steptp.engine.primitives.ValueExprError` with a message
naming the function for a bad argument.
"""

from __future__ import annotations

import math
from typing import Any

from ..leir import ast as A
from ..backend.preflight import accesses as eq_accesses  # target first, then every read
from . import patterns as P
from .navigation import IdentityMemo
from .domains import register_value_functions
from .primitives import (EqRef, EvalContext, NestRef, ValueExprError, get_item, get_nest,
                         iter_tensors)

_AXES = ("tx", "ty", "tz", "bx", "by", "bz")
_TAG = {"tx": "threadIdx.x", "ty": "threadIdx.y", "tz": "threadIdx.z",
        "bx": "blockIdx.x", "by": "blockIdx.y", "bz": "blockIdx.z"}


def _seq(fn: str, x) -> tuple:
    if isinstance(x, (tuple, list)):
        return tuple(x)
    if isinstance(x, A.Loop):
        return (x,)
    raise ValueExprError(f"{fn}: expected a list (loops, subscripts or names), got {x!r}")


def _int(fn: str, x) -> int:
    if isinstance(x, A.Int):
        x = x.value
    if not isinstance(x, int) or isinstance(x, bool):
        raise ValueExprError(f"{fn}: expected an integer, got {x!r}")
    return x


def _nest(fn: str, ctx: EvalContext, n) -> A.Nest:
    if not isinstance(n, NestRef):
        raise ValueExprError(f"{fn}: expected a nest, got {n!r}")
    return get_nest(ctx.module.program, n.path)


def _loop(fn: str, x) -> A.Loop:
    if isinstance(x, tuple) and len(x) == 1:
        x = x[0]
    if not isinstance(x, A.Loop):
        raise ValueExprError(f"{fn}: expected a loop, got {x!r}")
    return x


def _name(x) -> str:
    if isinstance(x, A.Index):
        return x.name
    if isinstance(x, A.Loop):
        return x.var
    return str(x)


def _index_name(x, what: str) -> str:
    """A loop index name given as an index term or a bare word (strict: nothing else)."""
    if isinstance(x, A.Index):
        return x.name
    if isinstance(x, str):
        return x
    raise ValueExprError(f"{what} must be a loop index name, got {x!r}")


def _loop_list(loops, fn: str) -> tuple:
    if not (isinstance(loops, tuple) and all(isinstance(l, A.Loop) for l in loops)):
        raise ValueExprError(f"{fn} expects a loop list (e.g. loops_of(?N)), got {loops!r}")
    return loops


def _expr(fn: str, x) -> A.Expr:
    """A value (a term, an index name, an integer) as an expression."""
    try:
        return P.value_to_expr(x)
    except P.TemplateError as e:
        raise ValueExprError(f"{fn}: {e}") from None


# ---------------------------------------------------------------------------
# Core: nests, tensors, memory, min/max
# ---------------------------------------------------------------------------


def _loops_of(ctx: EvalContext, nest) -> tuple:
    """The loop list of a nest."""
    if isinstance(nest, NestRef):
        return get_nest(ctx.module.program, nest.path).loops
    raise ValueExprError(f"loops_of expects a nest, got {nest!r}")


def _scope_of(ctx: EvalContext, name) -> str:
    """The scope of a tensor's occurrences (``mixed`` when they disagree)."""
    scopes = {t.scope for t in _occurrences(ctx, name)}
    return scopes.pop() if len(scopes) == 1 else "mixed"


def _dtype_of(ctx: EvalContext, name) -> str:
    """A tensor's dtype: the signature's, else that of its first occurrence."""
    d = ctx.module.signature.get(name)
    if d:
        return d.dtype
    for t in _occurrences(ctx, name):
        return t.dtype
    raise ValueExprError(f"unknown tensor {name!r}")


def _tensor_bytes(ctx: EvalContext, name) -> int:
    """Bytes of a whole tensor (signature shape, or the shape inferred by analysis)."""
    info = _analysis(ctx.module)
    if name not in info.shapes:
        raise ValueExprError(f"unknown tensor {name!r}")
    return math.prod(info.shapes[name]) * A.DTYPE_BYTES[info.dtype(name)]


def _shared_limit(ctx: EvalContext) -> int:
    """Static shared memory per block of the default GPU (steptp.backend.hardware)."""
    from ..backend.hardware import DEFAULT_GPU

    return DEFAULT_GPU.max_static_shared_bytes


# ---------------------------------------------------------------------------
# Lists
# ---------------------------------------------------------------------------


def _slice(ctx, xs, a, b):
    xs = _seq("slice", xs)
    return xs[_int("slice", a):_int("slice", b)]


def _drop(ctx, xs, k):
    xs, k = _seq("drop", xs), _int("drop", k)
    if not 0 <= k < len(xs):
        raise ValueExprError(f"drop: position {k} outside a list of {len(xs)}")
    return xs[:k] + xs[k + 1:]


def _replace_at(ctx, xs, k, new):
    xs, k = _seq("replace_at", xs), _int("replace_at", k)
    if not 0 <= k < len(xs):
        raise ValueExprError(f"replace_at: position {k} outside a list of {len(xs)}")
    ins = tuple(new) if isinstance(new, (tuple, list)) else (new,)
    return xs[:k] + ins + xs[k + 1:]


def _insert_at(ctx, xs, k, new):
    xs, k = _seq("insert_at", xs), _int("insert_at", k)
    if not 0 <= k <= len(xs):
        raise ValueExprError(f"insert_at: position {k} outside a list of {len(xs)}")
    ins = tuple(new) if isinstance(new, (tuple, list)) else (new,)
    return xs[:k] + ins + xs[k:]


def _item(ctx, xs, k):
    """Item ``k`` of a list (negative ``k`` counts from the end). Also accepts a single
    loop as a one-item list."""
    xs, k = _seq("item", xs), _int("item", k)
    if not -len(xs) <= k < len(xs):
        raise ValueExprError(f"item: position {k} outside a list of {len(xs)}")
    return xs[k]


def _contains(ctx, xs, x) -> bool:
    return any(_name(y) == _name(x) if isinstance(y, (A.Index, A.Loop, str)) else y == x for y in _seq("contains", xs))


def _index_in(ctx, xs, x) -> int:
    for k, y in enumerate(_seq("index_in", xs)):
        if (_name(y) == _name(x)) if isinstance(y, (A.Index, A.Loop, str)) else y == x:
            return k
    return -1


# ---------------------------------------------------------------------------
# Loops
# ---------------------------------------------------------------------------


def _permuted(ctx, items, order) -> tuple:
    """``items`` (a subscript list or any list) reordered: entry k is ``items[order[k]]``."""
    if not isinstance(items, tuple) or sorted(order) != list(range(len(items))):
        raise ValueExprError(f"permuted: {order!r} is not a permutation of {items!r}")
    return tuple(items[i] for i in order)


def _is_identity(ctx, order) -> bool:
    """True for the identity permutation ``(0, 1, ...)``."""
    return tuple(order) == tuple(range(len(order)))


def _loop_at(ctx, n, p, fn: str = "loop"):
    loops = _nest(fn, ctx, n).loops
    p = _int(fn, p)
    if not 0 <= p < len(loops):
        raise ValueExprError(f"{fn}: the nest has no loop at position {p}")
    return loops[p]


def _axis(l: A.Loop) -> str:
    return l.var[:2] if l.kind == "B" else ""


def _with(fn: str, l, **kw) -> A.Loop:
    l = _loop(fn, l)
    kind = kw.get("kind", l.kind)
    ext = kw.get("extent", l.extent)
    if kind not in A.LOOP_KINDS:
        raise ValueExprError(f"{fn}: unknown loop kind {kind!r}")
    if not isinstance(ext, int) or ext <= 0:
        raise ValueExprError(f"{fn}: bad extent {ext!r}")
    return A.Loop(kind, ext, kw.get("var", l.var))


def _keep_loops(ctx, loops, names):
    want = {_name(x) for x in _seq("keep_loops", names)}
    return tuple(l for l in _seq("keep_loops", loops) if _loop("keep_loops", l).var in want)


def _loop_pos(ctx, n, name) -> int:
    for k, l in enumerate(_nest("loop_pos", ctx, n).loops):
        if l.var == _name(name):
            return k
    return -1


def _indices_of(ctx, ls) -> tuple:
    """Index names of a loop list (``_{*?I}`` with ``?I = indices_of(loops_of(?N))``); a
    single loop counts as a one-loop list."""
    return tuple(_loop("indices_of", l).var for l in _seq("indices_of", ls))


def loops_without(ctx: EvalContext, loops, index) -> tuple:
    """``loops`` minus the loop with index ``index`` (order kept): the loops of a reduction
    nest minus its reduction axis. Raises if no loop has index ``index``."""
    loops = _loop_list(loops, "loops_without")
    name = _index_name(index, "loops_without's second argument")
    kept = tuple(l for l in loops if l.var != name)
    if len(kept) == len(loops):
        raise ValueExprError(f"loops_without: no loop with index {name!r} in "
                             f"{''.join(f'{l.kind}^{{{l.extent}}}_{{{l.var}=0}}' for l in loops)}")
    return kept


def set_extent(ctx: EvalContext, loops, index, extent) -> tuple:
    """``loops`` with the extent of the loop of index ``index`` set to ``extent`` (> 0): a
    loop over a longer or shorter range of the same index."""
    loops = _loop_list(loops, "set_extent")
    name = _index_name(index, "set_extent's second argument")
    if not isinstance(extent, int) or isinstance(extent, bool) or extent <= 0:
        raise ValueExprError(f"set_extent: the extent must be a positive integer, got {extent!r}")
    if name not in {l.var for l in loops}:
        raise ValueExprError(f"set_extent: no loop with index {name!r}")
    return tuple(A.Loop(l.kind, extent, l.var) if l.var == name else l for l in loops)


def _used(fn: str, terms) -> set[str]:
    terms = terms if isinstance(terms, tuple) else (terms,)
    out: set[str] = set()
    for t in terms:
        out |= {x.name for x in A.walk(_expr(fn, t)) if isinstance(x, A.Index)}
    return out


def loops_used_by(ctx: EvalContext, loops, terms) -> tuple:
    """The loops of ``loops`` whose index occurs in ``terms`` (a term or a subscript list):
    with a reduction's target subscript, its spatial loops."""
    used = _used("loops_used_by", terms)
    return tuple(l for l in _loop_list(loops, "loops_used_by") if l.var in used)


def loops_unused_by(ctx: EvalContext, loops, terms) -> tuple:
    """The loops of ``loops`` whose index does not occur in ``terms`` (a reduction's axes)."""
    used = _used("loops_unused_by", terms)
    return tuple(l for l in _loop_list(loops, "loops_unused_by") if l.var not in used)


# ---------------------------------------------------------------------------
# Terms
# ---------------------------------------------------------------------------


def _subscripts_of(ctx, t):
    if not isinstance(t, A.Tensor):
        raise ValueExprError(f"subscripts_of: expected a tensor term, got {t!r}")
    return tuple(t.indices)


def free_indices(x) -> tuple[str, ...]:
    """Loop-index names used by a term, a list of terms or a loop list (first occurrence
    order, each once)."""
    out: dict[str, None] = {}

    def rec(e):
        if isinstance(e, (tuple, list)):
            for y in e:
                rec(y)
        elif isinstance(e, A.Loop):
            out.setdefault(e.var, None)
        elif isinstance(e, str):
            out.setdefault(e, None)
        elif isinstance(e, A.Index):
            out.setdefault(e.name, None)
        elif isinstance(e, (A.Int, A.Float)):
            return
        else:
            for c in A.children(e):
                rec(c)

    rec(x)
    return tuple(out)


def _index_only_in(ctx, n, name, template) -> bool:
    """True when every use of index ``name`` in nest ``n`` (equations of inner nests and
    subscripts included) lies inside an occurrence of ``template`` (an expression
    template instantiated with the bindings, e.g. ``"?o*?f+?i"``)."""
    from . import patterns as P

    try:
        term = P.instantiate(P.parse_expr_pattern(str(template)), ctx.env)
    except (P.PatternError, P.TemplateError) as e:
        raise ValueExprError(f"index_only_in: {e}") from None
    v = _name(name)
    hole = A.Index("\0")

    def strip(e):
        if e == term:
            return hole
        kids = A.children(e)
        return A.rebuild(e, tuple(strip(c) for c in kids)) if kids else e

    for _, eq in _nest("index_only_in", ctx, n).equations():
        for e in (eq.target, eq.value):
            if any(isinstance(x, A.Index) and x.name == v for x in A.walk(strip(e))):
                return False
    return True


def subst_index(ctx: EvalContext, term, *pairs):
    """``term`` (an expression, or a tuple of expressions such as a subscript list) with
    loop indices ``i1, i2, ...`` replaced *simultaneously* by ``e1, e2, ...`` (index names or
    expressions), ``pairs = (i1, e1, i2, e2, ...)``. Moves an access from one nest's index
    names to another's; simultaneous, so swapping two names is safe. Source: capture-free
    substitution (:func:`steptp.leir.ast.substitute_indices`)."""
    if len(pairs) % 2 or not pairs:
        raise ValueExprError("subst_index takes a term and index/replacement pairs")
    mapping = {_index_name(pairs[k], "subst_index's index argument"): _expr("subst_index", pairs[k + 1])
               for k in range(0, len(pairs), 2)}
    if isinstance(term, tuple):
        return tuple(A.substitute_indices(_expr("subst_index", t), mapping) for t in term)
    return A.substitute_indices(_expr("subst_index", term), mapping)


def shifted(ctx: EvalContext, index, offset) -> A.Expr:
    """The index expression ``index + offset`` (just ``index`` for offset 0; ``index - k``
    for a negative offset), for ``subst_index`` (a loop over a sub-range starting at
    ``offset``)."""
    name = _index_name(index, "shifted's first argument")
    if not isinstance(offset, int) or isinstance(offset, bool):
        raise ValueExprError(f"shifted: the offset must be an integer, got {offset!r}")
    if offset == 0:
        return A.Index(name)
    return A.BinOp("+", A.Index(name), A.Int(offset)) if offset > 0 else A.BinOp("-", A.Index(name), A.Int(-offset))


def _renamed(ctx, term, old, new):
    """A term with every access of tensor ``old`` renamed to ``new`` (dtype, scope and
    subscripts kept)."""
    def fn(e):
        return A.Tensor(new, e.dtype, e.scope, e.indices) if isinstance(e, A.Tensor) and e.name == old else e

    return A.transform(_expr("renamed", term), fn)


def _reads_only(ctx, term, name) -> bool:
    """True when every tensor the term reads (subscripts included) is ``name``."""
    return all(e.name == name for e in A.walk(_expr("reads_only", term)) if isinstance(e, A.Tensor))


def _index_outside(ctx, term, name, var) -> bool:
    """True when loop index ``var`` occurs in the term outside the accesses of tensor
    ``name`` (as a value, or in another tensor's subscript)."""
    def visit(e) -> bool:
        if isinstance(e, A.Tensor) and e.name == name:
            return False
        if isinstance(e, A.Index):
            return e.name == var
        return any(visit(c) for c in A.children(e))

    return visit(_expr("index_outside", term))


def _plain_in(ctx, sub, var) -> bool:
    """True when loop index ``var`` is a plain entry of the subscript list ``sub``."""
    return isinstance(sub, tuple) and any(isinstance(e, A.Index) and e.name == var for e in sub)


def _plain_subscript(ctx, sub) -> bool:
    """True when every entry of the subscript list ``sub`` is a loop index or an integer
    literal: the tensor is read exactly at the iteration point, so a copy of it over the
    same loops stays in bounds without the guard of the original read (a padded
    convolution reads ``X_{...,c-1}`` under ``if_then_else(c<1,...)``)."""
    return isinstance(sub, tuple) and all(isinstance(e, (A.Index, A.Int)) for e in sub)


def _is_bound_name(name: str) -> bool:
    return len(name) >= 2 and name[0] in "tb" and name[1] in "xyz"


def _has_bound_index(ctx, t) -> bool:
    """True when a term or subscript list uses a thread/block-bound loop index (``tx..``,
    ``by..``): the GPU preflight cannot prove ``tx//f, tx%f`` race-free, so a reshape must
    leave such entries alone."""
    items = t if isinstance(t, tuple) else (t,)
    return any(isinstance(x, A.Index) and _is_bound_name(x.name)
               for e in items for x in A.walk(_expr("has_bound_index", e)))


def _target_of(ctx, eq) -> str:
    """Name of the tensor an equation (``?e``, an EqRef) writes."""
    if not isinstance(eq, EqRef):
        raise ValueExprError(f"target_of expects an equation, got {eq!r}")
    item = get_item(ctx.module.program, eq.path)
    if not isinstance(item, A.Assign):
        raise ValueExprError(f"target_of: {eq} is not an equation")
    return item.target.name


# ---------------------------------------------------------------------------
# Shapes, layouts and counts
# ---------------------------------------------------------------------------


_ANALYSES = IdentityMemo()
_ACCESSES = IdentityMemo()


def _analysis(module):
    """:func:`steptp.leir.analysis.analyze` of the module (no bounds check; read-only use),
    memoised for the last 32 modules by identity: parameter domains ask for shapes and
    sizes once per candidate (``set_storage_layout`` listed 649 candidates of the merged
    examples in 15 s without it, 13 ms of analysis each time; 0.4 s with it). Raises
    ``LeirSemanticError``."""
    from ..leir.analysis import analyze

    return _ANALYSES.get((module.program, module.signature),
                         lambda: analyze(module.program, module.signature, check_bounds=False))


def _accesses(program) -> dict[str, list]:
    """Every tensor access of ``program`` by tensor name, in program order (as
    :func:`iter_tensors` yields them), memoised for the last 32 programs by identity:
    ``rank_of`` and ``dim_has_bound_index`` are asked once per candidate value and walked the
    whole program each time (set_storage_layout on 348 nests: 8.8 s, most of it here)."""
    def index() -> dict[str, list]:
        out: dict[str, list] = {}
        for t in iter_tensors(program):
            out.setdefault(t.name, []).append(t)
        return out

    return _ACCESSES.get((program,), index)


def _occurrences(ctx: EvalContext, name) -> list:
    """The accesses of tensor ``name`` in the program, in program order ([] for a name that
    is not a string or not a tensor of the program)."""
    return _accesses(ctx.module.program).get(name, []) if isinstance(name, str) else []


def _shape(ctx, name, fn: str = "shape_of") -> tuple[int, ...]:
    """Shape of a tensor: the signature's, else the one inferred from the program's writes
    (:func:`steptp.leir.analysis.analyze`; a semantic error becomes a ValueExprError)."""
    name = _name(name)
    d = ctx.module.signature.get(name)
    if d is not None:
        return tuple(d.shape)
    from ..leir.analysis import LeirSemanticError

    try:
        shapes = _analysis(ctx.module).shapes
    except LeirSemanticError as e:
        raise ValueExprError(f"{fn}: {e}") from None
    if name not in shapes:
        raise ValueExprError(f"{fn}: unknown tensor {name!r}")
    return tuple(shapes[name])


def _rank_of(ctx, name) -> int:
    """Number of subscript entries of a tensor (its rank; 0 for a scalar): the signature's
    rank, else the subscript length of its first access in the program. (Equal to the rank
    of the inferred shape for a well-formed program, without running the analysis.)"""
    name = _name(name)
    decl = ctx.module.signature.get(name)
    if decl:
        return len(decl.shape)
    for t in _occurrences(ctx, name):
        return len(t.indices)
    raise ValueExprError(f"rank_of: unknown tensor {name!r}")


def _split_entry(ctx, sub, d, f) -> tuple:
    """A subscript list with entry ``d`` split in two, ``(e//f, e%f)``: the element's
    address in a copy whose dimension d (extent n) is reshaped to (n/f, f)."""
    if not isinstance(sub, tuple) or not (isinstance(d, int) and 0 <= d < len(sub)) or not isinstance(f, int) \
            or f <= 0:
        raise ValueExprError(f"split_entry: bad arguments {sub!r}, {d!r}, {f!r}")
    e = _expr("split_entry", sub[d])
    return tuple(sub[:d]) + (A.BinOp("//", e, A.Int(f)), A.BinOp("%", e, A.Int(f))) + tuple(sub[d + 1:])


def _flattened(ctx, sub, name) -> tuple:
    """A one-entry subscript addressing the same element of a row-major copy of tensor
    ``name`` (signature or inferred shape): ``(i0*s0+i1*s1+...,)`` with ``s_k`` the product
    of the later extents (``A_{tx,c}`` of an [8,12] tensor -> ``(tx*12+c,)``)."""
    shape = _shape(ctx, name, "flattened")
    if not isinstance(sub, tuple) or len(sub) != len(shape):
        raise ValueExprError(f"flattened: subscript {sub!r} does not match the rank of {_name(name)}")
    out = None
    for k, e in enumerate(sub):
        stride = math.prod(shape[k + 1:])
        term = _expr("flattened", e)
        if stride != 1:
            term = A.BinOp("*", term, A.Int(stride))
        out = term if out is None else A.BinOp("+", out, term)
    return (out if out is not None else A.Int(0),)


def _dim_has_bound_index(ctx, name, d) -> bool:
    """True when some access of tensor ``name`` has a thread/block-bound index in entry ``d``."""
    for t in _occurrences(ctx, name):
        if 0 <= d < len(t.indices) and _has_bound_index(ctx, t.indices[d]):
            return True
    return False


def _shape_of(ctx, name, d) -> int:
    """Extent of dimension ``d`` of a tensor (signature or inferred shape; negative ``d``
    counts from the last dimension)."""
    s, d = _shape(ctx, name), _int("shape_of", d)
    if not -len(s) <= d < len(s):
        raise ValueExprError(f"shape_of: tensor {_name(name)} has rank {len(s)}, no dimension {d}")
    return s[d]


def _count(ctx, name, writes: bool) -> int:
    name = _name(name)
    n = 0
    for _, eq in ctx.module.program.equations():
        if writes:
            n += eq.target.name == name
        else:
            reads = [x for x in A.walk(eq.value) if isinstance(x, A.Tensor) and x.name == name]
            reads += [x for i in eq.target.indices for x in A.walk(i) if isinstance(x, A.Tensor) and x.name == name]
            n += bool(reads)
    return n


# ---------------------------------------------------------------------------
# GPU facts
# ---------------------------------------------------------------------------


def _kernel(ctx, n) -> A.Nest:
    """The top-level nest (one GPU kernel launch site) containing nest ``n``."""
    if not isinstance(n, NestRef):
        raise ValueExprError(f"expected a nest, got {n!r}")
    return get_item(ctx.module.program, n.path[:1])


def _bound_axes(ctx, n) -> tuple[str, ...]:
    out: dict[str, None] = {}
    for l in _kernel(ctx, n).all_loops():
        if l.kind == "B":
            out.setdefault(_axis(l), None)
    return tuple(out)


def _thread_extents(nest: A.Nest) -> dict[str, int]:
    """Thread axis (``tx``, ``ty``, ``tz``) -> the largest extent a loop of ``nest`` binds it to."""
    out: dict[str, int] = {}
    for l in nest.all_loops():
        if l.kind == "B" and l.var.startswith("t"):
            out[l.var[:2]] = max(out.get(l.var[:2], 1), l.extent)
    return out


def _threads_per_block(ctx, n) -> int:
    return math.prod(_thread_extents(_kernel(ctx, n)).values())


def _axis_limit(ctx, ax) -> int:
    from ..backend.hardware import DEFAULT_GPU

    ax = _name(ax)[:2]
    if ax not in _TAG:
        raise ValueExprError(f"axis_limit: unknown axis {ax!r}; axes: {', '.join(_AXES)}")
    return DEFAULT_GPU.limit(_TAG[ax])


def _max_threads(ctx) -> int:
    from ..backend.hardware import DEFAULT_GPU

    return DEFAULT_GPU.max_threads_per_block


def _block_prefix(ctx, loops) -> tuple:
    """The leading loops of a loop list that are bound to a block axis (``B`` loops named
    ``bx..``, ``by..``, ``bz..``): one iteration of them is one thread block."""
    out = []
    for l in _loop_list(loops, "block_prefix"):
        if l.kind != "B" or not l.var.startswith("b"):
            break
        out.append(l)
    return tuple(out)


def _nest_tensors(ctx, n, writes: bool) -> tuple[str, ...]:
    """Names of the tensors a nest (inner nests included) writes (``writes``) or reads, in
    order of first occurrence."""
    out: dict[str, None] = {}
    for _, eq in _nest("nest_tensors", ctx, n).equations():
        for k, t in enumerate(eq_accesses(eq)):
            if (k == 0) == writes:
                out.setdefault(t.name, None)
    return tuple(out)


def _grid_is_prefix(ctx, n) -> bool:
    """True when every blockIdx-bound loop of top-level nest ``n`` is one of its leading block
    loops (:func:`_block_prefix`): the kernel's grid is those loops. A block axis bound further
    in (below a thread loop, or in one phase of a block-fused kernel) is part of the launch
    too, and every other phase then runs once per block of it (``stp lower --cuda``: a phase
    outside ``blockIdx.y`` runs in every ``blockIdx.y`` block)."""
    nest = _nest("grid_is_prefix", ctx, n)
    prefix = len(_block_prefix(ctx, nest.loops))
    return sum(1 for l in nest.all_loops() if l.kind == "B" and l.var.startswith("b")) == prefix


def _handoff(ctx, n1, n2) -> tuple[str, ...]:
    """Tensors nest ``n1`` writes and nest ``n2`` reads, in ``n1``'s order."""
    read2 = set(_nest_tensors(ctx, n2, False))
    return tuple(x for x in _nest_tensors(ctx, n1, True) if x in read2)


def _used_outside(ctx, names, n1, n2) -> bool:
    """True when a tensor of ``names`` is a signature tensor (input, parameter, output) or
    is accessed by a top-level nest other than the ones holding ``n1`` and ``n2``: such a
    tensor must stay in global memory."""
    names = set(_seq("used_outside", names))
    if names & {t.name for t in ctx.module.signature.tensors}:
        return True
    keep = {n1.path[0], n2.path[0]} if isinstance(n1, NestRef) and isinstance(n2, NestRef) else set()
    for k, nest in enumerate(ctx.module.program.nests):
        if k in keep:
            continue
        for _, eq in nest.equations():
            if any(t.name in names for t in eq_accesses(eq)):
                return True
    return False


def _sliced_by(ctx, n1, n2, indices) -> bool:
    """True when every tensor written by one of the nests ``n1``, ``n2`` and accessed by the
    other is accessed in both only inside the slice their shared outer loops select: each
    index of ``indices`` is a plain subscript entry at one fixed position of every such access
    and no other entry uses it. Iteration ``p`` of those loops then touches elements no other
    iteration touches, so running ``n1``'s and ``n2``'s work for ``p`` together (fusion at
    those loops) keeps every dependence (TVM ``compute_at`` at a shared outer loop)."""
    idx = tuple(_index_name(i, "sliced_by") for i in _seq("sliced_by", indices))
    w1, w2 = set(_nest_tensors(ctx, n1, True)), set(_nest_tensors(ctx, n2, True))
    a1 = w1 | set(_nest_tensors(ctx, n1, False))
    a2 = w2 | set(_nest_tensors(ctx, n2, False))
    shared = (w1 & a2) | (w2 & a1)
    for name in shared:
        acc = [t for n in (n1, n2) for _, eq in _nest("sliced_by", ctx, n).equations()
               for t in eq_accesses(eq) if t.name == name]
        for v in idx:
            pos = {tuple(k for k, e in enumerate(t.indices) if isinstance(e, A.Index) and e.name == v) for t in acc}
            if len(pos) != 1 or len(next(iter(pos))) != 1:
                return False
            p = next(iter(pos))[0]
            if any(v in free_indices(e) for t in acc for k, e in enumerate(t.indices) if k != p):
                return False
    return True


def _reads_elsewhere(ctx, name, sub) -> bool:
    """True when some read of tensor ``name`` is at a subscript other than ``sub`` (a write
    at ``sub`` is not a read)."""
    if not isinstance(sub, tuple):
        raise ValueExprError(f"reads_elsewhere expects a subscript list, got {sub!r}")
    for _, eq in ctx.module.program.equations():
        for k, t in enumerate(eq_accesses(eq)):
            if k > 0 and t.name == name and t.indices != sub:
                return True
    return False


def _reads_only_dtype(ctx, term, dt) -> bool:
    """True when ``term`` reads at least one tensor and every tensor it reads has dtype
    ``dt``: computed where it is read, it gives the value a ``dt`` tensor would have stored."""
    dts = {t.dtype for t in A.walk(_expr("reads_only_dtype", term)) if isinstance(t, A.Tensor)}
    return dts == {_name(dt)}


def _threads_agree(ctx, n1, n2) -> bool:
    """True when every thread axis bound in both nests has the same extent in both (one
    kernel launches one block shape: TVM keeps the first extent of a tag and skips work)."""
    e1, e2 = (_thread_extents(_nest("threads_agree", ctx, n)) for n in (n1, n2))
    return all(e1[a] == e2[a] for a in e1.keys() & e2.keys())


def _names_thread_indices(ctx, nest, sub) -> bool:
    """True when the subscript ``sub`` (a tuple of index terms) has, as plain entries, the
    index of every threadIdx-bound loop (``B`` loop named tx.., ty.., tz..) of ``nest``:
    each thread of a block then touches its own elements of a shared buffer (no race)."""
    if not isinstance(nest, NestRef) or not isinstance(sub, tuple):
        raise ValueExprError(f"names_thread_indices expects a nest and a subscript list, got {nest!r}, {sub!r}")
    loops = get_nest(ctx.module.program, nest.path).loops
    plain = {x.name for x in sub if isinstance(x, A.Index)}
    return all(l.var in plain for l in loops if l.kind == "B" and l.var.startswith("t"))



# ---------------------------------------------------------------------------
# Element-wise definitions (math rules that look through a producer nest)
# ---------------------------------------------------------------------------


def _tensors_read(e) -> set[str]:
    return {x.name for x in A.walk(e) if isinstance(x, A.Tensor)}


def element_definition(prog: A.Program, term, k: int, signature=frozenset()):
    """The element-wise definition of the read ``term`` in top-level nest ``k`` of ``prog``
    (the engine of ``definition(t, N)``; also used by the math normal forms that look through
    producer nests, :mod:`steptp.engine.mathprims`, and by the symbolic check).

    When ``term`` is a read ``X_{l}`` of a tensor not named in ``signature`` whose only writer
    is the single equation of an earlier top-level nest with exactly the loops of nest ``k``,
    writing ``X`` at the same subscript ``l`` whose entries are all of that nest's loop
    indices, not accumulating, and no nest from the producer up to ``k`` (itself included)
    writes a tensor the definition reads: that equation's value, which equals ``term`` at
    every iteration of nest ``k``. Otherwise ``term`` itself."""
    if not isinstance(term, A.Tensor) or term.name in signature:
        return term
    site = prog.nests[k]
    writers, written = _writer_index(prog)
    if len(writers.get(term.name, ())) != 1:
        return term
    i, producer, eq = writers[term.name][0]
    if i >= k or len(producer.body) != 1 or producer.body[0] is not eq or producer.loops != site.loops:
        return term
    if eq.target.indices != term.indices:
        return term
    plain = [x.name for x in eq.target.indices if isinstance(x, A.Index)]
    if len(plain) != len(eq.target.indices) or sorted(plain) != sorted(l.var for l in producer.loops):
        return term
    reads = _tensors_read(eq.value)
    if term.name in reads:
        return term
    if any(not reads.isdisjoint(w) for w in written[i:k + 1]):
        return term
    return eq.value


_WRITERS = IdentityMemo()


def _writer_index(prog: A.Program) -> tuple[dict[str, list], list[frozenset]]:
    """``(writers, written)`` of ``prog``, once per program (by identity): tensor name ->
    every ``(top-level nest, nest, equation)`` writing it, in program order; and per
    top-level nest the names it writes. :func:`element_definition` asks at every read of
    every look-through candidate; scanning the program each time made listing the math
    rules' candidates quadratic in the nest count."""
    def compute():
        writers: dict[str, list] = {}
        written = []
        for i, n in enumerate(prog.nests):
            names = set()
            for _, eq in n.equations():
                writers.setdefault(eq.target.name, []).append((i, n, eq))
                names.add(eq.target.name)
            written.append(frozenset(names))
        return writers, written

    return _WRITERS.get((prog,), compute)


def _definition(ctx, term, nest):
    """``definition(t, N)``: the element-wise definition of the term ``t`` read in nest ``N``.

    When ``t`` is a read ``X_{l}`` of an intermediate (not in the signature) whose only
    writer is the single equation of an earlier top-level nest with exactly the loops of
    ``N`` (``N`` itself top-level), writing ``X`` at the same subscript ``l`` whose entries are
    all of that nest's loop indices, not accumulating, and no nest from the producer up to
    ``N`` (itself included) writes a tensor the definition reads: that equation's value,
    which equals ``t`` at every iteration of ``N``. Otherwise ``t`` itself. (The translator
    emits one nest per operator, so ``log(x*y)`` is ``G=E*F`` then ``H=log(G)``.)
    See :func:`element_definition`."""
    if not isinstance(term, A.Tensor):
        return term
    if not isinstance(nest, NestRef):
        raise ValueExprError(f"definition: expected a nest, got {nest!r}")
    if len(nest.path) != 1:
        return term
    return element_definition(ctx.module.program, term, nest.path[0],
                              frozenset(t.name for t in ctx.module.signature.tensors))


def _head_of(ctx, term) -> str:
    """``head_of(t)``: the top operator of a term: a function name (``log``, ``exp`` ...), a
    binary operator (``+ - * / // % **``), ``neg``, or ``tensor`` / ``index`` / ``literal``."""
    t = _expr("head_of", term)
    if isinstance(t, A.Call):
        return t.func
    if isinstance(t, A.BinOp):
        return t.op
    if isinstance(t, A.Neg):
        return "neg"
    if isinstance(t, A.Tensor):
        return "tensor"
    if isinstance(t, A.Index):
        return "index"
    return "literal" if isinstance(t, (A.Int, A.Float)) else type(t).__name__.lower()


def _operand(ctx, term, k):
    """``operand(t, k)``: operand ``k`` of the term's top operator (function arguments, the two
    sides of a binary operator, the operand of a negation)."""
    t = _expr("operand", term)
    ops = (t.args if isinstance(t, A.Call) else (t.lhs, t.rhs) if isinstance(t, A.BinOp)
           else (t.operand,) if isinstance(t, A.Neg) else ())
    k = _int("operand", k)
    if not -len(ops) <= k < len(ops):
        raise ValueExprError(f"operand: {t!r} has {len(ops)} operand(s), no operand {k}")
    return ops[k]


#: name -> (arity, fn(ctx, *args)); arity -1 = variadic (checked by the function itself).
#: Added to VALUE_FUNCTIONS by :func:`~steptp.engine.domains.register_value_functions` below.
LANGUAGE_FUNCTIONS: dict[str, tuple[int, Any]] = {
    # core
    "loops_of": (1, _loops_of),
    "loop_count": (1, lambda ctx, n: len(_loops_of(ctx, n))),
    "extent_of": (2, lambda ctx, n, p: _loops_of(ctx, n)[p].extent),
    "item_count": (1, lambda ctx, n: len(get_nest(ctx.module.program, n.path).body)),
    "eq_count": (1, lambda ctx, n: sum(1 for _ in get_nest(ctx.module.program, n.path).equations())),
    "scope_of": (1, _scope_of),
    "dtype_of": (1, _dtype_of),
    "tensor_bytes": (1, _tensor_bytes),
    "shared_limit": (0, _shared_limit),
    "min": (2, lambda ctx, a, b: min(a, b)),
    "max": (2, lambda ctx, a, b: max(a, b)),
    # lists
    "len": (1, lambda ctx, xs: len(_seq("len", xs))),
    "item": (2, _item),
    "slice": (3, _slice),
    "drop": (2, _drop),
    "replace_at": (3, _replace_at),
    "insert_at": (3, _insert_at),
    "concat": (2, lambda ctx, a, b: _seq("concat", a) + _seq("concat", b)),
    "contains": (2, _contains),
    "index_in": (2, _index_in),
    "permuted": (2, _permuted),
    "is_identity": (1, _is_identity),
    "not_identity": (1, lambda ctx, order: not _is_identity(ctx, order)),
    # loops
    "loop": (2, _loop_at),
    "kind_of": (2, lambda ctx, n, p: _loop_at(ctx, n, p, "kind_of").kind),
    "index_of": (2, lambda ctx, n, p: _loop_at(ctx, n, p, "index_of").var),
    "axis_of": (2, lambda ctx, n, p: _axis(_loop_at(ctx, n, p, "axis_of"))),
    "with_kind": (2, lambda ctx, l, k: _with("with_kind", l, kind=_name(k))),
    "with_extent": (2, lambda ctx, l, e: _with("with_extent", l, extent=_int("with_extent", e))),
    "with_index": (2, lambda ctx, l, v: _with("with_index", l, var=_name(v))),
    "indices_of": (1, _indices_of),
    "keep_loops": (2, _keep_loops),
    "loop_pos": (2, _loop_pos),
    "loops_without": (2, loops_without),
    "set_extent": (3, set_extent),
    "loops_used_by": (2, loops_used_by),
    "loops_unused_by": (2, loops_unused_by),
    # terms and subscripts
    "subscripts_of": (1, _subscripts_of),
    "free_indices": (1, lambda ctx, t: free_indices(t)),
    "index_only_in": (3, _index_only_in),
    "tensor_name": (1, lambda ctx, t: t.name if isinstance(t, A.Tensor) else _name(t)),
    "tensors_of": (1, lambda ctx, t: tuple(dict.fromkeys(x.name for x in A.walk(t) if isinstance(x, A.Tensor)))),
    "subst_index": (-1, subst_index),
    "shifted": (2, shifted),
    "renamed": (3, _renamed),
    "reads_only": (2, _reads_only),
    "index_outside": (3, _index_outside),
    "plain_in": (2, _plain_in),
    "plain_subscript": (1, _plain_subscript),
    "has_bound_index": (1, _has_bound_index),
    "target_of": (1, _target_of),
    "definition": (2, _definition),
    "head_of": (1, _head_of),
    "operand": (2, _operand),
    # shapes, layouts and counts
    "shape_of": (2, _shape_of),
    "rank_of": (1, _rank_of),
    "flattened": (2, _flattened),
    "split_entry": (3, _split_entry),
    "dim_has_bound_index": (2, _dim_has_bound_index),
    "readers": (1, lambda ctx, x: _count(ctx, x, False)),
    "writers": (1, lambda ctx, x: _count(ctx, x, True)),
    # GPU
    "bound_axes": (1, _bound_axes),
    "threads_per_block": (1, _threads_per_block),
    "axis_limit": (1, _axis_limit),
    "is_thread_axis": (1, lambda ctx, ax: _name(ax)[:1] == "t" and _name(ax)[:2] in _TAG),
    "max_threads_per_block": (0, _max_threads),
    "names_thread_indices": (2, _names_thread_indices),
    "block_prefix": (1, _block_prefix),
    "handoff": (2, _handoff),
    "used_outside": (3, _used_outside),
    "sliced_by": (3, _sliced_by),
    "threads_agree": (2, _threads_agree),
    "grid_is_prefix": (1, _grid_is_prefix),
    "reads_elsewhere": (2, _reads_elsewhere),
    "reads_only_dtype": (2, _reads_only_dtype),
}


register_value_functions(LANGUAGE_FUNCTIONS)


__all__ = ["LANGUAGE_FUNCTIONS", "element_definition", "free_indices", "loops_without", "set_extent", "loops_used_by", "loops_unused_by",
           "subst_index", "shifted"]
