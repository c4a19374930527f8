"""The step sequences that take a translated GEMM and a 2-D convolution to the tiled GPU form
(thread blocks and threads bound, a register micro-tile, shared tiles of both inputs fetched
cooperatively, vectorized copies, an unrolled inner loop), as data: each step is
``(rule id, site filter, params)``, applied one at a time through the engine's public API
(:func:`steptp.engine.apply_rule`). Shared by ``tests/test_tiling_sequence.py`` and
``tests/test_shared_memory_tiling.py``.

The sequences are the engine's recipes ``rules/recipes/gemm_tiling.yaml`` and
``rules/recipes/conv_tiling.yaml`` (what the search proposes as one multi-step proposal),
instantiated with fixed tile sizes (:func:`steptp.engine.recipes.instantiate`) for a GEMM and a
convolution of the translator's form. A site filter is a dict: ``nest`` (a path), ``loop`` (a loop position in that
nest; negative from the innermost) and ``bindings`` (metavariable -> LEIR text, e.g.
``{"Z": "A"}``: the tensor a tile stages); :func:`pick` returns the one site of the rule
that matches it (an error if none or several).
"""

from __future__ import annotations

from steptp.engine import apply_rule
from steptp.engine.macros import site_for
from steptp.engine.recipes import instantiate, recipes_in_effect
from steptp.leir import parse_leir
from steptp.leir.fileformat import LeirModule
from steptp.rules import load_rules

RULES = {r.id: r for r in load_rules()}
RECIPES = {r.id: r for r in recipes_in_effect()}

#: a GEMM and a 2-D convolution as the translator writes them (the recipes' forms)
_GEMM = parse_leir("% program: matmul\n% input A: f32[64,64]\n% input C: f32[64,64]\n% output D: f32[64,64]\n"
                   "B^{64}_{tx=0}L^{64}_{a=0}L^{64}_{c=0}[D^{f32,g}_{tx,a}=D^{f32,g}_{tx,a}"
                   "+A^{f32,g}_{tx,c}*C^{f32,g}_{c,a};];\n")
_CONV = parse_leir("% program: conv2d\n% input A: f32[1,16,18,10]\n% param C: f32[16,16,3,3]\n"
                   "% output D: f32[1,16,16,8]\n"
                   "B^{16}_{tx=0}L^{16}_{a=0}L^{8}_{c=0}L^{16}_{d=0}L^{3}_{f=0}L^{3}_{g=0}[D^{f32,g}_{0,tx,a,c}="
                   "D^{f32,g}_{0,tx,a,c}+A^{f32,g}_{0,d,a+f,c+g}*C^{f32,g}_{tx,d,f,g};];\n")


def pick(rule_id: str, module: LeirModule, spec: dict):
    """The one site of rule ``rule_id`` in ``module`` that matches the filter ``spec``
    (:func:`steptp.engine.macros.site_for`; ``LookupError`` if none or several)."""
    return site_for(RULES[rule_id], module, {k: v for k, v in spec.items() if k != "optional"})


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
    """The engine's GEMM tiling sequence (:func:`steptp.engine.macros.gemm_tiling`) of nest 0:
    ``block`` x ``block`` output tiles per thread block, ``(block/micro)^2`` threads of
    ``micro`` x ``micro`` outputs, K in steps of ``bk``, tiles copied ``w`` elements at a time.
    ``gemm_tiling(64, 4, 16)`` is the usual 256-thread schedule of a 256x256x256 GEMM."""
    return instantiate(RECIPES["gemm_tiling"], _GEMM, 0, bm=block, bn=block, mi=micro, bk=bk, w=w)


#: GEMM ``D[M,N] = A[M,K] @ C[K,N]`` as the translator writes it
#: (``B^{M}_{tx}L^{N}_{a}L^{K}_{c}[D_{tx,a} += A_{tx,c}*C_{c,a}]``) to 16x16 output tiles per
#: block (4x4 threads of 4x4 micro-tiles), K in steps of 8: loops after the splits and the
#: reorder ``[bx, ao, ko, t1, t2, ki, m1, m2]``.
GEMM_TILING = gemm_tiling(16, 4, 8)

#: 2-D convolution ``D[0,co,oh,ow] += A[0,ci,oh+kh,ow+kw] * C[co,ci,kh,kw]`` as the translator
#: writes it (``B^{16}_{tx}L^{16}_{a}L^{16}_{c}L^{16}_{d}L^{3}_{f}L^{3}_{g}``: co, oh, ow, ci,
#: kh, kw; 16 output channels, 16x8 outputs) to one output channel per block row, 4 output
#: rows per block column, 4x2 threads of 4 output columns each, ci in steps of 8: loops ``[bx, ao, ko, ai, ct, ki, f, g, cm]``.
CONV_TILING = instantiate(RECIPES["conv_tiling"], _CONV, 0, f_oh=4, f_ow=4, f_ci=8)
