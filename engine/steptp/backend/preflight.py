"""Static checks that reject LEIR programs TVM 0.27 would miscompile *silently*.

Two families, both run on the LEIR AST (so every reason names the LEIR equation, tensor
and loop, not a TIR node):

* :func:`loop_hazards` (every target; :func:`steptp.backend.tvmscript.lower` raises
  :class:`LoweringError` for them): a vectorised (``V``) or parallel (``P``) loop over a
  reduction axis, or whose iterations touch the same element of a tensor written inside
  it (loop-carried dependence / race), and a parallel loop nested in a parallel loop.
  tvm-0.27-notes §2: TVM vectorises a reduction into wrong numbers with no diagnostic
  (t13b, t51) and parallel reductions race once ``TVM_NUM_THREADS > 1``.
* :func:`gpu_problems` / :func:`preflight` (CUDA path, before nvcc): what
  ``tvm.compile(target=cuda)`` accepts but the GPU cannot run as the LEIR means it
  (tvm-0.27-notes §3.4, t19/t19b/t19c/t37):

  - a thread-tag extent above the hardware limit (:mod:`steptp.backend.hardware`);
  - more than 1024 threads per block (product of the ``threadIdx`` extents of a kernel);
  - one thread tag bound with different extents in one kernel (TVM keeps the first);
  - one thread tag bound twice on one loop path;
  - an equation under no thread binding (TVM silently emits it as host code that would
    touch device memory);
  - a parallel or vectorized loop outside the kernel's bindings (host code around a
    kernel launch: ``tvm.compile(target=cuda)`` fails its thread-scope check);
  - a vectorized loop whose width has no CUDA vector type for a dtype it touches
    (:data:`~steptp.backend.hardware.CUDA_VECTOR_LANES`);
  - a vectorized loop around an equation that mixes dtypes (a conversion in vector code) or
    touches ``bool``: on an H200, TVM 0.27's CUDA code for ``E^{f16,l} = D^{f32,g}`` over 2
    lanes returned wrong values and ``D^{f64} = A^{f64} * C^{bool}`` over 2 lanes stopped with
    ``cudaErrorMisalignedAddress``, both Equal on the CPU;
  - a bound loop whose iterations (threads, blocks) touch the same element of a tensor
    written inside it: a reduction over ``blockIdx``, a race, or a read of another
    thread's value in the same step (the GPU's answer then differs from the sequential
    LEIR semantics the CPU verifies). Reductions over ``threadIdx`` are allowed (TVM emits
    a cross-thread all-reduce) when :func:`cross_thread_problem` finds nothing (a sum,
    product, max or min accumulation, initialised by its own equation, with only reduction
    loops inside the bound loop), and so are ``shared`` (per block) / ``local`` (per thread)
    tensors that each iteration writes before reading (a tile staged in shared memory). A
    shared tile may be filled *cooperatively* (TVM ``cache_read`` + the cooperative fetch,
    rule ``shared_memory_tiling``): a copy phase whose threads write distinct elements (its
    flat index is a mixed-radix form over the thread and copy loops, :func:`_separates`) and
    together the whole tile (a dense form over the copy's own loops, :func:`_dense_span`)
    before the reading phase runs; TVM's ``ThreadSync("shared")`` puts ``__syncthreads()``
    between the two phases and at the top of the enclosing reduction loop (the next fill
    overwrites what the previous readers read). A tile read in the phase that fills it, or
    kept in global memory, stays refused;
  - a global tensor handed between the phases of one kernel (sibling ``threadIdx`` loops
    under the same ``blockIdx`` loops, or code outside them) by different threads: TVM puts
    ``__syncthreads()`` between phases only for ``shared`` buffers
    (:func:`phase_handoff_problems`);
  - a read-modify-write (``X = X + ..``) of a ``global`` (``shared``) tensor outside a block
    (thread) axis bound elsewhere in its kernel: every block (thread) of that axis runs it
    at once (:func:`redundant_execution_problems`);
  - a ``shared``/``local`` intermediate used by more than one kernel (such memory does not
    outlive a kernel), or accessed across blocks (shared) / threads (local);
  - a known tensor (kernel parameter) annotated ``s``/``l`` (parameters are global);
  - more static shared memory per block than the hardware allows.

A *kernel* is the subtree under the outermost ``B`` loop of a loop path: loops outside it
run on the host (TVM launches the kernel once per host iteration), loops inside it run on
the device.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..leir import ast as A
from ..leir.analysis import EqSemantics, LeirSemanticError, ProgramInfo, analyze, tensor_refs
from ..leir.fileformat import LeirModule, Signature, parse_leir
from ..leir.printer import format_assign, format_expr
from .errors import LoweringError, PreflightError
from .hardware import CUDA_VECTOR_LANES, DEFAULT_GPU, GpuLimits, is_thread_tag

LoopId = tuple  # (nest path..., loop position within that nest)

# ---------------------------------------------------------------------------
# Input coercion and equation contexts (shared with tvmscript.py)
# ---------------------------------------------------------------------------


def coerce_module(module_or_program, signature: Signature | None = None) -> tuple[A.Program, Signature]:
    """``(program, signature)`` from a :class:`LeirModule`, ``.leir`` text, or a
    :class:`~steptp.leir.ast.Program` plus ``signature``. Raises :class:`LoweringError`
    when no signature is available or the text does not parse."""
    if isinstance(module_or_program, LeirModule):
        return module_or_program.program, signature or module_or_program.signature
    if isinstance(module_or_program, str):
        try:
            mod = parse_leir(module_or_program)
        except ValueError as e:
            raise LoweringError(f"LEIR text does not parse: {e}") from None
        sig = signature or mod.signature
        if not sig.tensors:
            raise LoweringError("LEIR text has no '% input/output' signature header and no signature was given")
        return mod.program, sig
    if isinstance(module_or_program, A.Program):
        if signature is None:
            raise LoweringError("a bare LEIR Program needs a signature (known tensors, their roles and shapes)")
        return module_or_program, signature
    raise TypeError(f"expected LeirModule, Program or LEIR text, got {type(module_or_program).__name__}")


def analyze_or_raise(prog: A.Program, sig: Signature) -> ProgramInfo:
    """:func:`steptp.leir.analysis.analyze`, with semantic errors as :class:`LoweringError`."""
    try:
        return analyze(prog, sig)
    except LeirSemanticError as e:
        raise LoweringError(f"LEIR semantic error: {e}") from None


@dataclass(frozen=True)
class EqContext:
    """One equation with positional loop identities (equal loops in sibling nests differ)."""

    index: int                                  # equation number in program order
    nest: int                                   # top-level nest number
    loops: tuple[tuple[LoopId, A.Loop], ...]    # enclosing loops, outermost first
    eq: A.Assign
    sem: EqSemantics

    @property
    def text(self) -> str:
        return format_assign(self.eq)

    def where(self) -> str:
        return f"'{self.text}' (nest {self.nest})"


def eq_contexts(prog: A.Program, info: ProgramInfo) -> list[EqContext]:
    """Equations in program order (the order of ``info.equations``) with loop identities."""
    out: list[EqContext] = []

    def rec(nest: A.Nest, path: tuple, outer: tuple, top: int):
        loops = outer + tuple(((*path, j), l) for j, l in enumerate(nest.loops))
        for i, item in enumerate(nest.body):
            if isinstance(item, A.Assign):
                k = len(out)
                sem = info.equations[k]
                assert sem.inst.eq is item or sem.inst.eq == item
                out.append(EqContext(k, top, loops, item, sem))
            else:
                rec(item, path + (i,), loops, top)

    for n, nest in enumerate(prog.nests):
        rec(nest, (n,), (), n)
    return out


def accesses(eq: A.Assign) -> list[A.Tensor]:
    """Every tensor access of an equation: the target first, then all reads (nested ones too)."""
    out = [eq.target]
    for i in eq.target.indices:
        out.extend(tensor_refs(i))
    out.extend(tensor_refs(eq.value))
    return out


# ---------------------------------------------------------------------------
# Linear index forms (injectivity proofs)
# ---------------------------------------------------------------------------


def linear_form(e: A.Expr) -> dict[str, int] | None:
    """``e`` as ``{var: coefficient, "": constant}`` if it is an integer-affine expression of
    loop indices (``+ - *`` by constants, negation), else ``None``."""
    if isinstance(e, A.Int):
        return {"": e.value}
    if isinstance(e, A.Index):
        return {e.name: 1}
    if isinstance(e, A.Neg):
        f = linear_form(e.operand)
        return None if f is None else {k: -v for k, v in f.items()}
    if isinstance(e, A.BinOp) and e.op in ("+", "-"):
        a, b = linear_form(e.lhs), linear_form(e.rhs)
        if a is None or b is None:
            return None
        s = -1 if e.op == "-" else 1
        out = dict(a)
        for k, v in b.items():
            out[k] = out.get(k, 0) + s * v
        return out
    if isinstance(e, A.BinOp) and e.op == "*":
        a, b = linear_form(e.lhs), linear_form(e.rhs)
        if a is None or b is None:
            return None
        if set(a) <= {""}:
            a, b = b, a
        if not set(b) <= {""}:
            return None  # product of two variables
        c = b.get("", 0)
        return {k: v * c for k, v in a.items()}
    return None


def _mixed_radix(form: dict[str, int], variables: list[str], extents: dict[str, int]) -> bool:
    """True if ``sum(form[v]*v)`` over the box ``0 <= v < extents[v]`` is injective."""
    span = 0
    for v in sorted(variables, key=lambda x: (abs(form[x]), x)):
        c = abs(form[v])
        if c <= span:
            return False
        span += c * (extents[v] - 1)
    return True


def subscript_injective(target: A.Tensor, spatial: list[str], extents: dict[str, int]) -> bool:
    """Can two different values of the ``spatial`` loop indices write the same element of
    ``target``? ``False`` means "maybe"; ``True`` is a proof (each index is covered by one
    subscript entry that is a mixed-radix affine form, e.g. ``tx``, ``c*457+tx``)."""
    need = {v for v in spatial if extents.get(v, 1) > 1}
    covered: set[str] = set()
    for idx in target.indices:
        f = linear_form(idx)
        if f is None:
            continue
        vs = [v for v, c in f.items() if v and c != 0]
        if not vs or not set(vs) <= need or covered & set(vs):
            continue
        if _mixed_radix(f, vs, extents):
            covered |= set(vs)
    return need <= covered


def _separates(entry: A.Expr, var: str, inner: dict[str, int], extent: int | None = None) -> bool:
    """True if equal values of ``entry`` imply equal ``var`` whatever the ``inner`` loop
    indices (outer indices are fixed while ``var`` loops, so they cancel): either ``var``'s
    coefficient exceeds the span of the inner terms, or the form over ``var`` and the inner
    indices is injective (a mixed-radix form such as a cooperative copy's
    ``c*256+tx*16+ty``, where the serial ``c`` inside the thread loops is the most
    significant digit: :func:`_mixed_radix`; needs ``var``'s ``extent``)."""
    f = linear_form(entry)
    if f is None or f.get(var, 0) == 0:
        return False
    span = sum(abs(c) * (inner[v] - 1) for v, c in f.items() if v and v != var and v in inner)
    if abs(f[var]) > span:
        return True
    if extent is None:
        return False
    vs = [v for v, c in f.items() if v and c != 0 and (v == var or v in inner)]
    ext = {v: (inner[v] if v != var else extent) for v in vs}
    return _mixed_radix(f, vs, ext)


# ---------------------------------------------------------------------------
# Loop hazards (every target)
# ---------------------------------------------------------------------------

_KIND_WORD = {"P": "parallel", "V": "vectorized"}


def _inner_extents(lid: LoopId, inside: list[EqContext]) -> dict[str, int]:
    """Extents of the loops nested in loop ``lid`` (max over sibling nests reusing a name)."""
    inner: dict[str, int] = {}
    for c in inside:
        pos = [x for x, _ in c.loops].index(lid)
        for _, l in c.loops[pos + 1:]:
            inner[l.var] = max(inner.get(l.var, 1), l.extent)
    return inner


def _private_per_iteration(lid: LoopId, w: str, inside: list[EqContext], all_ctxs: list[EqContext]) -> bool:
    """True if tensor ``w`` can be given a private copy per iteration of loop ``lid`` (what
    the GPU does for ``shared`` memory per block and ``local`` memory per thread) without
    changing the sequential semantics: every access is inside the loop, the first equation
    touching it in an iteration writes it without reading its old value, with an exactly
    known region (subscripts are loop indices of inner loops or fixed values), and that
    region covers everything the iteration reads."""
    users = [c for c in all_ctxs if any(t.name == w for t in accesses(c.eq))]
    if any(c not in inside for c in users):
        return False
    first = users[0]
    if first.eq.target.name != w:
        return False
    if any(t.name == w for t in accesses(first.eq)[1:]) and first.sem.init is None:
        return False
    pos = [x for x, _ in first.loops].index(lid)
    inner_vars = {l.var: l.extent for _, l in first.loops[pos + 1:]}
    fixed = {l.var for _, l in first.loops[: pos + 1]}
    others = {x for c in users if c is not first for x, _ in c.loops}
    own = {l.var: l.extent for x, l in first.loops[pos + 1:] if x not in others}
    region, seen = [], set()
    for e in first.eq.target.indices:
        names = _index_names(e)
        if names & seen:
            return False  # an index in two entries (a diagonal) writes no box
        seen |= names
        if isinstance(e, A.Index) and e.name in inner_vars:
            region.append((0, inner_vars[e.name] - 1))
        elif not names - fixed and not list(tensor_refs(e)):
            region.append(None)  # a fixed point: the same in every read below only if identical
        elif (span := _dense_span(e, own)) is not None:
            region.append(span)  # a cooperative fill: one element per iteration of the writer's own loops
        else:
            return False
    from ..leir.analysis import interval  # noqa: PLC0415

    for c in users:
        cpos = [x for x, _ in c.loops].index(lid)
        ranges = {l.var: (1 if j <= cpos else l.extent) for j, (_, l) in enumerate(c.loops)}
        for t in accesses(c.eq):
            if t.name != w or (c is first and t is first.eq.target):
                continue
            for d, e in enumerate(t.indices):
                if region[d] is None:
                    if e != first.eq.target.indices[d]:
                        return False
                    continue
                try:
                    lo, hi = interval(e, ranges)
                except LeirSemanticError:
                    return False
                if lo < region[d][0] or hi > region[d][1]:
                    return False
    return True


def _dense_span(e: A.Expr, own: dict[str, int]) -> tuple[int, int] | None:
    """``(lo, hi)`` when ``e`` is an affine form over loop indices of ``own`` (index ->
    extent: loops that enclose the writing equation and no reader) that takes every value
    of ``lo..hi`` exactly once (a dense mixed-radix form with positive coefficients, e.g.
    the flat index ``c*256+tx*16+ty`` of a tile that the block's threads fill
    cooperatively); ``None`` otherwise. Each run of those loops writes the whole interval
    before any reader runs."""
    f = linear_form(e)
    if f is None:
        return None
    vs = [v for v, c in f.items() if v and c != 0]
    if not vs or any(v not in own or f[v] < 0 for v in vs):
        return None
    stride = 1
    for v in sorted(vs, key=lambda x: f[x]):
        if f[v] != stride:
            return None
        stride *= own[v]
    lo = f.get("", 0)
    return lo, lo + stride - 1


def reduction_combiner(eq: A.Assign) -> str | None:
    """The commutative combiner of an accumulation ``X = X + v`` / ``X * v`` / ``max(X, v)`` /
    ``min(X, v)`` (``v`` must not read ``X``): ``"+"``, ``"*"``, ``"max"`` or ``"min"``;
    ``None`` for anything else (``X = X - v``, a plain store, and ``X`` as the second operand:
    TVM 0.27 matches the reducer syntactically, ``v + X`` is "No matched reducer"). These are
    the reducers TVM's ``LowerCrossThreadReduction`` matches (with the float ``-inf``/``inf``
    identities of :func:`steptp.backend.build.register_inf_reducers`)."""
    t, val = eq.target, eq.value
    if isinstance(val, A.BinOp) and val.op in ("+", "*"):
        op, args = val.op, (val.lhs, val.rhs)
    elif isinstance(val, A.Call) and val.func in ("max", "min") and len(val.args) == 2:
        op, args = val.func, tuple(val.args)
    else:
        return None
    if args[0] != t:
        return None
    other = args[1]
    if any(r.name == t.name for r in tensor_refs(other)):
        return None
    return op


def cross_thread_problem(lid: LoopId, c: EqContext) -> str | None:
    """Why equation ``c`` cannot be a cross-thread reduction over the ``threadIdx`` loop
    ``lid`` (``None``: it can). TVM 0.27 lowers a reduction axis bound to ``threadIdx`` to
    an all-reduce (``LowerCrossThreadReduction``: warp shuffles, shared memory across warps)
    only if (1) the update is a known combiner (:func:`reduction_combiner`), (2) the block
    initialises the accumulator itself (``T.init``: the equation's implicit initialisation
    with an injective target; without it TVM emits every thread's ``X = X + v`` as a race,
    silently) and (3) every loop inside the bound loop is a reduction axis of the equation
    (otherwise tvm.compile fails: "reduction-related loops ... the deepest")."""
    if reduction_combiner(c.eq) is None:
        return ("a cross-thread reduction needs an accumulation X=X+v, X=X*v, max(X,v) or min(X,v) "
                "(accumulator first)")
    spatial = [l.var for _, l in c.loops if l.var not in c.sem.reduction_axes]
    ext = {l.var: l.extent for _, l in c.loops}
    if c.sem.init is None or not subscript_injective(c.eq.target, spatial, ext):
        return ("a cross-thread reduction must initialise its accumulator in the same equation "
                "(the tensor is written before, or its subscript is not injective)")
    ids = [x for x, _ in c.loops]
    inner = [l for _, l in c.loops[ids.index(lid) + 1:] if l.extent > 1]
    bad = [l.var for l in inner if l.var not in c.sem.reduction_axes]
    if bad:
        return (f"loop(s) {', '.join(bad)} inside the bound reduction loop are not reduction axes "
                "(TVM needs the reduction loops innermost)")
    return None


def concurrent_loop_problems(lid: LoopId, loop: A.Loop, ctxs: list[EqContext], word: str,
                             reduction_ok: bool = False, private: dict[str, bool] | None = None) -> list[str]:
    """Problems of running the iterations of loop ``lid`` concurrently (P, V, B loops).

    (1) The loop index must not be a reduction axis of an equation inside the loop, unless
    ``reduction_ok`` (threadIdx: TVM lowers it to a cross-thread all-reduce) and the reduced
    tensor is not otherwise accessed inside the loop. (2) Every other tensor written inside
    the loop needs one subscript position where all its accesses inside the loop use the same
    affine entry that separates iterations (``v``, ``c*457+v`` with ``0 <= c < 457``...);
    otherwise iterations share elements (loop-carried dependence, race, or a read of a value
    another thread/lane writes in the same step, which differs from the sequential LEIR
    semantics the CPU verifies). ``private`` marks tensors that get one copy per iteration
    (GPU shared memory per block, local memory per thread); they pass (2) when
    :func:`_private_per_iteration` shows the copy is written before it is read.
    """
    if loop.extent <= 1:
        return []
    v = loop.var
    inside = [c for c in ctxs if any(x == lid for x, _ in c.loops)]
    if not inside:
        return []
    nest = inside[0].nest
    problems: list[str] = []
    reduced: dict[str, list[EqContext]] = {}
    for c in inside:
        if v in c.sem.reduction_axes:
            reduced.setdefault(c.eq.target.name, []).append(c)
    inner = _inner_extents(lid, inside)
    written: list[str] = []
    for c in inside:
        if c.eq.target.name not in written:
            written.append(c.eq.target.name)
    for w in written:
        if private and private.get(w) and _private_per_iteration(lid, w, inside, ctxs):
            # one copy per iteration, written before it is read there: an accumulation into it
            # (a block's tensor-core accumulator) stays within the iteration's own copy
            continue
        if w in reduced:
            users = [c for c in inside if any(t.name == w for t in accesses(c.eq))]
            only_reductions = all(c in reduced[w] for c in users)
            if reduction_ok and only_reductions:
                why = next((r for r in (cross_thread_problem(lid, x) for x in reduced[w]) if r), None)
                if why is None:
                    continue
                problems.append(f"{word} {v} (nest {nest}) runs over a reduction axis of equation "
                                f"{reduced[w][0].where()}: {why}")
                continue
            c = reduced[w][0]
            if loop.kind == "V":
                why = "TVM vectorizes reductions into wrong results"
            elif loop.kind == "P":
                why = "parallel iterations race on the accumulator"
            elif reduction_ok:
                why = "other threads read the partial result inside the same loop"
            else:
                why = "thread blocks cannot accumulate into one element (race)"
            problems.append(f"{word} {v} (nest {nest}) runs over a reduction axis of equation {c.where()}: {why}")
            continue
        acc = [t for c in inside for t in accesses(c.eq) if t.name == w]
        rank = len(acc[0].indices)
        ok = False
        if all(len(t.indices) == rank for t in acc):
            for d in range(rank):
                entries = {t.indices[d] for t in acc}
                if len(entries) == 1 and _separates(next(iter(entries)), v, inner, loop.extent):
                    ok = True
                    break
        if not ok:
            shown = sorted({format_expr(t) for t in acc})
            problems.append(f"{word} {v} (nest {nest}) writes tensor {w} at elements other iterations also "
                            f"access ({', '.join(shown[:4])}{', ...' if len(shown) > 4 else ''}): "
                            "loop-carried dependence or race")
    return problems


def loop_hazards(module_or_program, signature: Signature | None = None,
                 info: ProgramInfo | None = None) -> list[str]:
    """Reasons why a ``P``/``V`` loop would be miscompiled or race (empty list: none).

    For each parallel/vectorised loop: :func:`concurrent_loop_problems` (no reduction over
    it; every tensor written inside keeps iterations apart), and no parallel loop nested in
    a parallel loop (TVM: "Nested parallel loop is not supported").
    Source: tvm-0.27-notes §2 (t13, t13b, t51).
    """
    prog, sig = coerce_module(module_or_program, signature)
    info = info or analyze_or_raise(prog, sig)
    ctxs = eq_contexts(prog, info)
    problems: list[str] = []
    seen: dict[LoopId, A.Loop] = {}
    for c in ctxs:
        for lid, loop in c.loops:
            if loop.kind in _KIND_WORD and lid not in seen:
                seen[lid] = loop
    for lid, loop in seen.items():
        problems += concurrent_loop_problems(lid, loop, ctxs, f"{_KIND_WORD[loop.kind]} loop")
        if loop.kind == "P":
            for c in ctxs:
                ids = [x for x, _ in c.loops]
                if lid not in ids:
                    continue
                nested = [l for _, l in c.loops[ids.index(lid) + 1:] if l.kind == "P"]
                if nested:
                    problems.append(f"parallel loop {nested[0].var} is nested in parallel loop {loop.var} "
                                    f"(nest {c.nest}): TVM does not support nested parallel loops")
                    break
    return _dedupe(problems)


# ---------------------------------------------------------------------------
# GPU preflight
# ---------------------------------------------------------------------------


def _dedupe(items: list[str]) -> list[str]:
    out: list[str] = []
    for x in items:
        if x not in out:
            out.append(x)
    return out


def gpu_problems(module_or_program, signature: Signature | None = None, limits: GpuLimits = DEFAULT_GPU,
                 info: ProgramInfo | None = None) -> list[str]:
    """All GPU preflight problems of a program (empty list: the CUDA path may proceed).

    See the module docstring for the list; :func:`loop_hazards` are not included.
    Limits come from :mod:`steptp.backend.hardware` (``limits``). Pure Python, no TVM.
    """
    prog, sig = coerce_module(module_or_program, signature)
    info = info or analyze_or_raise(prog, sig)
    ctxs = eq_contexts(prog, info)
    problems: list[str] = []

    # known tensors must live in global memory
    for t in sig.tensors:
        if t.name in info.types and info.types[t.name][1] != "g":
            problems.append(f"known tensor {t.name} ({t.role}) is annotated with scope "
                            f"'{info.types[t.name][1]}', but kernel parameters live in global memory")

    kernels: dict[LoopId, list[EqContext]] = {}
    kernel_nest: dict[LoopId, int] = {}
    for c in ctxs:
        bound = [(lid, l) for lid, l in c.loops if l.kind == "B"]
        if not bound:
            problems.append(f"equation {c.where()} is not under any thread binding: "
                            "TVM would silently run it as host code on device memory")
            continue
        root = bound[0][0]
        host = [l for lid, l in c.loops[:[x for x, _ in c.loops].index(root)] if l.kind in ("P", "V")]
        if host:
            problems.append(f"{_KIND_WORD[host[0].kind]} loop {host[0].var} (nest {c.nest}) runs on the host around "
                            "a kernel launch: TVM's CUDA code generation rejects it (only serial/unrolled host loops)")
        kernels.setdefault(root, []).append(c)
        kernel_nest[root] = c.nest
        tags: dict[str, str] = {}
        for _, l in bound:
            tag = l.thread_tag
            if tag in tags:
                problems.append(f"{tag} is bound twice on one loop path ({tags[tag]}, {l.var}) in nest {c.nest}")
            tags[tag] = l.var
            if l.extent > limits.limit(tag):
                problems.append(f"loop {l.var} (nest {c.nest}) binds {tag} with extent {l.extent}, "
                                f"above the hardware limit {limits.limit(tag)} ({limits.name})")

    # vector widths the CUDA code generator can express for the dtypes a V loop touches
    seen_v: set = set()
    for c in ctxs:
        for lid, l in c.loops:
            if l.kind != "V" or l.extent <= 1:
                continue
            dts = sorted({info.dtype(t.name) for t in accesses(c.eq)})
            if (len(dts) > 1 or "bool" in dts) and (lid, "mixed") not in seen_v:
                seen_v.add((lid, "mixed"))
                problems.append(f"vectorized loop {l.var} (nest {c.nest}) around an equation of {'/'.join(dts)}: TVM's "
                                "CUDA vector code for dtype conversions and bool loads is wrong (wrong values, "
                                "misaligned addresses)")
            for dt in dts:
                lanes = CUDA_VECTOR_LANES.get(dt)
                if lanes is not None and l.extent not in lanes and (lid, dt) not in seen_v:
                    seen_v.add((lid, dt))
                    problems.append(f"vectorized loop {l.var} (nest {c.nest}) has {l.extent} lanes of {dt}: TVM's CUDA "
                                    f"code generation supports {sorted(lanes)} lanes for {dt}")

    # iterations of bound loops run concurrently
    bound_loops: dict[LoopId, A.Loop] = {}
    for c in ctxs:
        for lid, l in c.loops:
            if l.kind == "B" and lid not in bound_loops:
                bound_loops[lid] = l
    for lid, l in bound_loops.items():
        thread = is_thread_tag(l.thread_tag)
        private = {n: info.types[n][1] == "l" or (info.types[n][1] in ("s", "w") and not thread)
                   for n in info.intermediates}
        problems += concurrent_loop_problems(lid, l, ctxs, f"{l.thread_tag} loop", thread, private)

    kernel_of: dict[int, LoopId] = {}
    kernel_threads: dict[LoopId, bool] = {}
    for root, cs in kernels.items():
        nest = kernel_nest[root]
        extents: dict[str, list[tuple[LoopId, A.Loop]]] = {}
        for c in cs:
            for lid, l in c.loops:
                if l.kind == "B":
                    lst = extents.setdefault(l.thread_tag, [])
                    if all(x != lid for x, _ in lst):
                        lst.append((lid, l))
        for tag in sorted(extents):
            vals = sorted({l.extent for _, l in extents[tag]})
            if len(vals) > 1:
                first = extents[tag][0][1].extent
                problems.append(f"{tag} is bound with different extents {vals} in one kernel (nest {nest}): "
                                f"TVM would silently launch {first} and skip work")
        kernel_threads[root] = any(is_thread_tag(tag) for tag in extents)
        threads = 1
        factors = []
        for tag in ("threadIdx.x", "threadIdx.y", "threadIdx.z"):
            if tag in extents:
                e = max(l.extent for _, l in extents[tag])
                threads *= e
                factors.append(f"{tag}={e}")
        if threads > limits.max_threads_per_block:
            problems.append(f"kernel in nest {nest} uses {threads} threads per block ({' * '.join(factors)}), "
                            f"above the limit {limits.max_threads_per_block}")
        for c in cs:
            kernel_of[c.index] = root

    problems += phase_handoff_problems(kernels, kernel_nest, info)
    problems += redundant_execution_problems(kernels, kernel_nest, info)

    # shared / local intermediates: one kernel, no cross-block (shared) / cross-thread (local) access
    shared_bytes: dict[LoopId, int] = {}
    for name in info.intermediates:
        scope = info.types[name][1]
        if scope == "g":
            continue
        word = {"s": "shared", "l": "local", "w": "fragment"}[scope]
        users = [c for c in ctxs if any(t.name == name for t in accesses(c.eq))]
        roots = []
        for c in users:
            r = kernel_of.get(c.index)
            if r is not None and r not in roots:
                roots.append(r)
        if len(roots) > 1:
            nests = sorted({kernel_nest[r] for r in roots})
            problems.append(f"{word} intermediate {name} is used by {len(roots)} kernels (nests "
                            f"{', '.join(map(str, nests))}): {word} memory does not outlive a kernel")
            continue
        if not roots:
            continue
        root = roots[0]
        if scope == "w" and kernel_threads.get(root):
            problems.append(f"fragment {name} is used in nest {kernel_nest[root]}, a kernel with threadIdx loops: a "
                            f"tensor-core fragment belongs to the block's one warp, which the lowering launches "
                            f"(the kernel binds block loops only)")
            continue
        private_vars = set()
        for c in users:
            for _, l in c.loops:
                if l.kind == "B" and (scope == "l" or not is_thread_tag(l.thread_tag)):
                    private_vars.add(l.var)
        acc = [(c, t) for c in users for t in accesses(c.eq) if t.name == name]
        rank = len(info.shapes[name])
        bad = False
        for d in range(rank):
            entries = {t.indices[d] for _, t in acc}
            uses_private = any(_index_names(e) & private_vars for e in entries)
            if uses_private and len(entries) > 1:
                bad = True
        if bad:
            shown = sorted({format_expr(t) for _, t in acc})
            who = "thread" if scope == "l" else "thread block"  # a fragment: the block's warp
            problems.append(f"{word} intermediate {name} is accessed as {', '.join(shown[:4])} in nest "
                            f"{kernel_nest[root]}: {word} memory is private to one {who}")
        if scope == "s":
            shared_bytes[root] = shared_bytes.get(root, 0) + _per_block_bytes(name, acc, info)
    for root, nbytes in shared_bytes.items():
        if nbytes > limits.max_static_shared_bytes:
            problems.append(f"kernel in nest {kernel_nest[root]} needs {nbytes} bytes of shared memory per block, "
                            f"above the static limit {limits.max_static_shared_bytes}")
    return _dedupe(problems)


def _thread_loops(c: EqContext) -> tuple[tuple[LoopId, A.Loop], ...]:
    return tuple((lid, l) for lid, l in c.loops if l.kind == "B" and is_thread_tag(l.thread_tag))


def _per_thread_form(t: A.Tensor, threads: tuple[tuple[LoopId, A.Loop], ...]):
    """The subscript of access ``t`` with every threadIdx-bound index written as its tag, or
    ``None`` when some thread index of the enclosing phase is not a plain entry (then other
    threads touch the element too)."""
    names = {l.var: l.thread_tag for _, l in threads}
    plain = {e.name for e in t.indices if isinstance(e, A.Index)}
    if not set(names) <= plain:
        return None
    return tuple(A.transform(e, lambda x: A.Index(names[x.name]) if isinstance(x, A.Index) and x.name in names
                             else x) for e in t.indices)


def phase_handoff_problems(kernels: dict[LoopId, list[EqContext]], kernel_nest: dict[LoopId, int],
                           info: ProgramInfo) -> list[str]:
    """Global tensors handed between the *phases* of one kernel (sibling ``threadIdx`` loops,
    or code outside them, under the same ``blockIdx`` loops) by different threads.

    TVM 0.27 inserts ``__syncthreads()`` between phases only for ``shared`` buffers
    (``ThreadSync("shared")``; tvm-0.27-notes §3.4): with a ``global`` buffer the next phase
    reads (or overwrites) elements other threads of the block may not have written (read)
    yet, a race the sequential CPU semantics never shows (checked: ``stp lower --cuda`` of a
    row sum ``J_{bx}`` in one phase read by the next has the barrier with ``J^{f32,s}`` and
    none with ``J^{f32,g}``). A pair of accesses in different phases, one a write, passes only
    when both name every thread index of their phase as a plain entry and agree entry by
    entry once each thread index is replaced by its tag (the same thread touches the
    element in both phases). Returns one problem per (kernel, tensor)."""
    problems: list[str] = []
    for root, cs in kernels.items():
        acc = []  # (context, access, is write, phase)
        for c in cs:
            phase = tuple(lid for lid, _ in _thread_loops(c))
            for k, t in enumerate(accesses(c.eq)):
                if info.types.get(t.name, ("", "g"))[1] == "g":
                    acc.append((c, t, k == 0, phase))
        flagged: set[str] = set()
        for i, (c1, t1, w1, p1) in enumerate(acc):
            for c2, t2, w2, p2 in acc[i + 1:]:
                if t2.name != t1.name or t1.name in flagged or p1 == p2 or not (w1 or w2):
                    continue
                f1, f2 = _per_thread_form(t1, _thread_loops(c1)), _per_thread_form(t2, _thread_loops(c2))
                if f1 is not None and f1 == f2:
                    continue
                flagged.add(t1.name)
                problems.append(f"global tensor {t1.name} is handed between phases of the kernel in nest "
                                f"{kernel_nest[root]} by different threads ({format_expr(t1)} in {c1.where()}, "
                                f"{format_expr(t2)} in {c2.where()}): TVM puts no barrier between phases for "
                                "global memory (a shared-scope buffer gets __syncthreads)")
    return problems


def redundant_execution_problems(kernels: dict[LoopId, list[EqContext]], kernel_nest: dict[LoopId, int],
                                 info: ProgramInfo) -> list[str]:
    """Read-modify-write equations that every thread (or block) of an axis they are not bound
    to runs at once.

    A thread or block axis bound anywhere in a kernel is part of its launch: an equation of
    the kernel outside that axis's loop (another phase) runs in each of its threads (blocks),
    unguarded (checked: ``stp lower --cuda`` of ``B^{2}_{bxa}[L^{8}L^{4}[X_{bxa}=X_{bxa}+..];
    B^{8}_{txa}L^{4}[..]]`` gives the ``X`` loop with no ``threadIdx`` test). A store of the
    same value by each is harmless, and so is TVM's cross-thread all-reduce (a reduction loop
    bound to a thread axis: TVM groups the other threads, each group reducing alike), but a
    read-modify-write of one element (``X = X + ..``) by concurrent copies loses or repeats
    updates on the GPU while the CPU's sequential semantics runs it once. Threads not bound
    matter for ``shared`` and ``global`` targets, blocks not bound for ``global`` targets only
    (each block has its own shared memory); ``local`` targets are per thread. Returns one
    problem per (kernel, equation)."""
    problems: list[str] = []
    for root, cs in kernels.items():
        tags: dict[str, int] = {}
        for c in cs:
            for _, l in c.loops:
                if l.kind == "B":
                    tags.setdefault(l.thread_tag, l.extent)
        for c in cs:
            scope = info.types.get(c.eq.target.name, ("", "g"))[1]
            if scope == "l" or not any(t.name == c.eq.target.name for t in accesses(c.eq)[1:]):
                continue
            own = {l.thread_tag for _, l in c.loops if l.kind == "B"}
            target_vars = set().union(*map(_index_names, c.eq.target.indices))
            if any(l.var not in target_vars for _, l in _thread_loops(c)):
                continue  # a cross-thread all-reduce: TVM groups the other threads
            missing = [t for t in tags if t not in own and (scope == "g" or is_thread_tag(t))]
            if missing:
                who = ", ".join(f"{t} ({tags[t]})" for t in missing)
                problems.append(f"{c.where()} updates {c.eq.target.name} in place but is not under the kernel's "
                                f"{who} binding: every thread (block) of that axis runs it at once, and their "
                                "updates of one element race on the GPU")
    return problems


def _index_names(e: A.Expr) -> set[str]:
    return {x.name for x in A.walk(e) if isinstance(x, A.Index)}


def _per_block_bytes(name: str, acc, info: ProgramInfo) -> int:
    """Bytes of ``name`` one thread block touches: the interval of every subscript with the
    blockIdx-bound indices fixed (what TVM's buffer compaction allocates as __shared__)."""
    from ..leir.analysis import interval

    shape = info.shapes[name]
    lo = [math.inf] * len(shape)
    hi = [-math.inf] * len(shape)
    for c, t in acc:
        ranges = {l.var: (1 if (l.kind == "B" and not is_thread_tag(l.thread_tag)) else l.extent)
                  for _, l in c.loops}
        for d, e in enumerate(t.indices):
            try:
                a, b = interval(e, ranges)
            except LeirSemanticError:
                a, b = 0, shape[d] - 1
            lo[d] = min(lo[d], max(a, 0))
            hi[d] = max(hi[d], min(b, shape[d] - 1))
    n = 1
    for d in range(len(shape)):
        n *= int(hi[d] - lo[d] + 1) if hi[d] >= lo[d] else 1
    return n * A.DTYPE_BYTES.get(info.types[name][0], 8)


def preflight(module_or_program, signature: Signature | None = None, limits: GpuLimits = DEFAULT_GPU) -> None:
    """Run :func:`loop_hazards` and :func:`gpu_problems`; raise :class:`PreflightError`
    (``problems`` = every reason) if any fire. LEIR semantic errors raise
    :class:`LoweringError`. Call before :func:`steptp.backend.build.cuda_source` / nvcc."""
    prog, sig = coerce_module(module_or_program, signature)
    info = analyze_or_raise(prog, sig)
    problems = loop_hazards(prog, sig, info) + gpu_problems(prog, sig, limits, info)
    if problems:
        raise PreflightError(problems)


__all__ = ["coerce_module", "analyze_or_raise", "EqContext", "eq_contexts", "accesses", "linear_form",
           "subscript_injective", "concurrent_loop_problems", "reduction_combiner", "cross_thread_problem",
           "loop_hazards", "gpu_problems", "phase_handoff_problems", "preflight"]
