"""Multi-step engine proposals (issue 37's "reach", moved out of the round search): *macros*
(one rule applied at every site in turn), *macro sequences* (rules in turn, each at every site,
canonically) and *chains* (a step and the step it enables). Each is a list of single rule
applications, recorded step by step: the proposer (:class:`steptp.policy.EnginePolicy`) offers
it as one proposal with its intermediate programs, and the search verifies every step against
the root before the last is measured (a step that does not verify ends the proposal there), so
trajectories stay step-level. No verification, TVM or search code here: the rules through
:mod:`steptp.engine`, the chains' order by the static GPU model (:mod:`steptp.cost_model`).

:func:`macro_proposals` is what the engine service's worker runs
(:func:`steptp.rules.service.macro_candidates`)."""

from __future__ import annotations

import math
import random

from ..leir import ast as A
from ..leir.fileformat import LeirModule

#: Rules proposed as "apply at every site" macros besides their single steps.
MACRO_RULES = ("loop_binding", "operator_fusion", "loop_fusion", "epilogue_fusion")


#: Macro sequences: each rule applied at every site in turn, then the next rule, all canonically
#: (the first site and the first parameter each time, :func:`_macro`), recorded as their
#: verified single steps. Canonical binding gives every nest of one shape the same axes, so
#: nests stay identical and fusion remains possible after binding: ``loop_binding`` on every
#: nest then ``operator_fusion`` is the greedy chain of issue 37 (a 29x median over 33
#: KernelBench-style programs on an H200);
#: fusing first leaves fewer, larger kernels to bind (each launch costs microseconds);
#: ``epilogue_fusion`` then moves the fused element-wise tail of a GEMM or convolution into it.
#: The row-wise sequence (the translator's outer row loop of every nest to blocks, the next
#: spatial loops to threads, reductions to cross-thread all-reduces, then fusion and
#: ``block_fusion`` from the last kernel back) makes a softmax, LayerNorm or GroupNorm chain
#: one kernel per row block, as TVM's dlight ``GeneralReduction`` schedules them. Its
#: epilogue step comes before operator fusion, which would otherwise fuse a GEMM's bias add
#: forward into the next row reduction and leave the GEMM a kernel of its own; it starts by
#: inlining padding-like producers into their readers (``compute_inline_indexed``: a padded
#: convolution's pad kernel). Its variant starts with the canonical ``loop_split``
#: (:func:`_split_matches_previous`): a nest's loop split to the previous nest's extents (a
#: GroupNorm's channels as groups x channels per group), so the two bind alike. The row
#: sequences bind blocks outermost (``loop_binding/grid``: a block axis only directly below
#: block loops). The rows variants make every spatial loop below the row loop a block axis
#: while one is free, the rest threads (``loop_binding/rows``): a reduction over a middle axis
#: (softmax over channels) gets its spatial positions as the grid and its channels as
#: threads; their last variant first moves each element-wise nest's reduced axis inward to
#: the reductions' loop order (``loop_reorder/match``).
MACRO_SEQUENCES = (("loop_binding", "operator_fusion", "epilogue_fusion"),
                   ("operator_fusion", "loop_binding", "operator_fusion"),
                   ("operator_fusion", "epilogue_fusion", "loop_binding", "operator_fusion"),
                   ("compute_inline_indexed", "thread_block_rebinding", "loop_binding/grid",
                    "reduction_thread_binding", "epilogue_fusion", "operator_fusion", "block_fusion"),
                   ("loop_split", "thread_block_rebinding", "loop_binding/grid", "reduction_thread_binding",
                    "epilogue_fusion", "operator_fusion", "block_fusion"),
                   ("compute_inline_indexed", "thread_block_rebinding", "loop_binding/rows", "reduction_thread_binding",
                    "epilogue_fusion", "operator_fusion", "block_fusion"),
                   ("loop_reorder/match", "compute_inline_indexed", "thread_block_rebinding", "loop_binding/rows",
                    "reduction_thread_binding", "epilogue_fusion", "operator_fusion", "block_fusion"))

#: Two-step proposals: a step of the key rule followed by a step of one of its follow-ups,
#: when the first alone is a slowdown that enables the second (``thread_block_rebinding``
#: moves a one-block kernel's rows to blocks, slower alone, so that ``reduction_thread_binding``
#: can put the row reduction on the freed threads: a cross-thread all-reduce per row). Both
#: steps are recorded and verified.
#: ``reduction_factorization`` (rfactor) alone adds a pass; binding its partial results' new
#: spatial loop to threads or blocks splits a long serial reduction over many threads
#: (split-K: a GEMM's 1078-long reduction serial in one block of 55 threads). The follow-up
#: step is taken only in the nests the first step changed.
CHAINS = {"thread_block_rebinding": ("reduction_thread_binding",), "reduction_factorization": ("loop_binding",)}


def _split_matches_previous(prog, site, params) -> bool:
    """The canonical ``loop_split``: a split of serial or bound loop ``p`` of a top-level nest
    by ``f`` that makes the nest's loops up to ``p+1`` have the previous nest's extents (the
    loops before ``p`` already do; the previous nest's loops ``p``, ``p+1`` are ``n/f``, ``f``).
    A GroupNorm's element-wise nest over 272 channels after its group reductions over 17 x 16
    then binds like them, so ``block_fusion`` can join them (one block shape per kernel); its
    reads of the group statistics at ``c//16`` become plain block indices (the split simplifies
    subscripts)."""
    if site.nest is None or len(site.nest) != 1 or site.loop is None or site.nest[0] == 0:
        return False
    k, p, f = site.nest[0], site.loop, params.get("f")
    cur, prev = prog.nests[k].loops, prog.nests[k - 1].loops
    if not isinstance(f, int) or cur[p].kind not in ("L", "B") or p + 1 >= len(prev):
        return False
    return ([lp.extent for lp in cur[:p]] == [lp.extent for lp in prev[:p]]
            and prev[p].extent * prev[p + 1].extent == cur[p].extent and prev[p + 1].extent == f)


def _reorder_matches_neighbour(prog, site, params) -> bool:
    """The canonical ``loop_reorder``: one serial loop of a top-level nest moved inward so that
    the nest's loop extents and a neighbouring nest's (the previous or the next) agree, the
    shorter list a prefix of the longer, where they did not before. A softmax over channels
    (the translator's element-wise nests run batch, channel, h, w; its max and sum nests batch,
    h, w, then the channel reduction) then has every nest over batch, h, w first, so rows to
    blocks and ``block_fusion`` join them."""
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


def _rows_to_blocks(prog, site, params) -> bool:
    """The canonical ``loop_binding`` of the rows sequence: a loop below block-bound loops only
    takes a block axis while one is free (the spatial loops of a row, e.g. a softmax over
    channels' batch, h and w, become the grid), any other loop a thread axis (the channel loop
    of its element-wise pass; its reductions go to threads by ``reduction_thread_binding``)."""
    ax = params.get("ax")
    if not isinstance(ax, str) or site.nest is None or site.loop is None:
        return True
    bound = {lp.var[:2] for lp in prog.nests[site.nest[0]].all_loops() if lp.kind == "B"}
    free = {"bx", "by", "bz"} - bound
    return ax.startswith("b") == (_under_blocks(prog, site) and bool(free))


def _block_axes_outermost(prog, site, params) -> bool:
    """The canonical ``loop_binding`` of the row sequences: a block axis only for a loop all of
    whose enclosing loops in the kernel are block-bound (blocks outermost, then threads, then
    serial loops, as TVM's dlight schedules bind). A GroupNorm's normalisation pass over 66 x 6
    x 6 x 6 elements per group then keeps its last loops serial in each of the group's threads
    instead of binding them to blockIdx.y/z, so ``block_fusion`` can join it to the group's
    reductions (one grid per kernel)."""
    ax = params.get("ax")
    if not isinstance(ax, str) or not ax.startswith("b") or site.nest is None or site.loop is None:
        return True
    return _under_blocks(prog, site)


#: Step names of :data:`MACRO_SEQUENCES` whose canonical macro step is the first candidate a
#: filter ``(program, site, params) -> bool`` accepts, not simply the first; the rule is the
#: name's part before a ``/``. A macro sequence starting with one of them that takes no step
#: is skipped (it would repeat the sequence without it).
CANONICAL_FILTERS = {"loop_split": _split_matches_previous, "loop_reorder/match": _reorder_matches_neighbour,
                     "loop_binding/grid": _block_axes_outermost, "loop_binding/rows": _rows_to_blocks}



def _step(rule_id: str, step) -> dict:
    """The trajectory record of one applied step (:class:`steptp.engine.Step`) with its result
    (``leir``: canonical text, no header)."""
    from .jsonify import plain  # noqa: PLC0415  (math-rule parameters are LEIR subterms)
    from ..leir.printer import format_program  # noqa: PLC0415

    return {"rule": rule_id, "site": str(step.site), "params": plain(step.params),
            "leir": format_program(step.after.program)}


def macro(rule, mod: LeirModule, rng: random.Random, max_steps: int = 48, canonical: bool = False,
          accept=None) -> tuple[LeirModule, list[dict]]:
    """``rule`` applied at every site of ``mod`` in turn (at most ``max_steps`` steps; it stops
    when nothing matches): a random site and parameters each time (seeded by ``rng``), or with
    ``canonical`` the first candidate of :func:`steptp.engine.list_candidates` (the first site,
    the first allowed parameter; with ``accept``, a filter of :data:`CANONICAL_FILTERS`, the
    first it accepts) whose rewrite passes the GPU preflight (a site whose result the preflight
    refuses, e.g. over the shared-memory limit, does not end the macro). Returns the last
    module and the steps (:func:`_step` records)."""
    from . import apply_rule, list_candidates  # noqa: PLC0415

    steps: list[dict] = []
    for _ in range(max_steps):
        step = None
        if canonical:
            try:
                cands = list_candidates(rule, mod)
            except Exception:  # noqa: BLE001 - NoMatch: every site done
                break
            if accept is not None:  # outside the try: a filter's own error is a bug, not "no site"
                cands = [c for c in cands if accept(mod.program, *c)]
            for site, params in cands:
                try:
                    step = apply_rule(rule, mod, seed=rng.randrange(2**31), site=site, params=params)
                    break
                except Exception:  # noqa: BLE001 - refused by the preflight (or the rewrite): next site
                    continue
        else:
            try:
                step = apply_rule(rule, mod, seed=rng.randrange(2**31))
            except Exception:  # noqa: BLE001 - NoMatch: every site done; preflight rejections
                break
        if step is None:
            break
        mod = LeirModule(mod.signature, step.after.program)
        steps.append(_step(rule.id, step))
    return mod, steps


def run_sequence(seq, by_id: dict, mod: LeirModule, rng: random.Random,
                 max_steps: int = 48) -> tuple[LeirModule, list[dict]] | None:
    """One macro sequence of :data:`MACRO_SEQUENCES` from ``mod``: each step name's rule
    (``by_id``: rule id -> rule; a name ``rule/filter`` uses that rule with the canonical filter
    :data:`CANONICAL_FILTERS` names) applied canonically at every site in turn (:func:`macro`).
    Returns the last module and the steps, or ``None`` when a rule is missing or a filtered
    first step finds nothing (the rest would be the sequence without it)."""
    if not all(name.split("/")[0] in by_id for name in seq):
        return None
    steps: list[dict] = []
    for k, name in enumerate(seq):
        mod, more = macro(by_id[name.split("/")[0]], mod, rng, max_steps, canonical=True,
                          accept=CANONICAL_FILTERS.get(name))
        if k == 0 and name in CANONICAL_FILTERS and not more:
            return None
        steps += more
    return mod, steps


def chains(rule, follow, cands, cur: LeirModule, rng: random.Random, best: int) -> list[list[dict]]:
    """Two-step proposals (:data:`CHAINS`): ``rule`` at each of its sites ``cands``, then each
    rule of ``follow`` at each of its sites in the top-level nests the first step changed (the
    step it enables); the ``best`` pairs by the static GPU model
    (:func:`steptp.cost_model.static.static_scores` on ``cuda``), best first."""
    from . import NoMatch, apply_rule, list_candidates, site_nests  # noqa: PLC0415
    from ..cost_model.static import static_scores  # noqa: PLC0415

    pairs = []
    before = set(cur.program.nests)
    for site, params in cands:
        try:
            first = apply_rule(rule, cur, seed=rng.randrange(2**31), site=site, params=params)
        except Exception:  # noqa: BLE001 - preflight rejections, rewrite errors
            continue
        mid = LeirModule(cur.signature, first.after.program)
        changed = {k for k, n in enumerate(mid.program.nests) if n not in before}
        for frule in follow:
            try:
                fcands = list_candidates(frule, mid)
            except NoMatch:
                continue
            except Exception:  # noqa: BLE001
                continue
            for fsite, fparams in fcands:
                if not (site_nests(fsite, fsite.env) or set()) & changed:
                    continue
                try:
                    second = apply_rule(frule, mid, seed=rng.randrange(2**31), site=fsite, params=fparams)
                except Exception:  # noqa: BLE001
                    continue
                pairs.append((second.after.program, [_step(rule.id, first), _step(frule.id, second)]))
    if not pairs:
        return []
    pred = static_scores(cur.program, [p[0] for p in pairs], "cuda")
    order = sorted(range(len(pairs)), key=lambda i: (-pred[i], i))
    return [pairs[i][1] for i in order[:best]]


def site_for(rule, module: LeirModule, spec: dict):
    """The one site of ``rule`` in ``module`` matching the filter ``spec``: ``nest`` (a path),
    ``loop`` (a position in that nest, negative from the innermost), ``bindings``
    (metavariable -> LEIR text). Raises ``LookupError`` when none or several match."""
    from . import find_sites  # noqa: PLC0415
    from .navigation import get_nest  # noqa: PLC0415

    want = dict(spec)
    binds = want.pop("bindings", {})
    hits = []
    for s in find_sites(rule, module):
        d = s.describe()
        if "nest" in want and tuple(want["nest"]) != tuple(d.get("nest", ())):
            continue
        if "loop" in want and want["loop"] % len(get_nest(module.program, s.nest).loops) != d.get("loop"):
            continue
        if any(d["bindings"].get(k) != v for k, v in binds.items()):
            continue
        hits.append(s)
    if len(hits) != 1:
        raise LookupError(f"{rule.id} {spec}: {len(hits)} matching site(s)")
    return hits[0]


def apply_steps(by_id: dict, module: LeirModule, steps) -> list[dict]:
    """Apply ``steps`` (``(rule id, site filter, params)``, :func:`site_for`; a filter with
    ``"optional": True`` is left out where it does not apply) in turn; returns their records
    (:func:`_step`). Raises ``LookupError``/``KeyError`` or the engine's errors
    when a step does not apply (a rewrite the preflight refuses included)."""
    from . import apply_rule  # noqa: PLC0415

    out, cur = [], module
    for rule_id, spec, params in steps:
        rule = by_id[rule_id]
        spec = dict(spec)
        optional = spec.pop("optional", False)
        try:
            st = apply_rule(rule, cur, site=site_for(rule, cur, spec), params=params)
        except Exception:  # noqa: BLE001 - an optional step that does not apply here is left out
            if optional:
                continue
            raise
        cur = LeirModule(module.signature, st.after.program)
        out.append(_step(rule_id, st))
    return out


def gemm_tiling(k: int, block: int = 16, micro: int = 4, bk: int = 8, w: int = 4, *, bn: int | None = None,
                operands: tuple[str, str] = ("A", "C"), rebind: bool = True, batch: bool = False,
                extra: int = 0) -> list:
    """The steps that take top-level nest ``k``, a GEMM as the translator writes it
    (``B^{M}_{tx}L^{N}_{a}L^{K}_{c}[D_{tx,a} += A_{tx,c}*C_{c,a}]``, or ``C_{a,c}``: a
    transposed operand, as ``nn.Linear`` reads its weight), to ``block`` x ``bn`` output tiles
    per thread block (``bn`` defaults to ``block``) of ``(block/micro)*(bn/micro)`` threads,
    each a ``micro`` x ``micro`` register micro-tile, K in steps of ``bk``, both inputs
    (``operands``: the two tensors the product reads) staged in shared memory and copied ``w``
    elements at a time, the micro-tile loops unrolled, copies and write-back vectorized (TVM
    MetaSchedule's MultiLevelTiling "SSRSRS" with shared caches at the outer reduction loop;
    the CUDA C Programming Guide's tiled matrix multiplication).

    ``rebind``: the rows are on ``threadIdx.x`` and move to ``blockIdx.x`` first (False: the
    translator already bound them to blocks, as it does for M > 1024). ``batch``: the nest
    has a batch loop first (``B^{Bt}_{tx}L^{M}L^{N}L^{K}``, a batched matmul): the batch goes
    to ``blockIdx.z``, the row tiles to ``blockIdx.x``, every later loop position one further.
    ``extra``: further reduction loops after K (a convolution's window), kept serial right
    inside the K step, around the micro-tile. The extents must be multiples of the tiles
    (:func:`tiling_report` partitions the rest off first, rule ``loop_partition``)."""
    n = [k]
    bn = bn or block
    za, zb = operands
    o = 1 if batch else 0
    head = []
    if batch:
        head = [("thread_block_rebinding", {"nest": n, "loop": 0}, {"ax": "bz"})]
    elif rebind:
        head = [("thread_block_rebinding", {"nest": n, "loop": 0}, {"ax": "bx"})]
    def shifted(order):
        return ([0] + [i + 1 for i in order]) if batch else order

    if not extra:
        steps = head + [
            ("loop_split", {"nest": n, "loop": o + 0}, {"f": block}),
            ("loop_split", {"nest": n, "loop": o + 2}, {"f": bn}),
            ("loop_split", {"nest": n, "loop": o + 4}, {"f": bk}),
            ("loop_split", {"nest": n, "loop": o + 1}, {"f": micro}),
            ("loop_split", {"nest": n, "loop": o + 4}, {"f": micro}),
            ("loop_reorder", {"nest": n}, {"order": shifted([0, 3, 6, 1, 4, 7, 2, 5])}),
        ]
    else:  # two reorders, each within the innermost 7 loops that loop_reorder permutes
        r = list(range(4, 5 + extra))
        steps = head + [
            ("loop_split", {"nest": n, "loop": o + 0}, {"f": block}),
            ("loop_split", {"nest": n, "loop": o + 2}, {"f": bn}),
            ("loop_reorder", {"nest": n}, {"order": shifted([0, 2, 1, 3] + r)}),
            ("loop_split", {"nest": n, "loop": o + 4}, {"f": bk}),
            ("loop_split", {"nest": n, "loop": o + 2}, {"f": micro}),
            ("loop_split", {"nest": n, "loop": o + 4}, {"f": micro}),
            ("loop_reorder", {"nest": n},
             {"order": shifted([0, 1, 6, 2, 4, 7] + [8 + i for i in range(extra)] + [3, 5])}),
        ]
    if batch:
        steps.append(("loop_binding", {"nest": n, "loop": 1}, {"ax": "bx"}))
    steps += [
        ("loop_binding", {"nest": n, "loop": o + 1}, {"ax": "by"}),
        ("loop_binding", {"nest": n, "loop": o + 3}, {"ax": "ty"}),  # rows of threads on y, columns on x:
        ("loop_binding", {"nest": n, "loop": o + 4}, {"ax": "tx"}),  # a warp reads one row of A's tile
        ("register_tiling", {"nest": n}, {"s": "l"}),
        # register_tiling's phases: [k, 0] the initialisation, [k, 1] the accumulation, [k, 2]
        # the write-back; the tiles' copies go first in the accumulation ([k, 1, 0], [k, 1, 1])
        ("shared_memory_tiling", {"nest": [k, 1], "bindings": {"Z": za}}, {"w": w}),
        ("shared_memory_tiling", {"nest": [k, 1], "bindings": {"Z": zb}}, {"w": w}),
        ("loop_vectorization", {"nest": [k, 1, 0], "loop": -1, "optional": True}, {}),
        ("loop_vectorization", {"nest": [k, 1, 1], "loop": -1, "optional": True}, {}),
        ("loop_unrolling", {"nest": [k, 1, 2], "loop": -1}, {}),
        ("loop_unrolling", {"nest": [k, 1, 2], "loop": -2}, {}),
        # the K step too: the whole tile's multiply-adds in one straight block, so the
        # compiler reads each thread's row of the A tile 4 elements at a time (LDS.128)
        ("loop_unrolling", {"nest": [k, 1, 2], "loop": -3 - extra, "optional": True}, {}),
        ("loop_vectorization", {"nest": [k, 2], "loop": -1, "optional": True}, {}),
    ]
    return steps


def conv_tiling(k: int, f_oh: int = 4, f_ow: int = 4, f_ci: int = 8, w: int = 1, batch: bool = False,
                operands: tuple[str, str] = ("A", "C")) -> list:
    """The steps that take top-level nest ``k``, a 2-D convolution as the translator writes it
    (``B^{CO}_{tx}L^{OH}_{a}L^{OW}_{c}L^{CI}_{d}L^{KH}_{f}L^{KW}_{g}``), to one output channel
    per block row, ``f_oh`` output rows per block column, threads over the rows and the
    ``OW/f_ow`` column groups, ``f_ow`` outputs per thread in registers, the input window and
    the filter slice staged in shared memory per ``f_ci`` input channels, ``kw`` unrolled, the
    write-back vectorized. ``batch``: the nest has a batch loop first
    (``B^{N}_{tx}L^{CO}_{a}...``, 7 loops): the batch goes to ``blockIdx.z`` and the output
    channels to ``blockIdx.x`` first, every later loop position one further. ``operands``:
    the input and the filter (the tensors the product reads)."""
    n = [k]
    za, zc = operands
    if batch:
        head = [("thread_block_rebinding", {"nest": n, "loop": 0}, {"ax": "bz"}),
                ("loop_binding", {"nest": n, "loop": 1}, {"ax": "bx"})]
        rest = conv_tiling(k, f_oh, f_ow, f_ci, w, operands=operands)[1:]
        shifted = []
        for rule, spec, params in rest:
            spec = dict(spec)
            if spec.get("nest") == n and isinstance(spec.get("loop"), int) and spec["loop"] >= 0:
                spec["loop"] += 1
            elif spec.get("nest") == [k, 1, 2] and spec.get("loop") == 4:
                spec["loop"] = -1  # kw: the innermost loop of the compute phase
            if rule == "loop_reorder":
                params = {"order": [0] + [i + 1 for i in params["order"]]}
            shifted.append((rule, spec, params))
        return head + shifted
    return [
        ("thread_block_rebinding", {"nest": n, "loop": 0}, {"ax": "bx"}),
        ("loop_split", {"nest": n, "loop": 1}, {"f": f_oh}),
        ("loop_split", {"nest": n, "loop": 3}, {"f": f_ow}),
        ("loop_split", {"nest": n, "loop": 5}, {"f": f_ci}),
        ("loop_reorder", {"nest": n}, {"order": [0, 1, 5, 2, 3, 6, 7, 8, 4]}),
        ("loop_binding", {"nest": n, "loop": 1}, {"ax": "by"}),
        ("loop_binding", {"nest": n, "loop": 3}, {"ax": "tx"}),
        ("loop_binding", {"nest": n, "loop": 4}, {"ax": "ty"}),
        ("register_tiling", {"nest": n}, {"s": "l"}),
        ("shared_memory_tiling", {"nest": [k, 1], "bindings": {"Z": za}}, {"w": w}),
        # the filter slice: only where the block's threads divide it
        ("shared_memory_tiling", {"nest": [k, 1], "bindings": {"Z": zc}, "optional": True}, {"w": w}),
        ("loop_unrolling", {"nest": [k, 1, 2], "loop": 4, "optional": True}, {}),
        ("loop_vectorization", {"nest": [k, 2], "loop": 2, "optional": True}, {}),
    ]


def conv_window_tiling(k: int, t_oh: int = 4, t_ow: int = 32, f_ow: int = 4, f_ci: int = 2, f_co: int = 1,
                       batch: bool = False, operands: tuple[str, str] = ("A", "C")) -> list:
    """The steps that take top-level nest ``k``, a 2-D convolution as the translator writes it
    (``B^{CO}_{tx}L^{OH}_{a}L^{OW}_{c}L^{CI}_{d}L^{KH}_{f}L^{KW}_{g}``, or with a batch loop
    first), to output tiles of ``f_co`` channels x ``t_oh`` rows x ``t_ow*f_ow`` columns per
    block: the channel tiles on ``blockIdx.x``, the row tiles on ``blockIdx.y`` (the batch on
    ``blockIdx.z``), the column tiles a serial loop each block walks through; ``t_oh x t_ow``
    threads, each with ``f_co x f_ow`` outputs in registers (its columns ``t_ow`` apart:
    consecutive threads read consecutive shared words, no bank conflict, and write
    consecutive outputs; an input value read from shared memory feeds ``f_co`` multiply-adds,
    a filter value ``f_ow``); per ``f_ci`` input channels the input *window* of the tile
    (``f_ci x (t_oh+KH-1) x (t_ow*f_ow+KW-1)`` elements, each once; ``f_ci = 1``: the input
    channel loop itself is the step, one channel at a time: ``shared_memory_window_tiling``)
    in shared memory; the register loops and ``kw`` unrolled. ``f_co > 1`` needs the batch
    loop (the channel loop is then still serial when it is split). ``loop_reorder`` permutes
    at most the 7 innermost loops, so the splits and reorders alternate. Rows and columns the
    block tile does not cover need ``loop_partition`` first (:func:`_conv_sequences`).
    ``operands``: the input and the filter."""
    n = [k]
    za, _ = operands
    names = (["n"] if batch else []) + ["co", "oh", "ow", "ci", "kh", "kw"]
    steps: list = [("thread_block_rebinding", {"nest": n, "loop": 0}, {"ax": "bz" if batch else "bx"})]

    def split(name: str, f: int, outer: str, inner: str) -> None:
        i = names.index(name)
        steps.append(("loop_split", {"nest": n, "loop": i}, {"f": f}))
        names[i:i + 1] = [outer, inner]

    def reorder(target: list[str]) -> None:
        fixed = len(names) - len(target)
        want = names[:fixed] + target
        steps.append(("loop_reorder", {"nest": n}, {"order": [names.index(x) for x in want]}))
        names[:] = want

    regs = ["ow_r"]
    if batch and f_co > 1:
        split("co", f_co, "co_o", "co_r")
        reorder(["co_o", "oh", "ow", "ci", "kh", "kw", "co_r"])
        regs = ["co_r", "ow_r"]
    co = "co_o" if "co_o" in names else "co"
    rest = regs[:-1]  # co_r, when there
    split("oh", t_oh, "oh_o", "oh_i")
    split("ow", t_ow * f_ow, "ow_o", "ow_in")
    reorder((["ow_o", "oh_i", "ow_in", "ci", "kh", "kw"] + rest)[-7:] if rest else
            ["oh_o", "ow_o", "oh_i", "ow_in", "ci", "kh", "kw"])
    if f_ci > 1:
        split("ci", f_ci, "ci_o", "ci_i")
        reorder(["ci_o", "oh_i", "ow_in", "ci_i", "kh", "kw"] + rest if rest else
                ["ow_o", "ci_o", "oh_i", "ow_in", "ci_i", "kh", "kw"])
    else:  # the whole input channel loop is the staged step: one channel's window at a time
        reorder(["ow_o", "ci", "oh_i", "ow_in", "kh", "kw"] + rest)
    split("ow_in", t_ow, "ow_r", "ow_t")  # a thread's columns t_ow apart
    inner = ["ci_i"] if f_ci > 1 else []
    reorder((["oh_i", "ow_t"] + inner + ["kh", "kw"] + regs)[-7:])
    steps.append(("loop_binding", {"nest": n, "loop": names.index(co)}, {"ax": "bx"}) if batch else
                 ("loop_binding", {"nest": n, "loop": names.index("oh_o")}, {"ax": "by"}))
    if batch:
        steps.append(("loop_binding", {"nest": n, "loop": names.index("oh_o")}, {"ax": "by"}))
    steps += [
        ("loop_binding", {"nest": n, "loop": names.index("oh_i")}, {"ax": "ty"}),
        ("loop_binding", {"nest": n, "loop": names.index("ow_t")}, {"ax": "tx"}),
        ("register_tiling", {"nest": n}, {"s": "l"}),
        ("shared_memory_window_tiling", {"nest": [k, 1], "bindings": {"Z": za}}, {"p": 1}),
    ]
    # the register loops (innermost) and kw unrolled: the accumulators stay in registers
    for i in range(len(regs) + 1):
        steps.append(("loop_unrolling", {"nest": [k, 1, 1], "loop": -1 - i, "optional": True}, {}))
    for i in range(len(regs)):
        steps += [("loop_unrolling", {"nest": [k, 0], "loop": -1 - i, "optional": True}, {}),
                  ("loop_unrolling", {"nest": [k, 2], "loop": -1 - i, "optional": True}, {})]
    return steps


def tensor_core_sequence(k: int, nest) -> tuple[list | None, str | None]:
    """The steps that take top-level GEMM nest ``k`` (:func:`_gemm_form`, no window
    reductions) with f16 factors and an f32 accumulator to ``tensor_core_tiling``: 16x16
    output tiles per block (rows on ``blockIdx.x``, columns on ``blockIdx.y``, the batch on
    ``blockIdx.z``), the reduction split into steps of 16 (``loop_split`` of each loop by 16,
    ``loop_reorder`` to ``[blocks, ko, i, j, k]``, ``loop_binding``); or ``(None, reason)``.
    Rows, columns and the reduction must be multiples of 16 (the wmma shape) and at least 32
    (``loop_split`` splits by a proper divisor)."""
    form = _gemm_form(nest)
    if form is None or form[2] != 0:
        return None, "not a GEMM with one reduction loop"
    (x, y), batch, _ = form
    eq = nest.body[0]
    dts = {t.name: t.dtype for t in A.walk(eq.value) if isinstance(t, A.Tensor)}
    if dts.get(x) != "f16" or dts.get(y) != "f16" or eq.target.dtype != "f32":
        return None, "tensor cores: f16 factors and an f32 accumulator only"
    ext = [lp.extent for lp in nest.loops]
    o = 1 if batch else 0
    if any(e % 16 or e < 32 for e in ext[o:]):
        return None, (f"tensor cores: rows, columns and the reduction must be multiples of 16, at least 32 "
                      f"(extents {ext})")
    n = [k]
    seq: list = []
    if batch:
        seq.append(("thread_block_rebinding", {"nest": n, "loop": 0}, {"ax": "bz"}))
    elif nest.loops[0].var.startswith("t"):
        seq.append(("thread_block_rebinding", {"nest": n, "loop": 0}, {"ax": "bx"}))
    seq += [("loop_split", {"nest": n, "loop": o}, {"f": 16}),
            ("loop_split", {"nest": n, "loop": o + 2}, {"f": 16}),
            ("loop_split", {"nest": n, "loop": o + 4}, {"f": 16}),
            ("loop_reorder", {"nest": n}, {"order": list(range(o)) + [o + i for i in (0, 2, 4, 1, 3, 5)]})]
    if batch:
        seq.append(("loop_binding", {"nest": n, "loop": 1}, {"ax": "bx"}))
    seq += [("loop_binding", {"nest": n, "loop": o + 1}, {"ax": "by"}),
            ("tensor_core_tiling", {"nest": n}, {"m": 16})]
    return seq, None


def _reduction_shape(nest) -> list[int] | None:
    """The loop extents of a top-level nest ``B L .. L [one equation]`` whose first loop is the
    only bound one, else None."""
    loops = nest.loops
    if not loops or loops[0].kind != "B" or any(lp.kind != "L" for lp in loops[1:]):
        return None
    if len(nest.body) != 1 or not isinstance(nest.body[0], A.Assign):
        return None
    return [lp.extent for lp in loops]


def _gemm_form(nest) -> tuple[tuple[str, str], bool, int] | None:
    """``(operands, batch, extra)`` when the top-level nest is a GEMM-like reduction as the
    translator writes it: ``B^{M}L^{N}L^{K}..[C_{m,n} = C_{m,n} + X*Y]``, optionally with a
    batch loop first (the target then subscripted by batch, m, n), and ``extra`` further
    reduction loops after K (a 1-D convolution ``[N, CO, L, CI, KW]`` is a batched GEMM of
    CO x L outputs over CI, with the window loop KW inside); the value reads two tensors
    besides ``C``. Else None."""
    loops = nest.loops
    eq = nest.body[0]
    names = [lp.var for lp in loops]
    tgt = [x.name if isinstance(x, A.Index) else None for x in eq.target.indices]
    if len(tgt) not in (2, 3) or tgt != names[:len(tgt)] or len(loops) <= len(tgt):
        return None
    reads = _operands(eq)
    if len(reads) != 2 or not _is_reduction(nest) or not _product_of(eq.value, *reads):
        return None
    return (reads[0], reads[1]), len(tgt) == 3, len(loops) - len(tgt) - 1


def _operands(eq) -> list[str]:
    """The tensors equation ``eq``'s value reads besides its target, in order of first read."""
    return list(dict.fromkeys(x.name for x in A.walk(eq.value) if isinstance(x, A.Tensor) and x.name != eq.target.name))


def _product_of(value, x: str, y: str) -> bool:
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


def _tiled_extent(e: int, tile: int) -> int:
    """The part of extent ``e`` that tiles of ``tile`` cover: all of it when ``tile`` divides
    it, else what ``loop_partition`` keeps at a multiple of ``max(tile, 16)`` (its smallest
    step)."""
    return e if e % tile == 0 else e - e % max(tile, 16)


def _gemm_tries(ext: list[int], batch: bool, window: int = 1, elem_bytes: int = 4) -> list[tuple]:
    """Tile choices ``(bm, bn, micro, bk, w)`` for a GEMM of extents ``[Bt,] M, N, K``: block
    tiles of 8-128 rows and columns (a tile that does not divide M or N leaves a tail that
    ``loop_partition`` peels off, :func:`_tiled_extent`; at least two tiles remain), 64-1024
    threads of ``micro`` x ``micro`` outputs, ``bk`` (16, 8 or 4) dividing K, copies of ``w``
    elements that the threads cover exactly, and shared tiles of at most 48 KiB (``(bm + bn) * window * bk`` elements of
    ``elem_bytes``: ``window`` is the product of the extra reduction loops, whose window a
    tile stages whole). Ordered: enough thread blocks for the device's multiprocessors
    (``cost_model.gpu.GpuTarget().sms``) first, then the largest tile, the largest micro-tile
    (more FMAs per shared load), the longest K step and copy."""
    from ..cost_model.gpu import GpuTarget  # noqa: PLC0415

    sms = GpuTarget().sms
    nb = ext[0] if batch else 1
    m, n_, kk = ext[-3:]
    tries = []
    for bm in (128, 64, 32, 16, 8):
        for bn in (128, 64, 32, 16, 8):
            if _tiled_extent(m, bm) < 2 * bm or _tiled_extent(n_, bn) < 2 * bn:
                continue
            for mi in (8, 4, 2):
                th = (bm // mi) * (bn // mi)
                if bm % mi or bn % mi or not 64 <= th <= 1024:
                    continue
                for bk in (16, 8, 4):
                    if kk % bk or bk >= kk or (bm + bn) * window * bk * elem_bytes > 48 * 1024:
                        continue
                    for w in (4, 2, 1):
                        if (bm * bk) % (th * w) or (bn * bk) % (th * w):
                            continue
                        blocks = nb * (m // bm) * (n_ // bn)
                        tries.append(((blocks < sms, -bm * bn, -mi, -bk, -w, (m % bm > 0) + (n_ % bn > 0)),
                                      (bm, bn, mi, bk, w)))
    return [t for _, t in sorted(tries)]


def _gemm_sequences(k: int, nest, form, limit: int = 6) -> tuple[list[list], str | None]:
    """The tiling sequences to try for GEMM nest ``k`` of form ``form`` (:func:`_gemm_form`)
    (:func:`gemm_tiling`, after ``loop_partition`` steps for the rows and columns the tile
    does not divide), or ``([], reason)``."""
    if form is None:
        return [], "not a GEMM as the translator writes it ([batch,] rows, columns, one reduction; C = C + X*Y)"
    operands, batch, extra = form
    ext = [lp.extent for lp in nest.loops]
    window = math.prod(ext[len(ext) - extra:])
    eb = max(A.DTYPE_BYTES.get(t.dtype, 4) for t in A.walk(nest.body[0].value) if isinstance(t, A.Tensor))
    tries = _gemm_tries(ext[:len(ext) - extra], batch, window, eb)
    if not tries:
        return [], (f"no tile fits extents {ext}: rows and columns need at least two tiles of 8 or more "
                    f"(after peeling a tail), the reduction a step of 4, 8 or 16 that divides it and is "
                    f"smaller, 64-1024 threads and at most 48 KiB of shared tiles")
    o = 1 if batch else 0
    rebind = nest.loops[0].var.startswith("t")  # rows on threadIdx (translator: M <= 1024)
    seqs = []
    for bm, bn, mi, bk, w in tries[:limit]:
        pre = []
        if ext[o] % bm:
            pre.append(("loop_partition", {"nest": [k], "loop": o}, {"f": max(bm, 16)}))
        if ext[o + 1] % bn:
            pre.append(("loop_partition", {"nest": [k], "loop": o + 1}, {"f": max(bn, 16)}))
        seqs.append(pre + gemm_tiling(k, bm, mi, bk, w, bn=bn, operands=operands, rebind=rebind, batch=batch,
                                      extra=extra))
    return seqs, None


def _conv_window_tries(ext: list[int], elem_bytes: int) -> list[tuple[int, int, int, int]]:
    """``(t_oh, t_ow, f_ow, f_ci)`` of :func:`conv_window_tiling` for a convolution of loop
    extents ``ext`` (``[N,] CO, OH, OW, CI, KH, KW``), largest tiles first: each dimension
    the block tile splits keeps at least one full tile (``_tiled_extent``), the input channel
    step divides CI (1: the whole loop), the block has at most 1024 threads and the input
    window (padded to the threads) fits the shared memory per block
    (:data:`steptp.backend.hardware.DEFAULT_GPU`)."""
    from ..backend.hardware import DEFAULT_GPU  # noqa: PLC0415

    oh, ow, ci, kh, kw = ext[-5:]
    out = []
    for t_oh in (8, 4, 2):
        for t_ow, f_ow in ((32, 4), (32, 2), (16, 4), (16, 2), (8, 4), (8, 2)):
            cols = t_ow * f_ow
            if _tiled_extent(oh, t_oh) <= t_oh or _tiled_extent(ow, cols) <= cols:
                continue
            for f_ci in (8, 4, 2, 1):
                if f_ci > 1 and (ci % f_ci or f_ci >= ci) or f_ci == 1 and ci < 2:
                    continue
                nt = t_oh * t_ow
                size = f_ci * (t_oh + kh - 1) * (cols + kw - 1)
                if -(-size // nt) * nt * elem_bytes <= DEFAULT_GPU.max_static_shared_bytes:
                    out.append((t_oh, t_ow, f_ow, f_ci))
                    break
    return out


def _dtype_bytes_of(eq, name: str) -> int:
    """Bytes per element of tensor ``name`` as equation ``eq`` reads it (4 if not read)."""
    return next((A.DTYPE_BYTES.get(t.dtype, 4) for t in A.walk(eq.value) if isinstance(t, A.Tensor) and t.name == name), 4)


def _conv_sequences(k: int, nest) -> tuple[list[list], str | None]:
    """The tiling sequences to try for a 2-D convolution nest ``k`` (6 loops, or 7 with a
    batch loop first), after ``loop_partition`` steps for output rows and columns the
    per-block tile does not divide: first :func:`conv_window_tiling` (each input element in
    shared memory once per block), then :func:`conv_tiling`; or ``([], reason)``."""
    ext = [lp.extent for lp in nest.loops]
    batch = len(ext) == 7
    o = 1 if batch else 0
    eq = nest.body[0]
    reads = _operands(eq)
    if len(reads) != 2 or not _product_of(eq.value, *reads):
        return [], "not a convolution as the translator writes it (the product of an input and a filter)"
    oh, ow, ci = ext[-5:-2]
    window = []
    for t_oh, t_ow, f_ow, f_ci in _conv_window_tries(ext, _dtype_bytes_of(eq, reads[0]))[:4]:
        pre = []
        if oh % t_oh:
            pre.append(("loop_partition", {"nest": [k], "loop": o + 1}, {"f": 16}))
        if ow % (t_ow * f_ow):
            pre.append(("loop_partition", {"nest": [k], "loop": o + 2}, {"f": t_ow * f_ow}))
        co = ext[o]
        f_co = next((f for f in (4, 2) if batch and co % f == 0 and co > f), 1)
        window.append(pre + conv_window_tiling(k, t_oh, t_ow, f_ow, f_ci, f_co, batch=batch,
                                               operands=(reads[0], reads[1])))

    tries = [(a, b, c) for a in (4, 2) for b in (4, 2) for c in (8, 4, 2)
             if _tiled_extent(oh, a) > a and _tiled_extent(ow, b) > b and ci % c == 0 and c < ci]
    if not tries:
        if window:
            return window, None
        return [], f"no input-channel step divides {ci} (or the output is narrower than two tiles): extents {ext}"
    # one block holds a whole output row: f_oh rows x (OW / f_ow) column groups of threads
    fits = [t for t in tries if t[0] * (_tiled_extent(ow, t[1]) // t[1]) <= 1024]
    if not fits:
        if window:
            return window, None
        return [], (f"an output row of {ow} columns needs {_tiled_extent(ow, 4) // 4 * 2} or more threads in "
                    f"one block (this tiling keeps a row in a block), above 1024: extents {ext}")
    tries = fits
    seqs = []
    for a, b, c in tries[:4]:
        pre = []
        if oh % a:
            pre.append(("loop_partition", {"nest": [k], "loop": o + 1}, {"f": 16}))
        if ow % b:
            pre.append(("loop_partition", {"nest": [k], "loop": o + 2}, {"f": 16}))
        seqs.append(pre + conv_tiling(k, a, b, c, batch=batch, operands=(reads[0], reads[1])))
    return window + seqs, None


def tiling_report(by_id: dict, module: LeirModule) -> list[dict]:
    """For every top-level reduction nest with three or more loops whose equation multiplies
    two tensors (the GEMM-like and convolution-like kernels): ``{"nest": k, "steps": [...]}``
    (the first tiling sequence whose steps all apply: :func:`gemm_tiling` after any ``loop_partition`` of untiled rows
    or columns, or :func:`conv_tiling`; largest tiles first; the rules' own checks and the
    GPU preflight decide) or ``{"nest": k, "reason": text}`` (why none applies: the form,
    the extents, or the first step that failed and its error)."""
    needed = ("thread_block_rebinding", "loop_split", "loop_reorder", "loop_binding", "register_tiling",
              "shared_memory_tiling", "loop_vectorization", "loop_unrolling", "loop_partition")
    missing = [r for r in needed if r not in by_id]
    out = []
    for k, nest in enumerate(module.program.nests):
        ext = _reduction_shape(nest)
        if ext is None or len(ext) < 3 or not _is_reduction(nest) or not _multiply_accumulate(nest):
            continue
        if missing:
            out.append({"nest": k, "reason": f"the rules {', '.join(missing)} are not loaded"})
            continue
        outs = sum(isinstance(x, A.Index) for x in nest.body[0].target.indices)  # output loops
        form = _gemm_form(nest)
        if len(ext) in (3, 4) or form is not None:
            seqs, reason = _gemm_sequences(k, nest, form)
        elif len(ext) in (6, 7) and outs == len(ext) - 3:
            seqs, reason = _conv_sequences(k, nest)
        elif len(ext) in (6, 7):
            seqs, reason = [], (f"{outs} output loop(s) and {len(ext) - outs} reduction loop(s) (extents {ext}; a "
                                f"pointwise 3-D convolution has 5 and 1): neither a GEMM ([batch,] rows, columns) nor "
                                f"a 2-D convolution; no tiling sequence has this form yet")
        else:
            seqs, reason = [], (f"a {len(ext)}-loop reduction of neither form: GEMM-like ([batch,] rows, "
                                f"columns, then reductions: 1-D convolutions included) or 2-D convolution "
                                f"(6 loops, 7 batched)")
        for seq in seqs:
            try:
                steps = apply_steps(by_id, module, seq)
                out.append({"nest": k, "steps": steps + _tail_steps(by_id, module, k, steps), "sequence": seq})
                reason = None
                break
            except Exception as e:  # noqa: BLE001 - these parameters do not apply here: the next
                reason = _refusal(e)
        if reason is not None:
            out.append({"nest": k, "reason": reason})
        if "tensor_core_tiling" in by_id:
            tc, _why = tensor_core_sequence(k, nest)
            if tc is not None:
                try:
                    out.append({"nest": k, "steps": apply_steps(by_id, module, tc), "sequence": tc,
                                "tensor_core": True})
                except Exception:  # noqa: BLE001 - the CUDA-core tiling above stands alone
                    pass
    return out


def _tail_steps(by_id: dict, module: LeirModule, k: int, steps: list[dict]) -> list[dict]:
    """Steps that parallelise the tails ``loop_partition`` peeled off nest ``k`` (each a GEMM
    nest over the rows or columns no tile covered, rows on threads and the rest serial: one
    thread would run all the tail's columns times K): rows to ``blockIdx.x`` (the batch, if
    any, to ``blockIdx.z``), columns to ``threadIdx.x`` (split by a divisor of 32-256 first
    when there are more than 1024, the outer part on ``blockIdx.y``): a thread per output, as
    a plain GEMM kernel. A tail where these steps do not apply stays as it is."""
    from ..leir import parse_leir  # noqa: PLC0415

    if not steps or not any(st["rule"] == "loop_partition" for st in steps):
        return []
    cur = LeirModule(module.signature, parse_leir(steps[-1]["leir"], "<tiled>").program)
    added = len(cur.program.nests) - len(module.program.nests)
    out: list[dict] = []
    for j in range(k + 1, k + 1 + added):
        nest = cur.program.nests[j]
        ext = _reduction_shape(nest)
        if ext is not None and len(ext) in (6, 7) and _is_reduction(nest) and _multiply_accumulate(nest):
            seq = _grid_steps(nest, j, len(ext) - 3)  # a convolution's tail: [N,] CO, OH, OW
        elif ext is not None and not _is_reduction(nest) and 3 <= len(ext) <= 4:
            seq = _grid_steps(nest, j, len(ext))  # a tail's initialisation (elementwise)
        elif ext is None or len(ext) not in (3, 4) or not _is_reduction(nest) or not _multiply_accumulate(nest):
            continue
        else:
            seq = None
        if seq is not None:
            try:
                done = apply_steps(by_id, cur, seq)
            except Exception:  # noqa: BLE001 - this tail stays as it is
                continue
            if not done:
                continue
            out += done
            cur = LeirModule(module.signature, parse_leir(done[-1]["leir"], "<tiled>").program)
            continue
        o = len(ext) - 3
        loops = nest.loops
        seq = []
        if o:
            seq += [("thread_block_rebinding", {"nest": [j], "loop": 0}, {"ax": "bz"}),
                    ("loop_binding", {"nest": [j], "loop": 1}, {"ax": "bx"})]
        elif loops[0].var.startswith("t"):
            seq.append(("thread_block_rebinding", {"nest": [j], "loop": 0}, {"ax": "bx"}))
        n = loops[o + 1].extent
        if n <= 1024:
            seq.append(("loop_binding", {"nest": [j], "loop": o + 1}, {"ax": "tx"}))
        else:
            t = next((t for t in range(256, 31, -1) if n % t == 0), None)
            if t is None:
                continue
            seq += [("loop_split", {"nest": [j], "loop": o + 1}, {"f": t}),
                    ("loop_binding", {"nest": [j], "loop": o + 1}, {"ax": "by"}),
                    ("loop_binding", {"nest": [j], "loop": o + 2}, {"ax": "tx"})]
        try:
            done = apply_steps(by_id, cur, seq)
        except Exception:  # noqa: BLE001 - this tail stays as it is
            continue
        out += done
        cur = LeirModule(module.signature, parse_leir(done[-1]["leir"], "<tiled>").program)
    return out


def _grid_steps(nest, j: int, m: int) -> list:
    """Steps that spread top-level nest ``j``'s ``m`` (3 or 4) leading spatial loops, the
    first bound to ``threadIdx.x`` as the translator writes it, over a grid: the last on
    ``threadIdx.x`` (at most 1024), the others on ``blockIdx.z``/``x``/``y`` (``x``/``y``
    for two): a thread per output instead of one thread per outer iteration."""
    if nest.loops[m - 1].extent > 1024 or not nest.loops[0].var.startswith("t"):
        return []
    axes = ["bz", "bx", "by"] if m == 4 else ["bx", "by"]
    seq = [("thread_block_rebinding", {"nest": [j], "loop": 0}, {"ax": axes[0]})]
    seq += [("loop_binding", {"nest": [j], "loop": i}, {"ax": ax}) for i, ax in enumerate(axes[1:], start=1)]
    return seq + [("loop_binding", {"nest": [j], "loop": m - 1}, {"ax": "tx"})]


def _refusal(e: Exception) -> str:
    """The reason a tiling step failed, in words where the engine's error is terse."""
    msg = str(e).splitlines()[0][:300]
    if "'shared_memory_tiling': parameter w=" in msg and "domain []" in msg:
        return ("no shared-memory tile fits: the tile holds every element the K step reads, a convolution's "
                "input window once per output it feeds, and is above the shared memory per block or not "
                f"covered by the block's threads ({msg})")
    if isinstance(e, LookupError) and "0 matching site(s)" in msg:
        return (f"a step found no site: {msg} (the nest's form differs from what the tiling sequence "
                f"expects at that step)")
    return f"{type(e).__name__}: {msg}"


def _multiply_accumulate(nest) -> bool:
    """Whether the nest's equation multiplies two tensors it reads (a GEMM or convolution
    candidate; an in-place bias add or a row sum is not one)."""
    eq = nest.body[0]
    reads = _operands(eq)
    return any(_product_of(eq.value, x, y) for i, x in enumerate(reads) for y in reads[i + 1:])


def _is_reduction(nest) -> bool:
    eq = nest.body[0]
    return any(isinstance(x, A.Tensor) and x.name == eq.target.name for x in A.walk(eq.value))


def tiling_proposals(by_id: dict, module: LeirModule) -> list[list[dict]]:
    """The tiled form of every GEMM-like and convolution-like top-level nest as one multi-step
    proposal each (:func:`tiling_report`: the nests it refuses are left out here), and first,
    where there are several, one that tiles them all (:func:`_every_nest_tiled`). Its
    records are the steps."""
    tiled = [r for r in tiling_report(by_id, module) if "steps" in r]
    out = [r["steps"] for r in tiled]
    first = [r for i, r in enumerate(tiled) if all(q["nest"] != r["nest"] for q in tiled[:i])]  # one per nest
    if len(first) > 1:
        every = _every_nest_tiled(by_id, module, first)
        if every:
            out.insert(0, every)
    return out


def _every_nest_tiled(by_id: dict, module: LeirModule, tiled: list[dict]) -> list[dict] | None:
    """One proposal that tiles every nest of ``tiled`` (:func:`tiling_report` entries), the
    last nest first (a ``loop_partition`` adds nests only after the one it splits, so the
    earlier nests keep their positions); None where a sequence does not apply after
    another's. A program with several GEMMs (an attention's projections) is sped up by all
    of them together, which one nest alone never shows the cost model."""
    from ..leir import parse_leir  # noqa: PLC0415

    cur, steps = module, []
    for r in sorted(tiled, key=lambda r: -r["nest"]):
        if cur is module:  # the last nest's steps from the unchanged program: the report's own
            done = r["steps"]
        else:
            try:
                done = apply_steps(by_id, cur, r["sequence"])
                done += _tail_steps(by_id, cur, r["nest"], done)
            except Exception:  # noqa: BLE001 - one proposal per nest still stands
                return None
        steps += done
        cur = LeirModule(module.signature, parse_leir(done[-1]["leir"], "<tiled>").program)
    return steps


def macro_proposals(rules, module: LeirModule, seed: int, per_rule: int = 4, max_steps: int = 48) -> list[list[dict]]:
    """Every multi-step proposal of ``module`` as its list of steps (:func:`_step` records,
    each with its result): a :data:`MACRO_RULES` macro (random sites, seeded) when it takes at
    least two steps, the :data:`CHAINS` (the ``per_rule`` best pairs per rule) and the
    :data:`MACRO_SEQUENCES` (at least two steps). Deterministic for ``seed`` and the program."""
    from . import NoMatch, list_candidates  # noqa: PLC0415
    from ..seeds import seeded_rng  # noqa: PLC0415

    by_id = {r.id: r for r in rules}
    out: list[list[dict]] = []
    for rid in MACRO_RULES:
        if rid in by_id:
            _, steps = macro(by_id[rid], module, seeded_rng(seed, "macro", rid), max_steps)
            if len(steps) > 1:
                out.append(steps)
    for rid, follow in CHAINS.items():
        if rid not in by_id:
            continue
        try:
            cands = list_candidates(by_id[rid], module)
        except NoMatch:
            continue
        except Exception:  # noqa: BLE001 - a rule that fails on this program proposes nothing
            continue
        out += chains(by_id[rid], [by_id[f] for f in follow if f in by_id], cands, module,
                      seeded_rng(seed, "chain", rid), per_rule)
    for i, seq in enumerate(MACRO_SEQUENCES):
        got = run_sequence(seq, by_id, module, seeded_rng(seed, "sequence", str(i)), max_steps)
        if got is not None and len(got[1]) > 1:
            out.append(got[1])
    out += tiling_proposals(by_id, module)
    return out


__all__ = ["MACRO_RULES", "MACRO_SEQUENCES", "CHAINS", "CANONICAL_FILTERS", "macro", "run_sequence", "chains",
           "macro_proposals", "site_for", "apply_steps", "gemm_tiling", "conv_tiling", "tiling_proposals",
           "tiling_report"]
