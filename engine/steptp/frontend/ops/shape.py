"""Shape and indexing ops: views (reshape, transpose, permute, expand, select, slice: index
remappings, no nests), copies and casts, cat/stack/split, flip/repeat, cumulative sums and
products, narrow/diagonal/pad, index_select/embedding/gather."""

from __future__ import annotations

from ...leir import ast as A
from ..ir import (Buffer, Fill, Value, View, add, call, expand_view, iadd, mul, permute_view, reshape_view,
                  select_view, slice_view, sub)
from .context import lowering


# ---------------------------------------------------------------------------
# Views and copies (no nests)
# ---------------------------------------------------------------------------


@lowering("view", "reshape", "_unsafe_view", "flatten", "unflatten", "squeeze", "unsqueeze", "view_as",
          "reshape_as")
def lower_reshape(ctx):
    """Row-major reshapes (view, reshape, flatten, unflatten, squeeze, unsqueeze): an index
    remapping of the input, no nest."""
    x = ctx.args.get("self") if "self" in ctx.args else ctx.args.get("input")
    if not isinstance(x, Value):
        ctx.fail("expected a tensor", "self")
    return reshape_view(x, ctx.out_shape)


@lowering("transpose")
def lower_transpose(ctx):
    """``transpose(self, dim0, dim1)``: index remapping."""
    x = ctx.tensor("self")
    d0, d1 = ctx.dim(ctx.args["dim0"], x.rank, "dim0"), ctx.dim(ctx.args["dim1"], x.rank, "dim1")
    perm = list(range(x.rank))
    if x.rank:
        perm[d0], perm[d1] = perm[d1], perm[d0]
    return permute_view(x, perm)


@lowering("t", "numpy_T", "mT", "adjoint")
def lower_t(ctx):
    """``x.t()`` / ``x.T`` / ``x.mT``: reverse (or swap the last two) dims."""
    x = ctx.tensor("self")
    if ctx.op in ("mT", "adjoint"):
        perm = list(range(x.rank - 2)) + [x.rank - 1, x.rank - 2]
    else:
        perm = list(reversed(range(x.rank)))
    return permute_view(x, perm)


@lowering("permute")
def lower_permute(ctx):
    """``permute(self, dims)``: index remapping."""
    x = ctx.tensor("self")
    dims = [ctx.dim(d, x.rank, "dims") for d in ctx.args["dims"]]
    if sorted(dims) != list(range(x.rank)):
        ctx.fail(f"not a permutation: {ctx.args['dims']}", "dims")
    return permute_view(x, dims)


@lowering("expand", "expand_as", "broadcast_to")
def lower_expand(ctx):
    """``expand``/``expand_as``/``broadcast_to``: broadcasting index remapping."""
    return expand_view(ctx.tensor("self"), ctx.out_shape)


@lowering("broadcast_tensors")
def lower_broadcast_tensors(ctx):
    """``broadcast_tensors(tensors)``: a tuple of broadcasting views."""
    vals = ctx.node.meta["val"]
    return tuple(expand_view(v, tuple(int(n) for n in m.shape)) for v, m in zip(ctx.args["tensors"], vals))


@lowering("select")
def lower_select(ctx):
    """``select(self, dim, index)`` (``x[i]``): a constant subscript."""
    x = ctx.tensor("self")
    dim = ctx.dim(ctx.args["dim"], x.rank)
    i = ctx.args["index"]
    n = x.shape[dim]
    if not -n <= i < n:
        ctx.fail(f"index {i} out of range for size {n}", "index")
    return select_view(x, dim, i % n)


@lowering("slice")
def lower_slice(ctx):
    """``slice(self, dim, start, end, step)`` (``x[a:b:s]``): an affine subscript."""
    x = ctx.tensor("self")
    dim = ctx.dim(ctx.args.get("dim", 0), x.rank)
    n = x.shape[dim]
    step = ctx.args.get("step", 1)
    if not isinstance(step, int) or step <= 0:
        ctx.unsupported("step")
    start, _end, _ = slice(ctx.args.get("start"), ctx.args.get("end"), step).indices(n)
    length = ctx.out_shape[dim]
    return slice_view(x, dim, start, length, step)


@lowering("contiguous", "clone", "alias", "detach", "lift_fresh_copy", "_assert_tensor_metadata_noop")
def lower_identity(ctx):
    """Copies/aliases with no numeric effect: the value itself (copied only if an output)."""
    return ctx.tensor("self")


@lowering("dropout", "feature_dropout", "alpha_dropout", "feature_alpha_dropout", "native_dropout")
def lower_dropout(ctx):
    """Dropout: the identity when ``train`` is false or ``p == 0``; in training mode with
    ``p > 0`` it is random and raises (translate the model in eval mode). ``native_dropout``
    (functionalised graphs) also returns its all-true mask."""
    if ctx.args.get("train") and ctx.args.get("p", 0) != 0:
        ctx.fail("dropout in training mode with p > 0 is random; put the model in eval() mode "
                 "(stp translate --eval, translate_file(eval_mode=True))", "train")
    x = ctx.tensor("input")
    if ctx.op == "native_dropout":
        return (x, Fill(True, "bool", x.shape))
    return x


@lowering("to", "_to_copy", "type_as")
def lower_to(ctx):
    """``to``/``_to_copy``/``type_as``: the identity when the dtype does not change, else a
    copy nest into a tensor of the new dtype (the assignment casts)."""
    x = ctx.tensor("self")
    if ctx.out_dtype == x.dtype:
        return x
    return ctx.map(lambda v: v, x)


@lowering("getitem")
def lower_getitem(ctx):
    """``operator.getitem`` on a multi-result op (``max.dim(...)[0]``)."""
    seq, i = ctx.args["self"], ctx.args["index"]
    if not isinstance(seq, (tuple, list)):
        ctx.fail(f"getitem on {type(seq).__name__}", "self")
    v = seq[i]
    if v is None:
        ctx.fail(f"result {i} of the producer was not computed", "index")
    return v


# ---------------------------------------------------------------------------
# Concatenation, flips, repeats, cumulative ops
# ---------------------------------------------------------------------------


@lowering("cat", "concat", "concatenate")
def lower_cat(ctx):
    """``cat(tensors, dim)``: one copy nest per input, writing at its offset along ``dim``."""
    xs = [v for v in ctx.args["tensors"] if not (isinstance(v, Value) and v.shape == (0,))]
    out = ctx.result()
    dim = ctx.dim(ctx.args.get("dim", 0), out.rank)
    off = 0
    for j, x in enumerate(xs):
        if not isinstance(x, Value) or x.dtype != out.dtype:
            ctx.fail("inputs must be tensors of the result dtype", "tensors")
        sp = ctx.em.space(x.shape)
        tidx = list(sp.out)
        tidx[dim] = add(tidx[dim], A.Int(off)) if off else tidx[dim]
        ctx.em.emit(sp.loops, A.Assign(out.ref(tidx), x.read(sp.out)))
        off += x.shape[dim]
    return out


@lowering("stack")
def lower_stack(ctx):
    """``stack(tensors, dim)``: one copy nest per input at index ``j`` of the new dim."""
    xs = ctx.args["tensors"]
    out = ctx.result()
    dim = ctx.dim(ctx.args.get("dim", 0), out.rank)
    for j, x in enumerate(xs):
        if not isinstance(x, Value) or x.dtype != out.dtype:
            ctx.fail("inputs must be tensors of the result dtype", "tensors")
        sp = ctx.em.space(x.shape)
        tidx = list(sp.out)
        tidx.insert(dim, A.Int(j))
        ctx.em.emit(sp.loops, A.Assign(out.ref(tidx), x.read(sp.out)))
    return out


@lowering("split", "split_with_sizes", "chunk", "unbind", "tensor_split")
def lower_split(ctx):
    """``split``/``chunk``/``unbind``: a tuple of slice (or select) views."""
    x = ctx.tensor("self")
    dim = ctx.dim(ctx.args.get("dim", 0), x.rank)
    metas = ctx.node.meta.get("val")
    views, off = [], 0
    for k, m in enumerate(metas):
        n = int(m.shape[dim]) if ctx.op != "unbind" else 1
        if ctx.op == "unbind":
            views.append(select_view(x, dim, k))
        else:
            views.append(slice_view(x, dim, off, n, 1))
        off += n
    return tuple(views)


@lowering("flip")
def lower_flip(ctx):
    """``flip(self, dims)``: index ``n-1-i`` along each flipped dim (a view)."""
    x = ctx.tensor("self")
    dims = {ctx.dim(d, x.rank, "dims") for d in ctx.args["dims"]}

    def remap(idx):
        return tuple(sub(A.Int(x.shape[d] - 1), i) if d in dims and x.shape[d] > 1 else i for d, i in enumerate(idx))

    return View(x, x.shape, remap, "flip")


@lowering("repeat")
def lower_repeat(ctx):
    """``repeat(self, repeats)``: index ``i % n`` (a view)."""
    x = ctx.tensor("self")
    shape = ctx.out_shape
    off = len(shape) - x.rank

    def remap(idx):
        return tuple(A.Int(0) if n == 1 else (idx[off + d] if shape[off + d] == n else
                                              A.BinOp("%", idx[off + d], A.Int(n))) for d, n in enumerate(x.shape))

    return View(x, shape, remap, "repeat")


def _cumulative(ctx, kind: str):
    x = ctx.tensor("self")
    dim = ctx.dim(ctx.args["dim"], x.rank)
    out = ctx.result()
    if x.rank == 0 or x.shape[dim] == 1:
        return ctx.map(lambda v: v, x)
    n = x.shape[dim]

    def build(t: Buffer):
        # the scanned axis is the innermost serial loop; the other axes follow the policy
        sp = ctx.em.space([m for d, m in enumerate(x.shape) if d != dim], [n])
        (r,) = sp.red
        idx = sp.full(x.rank, [dim])
        prev = list(idx)
        prev[dim] = sub(r, A.Int(1))
        ident = ctx.lit(0 if kind == "sum" else 1, t.dtype)
        carry = call("if_then_else", A.Compare(">", r, A.Int(0)), t.ref(prev), ident)
        v = x.read(idx)
        ctx.em.emit(sp.loops, A.Assign(t.ref(idx), add(carry, v) if kind == "sum" else mul(carry, v)))

    return ctx.accumulate(out, build, n)


@lowering("cumsum")
def lower_cumsum(ctx):
    """``cumsum(self, dim)`` as a scan: ``O_i = if_then_else(i>0, O_{i-1}, 0) + X_i`` with the
    scanned axis as the innermost serial loop (a recurrence; no implicit init)."""
    return _cumulative(ctx, "sum")


@lowering("cumprod")
def lower_cumprod(ctx):
    """``cumprod(self, dim)`` as a scan: ``O_i = if_then_else(i>0, O_{i-1}, 1) * X_i``."""
    return _cumulative(ctx, "prod")


@lowering("fill")
def lower_fill(ctx):
    """``fill(self, value)``: a constant of ``self``'s shape."""
    v = ctx.args.get("value")
    if isinstance(v, Value):
        return expand_view(v, ctx.out_shape)
    return Fill(ctx.number("value"), ctx.out_dtype, ctx.out_shape)


@lowering("narrow")
def lower_narrow(ctx):
    """``narrow(self, dim, start, length)``: a slice view."""
    x = ctx.tensor("self")
    dim = ctx.dim(ctx.args["dim"], x.rank)
    start = ctx.args["start"]
    if not isinstance(start, int):
        ctx.unsupported("start")
    return slice_view(x, dim, start % x.shape[dim] if start < 0 else start, ctx.args["length"], 1)


@lowering("diagonal")
def lower_diagonal(ctx):
    """``diagonal(self, offset, dim1, dim2)``: a view (diagonal appended as the last dim)."""
    x = ctx.tensor("self")
    d1, d2 = ctx.dim(ctx.args.get("dim1", 0), x.rank, "dim1"), ctx.dim(ctx.args.get("dim2", 1), x.rank, "dim2")
    off = ctx.args.get("offset", 0)
    keep = [d for d in range(x.rank) if d not in (d1, d2)]

    def remap(idx):
        out = [None] * x.rank
        for j, d in enumerate(keep):
            out[d] = idx[j]
        i = idx[-1]
        out[d1], out[d2] = (i, iadd(i, A.Int(off))) if off >= 0 else (iadd(i, A.Int(-off)), i)
        return tuple(out)

    return View(x, ctx.out_shape, remap, "diagonal")


@lowering("diag")
def lower_diag(ctx):
    """``diag``: a 1-D input becomes a diagonal matrix (``if_then_else(j-i==k, x, 0)``), a
    2-D input yields its diagonal (a view)."""
    x = ctx.tensor("self")
    k = ctx.args.get("diagonal", 0)
    if x.rank == 2:
        return View(x, ctx.out_shape, lambda idx: (idx[0], iadd(idx[0], A.Int(k))) if k >= 0 else
                    (iadd(idx[0], A.Int(-k)), idx[0]), "diag")
    if x.rank != 1:
        ctx.fail("diag needs a 1-D or 2-D tensor", "self")
    out = ctx.result()
    sp = ctx.em.space(out.shape)
    i, j = sp.out
    cond = A.Compare("==", j, iadd(i, A.Int(k)))
    src = i if k >= 0 else j
    ctx.em.emit(sp.loops, A.Assign(out.ref(sp.out), call("if_then_else", cond, x.read((src,)), ctx.lit(0))))
    return out


@lowering("constant_pad_nd", "pad")
def lower_constant_pad(ctx):
    """Constant padding (``F.pad(x, pad, value=v)``): one ``if_then_else`` nest; negative
    pads crop. Other modes are rejected."""
    x = ctx.tensor("self")
    if ctx.op == "pad" and ctx.args.get("mode", "constant") != "constant":
        ctx.unsupported("mode")
    pad = list(ctx.args["pad"])
    value = ctx.args.get("value") or 0
    k = len(pad) // 2
    lo = [pad[2 * (k - 1 - j)] for j in range(k)]
    hi = [pad[2 * (k - 1 - j) + 1] for j in range(k)]
    out = ctx.result()
    sp = ctx.em.space(out.shape)
    idx = list(sp.out)
    src = idx[:x.rank - k]
    cond = None
    for j in range(k):
        d = x.rank - k + j
        i = idx[d]
        src.append(iadd(i, A.Int(-lo[j])))
        parts = []
        if lo[j] > 0:
            parts.append(A.Compare("<=", A.Int(lo[j]), i))
        if hi[j] > 0:
            parts.append(A.Compare("<", i, A.Int(x.shape[d] + lo[j])))
        for c in parts:
            cond = c if cond is None else A.BoolOp("and", cond, c)
    v = x.read(src)
    ctx.em.emit(sp.loops, A.Assign(out.ref(sp.out), v if cond is None else
                                   call("if_then_else", cond, v, ctx.lit(value))))
    return out


def _index_operand(ctx, name: str) -> Value:
    v = ctx.tensor(name)
    if v.dtype not in ("i64", "i32", "i16", "i8", "u8"):
        ctx.fail(f"expected an integer index tensor, got {v.dtype}", name)
    return v


@lowering("index_select")
def lower_index_select(ctx):
    """``index_select(self, dim, index)``: indirect subscript ``X[.., I[j], ..]``."""
    x, ind = ctx.tensor("self"), _index_operand(ctx, "index")
    dim = ctx.dim(ctx.args["dim"], x.rank)

    def remap(idx):
        return tuple(idx[:dim]) + (ind.read((idx[dim],) if ind.rank else ()),) + tuple(idx[dim + 1:])

    return ctx.map(lambda v: v, View(x, ctx.out_shape, remap, "index_select"))


@lowering("embedding")
def lower_embedding(ctx):
    """``embedding(weight, indices)``: ``O[.., d] = W[I[..], d]`` (indirect subscript)."""
    w, ind = ctx.tensor("weight"), _index_operand(ctx, "indices")
    n = ind.rank
    return ctx.map(lambda v: v, View(w, ctx.out_shape, lambda idx: (ind.read(idx[:n]),) + tuple(idx[n:]),
                                     "embedding"))


@lowering("gather")
def lower_gather(ctx):
    """``gather(self, dim, index)``: ``O[i..] = X[.., I[i..], ..]`` at ``dim``."""
    x, ind = ctx.tensor("self"), _index_operand(ctx, "index")
    dim = ctx.dim(ctx.args["dim"], x.rank)
    return ctx.map(lambda v: v, View(x, ctx.out_shape, lambda idx: tuple(idx[:dim]) + (ind.read(idx),) +
                                     tuple(idx[dim + 1:]), "gather"))
