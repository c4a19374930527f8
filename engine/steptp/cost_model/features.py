"""Fixed-length features of a LEIR program for the learned cost model
(:mod:`steptp.cost_model.learned`), in the spirit of TVM MetaSchedule's per-store features
(``PerStoreFeature``: loop extents and kinds, access strides, arithmetic intensity,
vectorize / parallel / thread-binding extents, buffer scopes), computed from the LEIR AST
alone (no build, no run).

Per equation instance (an equation with every loop around it):

* iteration count ``n`` (product of extents), loop depth, innermost extent and kind;
* arithmetic: operations per iteration (the static model's weights, :mod:`.cost`), of which
  transcendental calls; total operations ``n * ops``;
* memory: per access (target and reads), the stride of the **innermost** loop in it:
  contiguous (the innermost index in the last subscript, with its coefficient), strided
  (in another subscript) or invariant (not used: register reuse); bytes moved the way the
  static model counts them; accesses per scope (``g`` / ``s`` / ``l``);
* arithmetic intensity = operations / bytes moved;
* parallelism: the product of ``P`` extents and the trips around the parallel region
  (fork/join count), vector lanes of an innermost ``V`` loop, ``U`` extents, ``B`` thread
  and block extents;
* whether the equation accumulates into its target (a reduction), and whether its innermost
  loop is a reduction axis, so that consecutive iterations chain through the accumulator
  (:func:`steptp.cost_model.static.serial_chain`: latency-bound on a CPU), also times log2 of that
  loop's extent (short chains overlap in the out-of-order window);
* footprint: per access the elements its subscripts reach (the product of the extents of
  the loops whose index it uses) times the dtype size, summed per equation and, per tensor
  (its largest access), over the program; strides matter once it leaves the cache, so the
  strided fraction is also given times log2 of the equation's footprint.

On the CPU a bound ``B`` loop is a serial loop (the backend lowers it so), and its features
are those of an ``L`` loop: a thread binding there changes nothing the model sees.

Aggregation to one vector per program (MetaSchedule sums per-store features over the
blocks of a candidate): sums of the extensive figures (operations, bytes, iterations,
fork/joins, nests, equations) in log2, iteration-weighted means of the intensive ones
(vectorised fraction, contiguous / strided / invariant fractions, scope fractions …) and
maxima of a few (depth, innermost extent), plus the static model's estimate
(:func:`steptp.cost_model.static.estimate_ns`, log2 ns). :data:`FEATURE_NAMES` names the entries;
:func:`program_features` returns a ``list[float]`` of that length.
"""

from __future__ import annotations

import math

from ..leir import ast as A
from ..backend.preflight import linear_form
from ..leir.analysis import index_names, is_self_referencing
from .static import Target, _accesses, _ops, estimate_ns, serial_chain

_TRANSCENDENTAL = {"exp", "log", "sqrt", "tanh", "erf"}

#: Names of the program features, in order (see the module docstring). The first, the static
#: model's estimate, is also the learned model's prior (:mod:`steptp.cost_model.learned`): keep it first.
FEATURE_NAMES: tuple[str, ...] = (
    "log2_est_ns", "nests", "equations", "log2_iters", "log2_ops", "log2_bytes", "log2_intensity",
    "log2_transcendental", "log2_fork_joins", "log2_par_extent_max", "max_depth", "log2_inner_extent_max",
    "w_depth", "w_log2_inner_extent", "w_inner_serial", "w_inner_vector", "w_inner_unroll", "w_inner_parallel",
    "w_inner_bound", "w_vector_lanes", "w_log2_unroll", "w_parallel", "w_log2_par_extent", "w_bound",
    "w_log2_threads", "w_log2_blocks", "w_contiguous", "w_strided", "w_invariant", "w_unit_stride",
    "w_scope_g", "w_scope_s", "w_scope_l", "w_reduction", "w_dtype_bytes", "w_ops", "w_log2_intensity",
    "reduction_eqs", "vector_eqs", "parallel_eqs", "log2_eager_bytes", "log2_footprint", "log2_eq_footprint_max",
    "w_strided_x_footprint", "w_invariant_x_footprint", "w_inner_chain", "w_inner_chain_x_extent",
)


def _coef(e: A.Expr, var: str) -> float:
    """Coefficient of index ``var`` in a (linear) subscript; 0 when absent, 1 when not linear
    (:func:`steptp.backend.preflight.linear_form`)."""
    form = linear_form(e)
    if form is None:
        return 1.0 if var in index_names(e) else 0.0
    return float(form.get(var, 0))


def _eq_features(eq: A.Assign, loops: tuple[A.Loop, ...], tgt: Target) -> dict:
    if tgt.kind == "cpu":  # B loops are serial loops on the CPU
        loops = tuple(A.Loop("L", lp.extent, lp.var) if lp.kind == "B" else lp for lp in loops)
    n = math.prod(lp.extent for lp in loops) if loops else 1
    inner = loops[-1] if loops else None
    ops = _ops(eq.value)
    trans = sum(1 for x in A.walk(eq.value) if isinstance(x, A.Call) and x.func in _TRANSCENDENTAL)
    nbytes = A.DTYPE_BYTES.get(eq.target.dtype, 4)
    contiguous = strided = invariant = unit = 0
    scopes = {"g": 0, "s": 0, "l": 0}
    moved = 0.0
    accs = list(_accesses(eq))
    extents = {lp.var: lp.extent for lp in loops}
    reach: dict[str, float] = {}
    for acc in accs:
        b = A.DTYPE_BYTES.get(acc.dtype, 4)
        used_vars = set().union(*[index_names(i) for i in acc.indices]) if acc.indices else set()
        size = b * math.prod(extents.get(v, 1) for v in used_vars)
        reach[acc.name] = max(reach.get(acc.name, 0.0), float(size))
        scopes[acc.scope] = scopes.get(acc.scope, 0) + 1
        if inner is None or not acc.indices:
            invariant += 1
            moved += n * b / max(inner.extent if inner else 1, 1)
            continue
        last = index_names(acc.indices[-1])
        used = set().union(*[index_names(i) for i in acc.indices])
        if inner.var in last:
            contiguous += 1
            c = abs(_coef(acc.indices[-1], inner.var))
            unit += c == 1.0
            moved += n * b * min(max(c, 1.0), 16.0)
        elif inner.var in used:
            strided += 1
            moved += n * b * 8
        else:
            invariant += 1
            moved += n * b / max(inner.extent, 1)
    par = math.prod(lp.extent for lp in loops if lp.kind == "P")
    threads = math.prod(lp.extent for lp in loops if lp.kind == "B" and lp.var.startswith("t"))
    blocks = math.prod(lp.extent for lp in loops if lp.kind == "B" and not lp.var.startswith("t"))
    unroll = math.prod(lp.extent for lp in loops if lp.kind == "U")
    lanes = 1
    if inner is not None and inner.kind == "V":
        lanes = max(1, min(inner.extent, tgt.vector_bytes // nbytes))
    k = len(accs) or 1
    return {"n": n, "ops": ops, "trans": trans * n, "bytes": moved, "depth": len(loops),
            "inner_extent": inner.extent if inner else 1, "inner_kind": inner.kind if inner else "L",
            "lanes": lanes, "unroll": unroll, "par": par, "threads": threads, "blocks": blocks,
            "contiguous": contiguous / k, "strided": strided / k, "invariant": invariant / k, "unit": unit / k,
            "g": scopes.get("g", 0) / k, "s": scopes.get("s", 0) / k, "l": scopes.get("l", 0) / k,
            "reduction": 1.0 if is_self_referencing(eq) else 0.0, "chain": 1.0 if serial_chain(eq, loops) else 0.0,
            "dtype": nbytes, "reach": reach,
            "footprint": sum(reach.values())}


def _fork_joins(nest: A.Nest, outer: tuple[A.Loop, ...]) -> int:
    """Entries of a ``P`` region of the nest (the trips of the loops around the first ``P``)."""
    trips = 1
    for lp in outer + nest.loops:
        if lp.kind == "P":
            return trips
        trips *= lp.extent
    return sum(_fork_joins(x, outer + nest.loops) for x in nest.body if isinstance(x, A.Nest))


def _log2(x: float) -> float:
    return math.log2(1.0 + max(x, 0.0))


def program_features(program: A.Program, target: str = "cpu") -> list[float]:
    """The feature vector of ``program`` (a :class:`steptp.leir.ast.Program`): a list of
    ``len(FEATURE_NAMES)`` floats (log2 scales for extensive figures, iteration-weighted
    means for intensive ones; see the module docstring). ``target``: ``cpu`` or ``cuda``
    (vector width). Never raises for a parsed program; an empty program is all zeros but
    the counts."""
    tgt = Target.for_name(target)
    eqs = [_eq_features(eq, loops, tgt) for loops, eq in program.equations()]
    total_n = sum(e["n"] for e in eqs) or 1
    ops = sum(e["n"] * e["ops"] for e in eqs)
    nbytes = sum(e["bytes"] for e in eqs)

    def w(fn) -> float:  # iteration-weighted mean
        return sum(e["n"] * fn(e) for e in eqs) / total_n if eqs else 0.0

    kind = lambda k: w(lambda e: 1.0 if e["inner_kind"] == k else 0.0)  # noqa: E731
    fj = sum(_fork_joins(nest, ()) for nest in program.nests)
    eager_bytes = sum(e["n"] * e["dtype"] * 2 for e in eqs)
    tensors: dict[str, float] = {}
    for e in eqs:
        for name, size in e["reach"].items():
            tensors[name] = max(tensors.get(name, 0.0), size)
    vals = {
        "log2_est_ns": _log2(estimate_ns(program, tgt)), "nests": float(len(program.nests)),
        "equations": float(len(eqs)), "log2_iters": _log2(total_n), "log2_ops": _log2(ops),
        "log2_bytes": _log2(nbytes), "log2_intensity": math.log2((ops + 1.0) / (nbytes + 1.0)),
        "log2_transcendental": _log2(sum(e["trans"] for e in eqs)), "log2_fork_joins": _log2(fj),
        "log2_par_extent_max": _log2(max((e["par"] for e in eqs if e["par"] > 1), default=0)),
        "max_depth": float(max((e["depth"] for e in eqs), default=0)),
        "log2_inner_extent_max": _log2(max((e["inner_extent"] for e in eqs), default=0)),
        "w_depth": w(lambda e: e["depth"]), "w_log2_inner_extent": w(lambda e: _log2(e["inner_extent"])),
        "w_inner_serial": kind("L"), "w_inner_vector": kind("V"), "w_inner_unroll": kind("U"),
        "w_inner_parallel": kind("P"), "w_inner_bound": kind("B"), "w_vector_lanes": w(lambda e: e["lanes"]),
        "w_log2_unroll": w(lambda e: _log2(e["unroll"] - 1)), "w_parallel": w(lambda e: float(e["par"] > 1)),
        "w_log2_par_extent": w(lambda e: _log2(e["par"] - 1)),
        "w_bound": w(lambda e: float(e["threads"] * e["blocks"] > 1)),
        "w_log2_threads": w(lambda e: _log2(e["threads"] - 1)), "w_log2_blocks": w(lambda e: _log2(e["blocks"] - 1)),
        "w_contiguous": w(lambda e: e["contiguous"]), "w_strided": w(lambda e: e["strided"]),
        "w_invariant": w(lambda e: e["invariant"]), "w_unit_stride": w(lambda e: e["unit"]),
        "w_scope_g": w(lambda e: e["g"]), "w_scope_s": w(lambda e: e["s"]), "w_scope_l": w(lambda e: e["l"]),
        "w_reduction": w(lambda e: e["reduction"]), "w_dtype_bytes": w(lambda e: e["dtype"]),
        "w_ops": w(lambda e: e["ops"]),
        "w_log2_intensity": w(lambda e: math.log2((e["n"] * e["ops"] + 1.0) / (e["bytes"] + 1.0))),
        "reduction_eqs": sum(e["reduction"] for e in eqs), "vector_eqs": float(sum(e["lanes"] > 1 for e in eqs)),
        "parallel_eqs": float(sum(e["par"] > 1 for e in eqs)), "log2_eager_bytes": _log2(eager_bytes),
        "log2_footprint": _log2(sum(tensors.values())),
        "log2_eq_footprint_max": _log2(max((e["footprint"] for e in eqs), default=0)),
        "w_strided_x_footprint": w(lambda e: e["strided"] * _log2(e["footprint"])),
        "w_invariant_x_footprint": w(lambda e: e["invariant"] * _log2(e["footprint"])),
        "w_inner_chain": w(lambda e: e["chain"]),
        "w_inner_chain_x_extent": w(lambda e: e["chain"] * _log2(e["inner_extent"])),
    }
    return [float(vals[k]) for k in FEATURE_NAMES]


__all__ = ["FEATURE_NAMES", "program_features"]
