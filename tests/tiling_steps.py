"""The step sequences that take a translated GEMM and a 2-D convolution to the tiled GPU form
(thread blocks and threads bound, a register micro-tile, shared tiles of both inputs fetched
cooperatively, vectorized copies, an unrolled inner loop), as data: each step is
``(rule id, site filter, params)``, applied one at a time through the engine's public API
(:func:`steptp.engine.apply_rule`). Shared by ``tests/test_tiling_sequence.py`` and
``tests/test_shared_memory_tiling.py``.

A site filter is a dict: ``nest`` (a path), ``loop`` (a loop position in that nest; negative
from the innermost) and
``bindings`` (metavariable -> LEIR text, e.g. ``{"Z": "A"}``: the tensor a tile stages);
:func:`pick` returns the one site of the rule that matches it (an error if none or several).
"""

from __future__ import annotations

from steptp.engine import apply_rule, find_sites
from steptp.engine.navigation import get_nest
from steptp.leir.fileformat import LeirModule
from steptp.leir.printer import format_program
from steptp.rules import load_rules

RULES = {r.id: r for r in load_rules()}


def pick(rule_id: str, module: LeirModule, spec: dict):
    """The one site of rule ``rule_id`` in ``module`` that matches the filter ``spec``."""
    want = dict(spec)
    binds = want.pop("bindings", {})
    hits = []
    for s in find_sites(RULES[rule_id], module):
        d = s.describe()
        if "nest" in want and tuple(want["nest"]) != tuple(d.get("nest", ())):
            continue
        if "loop" in want and want["loop"] % len(get_nest(module.program, s.nest).loops) != d.get("loop"):
            continue
        if any(d["bindings"].get(k) != v for k, v in binds.items()):
            continue
        hits.append(s)
    assert len(hits) == 1, f"{rule_id} {spec}: {len(hits)} matching site(s) in\n{format_program(module.program)}"
    return hits[0]


def run_steps(module: LeirModule, steps, check=None):
    """Apply ``steps`` in turn; ``check(before, after, step)`` runs after each. Returns the
    list of modules, the input first."""
    out = [module]
    for rule_id, spec, params in steps:
        st = apply_rule(RULES[rule_id], out[-1], site=pick(rule_id, out[-1], spec), params=params)
        if check is not None:
            check(out[-1], st.after, (rule_id, spec, params))
        out.append(st.after)
    return out


def gemm_tiling(block: int = 16, micro: int = 4, bk: int = 8, w: int = 4) -> list:
    """The GEMM sequence for ``block`` x ``block`` output tiles per thread block, made of
    ``(block/micro)^2`` threads of ``micro`` x ``micro`` outputs, K in steps of ``bk``, tiles
    copied ``w`` elements at a time (``w`` must divide ``block*bk / threads``).
    ``gemm_tiling(64, 4, 16)`` is the usual 256-thread schedule of a 256x256x256 GEMM."""
    return [
        ("thread_block_rebinding", {"nest": [0], "loop": 0}, {"ax": "bx"}),
        ("loop_split", {"nest": [0], "loop": 0}, {"f": block}),
        ("loop_split", {"nest": [0], "loop": 2}, {"f": block}),
        ("loop_split", {"nest": [0], "loop": 4}, {"f": bk}),
        ("loop_split", {"nest": [0], "loop": 1}, {"f": micro}),
        ("loop_split", {"nest": [0], "loop": 4}, {"f": micro}),
        ("loop_reorder", {"nest": [0]}, {"order": [0, 3, 6, 1, 4, 7, 2, 5]}),
        ("loop_binding", {"nest": [0], "loop": 1}, {"ax": "by"}),
        # rows of threads on threadIdx.y, columns on threadIdx.x: a warp's 32 lanes read one
        # row of A's tile (a broadcast) and consecutive columns of C's (no bank conflict), and
        # write consecutive columns of the output (coalesced)
        ("loop_binding", {"nest": [0], "loop": 3}, {"ax": "ty"}),
        ("loop_binding", {"nest": [0], "loop": 4}, {"ax": "tx"}),
        ("register_tiling", {"nest": [0]}, {"s": "l"}),
        ("shared_memory_tiling", {"nest": [0, 0], "bindings": {"Z": "A"}}, {"w": w}),
        ("shared_memory_tiling", {"nest": [0, 0], "bindings": {"Z": "C"}}, {"w": w}),
        ("loop_vectorization", {"nest": [0, 0, 0], "loop": -1}, {}),            # float4 tile copies
        ("loop_vectorization", {"nest": [0, 0, 1], "loop": -1}, {}),
        ("loop_unrolling", {"nest": [0, 0, 2], "loop": -1}, {}),                # the micro-tile's loops
        ("loop_unrolling", {"nest": [0, 0, 2], "loop": -2}, {}),
        ("loop_vectorization", {"nest": [0, 1], "loop": -1}, {}),               # float4 write-back
    ]


#: GEMM ``D[M,N] = A[M,K] @ C[K,N]`` as the translator writes it
#: (``B^{M}_{tx}L^{N}_{a}L^{K}_{c}[D_{tx,a} += A_{tx,c}*C_{c,a}]``) to 16x16 output tiles per
#: block (4x4 threads of 4x4 micro-tiles), K in steps of 8: loops after the splits and the
#: reorder ``[bx, ao, ko, t1, t2, ki, m1, m2]``.
GEMM_TILING = gemm_tiling(16, 4, 8)

#: 2-D convolution ``D[0,co,oh,ow] += A[0,ci,oh+kh,ow+kw] * C[co,ci,kh,kw]`` as the translator
#: writes it (``B^{16}_{tx}L^{16}_{a}L^{16}_{c}L^{16}_{d}L^{3}_{f}L^{3}_{g}``: co, oh, ow, ci,
#: kh, kw; 16 output channels, 16x8 outputs) to one output channel per block row, 4 output
#: rows per block column, 4x2 threads of 4 output columns each, ci in steps of 8: loops ``[bx, ao, ko, ai, ct, ki, f, g, cm]``.
CONV_TILING = [
    ("thread_block_rebinding", {"nest": [0], "loop": 0}, {"ax": "bx"}),      # output channels to blocks
    ("loop_split", {"nest": [0], "loop": 1}, {"f": 4}),                       # [bx, ao, ai, c, d, f, g]
    ("loop_split", {"nest": [0], "loop": 3}, {"f": 4}),                       # [bx, ao, ai, ct, cm, d, f, g]
    ("loop_split", {"nest": [0], "loop": 5}, {"f": 8}),                       # [bx, ao, ai, ct, cm, ko, ki, f, g]
    ("loop_reorder", {"nest": [0]}, {"order": [0, 1, 5, 2, 3, 6, 7, 8, 4]}), # [bx, ao, ko, ai, ct, ki, f, g, cm]
    ("loop_binding", {"nest": [0], "loop": 1}, {"ax": "by"}),
    ("loop_binding", {"nest": [0], "loop": 3}, {"ax": "tx"}),
    ("loop_binding", {"nest": [0], "loop": 4}, {"ax": "ty"}),
    ("register_tiling", {"nest": [0]}, {"s": "l"}),                           # 8 outputs per thread in registers
    ("shared_memory_tiling", {"nest": [0, 0], "bindings": {"Z": "A"}}, {"w": 1}),   # the input window
    ("shared_memory_tiling", {"nest": [0, 0], "bindings": {"Z": "C"}}, {"w": 1}),   # the filter slice
    ("loop_unrolling", {"nest": [0, 0, 2], "loop": 4}, {}),                  # kw
    ("loop_vectorization", {"nest": [0, 1], "loop": 2}, {}),                 # float4 write-back
]
