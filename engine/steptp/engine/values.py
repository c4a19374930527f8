"""Rule-language value functions over lists, shapes, loops and thread bindings.

These extend :data:`steptp.engine.primitives.VALUE_FUNCTIONS` (the functions usable in
``let:``, ``params:`` domains and ``require:``, primitive arguments and ``{check: ...}``
preconditions). They are generic: no rule is named here. Documented in
``rules/README.md`` ("Values"); tested on their own in ``tests/test_rule_language.py``.

Families:

* **Lists** (loop lists such as ``loops_of(?N)``, subscript lists bound by a ``*?S``
  pattern splice, index-name lists): ``len``, ``item``, ``slice``, ``drop``,
  ``replace_at``, ``insert_at``, ``concat``, ``contains``, ``index_in``.
* **Loops** (an :class:`~steptp.leir.ast.Loop` value, e.g. ``loop(?N, ?pos)``):
  ``loop``, ``kind_of``, ``index_of``, ``axis_of``, ``with_kind``, ``with_extent``,
  ``with_index``, ``indices_of``, ``keep_loops``, ``loop_pos``.
* **Terms**: ``subscripts_of`` (a tensor term's subscript list), ``free_indices`` (loop
  indices a term or list uses, first-occurrence order), ``index_only_in`` (every use of
  an index lies inside a given term), ``tensor_name``, ``tensors_of`` (tensor names a
  term reads, subscripts included).
* **Shapes**: ``shape_of(X, d)``, ``rank_of(X)`` (signature or inferred shape).
* **GPU**: ``bound_axes(N)`` (thread/block axes bound in the kernel around nest ``N``),
  ``threads_per_block(N)``, ``axis_limit(ax)``, ``is_thread_axis(ax)``,
  ``max_threads_per_block()`` (:mod:`steptp.backend.hardware`).
* **Counts**: ``readers(X)`` / ``writers(X)`` (equations reading / writing a tensor).

Nest arguments are :class:`~steptp.engine.primitives.NestRef` bindings (``?N``,
``?nest``); every function raises :class:`~steptp.engine.primitives.ValueExprError` with a
message naming the function for a bad argument.
"""

from __future__ import annotations

import math
from typing import Any

from ..leir import ast as A
from .primitives import (VALUE_FUNCTIONS, EvalContext, NestRef, ValueExprError, get_item, get_nest)

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


def _loop_at(ctx, n, p):
    loops = _nest("loop", ctx, n).loops
    p = _int("loop", p)
    if not 0 <= p < len(loops):
        raise ValueExprError(f"loop: the nest has no loop at position {p}")
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


# ---------------------------------------------------------------------------
# Shapes and counts
# ---------------------------------------------------------------------------


def _shape(ctx, name) -> tuple[int, ...]:
    name = _name(name)
    d = ctx.module.signature.get(name)
    if d is not None:
        return tuple(d.shape)
    from ..leir.analysis import LeirSemanticError, analyze

    try:
        info = analyze(ctx.module.program, ctx.module.signature, check_bounds=False)
    except LeirSemanticError as e:
        raise ValueExprError(f"shape_of: {e}") from None
    if name not in info.shapes:
        raise ValueExprError(f"shape_of: unknown tensor {name!r}")
    return tuple(info.shapes[name])


def _shape_of(ctx, name, d) -> int:
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


def _all_loops(nest: A.Nest):
    yield from nest.loops
    for item in nest.body:
        if isinstance(item, A.Nest):
            yield from _all_loops(item)


def _bound_axes(ctx, n) -> tuple[str, ...]:
    out: dict[str, None] = {}
    for l in _all_loops(_kernel(ctx, n)):
        if l.kind == "B":
            out.setdefault(_axis(l), None)
    return tuple(out)


def _threads_per_block(ctx, n) -> int:
    ext: dict[str, int] = {}
    for l in _all_loops(_kernel(ctx, n)):
        if l.kind == "B" and l.var.startswith("t"):
            ext[l.var[:2]] = max(ext.get(l.var[:2], 1), l.extent)
    return math.prod(ext.values())


def _axis_limit(ctx, ax) -> int:
    from ..backend.hardware import DEFAULT_GPU

    ax = _name(ax)[:2]
    if ax not in _TAG:
        raise ValueExprError(f"axis_limit: unknown axis {ax!r}; axes: {', '.join(_AXES)}")
    return DEFAULT_GPU.limit(_TAG[ax])


def _max_threads(ctx) -> int:
    from ..backend.hardware import DEFAULT_GPU

    return DEFAULT_GPU.max_threads_per_block


#: name -> (arity, fn(ctx, *args)); merged into VALUE_FUNCTIONS below.
LANGUAGE_FUNCTIONS: dict[str, tuple[int, Any]] = {
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
    # loops
    "loop": (2, _loop_at),
    "kind_of": (2, lambda ctx, n, p: _loop_at(ctx, n, p).kind),
    "index_of": (2, lambda ctx, n, p: _loop_at(ctx, n, p).var),
    "axis_of": (2, lambda ctx, n, p: _axis(_loop_at(ctx, n, p))),
    "with_kind": (2, lambda ctx, l, k: _with("with_kind", l, kind=_name(k))),
    "with_extent": (2, lambda ctx, l, e: _with("with_extent", l, extent=_int("with_extent", e))),
    "with_index": (2, lambda ctx, l, v: _with("with_index", l, var=_name(v))),
    "indices_of": (1, lambda ctx, ls: tuple(_loop("indices_of", l).var for l in _seq("indices_of", ls))),
    "keep_loops": (2, _keep_loops),
    "loop_pos": (2, _loop_pos),
    # terms
    "subscripts_of": (1, _subscripts_of),
    "free_indices": (1, lambda ctx, t: free_indices(t)),
    "index_only_in": (3, _index_only_in),
    "tensor_name": (1, lambda ctx, t: t.name if isinstance(t, A.Tensor) else _name(t)),
    "tensors_of": (1, lambda ctx, t: tuple(dict.fromkeys(x.name for x in A.walk(t) if isinstance(x, A.Tensor)))),
    # shapes and counts
    "shape_of": (2, _shape_of),
    "rank_of": (1, lambda ctx, x: len(_shape(ctx, x))),
    "readers": (1, lambda ctx, x: _count(ctx, x, False)),
    "writers": (1, lambda ctx, x: _count(ctx, x, True)),
    # GPU
    "bound_axes": (1, _bound_axes),
    "threads_per_block": (1, _threads_per_block),
    "axis_limit": (1, _axis_limit),
    "is_thread_axis": (1, lambda ctx, ax: _name(ax)[:1] == "t" and _name(ax)[:2] in _TAG),
    "max_threads_per_block": (0, _max_threads),
}

for _k, _v in LANGUAGE_FUNCTIONS.items():
    VALUE_FUNCTIONS.setdefault(_k, _v)


__all__ = ["LANGUAGE_FUNCTIONS", "free_indices"]
