"""Rule-language value functions for GPU tiling (shared-memory tiles fetched cooperatively,
register micro-tiles, vector-width copies): the loops around an equation, its thread loops,
row-major flat indices of a loop list and their inverse, the alignment of a contiguous
run of elements, and the window (bounding box) an affine subscript reads over a set of loops. Generic like :mod:`steptp.engine.values` (no rule is named here); registered
in :data:`~steptp.engine.primitives.VALUE_FUNCTIONS` on import and documented in
``rules/README.md`` ("Values", GPU tiling). Used by ``rules/shared_memory_tiling.yaml``,
``rules/shared_memory_window_tiling.yaml`` and ``rules/register_tiling.yaml``; tested in
``tests/test_shared_memory_tiling.py`` and ``tests/test_tiling_reach.py``.

Sources: TVM ``tvm.s_tir.Schedule.cache_read``/``cache_write``/``fuse``/``split``/``bind``
(the cooperative fetch of a tile: the copy's loops fused, split by the block's thread count
and bound to the threads), CUDA C Programming Guide §5.3.2 (coalesced, aligned vector
accesses of 2 or 4 elements).
"""

from __future__ import annotations

import math

from ..leir import ast as A
from ..leir.indexarith import simplify_index
from .navigation import enclosing_loops
from .domains import register_value_functions
from .primitives import EqRef, NestRef, ValueExprError, get_item
from .values import _expr, _int, _loop_list, _name, _seq, _shape, free_indices, subst_index


def _eq(fn: str, ctx, e) -> A.Assign:
    if not isinstance(e, EqRef):
        raise ValueExprError(f"{fn}: expected an equation, got {e!r}")
    item = get_item(ctx.module.program, e.path)
    if not isinstance(item, A.Assign):
        raise ValueExprError(f"{fn}: {e} is not an equation")
    return item


def eq_loops(ctx, e) -> tuple:
    """``eq_loops(E)``: the loops enclosing equation E, outermost first (those of every nest
    on its path, inner nests included)."""
    _eq("eq_loops", ctx, e)
    return tuple(enclosing_loops(ctx.module.program, e.path))


def outer_loops(ctx, n) -> tuple:
    """``outer_loops(N)``: the loops enclosing nest N (those of the nests it is nested in,
    outermost first; empty for a top-level nest), not N's own."""
    if not isinstance(n, NestRef):
        raise ValueExprError(f"outer_loops: expected a nest, got {n!r}")
    return tuple(enclosing_loops(ctx.module.program, n.path)) if len(n.path) > 1 else ()


def reduction_axes(ctx, e) -> tuple[str, ...]:
    """``reduction_axes(E)``: the index names of the loops around E that are reduction
    axes of E (E reads its own target, and the index is absent from the target's
    subscript: LEIR's reduction semantics, paper §3); empty for a plain store."""
    eq = _eq("reduction_axes", ctx, e)
    if not any(isinstance(x, A.Tensor) and x.name == eq.target.name for x in A.walk(eq.value)):
        return ()
    used = set(free_indices(tuple(eq.target.indices)))
    return tuple(l.var for l in enclosing_loops(ctx.module.program, e.path) if l.var not in used)


def accumulation_identity(ctx, e) -> A.Expr:
    """``accumulation_identity(E)``: the identity of E's accumulation as a LEIR literal, the
    value LEIR's implicit initialisation gives its target (``steptp.leir.analysis``:
    ``+``/``-`` -> ``0.0``, ``*`` -> ``1.0``, ``max`` -> ``-inf``, ``min`` -> ``inf``). A rule
    that writes the initialisation itself uses it (TVM ``decompose_reduction``: the init
    leaves the reduction loop). Raises ``ValueExprError`` when E is not an accumulation."""
    from ..leir.analysis import INIT_VALUES, self_reference_kind  # noqa: PLC0415

    kind = self_reference_kind(_eq("accumulation_identity", ctx, e))
    if kind is None:
        raise ValueExprError(f"accumulation_identity: {e} is not an accumulation")
    return A.float_literal(INIT_VALUES[kind])


def thread_loops(ctx, loops) -> tuple:
    """``thread_loops(L)``: the loops of L bound to a threadIdx axis (``B`` loops named
    ``tx..``, ``ty..``, ``tz..``), in order: one iteration of them is one thread of a block."""
    return tuple(l for l in _loop_list(loops, "thread_loops") if l.kind == "B" and l.var[:1] == "t")


def extent_product(ctx, loops) -> int:
    """``extent_product(L)``: the product of L's extents (1 for an empty list): the
    elements of a tile over L, the threads of a block over its thread loops."""
    return math.prod(l.extent for l in _loop_list(loops, "extent_product"))


def _strides(loops: tuple) -> list[int]:
    out, s = [], 1
    for l in reversed(loops):
        out.append(s)
        s *= l.extent
    return out[::-1]


def linear_index(ctx, loops) -> A.Expr:
    """``linear_index(L)``: the row-major flat index of L's indices with L's extents,
    ``i0*(n1*n2) + i1*n2 + i2`` (the first loop most significant; ``0`` for an empty
    list). A tile stored as one flat shared array is read at the flat index of the loops it
    is indexed by; a cooperative copy writes element ``linear_index(c, threads.., v)``."""
    ls = _loop_list(loops, "linear_index")
    expr: A.Expr | None = None
    for l, s in zip(ls, _strides(ls)):
        term = A.Index(l.var) if s == 1 else A.BinOp("*", A.Index(l.var), A.Int(s))
        expr = term if expr is None else A.BinOp("+", expr, term)
    return expr if expr is not None else A.Int(0)


def delinearized(ctx, term, loops, flat, ranges=()) -> A.Expr | tuple:
    """``delinearized(t, L, f)``: term or subscript list ``t`` with each index of L replaced
    (simultaneously) by its row-major coordinate of the flat index ``f``
    (``(f // stride) % extent``; no ``%`` for the first loop, no ``//`` for the last), the
    inverse of :func:`linear_index`. With ``ranges`` (a loop list: the loops ``f`` runs over)
    each resulting subscript entry is simplified with their extents
    (:func:`steptp.leir.indexarith.simplify_index`)."""
    ls = _loop_list(loops, "delinearized")
    if not ls:
        return term
    f = _expr("delinearized", flat)
    pairs: list = []
    for k, (l, s) in enumerate(zip(ls, _strides(ls))):
        c = f if s == 1 else A.BinOp("//", f, A.Int(s))
        if k > 0:
            c = A.BinOp("%", c, A.Int(l.extent))
        pairs += [l.var, c]
    out = subst_index(ctx, term, *pairs)
    rng = {l.var: l.extent for l in _loop_list(tuple(_seq("delinearized", ranges)) if ranges else (), "delinearized")}
    if rng:
        out = tuple(simplify_index(x, rng) for x in out) if isinstance(out, tuple) else simplify_index(out, rng)
    return out


def loops_in_order(ctx, loops, names) -> tuple:
    """``loops_in_order(L, names)``: the loops of L whose index is in ``names``, in the order
    of ``names`` (e.g. ``free_indices(?l)``: a tile's loops in the order its tensor's
    subscript uses them, so the tile keeps the tensor's layout)."""
    by = {l.var: l for l in _loop_list(loops, "loops_in_order")}
    return tuple(by[n] for n in (_name(x) for x in _seq("loops_in_order", names)) if n in by)


def serial_loop(ctx, index, extent) -> tuple:
    """``serial_loop(i, n)``: the one-loop list ``L^{n}_{i=0}``, or the empty list when
    ``n == 1`` (a copy that needs no loop of its own)."""
    if not isinstance(extent, int) or isinstance(extent, bool) or extent < 1:
        raise ValueExprError(f"serial_loop: the extent must be a positive integer, got {extent!r}")
    return () if extent == 1 else (A.Loop("L", extent, _name(index)),)


def aligned_run(ctx, sub, name, index, width) -> bool:
    """``aligned_run(l, X, i, w)``: the elements of X at subscript ``l`` form aligned runs
    of ``w`` consecutive elements along loop index ``i``: ``i`` occurs only in the last
    entry, there with coefficient 1 in an affine form whose other coefficients and constant
    are multiples of ``w``, and X's last dimension is a multiple of ``w`` (so every run
    starts at an address aligned to ``w`` elements, as CUDA's ``float2``/``float4`` loads
    require: CUDA C Programming Guide §5.3.2). Run start: ``i`` a multiple of ``w``."""
    from ..backend.preflight import linear_form  # noqa: PLC0415

    w = width if isinstance(width, int) else 0
    entries = tuple(_seq("aligned_run", sub))
    v = _name(index)
    if w < 1 or not entries:
        return False
    if w == 1:
        return True
    if any(v in free_indices(e) for e in entries[:-1]):
        return False
    f = linear_form(_expr("aligned_run", entries[-1]))
    if f is None or f.get(v) != 1:
        return False
    if any(c % w for k, c in f.items() if k != v):
        return False
    return _shape(ctx, _name(name), "aligned_run")[-1] % w == 0


def dtype_bytes(ctx, dt) -> int:
    """``dtype_bytes(dt)``: bytes of one element of LEIR dtype ``dt`` (``f32`` -> 4)."""
    code = _name(dt)
    if code not in A.DTYPE_BYTES:
        raise ValueExprError(f"dtype_bytes: unknown dtype {code!r}")
    return A.DTYPE_BYTES[code]


def _window_parts(fn: str, sub, loops) -> list[tuple[A.Expr, A.Expr, int]]:
    """Per entry of subscript ``sub``: ``(base, local, span)``: the entry split into the part
    free of L's indices (``base``: L's indices set to 0) and the rest (``local``, an affine form
    of L's indices with non-negative integer coefficients), and ``span = 1 + max(local)``
    over L's ranges. Raises ``ValueExprError`` where an entry is not affine in L's indices or a
    coefficient is negative."""
    from ..backend.preflight import linear_form  # noqa: PLC0415

    ls = _loop_list(loops, fn)
    ext = {l.var: l.extent for l in ls}
    out = []
    for entry in _seq(fn, sub):
        e = _expr(fn, entry)
        used = [v for v in free_indices(e) if v in ext]
        if not used:
            out.append((e, A.Int(0), 1))
            continue
        f = linear_form(e)
        if f is None or any(f.get(v, 0) < 0 for v in used):
            raise ValueExprError(f"{fn}: subscript entry {e} is not a non-negative affine form of the window's loops")
        base: A.Expr | None = None
        for v, c in f.items():
            if v in used or v == "" or c == 0:
                continue
            t = A.Index(v) if c == 1 else A.BinOp("*", A.Index(v), A.Int(c))
            base = t if base is None else A.BinOp("+", base, t)
        if f.get("", 0):
            k = f[""]
            base = A.Int(k) if base is None else A.BinOp("+" if k > 0 else "-", base, A.Int(abs(k)))
        base = base if base is not None else A.Int(0)
        local: A.Expr | None = None
        span = 1
        for v in sorted(used, key=lambda v: [l.var for l in ls].index(v)):
            c = f[v]
            if c == 0:
                continue
            t = A.Index(v) if c == 1 else A.BinOp("*", A.Int(c), A.Index(v))
            local = t if local is None else A.BinOp("+", local, t)
            span += c * (ext[v] - 1)
        out.append((base, local if local is not None else A.Int(0), span))
    return out


def window_affine(ctx, sub, loops) -> bool:
    """``window_affine(l, L)``: every entry of subscript ``l`` is an affine form of L's
    indices with non-negative integer coefficients (plus anything free of them), so the
    elements it reads over L lie in a box, the *window* (a convolution's
    ``oh*S+kh``: rows ``0 .. S*(OH-1)+KH-1`` past the origin)."""
    try:
        _window_parts("window_affine", sub, loops)
    except ValueExprError:
        return False
    return True


def window_spans(ctx, sub, loops) -> tuple[int, ...]:
    """``window_spans(l, L)``: per entry of subscript ``l``, the extent of the window of
    elements it reads over L's ranges (``1 + sum(c_i*(n_i-1))`` for an entry
    ``base + sum(c_i*i)``; 1 for an entry free of L). TVM computes the same box as the region
    of a ``cache_read`` moved by ``compute_at`` (its region inference)."""
    return tuple(s for _, _, s in _window_parts("window_spans", sub, loops))


def window_size(ctx, sub, loops) -> int:
    """``window_size(l, L)``: the number of elements of the window of ``l`` over L
    (the product of :func:`window_spans`): each element once, where a tile over L's loops
    (``extent_product``) holds an element once per iteration that reads it."""
    return math.prod(window_spans(ctx, sub, loops))


def _window_strides(spans) -> list[int]:
    out, s = [], 1
    for n in reversed(spans):
        out.append(s)
        s *= n
    return out[::-1]


def window_index(ctx, sub, loops) -> A.Expr:
    """``window_index(l, L)``: the row-major flat index, in the window of ``l`` over L
    (:func:`window_spans`), of the element ``l`` reads: ``sum(local_d * stride_d)`` over the
    entries, ``local_d`` the entry's part in L's indices."""
    parts = _window_parts("window_index", sub, loops)
    expr: A.Expr | None = None
    for (_, local, span), st in zip(parts, _window_strides([p[2] for p in parts])):
        if span == 1:
            continue
        t = local if st == 1 else A.BinOp("*", local, A.Int(st))
        expr = t if expr is None else A.BinOp("+", expr, t)
    return expr if expr is not None else A.Int(0)


def window_source(ctx, sub, loops, flat, ranges=()) -> tuple:
    """``window_source(l, L, f[, R])``: the subscript of the element at flat position ``f``
    of the window of ``l`` over L: per entry ``base_d + (f // stride_d) % span_d`` (no ``%``
    on the first entry with a span, no ``//`` on the last), ``base_d`` the entry with L's
    indices at 0. The inverse of :func:`window_index` for a cooperative copy that fills the
    window element by element. With ``R`` (the loops ``f`` runs over) each entry is simplified
    with their extents (:func:`steptp.leir.indexarith.simplify_index`)."""
    parts = _window_parts("window_source", sub, loops)
    f = _expr("window_source", flat)
    spans = [p[2] for p in parts]
    strides = _window_strides(spans)
    wide = [k for k, s in enumerate(spans) if s > 1]
    out = []
    for k, ((base, _, span), st) in enumerate(zip(parts, strides)):
        if span == 1:
            out.append(base)
            continue
        c = f if st == 1 else A.BinOp("//", f, A.Int(st))
        if k != wide[0]:
            c = A.BinOp("%", c, A.Int(span))
        out.append(c if base == A.Int(0) else A.BinOp("+", base, c))
    rng = {l.var: l.extent for l in _loop_list(tuple(_seq("window_source", ranges)) if ranges else (), "window_source")}
    return tuple(simplify_index(x, rng) for x in out) if rng else tuple(out)


def all_serial(ctx, loops) -> bool:
    """``all_serial(L)``: every loop of L is a serial ``L`` loop (true for an empty list):
    loops that every thread of a block runs in step, such as those between a kernel's block
    loops and a shared tile's reduction step."""
    return all(l.kind == "L" for l in _loop_list(loops, "all_serial"))


def tiled_extent(ctx, e, tile) -> int:
    """``tiled_extent(e, t)``: the part of extent ``e`` that tiles of ``t`` cover: all of it
    when ``t`` divides it, else what ``loop_partition`` keeps, a multiple of ``max(t, 16)``
    (its smallest step); the rest is a tail nest."""
    e, tile = _int("tiled_extent", e), _int("tiled_extent", tile)
    return e if e % tile == 0 else e - e % max(tile, 16)


def divisors(ctx, n) -> tuple[int, ...]:
    """``divisors(n)``: the positive divisors of ``n``, ascending (a recipe's tries:
    ``for: {t: "divisors(?N)"}``)."""
    n = _int("divisors", n)
    return tuple(d for d in range(1, n + 1) if n % d == 0) if n > 0 else ()


def sm_count(ctx) -> int:
    """``sm_count()``: the streaming multiprocessors of the default GPU, from the device
    table of ``stp roofline`` (:data:`steptp.roofline.GPUS`, the entry of
    :data:`steptp.backend.hardware.DEFAULT_GPU`): a grid of fewer blocks leaves some idle."""
    from ..backend.hardware import DEFAULT_GPU  # noqa: PLC0415
    from ..roofline import gpu_model_for, gpu_spec  # noqa: PLC0415

    return gpu_spec(gpu_model_for(DEFAULT_GPU.name) or "h100").sms


TILING_FUNCTIONS = {
    "tiled_extent": (2, tiled_extent),
    "divisors": (1, divisors),
    "sm_count": (0, sm_count),
    "accumulation_identity": (1, accumulation_identity),
    "dtype_bytes": (1, dtype_bytes),
    "eq_loops": (1, eq_loops),
    "outer_loops": (1, outer_loops),
    "reduction_axes": (1, reduction_axes),
    "thread_loops": (1, thread_loops),
    "extent_product": (1, extent_product),
    "linear_index": (1, linear_index),
    "delinearized": (-1, lambda ctx, *a: delinearized(ctx, *a) if len(a) in (3, 4) else _arity("delinearized")),
    "loops_in_order": (2, loops_in_order),
    "serial_loop": (2, serial_loop),
    "aligned_run": (4, aligned_run),
    "window_affine": (2, window_affine),
    "window_spans": (2, window_spans),
    "window_size": (2, window_size),
    "window_index": (2, window_index),
    "window_source": (-1, lambda ctx, *a: window_source(ctx, *a) if len(a) in (3, 4) else _arity("window_source")),
    "all_serial": (1, all_serial),
}


def _arity(fn: str):
    raise ValueExprError(f"{fn} takes 3 or 4 arguments")


register_value_functions(TILING_FUNCTIONS)

__all__ = ["TILING_FUNCTIONS", "accumulation_identity",
           "eq_loops", "outer_loops", "reduction_axes", "thread_loops", "extent_product", "linear_index",
           "delinearized", "dtype_bytes", "loops_in_order", "serial_loop", "aligned_run",
           "window_affine", "window_spans", "window_size", "window_index", "window_source", "all_serial",
           "tiled_extent", "divisors", "sm_count"]
