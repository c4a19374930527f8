"""The vocabulary recipes name (``rules/recipes/*.yaml``, :mod:`steptp.engine.recipes`):
*nest forms* and *site filters*. Generic analyses of LEIR, as the rules' relations are: no
recipe and no rule is named here.

A **nest form** (:data:`FORMS`) reads one top-level nest ``fn(nest) -> dict | str | None``:
the bindings a recipe's conditions, tries and steps use (extents, operand names, the names of
the nest's loops, outermost first, that the steps address), a string when the nest is of the
form's family but not of the form (the reason, shown by ``stp rules tiling``), or None when it
is not of the family at all.

* ``gemm``: a GEMM-like reduction as the translator writes it,
  ``B^{M}L^{N}L^{K}..[C_{m,n} = C_{m,n} + X*Y]``, optionally with a batch loop first (the
  target then subscripted by batch, m, n) and ``extra`` further reduction loops after K (a
  1-D convolution ``[N, CO, L, CI, KW]`` is a batched GEMM of CO x L outputs over CI with the
  window loop inside). Loops ``[b,] m, n, k, w0, w1..``.
* ``conv2d``: a 2-D convolution as the translator writes it,
  ``B^{CO}L^{OH}L^{OW}L^{CI}L^{KH}L^{KW}[D_{co,oh,ow} += A*C]`` (7 loops with a batch loop
  first). Loops ``[n,] co, oh, ow, ci, kh, kw``.
* ``peeled_gemm``, ``peeled_conv``, ``elementwise``: the nests a ``loop_partition`` peels off a
  tiled nest (a GEMM's rows or columns, a convolution's rows or columns, their
  initialisation). Loops ``l0, l1, ..``.

A **site filter** (:data:`SITE_FILTERS`) ``fn(program, site, params) -> bool`` picks, among a
rule's candidates, the ones a canonical recipe step takes (``accept:`` of a ``sequence``
recipe's step).

Sources: TVM MetaSchedule's MultiLevelTiling (which blocks it tiles: a reduction block whose
body multiplies two buffers), TVM dlight's ``GeneralReduction`` (row-wise schedules).
"""

from __future__ import annotations

import math
from typing import Callable

from ..leir import ast as A

# ---------------------------------------------------------------------------
# nest analyses
# ---------------------------------------------------------------------------


def reduction_shape(nest) -> list[int] | None:
    """The loop extents of a top-level nest ``B L .. L [one equation]`` whose first loop is the
    only bound one, else None."""
    loops = nest.loops
    if not loops or loops[0].kind != "B" or any(lp.kind != "L" for lp in loops[1:]):
        return None
    if len(nest.body) != 1 or not isinstance(nest.body[0], A.Assign):
        return None
    return [lp.extent for lp in loops]


def operands(eq) -> list[str]:
    """The tensors equation ``eq``'s value reads besides its target, in order of first read."""
    return list(dict.fromkeys(x.name for x in A.walk(eq.value) if isinstance(x, A.Tensor) and x.name != eq.target.name))


def product_of(value, x: str, y: str) -> bool:
    """Whether ``value`` holds a product of a term reading ``x`` and a term reading ``y`` (the
    multiply-accumulate of a GEMM or convolution, not e.g. a softmax's sum of exp(x - max))."""
    def names(t):
        return {z.name for z in A.walk(t) if isinstance(z, A.Tensor)}

    for t in A.walk(value):
        if isinstance(t, A.BinOp) and t.op == "*":
            a, b = names(t.lhs), names(t.rhs)
            if (x in a and y in b) or (y in a and x in b):
                return True
    return False


def is_reduction(nest) -> bool:
    """Whether the nest's (first) equation reads its own target (an accumulation)."""
    eq = nest.body[0]
    return any(isinstance(x, A.Tensor) and x.name == eq.target.name for x in A.walk(eq.value))


def multiply_accumulate(nest) -> bool:
    """Whether the nest's equation multiplies two tensors it reads (a GEMM or convolution
    candidate; an in-place bias add or a row sum is not one)."""
    eq = nest.body[0]
    reads = operands(eq)
    return any(product_of(eq.value, x, y) for i, x in enumerate(reads) for y in reads[i + 1:])


def gemm_form(nest) -> tuple[tuple[str, str], bool, int] | None:
    """``(operands, batch, extra)`` when the top-level nest is GEMM-like as the translator
    writes it (the ``gemm`` form of the module docstring), else None."""
    loops = nest.loops
    eq = nest.body[0]
    names = [lp.var for lp in loops]
    tgt = [x.name if isinstance(x, A.Index) else None for x in eq.target.indices]
    if len(tgt) not in (2, 3) or tgt != names[:len(tgt)] or len(loops) <= len(tgt):
        return None
    reads = operands(eq)
    if len(reads) != 2 or not is_reduction(nest) or not product_of(eq.value, *reads):
        return None
    return (reads[0], reads[1]), len(tgt) == 3, len(loops) - len(tgt) - 1


def _dtype_of(eq, name: str) -> str | None:
    """The dtype of tensor ``name`` as equation ``eq`` reads it (None if not read)."""
    return next((t.dtype for t in A.walk(eq.value) if isinstance(t, A.Tensor) and t.name == name), None)


def _mac_candidate(nest) -> list[int] | None:
    """The extents of a top-level multiply-accumulate reduction of three or more loops (what
    the tiling forms consider), else None."""
    ext = reduction_shape(nest)
    if ext is None or len(ext) < 3 or not is_reduction(nest) or not multiply_accumulate(nest):
        return None
    return ext


# ---------------------------------------------------------------------------
# forms
# ---------------------------------------------------------------------------


def form_gemm(nest):
    """The ``gemm`` form: bindings ``X``, ``Y`` (the two tensors the product reads), ``batch``
    (bool), ``Bt`` (the batch extent, 1 without), ``M``, ``N``, ``K``, ``extra`` (reduction
    loops after K), ``window`` (their names), ``window_size`` (the product of their extents),
    ``rows_on_threads`` (the rows on ``threadIdx``: the translator's form for M <= 1024),
    ``elem_bytes`` (the widest element the value reads), ``X_dtype``, ``Y_dtype``, ``acc_dtype``,
    ``ext`` and ``loops``."""
    ext = _mac_candidate(nest)
    if ext is None:
        return None
    form = gemm_form(nest)
    outs = sum(isinstance(x, A.Index) for x in nest.body[0].target.indices)
    if form is None:
        if len(ext) in (3, 4):
            return "not a GEMM as the translator writes it ([batch,] rows, columns, one reduction; C = C + X*Y)"
        if len(ext) in (6, 7) and outs == len(ext) - 3:
            return None  # a 2-D convolution: conv2d's
        if len(ext) in (6, 7):
            return (f"{outs} output loop(s) and {len(ext) - outs} reduction loop(s) (extents {ext}; a pointwise "
                    f"3-D convolution has 5 and 1): neither a GEMM ([batch,] rows, columns) nor a 2-D "
                    f"convolution; no tiling recipe has this form yet")
        return (f"a {len(ext)}-loop reduction of neither form: GEMM-like ([batch,] rows, columns, then "
                f"reductions: 1-D convolutions included) or 2-D convolution (6 loops, 7 batched)")
    (x, y), batch, extra = form
    eq = nest.body[0]
    o = 1 if batch else 0
    window = [f"w{i}" for i in range(extra)]
    return {"X": x, "Y": y, "batch": batch, "Bt": ext[0] if batch else 1, "M": ext[o], "N": ext[o + 1],
            "K": ext[o + 2], "extra": extra, "window": window,
            "window_size": math.prod(ext[len(ext) - extra:]),
            "rows_on_threads": nest.loops[0].var.startswith("t"),
            "elem_bytes": max(A.DTYPE_BYTES.get(t.dtype, 4) for t in A.walk(eq.value) if isinstance(t, A.Tensor)),
            "X_dtype": _dtype_of(eq, x), "Y_dtype": _dtype_of(eq, y), "acc_dtype": eq.target.dtype,
            "ext": ext, "loops": (["b"] if batch else []) + ["m", "n", "k"] + window}


def form_conv2d(nest):
    """The ``conv2d`` form: bindings ``X`` (the input), ``Y`` (the filter), ``batch`` (bool),
    ``CO``, ``OH``, ``OW``, ``CI``, ``KH``, ``KW``, ``in_bytes`` (bytes per input element),
    ``ext`` and ``loops``."""
    ext = _mac_candidate(nest)
    if ext is None or gemm_form(nest) is not None or len(ext) not in (6, 7):
        return None
    outs = sum(isinstance(x, A.Index) for x in nest.body[0].target.indices)
    if outs != len(ext) - 3:
        return None  # gemm's reason covers it
    eq = nest.body[0]
    reads = operands(eq)
    if len(reads) != 2 or not product_of(eq.value, *reads):
        return "not a convolution as the translator writes it (the product of an input and a filter)"
    batch = len(ext) == 7
    co, oh, ow, ci, kh, kw = ext[-6:]
    return {"X": reads[0], "Y": reads[1], "batch": batch, "CO": co, "OH": oh, "OW": ow, "CI": ci, "KH": kh,
            "KW": kw, "in_bytes": A.DTYPE_BYTES.get(_dtype_of(eq, reads[0]), 4), "ext": ext,
            "loops": (["n"] if batch else []) + ["co", "oh", "ow", "ci", "kh", "kw"]}


def _positional(nest, ext: list[int]) -> dict:
    return {"ext": ext, "loops": [f"l{i}" for i in range(len(ext))], "nloops": len(ext),
            "first_on_threads": nest.loops[0].var.startswith("t")}


def form_peeled_conv(nest):
    """The ``peeled_conv`` form: a convolution nest (6 or 7 loops, a multiply-accumulate
    reduction); ``spatial`` = its output loops (3, or 4 batched), ``last`` = the extent of the
    innermost of them."""
    ext = reduction_shape(nest)
    if ext is None or len(ext) not in (6, 7) or not is_reduction(nest) or not multiply_accumulate(nest):
        return None
    return {**_positional(nest, ext), "spatial": len(ext) - 3, "last": ext[len(ext) - 4]}


def form_elementwise(nest):
    """The ``elementwise`` form: a plain store over 3 or 4 loops (a tail's initialisation);
    ``spatial`` = its loop count, ``last`` = the innermost extent."""
    ext = reduction_shape(nest)
    if ext is None or is_reduction(nest) or not 3 <= len(ext) <= 4:
        return None
    return {**_positional(nest, ext), "spatial": len(ext), "last": ext[-1]}


def form_peeled_gemm(nest):
    """The ``peeled_gemm`` form: a GEMM-like multiply-accumulate over 3 or 4 loops (a batch loop
    first with 4); ``batch`` (bool), ``N`` (the column extent); loops ``[b,] m, n, k``."""
    ext = reduction_shape(nest)
    if ext is None or len(ext) not in (3, 4) or not is_reduction(nest) or not multiply_accumulate(nest):
        return None
    batch = len(ext) == 4
    return {**_positional(nest, ext), "batch": batch, "N": ext[len(ext) - 2],
            "loops": (["b"] if batch else []) + ["m", "n", "k"]}


#: nest forms: name -> ``fn(nest) -> bindings dict | reason str | None`` (module docstring)
FORMS: dict[str, Callable] = {"gemm": form_gemm, "conv2d": form_conv2d, "peeled_conv": form_peeled_conv,
                              "elementwise": form_elementwise, "peeled_gemm": form_peeled_gemm}


# ---------------------------------------------------------------------------
# site filters
# ---------------------------------------------------------------------------


def extents_match_previous(prog, site, params) -> bool:
    """A split of serial or bound loop ``p`` of a top-level nest by ``f`` (``params["f"]``) that
    makes the nest's loops up to ``p+1`` have the previous nest's extents (the loops before
    ``p`` already do; the previous nest's loops ``p``, ``p+1`` are ``n/f``, ``f``). A
    GroupNorm's element-wise nest over 272 channels after its group reductions over 17 x 16
    then binds like them, so the nests can later share a kernel; its reads of the group
    statistics at ``c//16`` become plain block indices (the split simplifies subscripts)."""
    if site.nest is None or len(site.nest) != 1 or site.loop is None or site.nest[0] == 0:
        return False
    k, p, f = site.nest[0], site.loop, params.get("f")
    cur, prev = prog.nests[k].loops, prog.nests[k - 1].loops
    if not isinstance(f, int) or cur[p].kind not in ("L", "B") or p + 1 >= len(prev):
        return False
    return ([lp.extent for lp in cur[:p]] == [lp.extent for lp in prev[:p]]
            and prev[p].extent * prev[p + 1].extent == cur[p].extent and prev[p + 1].extent == f)


def order_matches_neighbour(prog, site, params) -> bool:
    """A loop order (``params["order"]``) that moves one serial loop of a top-level nest inward
    so that the nest's loop extents and a neighbouring nest's (the previous or the next) agree,
    the shorter list a prefix of the longer, where they did not before. A softmax over channels
    (the translator's element-wise nests run batch, channel, h, w; its max and sum nests batch,
    h, w, then the channel reduction) then has every nest over batch, h, w first."""
    order = params.get("order")
    if site.nest is None or len(site.nest) != 1 or not isinstance(order, (list, tuple)):
        return False
    k, loops = site.nest[0], prog.nests[site.nest[0]].loops
    n = len(order)
    moves = [(i, j) for i in range(n) for j in range(i + 1, n)
             if list(order) == [*range(i), *range(i + 1, j + 1), i, *range(j + 1, n)]]
    if len(moves) != 1 or loops[moves[0][0]].kind != "L":
        return False

    def agrees(a, b):
        m = min(len(a), len(b))
        return a[:m] == b[:m]

    before = [lp.extent for lp in loops]
    after = [loops[o].extent for o in order]
    for nb in (k - 1, k + 1):
        if 0 <= nb < len(prog.nests):
            ext = [lp.extent for lp in prog.nests[nb].loops]
            if agrees(after, ext) and not agrees(before, ext):
                return True
    return False


def _under_blocks(prog, site) -> bool:
    """True when every loop of the kernel above loop ``site.loop`` of nest ``site.nest`` (the
    outer nests' loops, then the nest's own before it) is bound to a block axis."""
    from .navigation import enclosing_loops, get_nest  # noqa: PLC0415

    outer = enclosing_loops(prog, (*site.nest, 0))  # every nest on the path, this one included
    above = outer[:len(outer) - len(get_nest(prog, site.nest).loops) + site.loop]
    return all(lp.kind == "B" and lp.var.startswith("b") for lp in above)


def blocks_while_free(prog, site, params) -> bool:
    """A thread-axis binding (``params["ax"]``) where a loop below block-bound loops only takes
    a block axis while one is free (the spatial loops of a row, e.g. a softmax over channels'
    batch, h and w, become the grid), any other loop a thread axis."""
    ax = params.get("ax")
    if not isinstance(ax, str) or site.nest is None or site.loop is None:
        return True
    bound = {lp.var[:2] for lp in prog.nests[site.nest[0]].all_loops() if lp.kind == "B"}
    free = {"bx", "by", "bz"} - bound
    return ax.startswith("b") == (_under_blocks(prog, site) and bool(free))


def block_axes_outermost(prog, site, params) -> bool:
    """A binding (``params["ax"]``) that gives a block axis only to a loop all of whose
    enclosing loops in the kernel are block-bound (blocks outermost, then threads, then serial
    loops, as TVM's dlight schedules bind). A GroupNorm's normalisation pass over 66 x 6 x 6 x 6
    elements per group then keeps its last loops serial in each of the group's threads instead
    of binding them to blockIdx.y/z, so it can share a kernel with the group's reductions (one
    grid per kernel)."""
    ax = params.get("ax")
    if not isinstance(ax, str) or not ax.startswith("b") or site.nest is None or site.loop is None:
        return True
    return _under_blocks(prog, site)


#: site filters: name -> ``fn(program, site, params) -> bool`` (module docstring)
SITE_FILTERS: dict[str, Callable] = {"extents_match_previous": extents_match_previous,
                                     "order_matches_neighbour": order_matches_neighbour,
                                     "blocks_while_free": blocks_while_free,
                                     "block_axes_outermost": block_axes_outermost}


__all__ = ["FORMS", "SITE_FILTERS", "reduction_shape", "operands", "product_of", "is_reduction",
           "multiply_accumulate", "gemm_form", "extents_match_previous", "order_matches_neighbour",
           "blocks_while_free", "block_axes_outermost"]
