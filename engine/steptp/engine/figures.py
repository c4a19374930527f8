"""The figures of one step: what it changes in the kernels it touches, counted from the
program text (design.md §8 "A reason is true of its step"; issue 50).

:func:`step_figures` compares the *target* of a step in the program before and after it. The
target is the multiset difference of the top-level nests (each a kernel launch): the nests
only in ``before`` against the nests only in ``after``, so unchanged kernels, which would
contribute the same to both sides, are left out; a step that only exchanges whole nests (no
nest text changes) is counted over the whole program. Every figure is a ``[before, after]``
pair (JSON lists), computed per target kernel and then combined:

========================  =====================================================================
``kernels``               kernel launches: per top-level nest the launches of the static GPU model
                          (:func:`steptp.cost_model.gpu._host_launches`: one per iteration of the
                          serial loops around its first ``B`` loop, else 1), summed
``threads``               threads per launch: ``threadIdx`` extents times ``blockIdx`` extents of
                          the kernel's ``B`` loops (``B^{n}_{tx=0}``, ``B^{n}_{bx=0}``, docs/leir.md),
                          as the static GPU model's grid (:func:`steptp.cost_model.gpu.kernel_estimate`);
                          the largest target kernel's; 1 for a kernel without ``B`` loops
``blocks``                thread blocks per launch (``blockIdx`` extents), the largest target kernel's
``serial_trips``          serial trip count per thread: the product of the extents of the loops
                          that enclose an equation and are not bound to threads or blocks (``L``;
                          ``P``, ``V`` and ``U`` loops also run inside one thread on the GPU, as in the
                          static GPU model), host loops excluded; the largest over the target's
                          equations (iterations)
``ops``                   operations by kind (``{kind: [before, after]}``), per equation
                          :func:`steptp.cost_model.opcount.op_kinds` (one per node, subscripts and
                          integer index arithmetic excluded) times its instances (the product of
                          all its enclosing loops' extents), summed; both branches of a select
                          count (counts of evaluations)
``ops_total``             the sum of ``ops`` over its kinds (evaluations)
``global_bytes_read``     bytes: every global-scope (``g``) tensor read on a right-hand side, times
                          its dtype size (:data:`steptp.leir.ast.DTYPE_BYTES`), times the
                          equation's instances (a static count of accesses, caches ignored; the
                          accesses as :func:`steptp.cost_model.opcount._accesses` lists them)
``global_bytes_written``  bytes: the same for global-scope targets
``onchip_tensors``        distinct tensors in shared (``s``) or local (``l``) memory in the target
``loop_depth``            loops around an equation (all kinds), the largest over the target's
                          equations
``innermost_trips``       trip count of the innermost loop around an equation, the largest over
                          the target's equations (iterations)
``parallel_loops``        ``P`` loops in the target (CPU threads), and likewise ``vector_loops``
                          (``V``, SIMD lanes) and ``unrolled_loops`` (``U``)
``unit_stride_accesses``  global-scope accesses (per equation, not per instance) whose address
                          moves by one element per iteration of the equation's innermost loop: the
                          loop variable appears only in the last subscript, with coefficient 1
                          (contiguous, coalesced across threads when the loop is a thread loop)
``static_ns``             nanoseconds: the static GPU model's time of the target kernels
                          (:func:`steptp.cost_model.gpu.kernel_estimate`, the per-kernel terms of
                          :func:`steptp.cost_model.static.estimate_ns` with a ``cuda`` target)
========================  =====================================================================

plus ``output_elements`` (the elements of the signature's outputs, the unit ``ops`` are
rendered in) and ``target`` (``{"before": [...], "after": [...], "program": bool}``: the
target's top-level nest numbers, 0-based, and whether it is the whole program).

:func:`render_figures` writes the figures that changed as ``threads per launch 128 → 64``;
:func:`figure_effects` writes the effect sentences the figures support (more parallelism,
fewer operations, fewer global memory accesses, data reuse) and the plain cost of a step that
pays now for a later one. :func:`step_figures` never raises for a valid program: a figure
whose computation fails is left out (fewer figures, never invented ones).
"""

from __future__ import annotations

import math
from collections import Counter
from functools import lru_cache

from ..leir import ast as A
from ..leir.analysis import index_names
from ..leir.fileformat import LeirModule
from .navigation import nest_diff

#: The figures in the order they are rendered.
FIGURE_ORDER = ("kernels", "threads", "blocks", "serial_trips", "ops", "global_bytes_read",
                "global_bytes_written", "onchip_tensors", "loop_depth", "innermost_trips", "parallel_loops",
                "vector_loops", "unrolled_loops", "unit_stride_accesses", "static_ns")
#: The figures a step with no other change states unchanged (``before → after`` with equal
#: values), so every reason gives its step's figures.
UNCHANGED_ORDER = ("threads", "serial_trips", "ops_total", "global_bytes_read", "static_ns")

#: A change of the static model's time below this fraction of the larger time is not a change.
TIME_TOLERANCE = 1e-3

#: The sentence of a step that changes no counted figure.
NO_FIGURE_SENTENCE = ("This step changes none of the counted figures (kernel launches, threads and blocks per "
                      "launch, serial trip count per thread, operations by kind, global bytes read and written, "
                      "tensors in shared or local memory, loop depth and kinds, the innermost trip count, "
                      "unit-stride accesses, the static GPU model's time within 0.1 %): it changes the "
                      "program's form, not what these figures measure.")

_LABELS = {"kernels": "kernel launches", "threads": "threads per launch", "blocks": "thread blocks per launch",
           "serial_trips": "serial trip count per thread", "global_bytes_read": "global bytes read",
           "global_bytes_written": "global bytes written", "onchip_tensors": "tensors in shared or local memory",
           "static_ns": "static model time", "loop_depth": "loops around an equation",
           "innermost_trips": "innermost loop trip count", "parallel_loops": "parallel (P) loops",
           "vector_loops": "vectorized (V) loops", "unrolled_loops": "unrolled (U) loops",
           "unit_stride_accesses": "global accesses with unit stride along the innermost loop",
           "ops_total": "operations per output element"}


# ---------------------------------------------------------------------------
# counting
# ---------------------------------------------------------------------------


def _host_prefix(nest: A.Nest) -> int:
    """How many leading loops of ``nest`` run on the host (the static GPU model's launches:
    the loops before the first ``B`` loop, all of the nest's own loops when only an inner nest
    binds, none without any ``B`` loop)."""
    if not any(lp.kind == "B" for lp in nest.all_loops()):
        return 0
    for k, lp in enumerate(nest.loops):
        if lp.kind == "B":
            return k
    return len(nest.loops)


@lru_cache(maxsize=4096)
def _kernel(nest: A.Nest) -> dict:
    """The figures of one top-level nest (a kernel); figures that fail are missing. Cached by
    the (immutable, hash-cached) nest: the candidates of one program share their original's."""
    from ..cost_model.gpu import kernel_estimate
    from ..cost_model.opcount import op_kinds

    out: dict = {}
    try:
        k = kernel_estimate(nest)
        out.update(kernels=k.launches, threads=k.threads * k.blocks, blocks=k.blocks, static_ns=k.ns)
    except Exception:  # noqa: BLE001 - a figure that cannot be computed is left out
        pass
    try:
        host = _host_prefix(nest)
        serial = 0
        ops: Counter = Counter()
        read = written = 0
        onchip = set()
        for loops, eq in nest.equations():
            inst = math.prod(lp.extent for lp in loops)
            serial = max(serial, math.prod(lp.extent for lp in loops[host:] if lp.kind != "B"))
            for kind, n in op_kinds(eq.value).items():
                ops[kind] += n * inst
            for i, acc in enumerate(_accesses_of(eq)):
                if acc.scope in ("s", "l"):
                    onchip.add(acc.name)
                elif acc.scope == "g":
                    b = A.DTYPE_BYTES.get(acc.dtype, 4) * inst
                    if i == 0:
                        written += b
                    else:
                        read += b
        out.update(serial_trips=serial, ops=dict(ops), global_bytes_read=read, global_bytes_written=written,
                   onchip=frozenset(onchip))
    except Exception:  # noqa: BLE001
        pass
    try:
        out.update(_structure(nest))
    except Exception:  # noqa: BLE001
        pass
    return out


def _unit_stride(sub: tuple, var: str) -> bool:
    """Whether an access with subscripts ``sub`` moves by one element per step of loop
    variable ``var``: ``var`` only in the last subscript, with coefficient 1
    (:func:`steptp.engine.inputbounds.linear_form`)."""
    from .inputbounds import linear_form

    if not sub:
        return False
    for s_ in sub[:-1]:
        if any(isinstance(x, A.Index) and x.name == var for x in A.walk(s_)):
            return False
    terms, _ = linear_form(sub[-1])
    return terms.get(A.Index(var)) == 1 and not any(
        isinstance(x, A.Index) and x.name == var for t in terms if t != A.Index(var) for x in A.walk(t))


def _structure(nest: A.Nest) -> dict:
    """Loop-structure and access-pattern figures of one kernel (module docstring)."""
    depth = inner = 0
    unit = 0
    for loops, eq in nest.equations():
        depth = max(depth, len(loops))
        if not loops:
            continue
        inner = max(inner, loops[-1].extent)
        var = loops[-1].var
        for acc in _accesses_of(eq):
            if acc.scope == "g" and _unit_stride(tuple(acc.indices), var):
                unit += 1
    kinds = Counter(lp.kind for lp in nest.all_loops())
    return {"loop_depth": depth, "innermost_trips": inner, "parallel_loops": kinds.get("P", 0),
            "vector_loops": kinds.get("V", 0), "unrolled_loops": kinds.get("U", 0), "unit_stride_accesses": unit}


def _accesses_of(eq: A.Assign):
    from ..cost_model.opcount import _accesses

    return _accesses(eq)


def _combine(kernels: list[dict]) -> dict:
    """The figures of a set of kernels: sums of the extensive ones, the largest launch and
    serial chain; a figure is present only when every kernel has it."""
    out: dict = {}

    def have(k):
        return all(k in d for d in kernels)

    for k in ("kernels", "global_bytes_read", "global_bytes_written", "static_ns", "parallel_loops", "vector_loops",
              "unrolled_loops", "unit_stride_accesses"):
        if have(k):
            out[k] = sum(d[k] for d in kernels)
    for k in ("threads", "blocks", "serial_trips", "loop_depth", "innermost_trips"):
        if have(k):
            out[k] = max((d[k] for d in kernels), default=0)
    if have("ops"):
        ops: Counter = Counter()
        for d in kernels:
            ops.update(d["ops"])
        out["ops"] = ops
    if have("onchip"):
        out["onchip_tensors"] = len(set().union(*[d["onchip"] for d in kernels]))
    return out


def output_elements(module: LeirModule) -> int:
    """Elements of the signature's outputs (products of their shapes, summed); 0 without
    declared outputs."""
    try:
        return sum(math.prod(t.shape) for t in module.signature.outputs)
    except Exception:  # noqa: BLE001
        return 0


def step_figures(before: LeirModule, after: LeirModule, target=None) -> dict:
    """The figures of the step ``before`` → ``after`` (see the module docstring for each
    figure, its unit and its source): a JSON-ready dict ``{figure: [before, after], "ops":
    {kind: [before, after]}, "output_elements": n, "target": ...}``.

    ``target``: ``None`` (the top-level nests that differ between the two programs, or the
    whole program when none does), ``"program"``, or ``(before nest numbers, after nest
    numbers)`` (0-based). Never raises for valid programs: a figure that cannot be computed is
    left out."""
    out: dict = {}
    try:
        bp, ap = before.program, after.program
        if target is None:
            ib, ia = nest_diff(bp, ap)
            if not ib and not ia:
                target = "program"
        elif target != "program":
            ib, ia = (list(target[0]), list(target[1]))
        whole = target == "program"
        if whole:
            ib, ia = list(range(len(bp.nests))), list(range(len(ap.nests)))
        out["target"] = {"before": ib, "after": ia, "program": whole}
        fb = _combine([_kernel(bp.nests[i]) for i in ib])
        fa = _combine([_kernel(ap.nests[i]) for i in ia])
        for k in FIGURE_ORDER:
            if k == "ops" or k not in fb or k not in fa:
                continue
            x, y = fb[k], fa[k]
            out[k] = [round(x, 3), round(y, 3)] if isinstance(x, float) else [x, y]
        if "ops" in fb and "ops" in fa:
            kinds = sorted(set(fb["ops"]) | set(fa["ops"]))
            out["ops"] = {k: [fb["ops"].get(k, 0), fa["ops"].get(k, 0)] for k in kinds}
            out["ops_total"] = [sum(fb["ops"].values()), sum(fa["ops"].values())]
        out["output_elements"] = output_elements(before)
    except Exception:  # noqa: BLE001 - fewer figures, never an exception
        pass
    return out


# ---------------------------------------------------------------------------
# what changed, and the text
# ---------------------------------------------------------------------------


def _pair(fig: dict, k: str):
    v = fig.get(k)
    if isinstance(v, (list, tuple)) and len(v) == 2 and all(isinstance(x, (int, float)) for x in v):
        return v[0], v[1]
    return None


def time_changed(fig: dict) -> bool:
    """Whether the static model's time moved by at least :data:`TIME_TOLERANCE` of the
    larger of the two times."""
    p = _pair(fig, "static_ns")
    return p is not None and abs(p[1] - p[0]) >= TIME_TOLERANCE * max(abs(p[0]), abs(p[1]), 1e-9)


def changed_ops(fig: dict) -> dict:
    """``{kind: (before, after)}`` of the operation kinds whose count changed."""
    ops = fig.get("ops") or {}
    return {k: (v[0], v[1]) for k, v in ops.items() if isinstance(v, (list, tuple)) and len(v) == 2 and v[0] != v[1]}


def changed_figures(fig: dict) -> list[str]:
    """The names of the figures that differ before and after, in :data:`FIGURE_ORDER`
    (``static_ns`` only when :func:`time_changed`)."""
    out = []
    for k in FIGURE_ORDER:
        if k == "ops":
            if changed_ops(fig):
                out.append(k)
        elif k == "static_ns":
            if time_changed(fig):
                out.append(k)
        else:
            p = _pair(fig, k)
            if p is not None and p[0] != p[1]:
                out.append(k)
    return out


def _num(x: float) -> str:
    """A count: an integer as is, else up to 3 decimals."""
    if float(x).is_integer():
        return str(int(x))
    return f"{x:.3f}".rstrip("0").rstrip(".")


def _time(ns: float, digits: int) -> str:
    if abs(ns) < 1000:
        return f"{ns:.{digits}g} ns"
    return f"{ns / 1000:.{digits}g} µs"


def _times(a: float, b: float) -> tuple[str, str]:
    """Both times with enough significant digits (3 to 6) to tell them apart."""
    for d in range(3, 7):
        x, y = _time(a, d), _time(b, d)
        if x != y:
            break
    return x, y


def _op_name(k: str) -> str:
    return {"if_then_else": "select", "and": "logical and", "or": "logical or", "not": "logical not"}.get(k, k)


def render_figures(fig: dict) -> str:
    """The changed figures as ``label before → after`` items joined by ``; `` (empty when none
    changed): ``threads per launch 128 → 64; serial trip count per thread 32 → 64; exp 1 → 2 per
    output element; global bytes read 4096 → 2048; static model time 3.1 µs → 2.9 µs``.
    Operations are given per output element when the signature declares outputs, else as
    counts of evaluations."""
    items = []
    per = fig.get("output_elements") or 0
    for k in changed_figures(fig):
        if k == "ops":
            for kind, (x, y) in changed_ops(fig).items():
                if per:
                    items.append(f"{_op_name(kind)} {_num(x / per)} → {_num(y / per)} per output element")
                else:
                    items.append(f"{_op_name(kind)} {_num(x)} → {_num(y)} evaluations")
        elif k == "static_ns":
            x, y = _times(*_pair(fig, k))
            items.append(f"{_LABELS[k]} {x} → {y}")
        else:
            x, y = _pair(fig, k)
            items.append(f"{_LABELS[k]} {_num(x)} → {_num(y)}")
    return "; ".join(items)


def render_unchanged(fig: dict) -> str:
    """For a step whose figures did not change: the main ones as ``label x → x`` items (the
    same value twice: stated, not omitted), joined by ``; ``; empty when none is known."""
    items = []
    per = fig.get("output_elements") or 0
    for k in UNCHANGED_ORDER:
        p = _pair(fig, k)
        if p is None:
            continue
        if k == "ops_total":
            if not per:
                continue
            items.append(f"{_LABELS[k]} {_num(p[0] / per)} → {_num(p[1] / per)}")
        elif k == "static_ns":
            items.append(f"{_LABELS[k]} {_time(p[0], 3)} → {_time(p[1], 3)}")
        else:
            items.append(f"{_LABELS[k]} {_num(p[0])} → {_num(p[1])}")
    return "; ".join(items)


def _ratio(x: float, y: float) -> str:
    """``y`` relative to ``x`` in words: ``twice``, ``half``, ``4 times``, ``a quarter of``."""
    if x <= 0:
        return f"{_num(y)} instead of {_num(x)}"
    r = y / x
    words = {2.0: "twice", 0.5: "half", 0.25: "a quarter of", 3.0: "three times", 4.0: "four times"}
    if r in words:
        return words[r]
    if r > 1:
        return f"{_num(round(r, 2))} times"
    inv = x / y if y else 0
    if y and float(inv).is_integer():
        return f"1/{int(inv)} of"
    return f"{_num(round(r, 2))} times"


def _kinds(kinds) -> str:
    names = [_op_name(k) for k in kinds]
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


def figure_effects(fig: dict) -> list[str]:
    """The effect sentences the figures support, one per effect, in the order parallelism,
    serial work, launches, operations, global memory, data reuse, static time. An effect is
    named only where its figure shows it (more threads or blocks per launch: more
    parallelism; a lower operation count: fewer operations; fewer global bytes: fewer memory
    accesses; fewer global reads while a shared/local tensor appears: data reuse); a step
    that halves the threads and lengthens each thread's serial loop says that it costs
    parallelism now. Empty when nothing changed (see :data:`NO_FIGURE_SENTENCE`)."""
    out: list[str] = []
    changed = set(changed_figures(fig))
    t, b, s = _pair(fig, "threads"), _pair(fig, "blocks"), _pair(fig, "serial_trips")
    s_said = False
    if t and t[1] > t[0]:
        sent = f"Each launch runs {_ratio(*t)} as many threads: more parallelism"
        if s and s[1] < s[0]:
            sent += f", and each thread runs {_ratio(*s)} the serial iterations"
            s_said = True
        out.append(sent + ".")
    elif t and t[1] < t[0]:
        if s and s[1] > s[0]:
            out.append(f"This step alone runs {_ratio(*t)} the threads per launch and gives each thread "
                       f"{_ratio(*s)} the serial iterations: it costs parallelism now, and what it buys depends "
                       "on a later step on the new loops.")
            s_said = True
        else:
            out.append(f"Each launch runs {_ratio(*t)} the threads: less parallelism.")
    elif b and b[1] > b[0]:
        out.append(f"The same threads run in {_num(b[1])} thread blocks instead of {_num(b[0])}, so more "
                   "multiprocessors can run them at once: more parallelism.")
    elif b and b[1] < b[0]:
        out.append(f"The same threads run in {_num(b[1])} thread blocks instead of {_num(b[0])}, on fewer "
                   "multiprocessors at once.")
    if s and s[0] != s[1] and not s_said:
        if s[1] < s[0]:
            out.append(f"Each thread runs {_ratio(*s)} the serial iterations.")
        else:
            out.append(f"Each thread runs {_ratio(*s)} as many serial iterations.")
    k = _pair(fig, "kernels")
    if k and k[1] < k[0]:
        n = int(k[0] - k[1])
        out.append(f"It saves {n} kernel launch{'es' if n > 1 else ''}.")
    elif k and k[1] > k[0]:
        n = int(k[1] - k[0])
        out.append(f"It adds {n} kernel launch{'es' if n > 1 else ''}.")
    ops = changed_ops(fig)
    if ops:
        fewer = [x for x, (p, q) in ops.items() if q < p]
        more = [x for x, (p, q) in ops.items() if q > p]
        if fewer and not more:
            out.append(f"It evaluates fewer operations (fewer {_kinds(fewer)}).")
        elif more and not fewer:
            if _gains(fig):
                out.append(f"It evaluates more operations (more {_kinds(more)}).")
            else:
                out.append(f"This step alone evaluates more operations (more {_kinds(more)}); the rewritten form "
                           "is what a later step can build on.")
        else:
            tot = _pair(fig, "ops_total")
            net = "" if not tot or tot[0] == tot[1] else \
                (": fewer operations in all" if tot[1] < tot[0] else ": more operations in all")
            out.append(f"It trades operations: fewer {_kinds(fewer)}, more {_kinds(more)}{net}.")
    r, w = _pair(fig, "global_bytes_read"), _pair(fig, "global_bytes_written")
    if r and w and (r[0] != r[1] or w[0] != w[1]):
        parts_less = [n for n, p in (("reads", r), ("writes", w)) if p[1] < p[0]]
        parts_more = [n for n, p in (("reads", r), ("writes", w)) if p[1] > p[0]]
        if parts_less and not parts_more:
            out.append(f"It makes fewer global memory accesses (fewer {' and '.join(parts_less)}).")
        elif parts_more and not parts_less:
            out.append(f"It adds global memory traffic (more {' and '.join(parts_more)}).")
        else:
            out.append(f"It makes fewer global memory {parts_less[0]} and more global memory {parts_more[0]}.")
    o = _pair(fig, "onchip_tensors")
    if r and o and r[1] < r[0] and o[1] > o[0]:
        out.append("The values it keeps in shared or local memory are read from there instead of from global "
                   "memory: data reuse.")
    if "static_ns" in changed:
        p = _pair(fig, "static_ns")
        out.append(f"The static GPU model estimates the changed kernels {'faster' if p[1] < p[0] else 'slower'}.")
    return out


def _gains(fig: dict) -> bool:
    """Whether any figure improved: fewer launches, serial iterations or global bytes, more
    threads or blocks per launch, or a faster static model time."""
    def fell(k):
        p = _pair(fig, k)
        return p is not None and p[1] < p[0]

    def rose(k):
        p = _pair(fig, k)
        return p is not None and p[1] > p[0]

    return (fell("kernels") or fell("serial_trips") or fell("global_bytes_read") or fell("global_bytes_written")
            or rose("threads") or rose("blocks") or (time_changed(fig) and fell("static_ns")))


def figures_scope(fig: dict) -> str:
    """What the figures are counted over, in words: ``the kernel it changes``, ``the kernels it
    changes (2 before, 1 after)`` or ``the whole program``."""
    tg = fig.get("target")
    if not isinstance(tg, dict) or tg.get("program"):
        return "the whole program"
    nb, na = len(tg.get("before", ())), len(tg.get("after", ()))
    if nb == na == 1:
        return "the kernel it changes"
    return f"the kernels it changes ({nb} before, {na} after)"


def read_reuse(nest: A.Nest) -> tuple[dict[str, int], bool]:
    """Reads per element of every global tensor that ``nest`` reads: ``({name: reads per
    element}, exact)`` for those read more than once (instances of the equation over the
    elements its subscript can reach, the product of the extents of the loops it uses; the
    largest over the tensor's reads), and whether the answer is exact, i.e. every read's
    subscript entries are single distinct loop indices or constants, so that a tensor absent
    from the dict is read once per element (no reuse for a schedule to capture)."""
    reuse: dict[str, int] = {}
    exact = True
    try:
        for loops, eq in nest.equations():
            inst = math.prod(lp.extent for lp in loops)
            ext = {lp.var: lp.extent for lp in loops}
            for i, acc in enumerate(_accesses_of(eq)):
                if i == 0 or acc.scope != "g":
                    continue
                seen: list[str] = []
                for ix in acc.indices:
                    if isinstance(ix, A.Index):
                        seen.append(ix.name)
                    elif not isinstance(ix, A.Int):
                        exact = False
                        seen += sorted(index_names(ix))
                if len(set(seen)) != len(seen):
                    exact = False
                reach = math.prod(ext.get(v, 1) for v in set(seen))
                f = inst // max(reach, 1)
                if f > 1:
                    reuse[acc.name] = max(reuse.get(acc.name, 0), f)
    except Exception:  # noqa: BLE001
        return {}, False
    return reuse, exact


__all__ = ["FIGURE_ORDER", "UNCHANGED_ORDER", "NO_FIGURE_SENTENCE", "TIME_TOLERANCE", "step_figures", "changed_figures",
           "changed_ops", "time_changed", "render_figures", "render_unchanged", "figure_effects", "figures_scope", "read_reuse", "output_elements"]
