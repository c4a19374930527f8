"""Multi-step engine proposals (issue 37's "reach", moved out of the round search): *macros*
(one rule applied at every site in turn), *macro sequences* (rules in turn, each at every site,
canonically) and *chains* (a step and the step it enables). Each is a list of single rule
applications, recorded step by step: the proposer (:class:`steptp.policy.EnginePolicy`) offers
it as one proposal with its intermediate programs, and the search verifies every step against
the root before the last is measured (a step that does not verify ends the proposal there), so
trajectories stay step-level. No verification, TVM or search code here: the rules through
:mod:`steptp.engine`, the chains' order by the static GPU model (:mod:`steptp.cost_model`).

:func:`macro_proposals` is what the engine service's worker runs
(:func:`steptp.engine.service.macro_candidates`)."""

from __future__ import annotations

import random

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


def gemm_tiling(k: int, block: int = 16, micro: int = 4, bk: int = 8, w: int = 4) -> list:
    """The steps that take top-level nest ``k``, a GEMM as the translator writes it
    (``B^{M}_{tx}L^{N}_{a}L^{K}_{c}[D_{tx,a} += A_{tx,c}*C_{c,a}]``), to ``block`` x ``block``
    output tiles per thread block of ``(block/micro)^2`` threads, each a ``micro`` x ``micro``
    register micro-tile, K in steps of ``bk``, both inputs staged in shared memory and copied
    ``w`` elements at a time, the micro-tile loops unrolled, copies and write-back vectorized
    (TVM MetaSchedule's MultiLevelTiling "SSRSRS" with shared caches at the outer reduction
    loop; the CUDA C Programming Guide's tiled matrix multiplication)."""
    n = [k]
    return [
        ("thread_block_rebinding", {"nest": n, "loop": 0}, {"ax": "bx"}),
        ("loop_split", {"nest": n, "loop": 0}, {"f": block}),
        ("loop_split", {"nest": n, "loop": 2}, {"f": block}),
        ("loop_split", {"nest": n, "loop": 4}, {"f": bk}),
        ("loop_split", {"nest": n, "loop": 1}, {"f": micro}),
        ("loop_split", {"nest": n, "loop": 4}, {"f": micro}),
        ("loop_reorder", {"nest": n}, {"order": [0, 3, 6, 1, 4, 7, 2, 5]}),
        ("loop_binding", {"nest": n, "loop": 1}, {"ax": "by"}),
        ("loop_binding", {"nest": n, "loop": 3}, {"ax": "ty"}),  # rows of threads on y, columns on x:
        ("loop_binding", {"nest": n, "loop": 4}, {"ax": "tx"}),  # a warp reads one row of A's tile
        ("register_tiling", {"nest": n}, {"s": "l"}),
        ("shared_memory_tiling", {"nest": [k, 0], "bindings": {"Z": "A"}}, {"w": w}),
        ("shared_memory_tiling", {"nest": [k, 0], "bindings": {"Z": "C"}}, {"w": w}),
        ("loop_vectorization", {"nest": [k, 0, 0], "loop": -1}, {}),
        ("loop_vectorization", {"nest": [k, 0, 1], "loop": -1}, {}),
        ("loop_unrolling", {"nest": [k, 0, 2], "loop": -1}, {}),
        ("loop_unrolling", {"nest": [k, 0, 2], "loop": -2}, {}),
        ("loop_vectorization", {"nest": [k, 1], "loop": -1}, {}),
    ]


def conv_tiling(k: int, f_oh: int = 4, f_ow: int = 4, f_ci: int = 8, w: int = 1, batch: bool = False) -> list:
    """The steps that take top-level nest ``k``, a 2-D convolution as the translator writes it
    (``B^{CO}_{tx}L^{OH}_{a}L^{OW}_{c}L^{CI}_{d}L^{KH}_{f}L^{KW}_{g}``), to one output channel
    per block row, ``f_oh`` output rows per block column, threads over the rows and the
    ``OW/f_ow`` column groups, ``f_ow`` outputs per thread in registers, the input window and
    the filter slice staged in shared memory per ``f_ci`` input channels, ``kw`` unrolled, the
    write-back vectorized. ``batch``: the nest has a batch loop first
    (``B^{N}_{tx}L^{CO}_{a}...``, 7 loops): the batch goes to ``blockIdx.z`` and the output
    channels to ``blockIdx.x`` first, every later loop position one further."""
    n = [k]
    if batch:
        head = [("thread_block_rebinding", {"nest": n, "loop": 0}, {"ax": "bz"}),
                ("loop_binding", {"nest": n, "loop": 1}, {"ax": "bx"})]
        rest = conv_tiling(k, f_oh, f_ow, f_ci, w)[1:]
        shifted = []
        for rule, spec, params in rest:
            spec = dict(spec)
            if spec.get("nest") == n and isinstance(spec.get("loop"), int) and spec["loop"] >= 0:
                spec["loop"] += 1
            elif spec.get("nest") == [k, 0, 2] and spec.get("loop") == 4:
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
        ("shared_memory_tiling", {"nest": [k, 0], "bindings": {"Z": "A"}}, {"w": w}),
        # the filter slice: only where the block's threads divide it
        ("shared_memory_tiling", {"nest": [k, 0], "bindings": {"Z": "C"}, "optional": True}, {"w": w}),
        ("loop_unrolling", {"nest": [k, 0, 2], "loop": 4, "optional": True}, {}),
        ("loop_vectorization", {"nest": [k, 1], "loop": 2, "optional": True}, {}),
    ]


def _reduction_shape(nest) -> list[int] | None:
    """The loop extents of a top-level nest ``B L .. L [one equation]`` whose first loop is the
    only bound one, else None."""
    from ..leir import ast as A  # noqa: PLC0415

    loops = nest.loops
    if not loops or loops[0].kind != "B" or any(lp.kind != "L" for lp in loops[1:]):
        return None
    if len(nest.body) != 1 or not isinstance(nest.body[0], A.Assign):
        return None
    return [lp.extent for lp in loops]


def tiling_proposals(by_id: dict, module: LeirModule) -> list[list[dict]]:
    """The tiled form of every GEMM-like and convolution-like top-level nest (:func:`gemm_tiling`,
    :func:`conv_tiling`) as one multi-step proposal each: the first parameters (largest tiles
    first) whose steps all apply (the rules' own checks and the GPU preflight decide; a
    parameter that does not divide an extent or a tile over the shared-memory limit fails and
    the next is tried). Its records are the steps."""
    needed = ("thread_block_rebinding", "loop_split", "loop_reorder", "loop_binding", "register_tiling",
              "shared_memory_tiling", "loop_vectorization", "loop_unrolling")
    if not all(r in by_id for r in needed):
        return []
    out = []
    for k, nest in enumerate(module.program.nests):
        ext = _reduction_shape(nest)
        if ext is None:
            continue
        if len(ext) == 3:
            m, n_, kk = ext
            tries = [(b, mi, bk, w) for b in (64, 32, 16) for mi in (4, 2) for bk in (16, 8)
                     for w in (4, 2, 1) if m % b == 0 and n_ % b == 0 and kk % bk == 0 and b < min(m, n_) and bk < kk
                     and (b // mi) ** 2 <= 1024 and (b * bk) % ((b // mi) ** 2 * w) == 0]
            # enough thread blocks for the device first (132 SMs on an H100/H200: a 256x256 output in
            # 64x64 tiles is 16 blocks, most SMs idle), the largest tile among those
            tries.sort(key=lambda t: ((m // t[0]) * (n_ // t[0]) < 132, -t[0], -t[1], -t[2], -t[3]))
            seqs = [gemm_tiling(k, *t) for t in tries[:6]]
        elif len(ext) in (6, 7):
            batch = len(ext) == 7
            oh, ow, ci = ext[-5:-2]
            tries = [(a, b, c) for a in (4, 2) for b in (4, 2) for c in (8, 4, 2) if oh % a == 0 and ow % b == 0
                     and ci % c == 0 and a < oh and b < ow and c < ci]
            seqs = [conv_tiling(k, *t, batch=batch) for t in tries[:4]]
        else:
            continue
        for seq in seqs:
            try:
                out.append(apply_steps(by_id, module, seq))
                break
            except Exception:  # noqa: BLE001 - these parameters do not apply here: the next
                continue
    return out


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
           "macro_proposals", "site_for", "apply_steps", "gemm_tiling", "conv_tiling", "tiling_proposals"]
