"""LEIR -> TVMScript text (TVM 0.27 S-TIR dialect), deterministic.

The text is what the dataset stores as "TIR" and what :mod:`steptp.backend.build` parses
with ``tvm.script.from_source`` (tvm-0.27-notes §1.2). Same LEIR + signature + target
gives the same bytes: everything is emitted in program order, nothing iterates a set.

Shape of the output (paper §3, reference-notes §3, rewritten for TVM 0.27)::

    @I.ir_module
    class Module:
        @T.prim_func(s_tir=True)
        def main(A: T.Buffer((8, 12), "float32"), W: ..., C: ...):     # signature header order
            D = T.alloc_buffer((8, 16), "float32")                      # global intermediates
            with T.sblock("root"):                                      # only if s/l intermediates
                S = T.sblock_alloc_buffer((8,), "float32", scope="shared")
                for tx in T.thread_binding(8, thread="threadIdx.x"):   # CPU path: range(8)
                    for a in range(16):
                        for c in range(12):
                            with T.sblock("D"):
                                v_tx, v_a, v_c = T.axis.remap("SSR", [tx, a, c])
                                with T.init():
                                    D[v_tx, v_a] = T.float32(0.0)
                                D[v_tx, v_a] = D[v_tx, v_a] + A[v_tx, v_c] * W[v_a, v_c]

Decisions (all follow the LEIR semantics of :mod:`steptp.leir.analysis`):

* **Blocks.** One ``T.sblock`` per equation, named after its target (``D``, ``D_1``...).
  One block iterator per enclosing loop, outermost first: reduce (``R``) if the loop index
  is one of the equation's reduction axes, spatial (``S``) otherwise.
* **Implicit init.** ``EqSemantics.init`` becomes ``with T.init():`` when the target
  subscript is provably injective in the spatial indices (TVM runs the init once per
  spatial point, when all reduce iterators are 0). Otherwise (``D_{tx//2}=D_{tx//2}+...``,
  where TVM would re-initialise on every spatial point) a separate ``<name>_init`` block
  over the equation's spatial loops fills the target with the identity right before the
  top-level nest.
* **Allocation.** Global intermediates: ``T.alloc_buffer`` at the function root (host
  allocation, passed to kernels). Shared/local intermediates: ``T.sblock_alloc_buffer`` in
  an explicit root block; TVM's allocation planning then moves them into the kernel and
  compacts them to ``__shared__``/register arrays (tvm-0.27-notes §3.4, t19e). The same
  text runs on CPU (scopes are plain memory there, notes §2.1).
* **Loops.** ``L``/``P``/``V``/``U``/``B`` -> ``range``/``T.parallel``/``T.vectorized``/
  ``T.unroll``/``T.thread_binding(n, thread=Loop.thread_tag)``; on the CPU path bound
  loops are serial ``range`` loops (notes §2.1: exact because the lowering never emits
  barriers). Parallel/vectorised hazards are rejected first (:func:`preflight.loop_hazards`).
* **Types.** Expressions are typed bottom-up (tensors: their dtype; literals and loop
  indices are *weak* and take the type of what they meet; ``/`` is true division; float
  beats int, wider beats narrower). Every constant is printed with its dtype
  (``T.float16(0.5)``, ``T.float32("-inf")``, integer ``inf`` -> ``T.max_value``), every
  loop index used as a value is cast, and the right-hand side is cast to the target dtype
  only where types differ, so an f16 program computes in f16 (notes §2, t21b).
* **Operators.** ``//``/``%``: ``T.floordiv``/``T.floormod`` on integers (Python
  semantics), ``T.floor(a/b)`` and ``a - T.floor(a/b)*b`` on floats; ``**`` -> ``T.pow``;
  ``exp log sqrt abs erf tanh max min`` -> ``T.*``; ``if_then_else`` -> ``T.if_then_else``
  (lazy: the unselected branch is not evaluated, so guarded reads are safe); conditions use
  ``< <= > >= == !=`` and ``and``/``or``/``not``. fp16 ``erf`` is computed as
  ``T.Cast(dt, T.erf(T.Cast("float32", x)))`` on every target (LLVM has no fp16 erf,
  notes §2, and the two forms must differ only in thread bindings); bfloat16 math
  functions, ``**`` and floor are computed the same way on every target (TVM 0.27 rejects
  ``T.pow`` & co. on bfloat16), i.e. in float32 rounded once to bfloat16, which is what
  PyTorch does for bfloat16 ops.
* **Names.** Buffers keep their LEIR names, loop variables too (block iterators get a
  ``v_`` prefix); a name that would clash with TVMScript (``T``, ``I``, ``R``, Python
  keywords, ``range``...) gets ``_`` appended.
"""

from __future__ import annotations

import keyword
import math
from dataclasses import dataclass

from ..leir import ast as A
from ..leir.analysis import ProgramInfo, tensor_refs
from ..leir.fileformat import Signature
from ..leir.printer import format_assign, format_expr
from .errors import LoweringError
from .preflight import EqContext, analyze_or_raise, coerce_module, eq_contexts, loop_hazards, subscript_injective

TARGETS = ("cpu", "cuda")

#: LEIR dtype codes this backend lowers (complex/fp8/str codes of the reference are not).
SUPPORTED_DTYPES = ("f16", "bf16", "f32", "f64", "i8", "i16", "i32", "i64", "u8", "u16", "u32", "u64", "bool")

_FLOAT_BITS = {"float16": 16, "bfloat16": 16, "float32": 32, "float64": 64}
_INT_BITS = {"int8": 8, "int16": 16, "int32": 32, "int64": 64, "uint8": 8, "uint16": 16, "uint32": 32, "uint64": 64}
WEAK_INT = "~int"      # integer literal or loop index: adopts the type it meets
WEAK_FLOAT = "~float"  # float literal (or a true division of weak ints)
DEFAULT_FLOAT = "float64"

_RESERVED = {"T", "I", "R", "Axis", "Module", "True", "False", "None", "range", "tvm", "tirx", "main"}
_LOOP_FUNCS = {"L": "range", "P": "T.parallel", "V": "T.vectorized", "U": "T.unroll"}
_CMP = {"<": "<", "<=": "<=", ">": ">", ">=": ">=", "==": "==", "!=": "!="}


def tvm_dtype(code: str) -> str:
    """TVM/numpy dtype name of a LEIR dtype code (``f32`` -> ``float32``); LoweringError if unsupported."""
    if code not in SUPPORTED_DTYPES:
        raise LoweringError(f"dtype '{code}' is not supported by the backend")
    return A.DTYPES[code]


def is_float(t: str) -> bool:
    return t in _FLOAT_BITS or t == WEAK_FLOAT


def is_intlike(t: str) -> bool:
    return t in _INT_BITS or t == "bool" or t == WEAK_INT


def promote(a: str, b: str) -> str:
    """Result type of a binary arithmetic operation on types ``a`` and ``b``."""
    if a == b:
        return a
    for x, y in ((a, b), (b, a)):
        if x == WEAK_INT:
            return "int32" if y == "bool" else y
    for x, y in ((a, b), (b, a)):
        if x == WEAK_FLOAT:
            return y if y in _FLOAT_BITS else WEAK_FLOAT
    if a in _FLOAT_BITS and b in _FLOAT_BITS:
        if _FLOAT_BITS[a] == _FLOAT_BITS[b]:
            return "float32"  # float16 vs bfloat16
        return a if _FLOAT_BITS[a] > _FLOAT_BITS[b] else b
    if a in _FLOAT_BITS:
        return a
    if b in _FLOAT_BITS:
        return b
    if a == "bool":
        return b
    if b == "bool":
        return a
    sa, sb = not a.startswith("u"), not b.startswith("u")
    ba, bb = _INT_BITS[a], _INT_BITS[b]
    if sa == sb:
        return a if ba >= bb else b
    signed_bits, unsigned_bits = (ba, bb) if sa else (bb, ba)
    bits = signed_bits if signed_bits > unsigned_bits else min(64, 2 * unsigned_bits)
    return f"int{bits}"


def resolve(t: str, want: str) -> str:
    """Concrete type in which an expression of inferred type ``t`` is computed, given the
    type ``want`` its context asks for."""
    if t == WEAK_INT:
        return "int32" if want == "bool" or want in (WEAK_INT, WEAK_FLOAT) else want
    if t == WEAK_FLOAT:
        return want if want in _FLOAT_BITS else DEFAULT_FLOAT
    return t


def _fmt_float(v: float) -> str:
    r = repr(float(v))
    return r


def const(dtype: str, v: float | int) -> str:
    """A typed TVMScript constant (``T.float16(0.5)``, ``T.float32("-inf")``, ``3`` for int32)."""
    if dtype in _FLOAT_BITS:
        if isinstance(v, float) and math.isinf(v):
            return f'T.{dtype}("{"inf" if v > 0 else "-inf"}")'
        if isinstance(v, float) and math.isnan(v):
            return f'T.{dtype}("nan")'
        return f"T.{dtype}({_fmt_float(v)})"
    if dtype == "bool":
        if isinstance(v, float) and math.isinf(v):
            return f"T.bool({v > 0})"
        return f"T.bool({bool(v)})"
    if dtype in _INT_BITS:
        if isinstance(v, float) and math.isinf(v):
            return f'T.{"max_value" if v > 0 else "min_value"}("{dtype}")'
        iv = int(v)
        if dtype == "int32":
            return str(iv) if iv >= 0 else f"({iv})"
        return f"T.{dtype}({iv})"
    raise LoweringError(f"cannot form a constant of type {dtype}")


@dataclass
class Lowered:
    """Result of :func:`lower_module`: the text plus what build/run need to call it.

    ``params``: (LEIR name, TIR buffer name) per function parameter, signature header
    order. ``info``: the analysis the lowering used.
    """

    text: str
    target: str
    signature: Signature
    params: tuple[tuple[str, str], ...]
    info: ProgramInfo


class _Namer:
    """Deterministic, collision-free Python identifiers for buffers and loop variables."""

    def __init__(self, prog: A.Program, sig: Signature, info: ProgramInfo):
        self.used: set[str] = set()
        self.buf: dict[str, str] = {}
        self.loop: dict[str, str] = {}
        names = list(sig.names) + [n for n in info.intermediates if n not in sig.names]
        loop_names: list[str] = []
        for sem in info.equations:
            for l in sem.inst.loops:
                if l.var not in loop_names:
                    loop_names.append(l.var)
        taken = set(names) | set(loop_names)
        for n in names:
            self.buf[n] = self._safe(n, taken)
        for n in loop_names:
            self.loop[n] = self._safe(n, taken)

    def _safe(self, n: str, taken: set[str]) -> str:
        cand = n
        if cand in _RESERVED or keyword.iskeyword(cand) or keyword.issoftkeyword(cand):
            cand = n + "_"
        elif cand.startswith("v_"):
            cand = "l" + n
        while cand in self.used or (cand != n and cand in taken):
            cand += "_"
        self.used.add(cand)
        return cand

    def iv(self, loop_var: str) -> str:
        """Block iterator name of a loop index."""
        return "v_" + self.loop[loop_var]


#: Bit patterns of the quiet NaNs that fill buffers in a poisoned build (``lower_module(...,
#: poison=True)``): a kernel that reads an element nothing wrote, or leaves an output
#: element unwritten, carries this exact pattern into its outputs (x86 and LLVM propagate a
#: NaN operand's payload). Default NaNs (``log(-1)``) have other payloads.
from .poison import POISON_BITS  # noqa: E402  (one table: verification here, GPU runs there)


#: Annotations of the verification form (``poison=True``), never in stored TIR: a bound
#: loop, serial on the CPU, carries its thread tag; a poison fill block carries a marker.
#: :func:`steptp.backend.build.gpu_form` turns the parsed verification form into the GPU
#: form with them (one TVMScript parse per candidate instead of two).
THREAD_MARK = "stp.thread_binding"
POISON_MARK = "stp.poison"


#: Cephes ``expf`` (the constants of TVM's ``topi.fast_exp``): exp(x) = 2^n * p(f) with
#: n = floor(x*log2(e) + 1/2), f = x - n*ln 2 (ln 2 in two parts), p a degree-7 polynomial;
#: x clamped to [FAST_EXP_LO, FAST_EXP_HI] first (below: 0; above: overflows to inf)
FAST_EXP_LO, FAST_EXP_HI = -87.33654, 89.0
_FAST_EXP_POLY = (1.9875691500e-4, 1.3981999507e-3, 8.3334519073e-3, 4.1665795894e-2, 1.6666665459e-1,
                  5.0000001201e-1)


class _Emitter:
    poison = False
    #: performance form only (``lower_module(..., fast_exp=True, vector_lanes=w)``):
    #: float32 ``exp`` inside a ``V`` loop as the polynomial :data:`_FAST_EXP_POLY` (LLVM
    #: has no vector ``expf`` and calls libm once per lane), and ``V`` loops longer than
    #: ``split_above`` lanes split into a serial loop over a vectorised loop of ``w`` lanes (and
    #: a tail, :meth:`_loops`)
    fast_exp = False
    vector_lanes = 0
    split_above = 0

    def __init__(self, prog: A.Program, sig: Signature, info: ProgramInfo, target: str):
        self.prog, self.sig, self.info, self.target = prog, sig, info, target
        self.names = _Namer(prog, sig, info)
        self.lines: list[str] = []
        self.block_names: set[str] = set()
        self.ctx: EqContext | None = None
        self.split: dict[str, str] = {}                    # split V loop var -> its index expression
        self.lets: list[str] = []                          # let bindings before the current store
        self.vector_eq = False                             # fast exp applies to the current equation
        self.wide = False                                  # the current equation writes a fragment (w)
        self.fragments = fragment_scopes(prog, info, target)
        self.warp_kernels = {id(n) for n in prog.nests
                             if target == "cuda" and _uses_fragments(n)}
        self.types = {n: tvm_dtype(dt) for n, (dt, _s) in info.types.items()}
        for t in sig.tensors:
            self.types[t.name] = tvm_dtype(t.dtype)

    # ----------------------------------------------------------------- types
    def infer(self, e: A.Expr) -> str:
        if isinstance(e, A.Int) or isinstance(e, A.Index):
            return WEAK_INT
        if isinstance(e, A.Float):
            return WEAK_FLOAT
        if isinstance(e, A.Tensor):
            return self.types[e.name]
        if isinstance(e, A.Neg):
            t = self.infer(e.operand)
            return "int32" if t == "bool" else t
        if isinstance(e, A.BinOp):
            t = promote(self.infer(e.lhs), self.infer(e.rhs))
            if e.op in ("/", "**"):
                return WEAK_FLOAT if is_intlike(t) else t
            if t == "bool":
                return "int32"
            return t
        if isinstance(e, A.Call):
            if e.func in ("exp", "log", "sqrt", "erf", "tanh"):
                t = self.infer(e.args[0])
                return WEAK_FLOAT if is_intlike(t) else t
            if e.func == "abs":
                return self.infer(e.args[0])
            if e.func in ("max", "min"):
                return promote(self.infer(e.args[0]), self.infer(e.args[1]))
            if e.func == "if_then_else":
                return promote(self.infer(e.args[1]), self.infer(e.args[2]))
        if isinstance(e, (A.Compare, A.BoolOp, A.Not)):
            return "bool"
        raise LoweringError(f"unsupported expression {format_expr(e)!r}{self._where()}")

    def _where(self) -> str:
        return f" in equation {self.ctx.where()}" if self.ctx else ""

    # ------------------------------------------------------------ expressions
    def emit(self, e: A.Expr, want: str) -> str:
        """Text of ``e`` with TVM type exactly ``want`` (casting if needed)."""
        t = self.infer(e)
        if want == "bool" and isinstance(e, (A.Int, A.Float)):
            return const("bool", e.value)
        if t == WEAK_INT and not isinstance(e, A.Int) and want not in _INT_BITS:
            r = "int32"  # integer arithmetic of indices/literals stays integer (floor semantics), cast once
        elif self.wide and is_float(t) and is_float(want) and not isinstance(e, A.Tensor):
            r = want  # a fragment's equation: operands cast to the target's dtype first (exact products)
        else:
            r = resolve(t, want)
        s = self.emit_as(e, r)
        return self.cast(s, r, want)

    def cast(self, s: str, have: str, want: str) -> str:
        if have == want:
            return s
        if want == "bool":
            return f"({s} != {const(have, 0)})"
        return f'T.Cast("{want}", {_strip(s)})'

    def emit_as(self, e: A.Expr, r: str) -> str:
        if isinstance(e, A.Int):
            return const(r, e.value)
        if isinstance(e, A.Float):
            if r in _INT_BITS and not math.isinf(e.value) and e.value != int(e.value):
                raise LoweringError(f"float literal {e.value} used as an integer{self._where()}")
            return const(r, e.value)
        if isinstance(e, A.Index):
            s = self.names.iv(e.name)
            return s if r == "int32" else f'T.Cast("{r}", {s})'
        if isinstance(e, A.Tensor):
            return self.load(e)
        if isinstance(e, A.Neg):
            if isinstance(e.operand, A.Float) and math.isinf(e.operand.value):
                return const(r, -e.operand.value)
            if isinstance(e.operand, (A.Int, A.Float)) and (r in _FLOAT_BITS or r in _INT_BITS):
                return const(r, -e.operand.value)
            return f"(-{self.emit(e.operand, r)})"
        if isinstance(e, A.BinOp):
            return self.binop(e, r)
        if isinstance(e, A.Call):
            return self.call(e, r)
        if isinstance(e, A.Compare):
            ct = resolve(promote(self.infer(e.lhs), self.infer(e.rhs)), WEAK_INT)
            return f"({self.emit(e.lhs, ct)} {_CMP[e.op]} {self.emit(e.rhs, ct)})"
        if isinstance(e, A.BoolOp):
            return f"({self.emit(e.lhs, 'bool')} {e.op} {self.emit(e.rhs, 'bool')})"
        if isinstance(e, A.Not):
            return f"(not {self.emit(e.operand, 'bool')})"
        raise LoweringError(f"unsupported expression {format_expr(e)!r}{self._where()}")

    def binop(self, e: A.BinOp, r: str) -> str:
        a, b = self.emit(e.lhs, r), self.emit(e.rhs, r)
        if e.op in ("+", "-", "*"):
            return f"({a} {e.op} {b})"
        if e.op == "/":
            if not is_float(r):
                raise LoweringError(f"true division computed in {r}{self._where()}")
            return f"({a} / {b})"
        if e.op == "//":
            if r == "bfloat16":
                return f'T.Cast("{r}", T.floor(T.Cast("float32", {a} / {b})))'
            return f"T.floor({a} / {b})" if is_float(r) else f"T.floordiv({_strip(a)}, {_strip(b)})"
        if e.op == "%":
            if r == "bfloat16":
                return f'({a} - T.Cast("{r}", T.floor(T.Cast("float32", {a} / {b}))) * {b})'
            return f"({a} - T.floor({a} / {b}) * {b})" if is_float(r) else f"T.floormod({_strip(a)}, {_strip(b)})"
        if e.op == "**":
            if r == "bfloat16":
                return f'T.Cast("{r}", T.pow(T.Cast("float32", {_strip(a)}), T.Cast("float32", {_strip(b)})))'
            return f"T.pow({_strip(a)}, {_strip(b)})"
        raise LoweringError(f"unsupported operator {e.op!r}{self._where()}")

    def call(self, e: A.Call, r: str) -> str:
        f = e.func
        if f == "exp" and r == "float32" and self.fast_exp and self.vector_eq:
            return self.fast_exp_text(self.emit(e.args[0], r))
        if f == "if_then_else":
            c = _strip(self.emit(e.args[0], "bool"))
            a, b = _strip(self.emit(e.args[1], r)), _strip(self.emit(e.args[2], r))
            return f"T.if_then_else({c}, {a}, {b})"
        if f in ("exp", "log", "sqrt", "tanh", "erf"):
            x = self.emit(e.args[0], r)
            # bf16 math, and fp16 erf (no LLVM intrinsic), compute in f32 on every target, so the
            # CPU and GPU forms differ only in thread bindings (see build.gpu_form)
            if r == "bfloat16" or (f == "erf" and r == "float16"):
                return f'T.Cast("{r}", T.{f}(T.Cast("float32", {_strip(x)})))'
            return f"T.{f}({_strip(x)})"
        if f == "abs":
            return f"T.abs({_strip(self.emit(e.args[0], r))})"
        if f in ("max", "min") and r == "bool":  # TVM has no bool max/min: or / and
            op = "or" if f == "max" else "and"
            return f"({self.emit(e.args[0], r)} {op} {self.emit(e.args[1], r)})"
        if f in ("max", "min"):
            return f"T.{f}({_strip(self.emit(e.args[0], r))}, {_strip(self.emit(e.args[1], r))})"
        raise LoweringError(f"unsupported function {f!r}{self._where()}")

    def fast_exp_text(self, x: str) -> str:
        """float32 exp(x) as the Cephes polynomial (:data:`_FAST_EXP_POLY`), with let
        bindings for the clamped argument, n and f (relative error <= 3e-7 on the normal
        range; exp(-inf) = 0, exp(+inf) = inf; a NaN argument may not propagate)."""
        k = len(self.lets) // 3
        xc, n, fr = f"_fe{k}_x", f"_fe{k}_n", f"_fe{k}_f"
        c = lambda v: const("float32", v)  # noqa: E731
        self.lets += [f"{xc}: T.let = T.min(T.max({_strip(x)}, {c(FAST_EXP_LO)}), {c(FAST_EXP_HI)})",
                      f"{n}: T.let = T.floor({xc} * {c(1.4426950408889634)} + {c(0.5)})",
                      f"{fr}: T.let = {xc} - {n} * {c(0.693359375)} + {n} * {c(2.12194440e-4)}"]
        p = c(_FAST_EXP_POLY[0])
        for coef in _FAST_EXP_POLY[1:]:
            p = f"({p} * {fr} + {c(coef)})"
        scale = f'T.reinterpret("float32", T.shift_left(T.Cast("int32", {n}) + 126, 23))'
        return f"(({p} * {fr} * {fr} + {fr} + {c(1.0)}) * {scale} * {c(2.0)})"

    def index(self, e: A.Expr) -> str:
        t = self.infer(e)
        if t == WEAK_INT or t == "bool":
            t = "int32"
        if t not in _INT_BITS:
            raise LoweringError(f"subscript {format_expr(e)!r} is not an integer expression{self._where()}")
        return self.emit(e, t)

    def load(self, t: A.Tensor) -> str:
        name = self.names.buf[t.name]
        if not t.indices:
            return f"{name}[()]"
        return f"{name}[{', '.join(_strip(self.index(i)) for i in t.indices)}]"

    # ------------------------------------------------------------ statements
    def out(self, depth: int, s: str) -> None:
        self.lines.append("    " * depth + s)

    def block_name(self, base: str) -> str:
        name, k = base, 0
        while name in self.block_names:
            k += 1
            name = f"{base}_{k}"
        self.block_names.add(name)
        return name

    def loop_header(self, l: A.Loop) -> str:
        v = self.names.loop[l.var]
        if l.kind == "B":
            if self.target == "cuda":
                return f'for {v} in T.thread_binding({l.extent}, thread="{l.thread_tag}"):'
            if self.poison:  # verification form: the GPU form is derived from it (build.gpu_form)
                return f'for {v} in T.serial({l.extent}, annotations={{"{THREAD_MARK}": "{l.thread_tag}"}}):'
            return f"for {v} in range({l.extent}):"
        return f"for {v} in {_LOOP_FUNCS[l.kind]}({l.extent}):"

    def iter_vars(self, depth: int, loops, reduce: set[str], split: bool = True) -> None:
        if not loops:
            return
        ivs = [self.names.iv(l.var) for l in loops]
        kinds = "".join("R" if l.var in reduce else "S" for l in loops)
        if split and any(l.var in self.split for l in loops):
            for iv, k, l in zip(ivs, kinds, loops):
                src = self.split.get(l.var) or self.names.loop[l.var]
                self.out(depth, f"{iv} = T.axis.{'reduce' if k == 'R' else 'spatial'}({l.extent}, {src})")
            return
        if len(loops) == 1:
            axis = "reduce" if kinds == "R" else "spatial"
            self.out(depth, f"{ivs[0]} = T.axis.{axis}({loops[0].extent}, {self.names.loop[loops[0].var]})")
        else:
            srcs = ", ".join(self.names.loop[l.var] for l in loops)
            self.out(depth, f'{", ".join(ivs)} = T.axis.remap("{kinds}", [{srcs}])')

    def store(self, target: A.Tensor, value_text: str) -> str:
        return f"{self.load(target)} = {value_text}"

    def equation(self, depth: int, c: EqContext, use_tinit: bool) -> None:
        self.ctx = c
        loops = [l for _, l in c.loops]
        red = set(c.sem.reduction_axes)
        tdt = self.types[c.eq.target.name]
        self.out(depth, f'with T.sblock("{self.block_name(c.eq.target.name)}"):')
        self.iter_vars(depth + 1, loops, red)
        if c.sem.init is not None and use_tinit:
            self.out(depth + 1, "with T.init():")
            self.out(depth + 2, self.store(c.eq.target, const(tdt, c.sem.init)))
        # TVM 0.27's vectoriser scalarises a store holding an if_then_else and then loses the
        # let bindings before it ("variables ... are used, but are not passed in"): such an
        # equation keeps T.exp
        self.vector_eq = any(l.kind == "V" for l in loops) and not any(
            isinstance(x, A.Call) and x.func == "if_then_else" for x in A.walk(c.eq.value))
        self.lets = []
        self.wide = c.eq.target.scope == "w"
        value = _strip(self.emit(c.eq.value, tdt))
        for let in self.lets:
            self.out(depth + 1, let)
        self.out(depth + 1, self.store(c.eq.target, value))
        self.ctx, self.vector_eq, self.lets, self.wide = None, False, [], False

    def init_nest(self, depth: int, c: EqContext) -> int:
        """Separate identity fill for an accumulation whose target is not injective."""
        self.ctx = c
        spatial = [l for _, l in c.loops if l.var not in c.sem.reduction_axes]
        written_here = {x.eq.target.name for x in self._nest_ctxs[c.nest]}
        sub_reads = {t.name for i in c.eq.target.indices for t in tensor_refs(i)}
        if sub_reads & written_here:
            raise LoweringError(f"cannot place the implicit initialisation of {c.eq.target.name} before nest {c.nest}: "
                                f"its subscript reads {sorted(sub_reads & written_here)} computed in the same nest")
        if self.target == "cuda" and not any(l.kind == "B" for l in spatial):
            raise LoweringError(f"the implicit initialisation of {c.eq.target.name} in {c.where()} needs its own "
                                "kernel, but the equation's spatial loops carry no thread binding")
        d = depth
        for l in spatial:
            kind = "B" if l.kind == "B" else "L"
            self.out(d, self.loop_header(A.Loop(kind, l.extent, l.var)))
            d += 1
        self.out(d, f'with T.sblock("{self.block_name(c.eq.target.name + "_init")}"):')
        self.iter_vars(d + 1, spatial, set(), split=False)
        self.out(d + 1, self.store(c.eq.target, const(self.types[c.eq.target.name], c.sem.init)))
        self.ctx = None
        return d

    def poison_fill(self, depth: int, name: str) -> None:
        """Fill a floating-point intermediate with :data:`POISON_BITS` before the program runs."""
        dt = self.types[name]
        if dt not in POISON_BITS:
            return
        bits_t, bits = POISON_BITS[dt]
        shape = self.info.shapes[name]
        d = depth
        loops = [A.Loop("L", n, f"_pz{i}") for i, n in enumerate(shape)]
        for i, n in enumerate(shape):
            self.out(d, f"for _pz{i} in range({n}):")
            d += 1
        self.out(d, f'with T.sblock("{self.block_name(name + "_poison")}"):')
        self.out(d + 1, f'T.sblock_attr({{"{POISON_MARK}": 1}})')
        ivs = [f"v__pz{i}" for i in range(len(shape))]
        if len(loops) == 1:
            self.out(d + 1, f"{ivs[0]} = T.axis.spatial({shape[0]}, _pz0)")
        elif loops:
            self.out(d + 1, f'{", ".join(ivs)} = T.axis.remap("{"S" * len(loops)}", [{", ".join(l.var for l in loops)}])')
        target = f"{self.names.buf[name]}[{', '.join(ivs)}]" if ivs else f"{self.names.buf[name]}[()]"
        self.out(d + 1, f'{target} = T.reinterpret("{dt}", T.{bits_t}({bits}))')

    # ------------------------------------------------------------- program
    def run(self) -> str:
        prog, sig, info = self.prog, self.sig, self.info
        ctxs = eq_contexts(prog, info)
        self._nest_ctxs: dict[int, list[EqContext]] = {}
        for c in ctxs:
            self._nest_ctxs.setdefault(c.nest, []).append(c)
        use_tinit: dict[int, bool] = {}
        for c in ctxs:
            if c.sem.init is None:
                continue
            spatial = [l.var for _, l in c.loops if l.var not in c.sem.reduction_axes]
            ext = {l.var: l.extent for _, l in c.loops}
            use_tinit[c.index] = subscript_injective(c.eq.target, spatial, ext)

        params = []
        for t in sig.tensors:
            shape = "(" + ", ".join(str(s) for s in t.shape) + ("," if len(t.shape) == 1 else "") + ")"
            params.append(f'{self.names.buf[t.name]}: T.Buffer({shape}, "{tvm_dtype(t.dtype)}")')
        self.out(0, "@I.ir_module")
        self.out(0, "class Module:")
        self.out(1, "@T.prim_func(s_tir=True)")
        self.out(1, f"def main({', '.join(params)}):")
        depth = 2
        glob, block_alloc = [], []
        for n in info.intermediates:
            scope = info.types[n][1]
            (glob if scope == "g" else block_alloc).append(n)
        for n in glob:
            self.out(depth, f'{self.names.buf[n]} = T.alloc_buffer({_shape(info.shapes[n])}, "{self.types[n]}")')
        if block_alloc:
            self.out(depth, 'with T.sblock("root"):')
            depth += 1
            for n in block_alloc:
                scope = self.fragments.get(n) or A.SCOPES[info.types[n][1]]
                self.out(depth, f'{self.names.buf[n]} = T.sblock_alloc_buffer({_shape(info.shapes[n])}, '
                                f'"{self.types[n]}", scope="{scope}")')
        self.block_names = set()
        if self.poison:
            for n in info.intermediates:
                self.poison_fill(depth, n)
        k = 0
        for n, nest in enumerate(prog.nests):
            for c in self._nest_ctxs.get(n, []):
                if c.sem.init is not None and not use_tinit[c.index]:
                    self.init_nest(depth, c)
            k = self.nest(depth, nest, ctxs, k, use_tinit)
        if not prog.nests:
            self.out(depth, "T.evaluate(0)")
        return "\n".join(self.lines) + "\n"

    def nest(self, depth: int, nest: A.Nest, ctxs: list[EqContext], k: int, use_tinit: dict[int, bool]) -> int:
        if self.target == "cuda" and self.fragments and is_fragment_op(nest):
            self.ctx = ctxs[k]
            self.fragment_op(depth, nest)
            self.ctx = None
            return k + 1
        return self._loops(depth, nest, 0, ctxs, k, use_tinit)

    # ------------------------------------------------------- tensor cores
    def _affine(self, e: A.Expr) -> str:
        """An integer-affine index expression with the loops' own names (an opaque block)."""
        if isinstance(e, A.Int):
            return str(e.value)
        if isinstance(e, A.Index):
            return self.names.loop[e.name]
        if isinstance(e, A.BinOp) and e.op in ("+", "-", "*"):
            return f"({self._affine(e.lhs)} {e.op} {self._affine(e.rhs)})"
        raise LoweringError(f"fragment access {format_expr(e)!r} is not an affine index{self._where()}")

    def _tile_access(self, t: A.Tensor, rows: str, cols: str) -> tuple[str, str, str, int, str]:
        """``(pointer offset, region, layout, leading dimension, element count)`` of the 16x16
        tile of tensor access ``t`` that fragment loops ``rows``/``cols`` sweep: ``rows`` and
        ``cols`` each in one subscript entry with coefficient 1 (row-major: ``cols`` in the
        last entry and ``rows`` in the one before it; column-major: swapped), the other
        entries free of both."""
        from .preflight import linear_form  # noqa: PLC0415

        shape = self.info.shapes.get(t.name) or next(x.shape for x in self.sig.tensors if x.name == t.name)
        n = len(t.indices)
        forms = [linear_form(x) for x in t.indices]
        if n < 2 or any(f is None for f in forms):
            raise LoweringError(f"fragment access {format_expr(t)} needs an affine subscript of rank 2 or more"
                                f"{self._where()}")
        where = {v: [d for d, f in enumerate(forms) if f.get(v, 0)] for v in (rows, cols)}
        if where[rows] == [n - 2] and where[cols] == [n - 1]:
            layout = "row_major"
        elif where[rows] == [n - 1] and where[cols] == [n - 2]:
            layout = "col_major"
        else:
            raise LoweringError(f"fragment access {format_expr(t)}: the tile's loops {rows}, {cols} must sweep its "
                                f"last two subscript entries{self._where()}")
        if forms[n - 2].get(where[rows][0] == n - 2 and rows or cols) != 1 or \
                forms[n - 1].get(where[cols][0] == n - 1 and cols or rows) != 1:
            raise LoweringError(f"fragment access {format_expr(t)}: the tile's loops must step by 1{self._where()}")
        base = [A.substitute_indices(x, {rows: A.Int(0), cols: A.Int(0)}) for x in t.indices]
        strides = [math.prod(shape[d + 1:]) for d in range(n)]
        offset = " + ".join(f"{self._affine(b)} * {s}" for b, s in zip(base, strides))
        region = ", ".join(f"{self._affine(b)}:{self._affine(b)} + {16 if d >= n - 2 else 1}"
                           for d, b in enumerate(base))
        ld = shape[-1]
        return offset, region, layout, ld, str(ld * 16)

    def fragment_op(self, depth: int, nest: A.Nest) -> None:
        """One ``wmma`` operation for a tensor-core nest (:func:`is_fragment_op`): a fragment set
        to a constant (``fill_fragment``), loaded from a tile (``load_matrix_sync``), the
        multiply-accumulate ``F = F + X*Y`` over 16x16x16 (``mma_sync``) or stored to a tile
        (``store_matrix_sync``), in an opaque block that states what it reads and writes.
        Source: TVM's WMMA intrinsic implementations (``tvm.s_tir.tensor_intrin.cuda``),
        CUDA C Programming Guide §7.24."""
        eq = nest.body[0]
        t, v = eq.target, eq.value
        lv = [l.var for l in nest.loops]
        buf = self.names.buf
        d = depth + 1
        self.out(depth, f'with T.sblock("{self.block_name(t.name)}"):')
        if t.scope == "w" and t.indices != tuple(A.Index(x) for x in lv[:2]):
            raise LoweringError(f"fragment {t.name} must be written at its tile loops' indices{self._where()}")
        if t.scope == "w" and isinstance(v, (A.Int, A.Float)) and len(lv) == 2:
            self.out(d, "T.reads()")
            self.out(d, f"T.writes({buf[t.name]}[0:16, 0:16])")
            self.out(d, f"T.tvm_fill_fragment({buf[t.name]}.data, 16, 16, 16, 0, "
                        f"{const(self.types[t.name], v.value)})")
        elif t.scope == "w" and isinstance(v, A.Tensor) and v.scope != "w" and len(lv) == 2:
            off, region, layout, ld, ext = self._tile_access(v, lv[0], lv[1])
            if self.fragments[t.name] not in ("wmma.matrix_a", "wmma.matrix_b") or v.dtype != t.dtype:
                raise LoweringError(f"fragment {t.name} is loaded from {v.name} but is no factor of the same "
                                    f"dtype{self._where()}")
            self.out(d, f"T.reads({buf[v.name]}[{region}])")
            self.out(d, f"T.writes({buf[t.name]}[0:16, 0:16])")
            self.out(d, f"T.tvm_load_matrix_sync({buf[t.name]}.data, 16, 16, 16, 0, T.tvm_access_ptr("
                        f'T.type_annotation("{self.types[v.name]}"), {buf[v.name]}.data, {off}, {ext}, 1), {ld}, '
                        f'"{layout}")')
        elif len(lv) == 3 and (factors := _mma_factors(eq)) is not None:
            x, y = factors
            if (x.indices, y.indices) != ((A.Index(lv[0]), A.Index(lv[2])), (A.Index(lv[2]), A.Index(lv[1]))):
                raise LoweringError(f"the multiply-accumulate must read {x.name}[i, k] and {y.name}[k, j] over its "
                                    f"loops i, j, k{self._where()}")
            f_, a_, b_ = buf[t.name], buf[x.name], buf[y.name]
            self.out(d, f"T.reads({f_}[0:16, 0:16], {a_}[0:16, 0:16], {b_}[0:16, 0:16])")
            self.out(d, f"T.writes({f_}[0:16, 0:16])")
            self.out(d, f"T.tvm_mma_sync({f_}.data, 0, {a_}.data, 0, {b_}.data, 0, {f_}.data, 0)")
        elif t.scope != "w" and isinstance(v, A.Tensor) and v.scope == "w" and len(lv) == 2:
            if v.indices != tuple(A.Index(x) for x in lv) or self.fragments.get(v.name) != "wmma.accumulator" \
                    or v.dtype != t.dtype:
                raise LoweringError(f"only an accumulator fragment read at its tile loops' indices is stored, "
                                    f"in its own dtype{self._where()}")
            off, region, layout, ld, ext = self._tile_access(t, lv[0], lv[1])
            self.out(d, f"T.reads({buf[v.name]}[0:16, 0:16])")
            self.out(d, f"T.writes({buf[t.name]}[{region}])")
            self.out(d, f"T.tvm_store_matrix_sync({buf[v.name]}.data, 16, 16, 16, 0, T.tvm_access_ptr("
                        f'T.type_annotation("{self.types[t.name]}"), {buf[t.name]}.data, {off}, {ext}, 2), {ld}, '
                        f'"{layout}")')
        else:
            raise LoweringError(f"a nest over fragments must fill, load, multiply-accumulate or store one 16x16 "
                                f"tile{self._where()}")

    def _loops(self, d: int, nest: A.Nest, i: int, ctxs: list[EqContext], k: int, use_tinit: dict[int, bool]) -> int:
        """Loops ``i..`` of ``nest`` and its body; returns the index of the next equation.

        Performance form: a ``V`` loop of extent n > ``split_above`` becomes a serial loop of
        n // w iterations over ``T.vectorized(w)`` (w: ``vector_lanes``) and, when w does not
        divide n, a tail of n % w lanes with a second copy of the loops inside and the body
        (TVM's vectoriser scalarises a guarded tail). LLVM turns one n-lane vector into
        straight-line code over n / w registers, which is faster than the loop while it fits
        the register file and spills beyond it.
        A ``V`` loop is never a reduction axis (:func:`~steptp.backend.preflight.loop_hazards`
        rejects it), so no block of the tail initialises an accumulator a second time.

        A kernel holding tensor-core fragments (``w``) runs one warp per block on CUDA: a
        ``threadIdx.x`` loop of 32 right inside its block loops, which no equation indexes (the
        ``wmma`` operations are collective: every lane of the warp issues them)."""
        if id(nest) in self.warp_kernels and i == _block_lead(nest):
            self.out(d, f'for _warp in T.thread_binding({WARP_SIZE}, thread="threadIdx.x"):')
            d += 1
        if i == len(nest.loops):
            return self._body(d, nest, ctxs, k, use_tinit)
        l, w = nest.loops[i], self.vector_lanes
        if l.kind == "V" and w and l.extent > max(w, self.split_above):
            main, tail = divmod(l.extent, w)
            v = self.names.loop[l.var]
            self.out(d, f"for _vo_{v} in range({main}):")
            self.out(d + 1, f"for _vi_{v} in T.vectorized({w}):")
            self.split[l.var] = f"_vo_{v} * {w} + _vi_{v}"
            end = self._loops(d + 2, nest, i + 1, ctxs, k, use_tinit)
            if tail:
                self.out(d, f"for _vt_{v} in {'T.vectorized' if tail > 1 else 'range'}({tail}):")
                self.split[l.var] = f"{main * w} + _vt_{v}"
                end = self._loops(d + 1, nest, i + 1, ctxs, k, use_tinit)
            del self.split[l.var]
            return end
        self.out(d, self.loop_header(l))
        return self._loops(d + 1, nest, i + 1, ctxs, k, use_tinit)

    def _body(self, d: int, nest: A.Nest, ctxs: list[EqContext], k: int, use_tinit: dict[int, bool]) -> int:
        if not nest.body:
            self.out(d, "T.evaluate(0)")
        for item in nest.body:
            if isinstance(item, A.Assign):
                c = ctxs[k]
                self.equation(d, c, use_tinit.get(c.index, True))
                k += 1
            else:
                k = self.nest(d, item, ctxs, k, use_tinit)
        return k


WARP_SIZE = 32  # lanes of a CUDA warp (the one warp of a tensor-core kernel's block)


def _uses_fragments(nest: A.Nest) -> bool:
    """Whether an equation inside ``nest`` writes or reads a fragment (scope ``w``)."""
    return any(t.scope == "w" for _, eq in nest.equations() for t in (eq.target, *tensor_refs(eq.value)))


def _mma_factors(eq: A.Assign) -> tuple[A.Tensor, A.Tensor] | None:
    """``(X, Y)`` when ``eq`` is a fragment multiply-accumulate ``F = F + X*Y`` with ``F``,
    ``X`` and ``Y`` fragments (scope ``w``), else None."""
    t, v = eq.target, eq.value
    if not (t.scope == "w" and isinstance(v, A.BinOp) and v.op == "+" and isinstance(v.lhs, A.Tensor)
            and v.lhs.name == t.name and isinstance(v.rhs, A.BinOp) and v.rhs.op == "*"):
        return None
    x, y = v.rhs.lhs, v.rhs.rhs
    ok = isinstance(x, A.Tensor) and isinstance(y, A.Tensor) and x.scope == "w" and y.scope == "w"
    return (x, y) if ok else None


def _block_lead(nest: A.Nest) -> int:
    """The number of leading loops of ``nest`` bound to a block axis (``bx..``)."""
    k = 0
    while k < len(nest.loops) and nest.loops[k].kind == "B" and nest.loops[k].var[:1] == "b":
        k += 1
    return k


def is_fragment_op(nest: A.Nest) -> bool:
    """Whether ``nest`` is one tensor-core operation: two or three serial loops of 16 around
    one equation that reads or writes a fragment (scope ``w``)."""
    return (len(nest.loops) in (2, 3) and all(l.extent == 16 and l.kind in ("L", "U") for l in nest.loops)
            and len(nest.body) == 1 and isinstance(nest.body[0], A.Assign) and _uses_fragments(nest))


def fragment_scopes(prog: A.Program, info: ProgramInfo, target: str) -> dict[str, str]:
    """TVM storage scope of each tensor-core fragment (LEIR scope ``w``): on CUDA the role its
    equations give it: the accumulator of an accumulation ``F = F + X*Y`` over fragments is
    ``wmma.accumulator``, its left factor ``wmma.matrix_a``, its right factor
    ``wmma.matrix_b`` (TVM ``tvm.s_tir.tensor_intrin.cuda``'s WMMA intrinsics); on the CPU
    plain ``local`` memory. Raises :class:`LoweringError` for a fragment with no role or two.
    Source: CUDA C Programming Guide §7.24 (warp matrix functions)."""
    frags = [n for n in info.intermediates if info.types[n][1] == "w"]
    if not frags:
        return {}
    if target != "cuda":
        return {n: "local" for n in frags}
    roles: dict[str, set[str]] = {n: set() for n in frags}

    for _, eq in prog.equations():
        factors = _mma_factors(eq)
        if factors is not None:
            roles[eq.target.name].add("wmma.accumulator")
            roles[factors[0].name].add("wmma.matrix_a")
            roles[factors[1].name].add("wmma.matrix_b")
    out = {}
    for n, r in roles.items():
        if len(r) != 1:
            raise LoweringError(f"fragment {n} (scope w) has {'no role' if not r else 'roles ' + ', '.join(sorted(r))}: "
                                f"a fragment is the accumulator, the left or the right factor of one "
                                f"accumulation F = F + X*Y over fragments")
        out[n] = r.pop()
    return out


def _shape(shape: tuple[int, ...]) -> str:
    if len(shape) == 1:
        return f"({shape[0]},)"
    return "(" + ", ".join(str(s) for s in shape) + ")"


def _strip(s: str) -> str:
    """Drop one redundant pair of outer parentheses."""
    if s.startswith("(") and s.endswith(")"):
        depth = 0
        for i, ch in enumerate(s):
            depth += ch == "("
            depth -= ch == ")"
            if depth == 0 and i < len(s) - 1:
                return s
        return s[1:-1]
    return s


def lower_module(module_or_program, signature: Signature | None = None, target: str = "cpu",
                 poison: bool = False, fast_exp: bool = False, vector_lanes: int = 0,
                 split_above: int = 0) -> Lowered:
    """Lower LEIR to TVMScript and return it with its parameter mapping (see :class:`Lowered`).

    Raises :class:`LoweringError` for LEIR semantic errors (shapes, bounds, dtype clashes,
    from :func:`steptp.leir.analysis.analyze`), unsupported dtypes/constructs, a tensor used
    with two storage scopes, and loop hazards (:func:`steptp.backend.preflight.loop_hazards`).
    ``poison=True`` (verification builds, CPU target) first fills every floating-point
    intermediate with the NaN pattern :data:`POISON_BITS` of its dtype, and marks bound
    loops and fill blocks (:data:`THREAD_MARK`, :data:`POISON_MARK`) so that the GPU form
    can be derived from the parsed result (:func:`steptp.backend.build.gpu_form`).

    ``fast_exp`` and ``vector_lanes`` (the CPU performance form only,
    :func:`steptp.backend.perf.perf_cpu_text`): float32 ``exp`` inside ``V`` loops as a
    vectorisable polynomial (:meth:`_Emitter.fast_exp_text`, TVM ``topi.fast_exp``'s
    method), and each ``V`` loop longer than ``split_above`` lanes (and than
    ``vector_lanes``) split into a serial loop over ``T.vectorized(vector_lanes)`` (the
    machine's vector width: a 4096-lane vector type is legalised into spills) plus, when the
    width does not divide the extent, a vectorised tail (:meth:`_Emitter._loops`). Raises ``ValueError`` for
    either with ``poison`` (verification builds stay exact).
    """
    if (fast_exp or vector_lanes) and poison:
        raise ValueError("lower_module: fast_exp / vector_lanes are for performance builds, not poisoned ones")
    if target not in TARGETS:
        raise LoweringError(f"unknown target {target!r}; expected one of {TARGETS}")
    prog, sig = coerce_module(module_or_program, signature)
    info = analyze_or_raise(prog, sig)
    for t in sig.tensors:
        tvm_dtype(t.dtype)
    _check_scopes(prog, info)
    hazards = loop_hazards(prog, sig, info)
    if hazards:
        raise LoweringError("; ".join(hazards))
    em = _Emitter(prog, sig, info, target)
    em.poison = poison
    em.fast_exp, em.vector_lanes, em.split_above = fast_exp, int(vector_lanes), int(split_above)
    text = em.run()
    params = tuple((t.name, em.names.buf[t.name]) for t in sig.tensors)
    return Lowered(text, target, sig, params, info)


def _check_scopes(prog: A.Program, info: ProgramInfo) -> None:
    seen: dict[str, tuple[str, str]] = {}
    for s in info.equations:
        eq = s.inst.eq
        for t in [eq.target, *tensor_refs(eq.value), *[r for i in eq.target.indices for r in tensor_refs(i)]]:
            prev = seen.get(t.name)
            if prev is None:
                seen[t.name] = (t.scope, format_assign(eq))
            elif prev[0] != t.scope and t.name in info.intermediates:
                raise LoweringError(f"intermediate {t.name} is used with storage scopes '{prev[0]}' "
                                    f"('{prev[1]}') and '{t.scope}' ('{format_assign(eq)}')")


def lower(module_or_program, signature: Signature | None = None, target: str = "cpu") -> str:
    """TVMScript text (an ``@I.ir_module`` with one ``@T.prim_func(s_tir=True) main``) of a
    LEIR program.

    * ``module_or_program``: :class:`~steptp.leir.fileformat.LeirModule`, ``.leir`` text
      with a signature header, or a :class:`~steptp.leir.ast.Program` (then ``signature``
      is required; it also overrides a module's own signature).
    * ``target``: ``"cpu"`` (bound loops become serial) or ``"cuda"``
      (``T.thread_binding``).
    * The function's parameters are the signature's known tensors in header order, as
      ``T.Buffer(shape, dtype)``; outputs are written in place.

    Deterministic (same input -> same bytes). Raises :class:`LoweringError` (see
    :func:`lower_module`). Source: paper §3 "LEIR-to-TIR translator"; TVM 0.27 TVMScript.
    """
    return lower_module(module_or_program, signature, target).text


__all__ = ["TARGETS", "SUPPORTED_DTYPES", "Lowered", "lower", "lower_module", "tvm_dtype", "promote", "resolve",
           "const", "WEAK_INT", "WEAK_FLOAT", "THREAD_MARK", "POISON_MARK"]
