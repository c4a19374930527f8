"""PyTorch -> LEIR translation (paper §3.2 stage i).

Pipeline: ``trace.trace_model`` (torch.export, ATen graph with static shapes) -> one lowering
per live graph node from the op table ``ops.OPS`` -> a :class:`LeirModule` (signature +
program) checked with :func:`steptp.leir.analysis.analyze`.

Signature and names
    Known tensors are named first, in signature order: the tensor inputs of ``forward`` in
    order (``A``, ``C``, ``D`` ...), then the parameters and buffers the outputs depend on
    (role ``param``; their real values are kept in :attr:`Translation.param_values`), then
    lifted tensor constants (role ``constant``), then the outputs (role ``output``).
    Intermediates take the following names in the order they are created. Names skip
    ``B L P T U V`` (see ``naming.py``).

Binding policy (hardware limits: threadIdx.x <= 1024, blockIdx.x <= 2^31-1)
    In every nest the outermost output axis of extent > 1 is bound: ``B^{n}_{tx=0}`` if
    ``n <= 1024``, else ``B^{n}_{bx=0}``; the other output axes and the reduction axes are
    serial ``L`` loops named ``a c d f ...`` (reduced loops innermost); unit output axes get no
    loop and are indexed by ``0``; a nest with a scalar result gets ``B^{1}_{tx=0}``. No nest
    ever binds more than one axis, so thread and grid limits hold by construction.

Semantics relied on (design.md §2): implicit init of reductions (``D=D+...`` starts at 0,
``max`` at -inf ...), accumulation onto a buffer written by an earlier nest (``linear``'s bias
nest), recurrences on ``a-1`` under an ``if_then_else`` guard (cumsum), ``if_then_else``
evaluating only the selected branch, and the backend's typing of mixed-dtype equations
(promotion like PyTorch, cast to the target's dtype on assignment).

Numerics (``ops.OpContext.acc_dtype``): sums over f16/bf16 accumulate in an f32
intermediate; f32 sums of >= 65536 terms, and f32 normalisation statistics over >= 256
terms, accumulate in f64 (a sequential f32 sum drifts where PyTorch's CPU kernels use
cascade sums or double accumulators); the result is cast once by a copy nest.

Errors: any op without a lowering, any unsupported argument value or dynamic shape raises :class:`TranslationError` naming the op, the argument and the fx node; the
translator never returns a partial result.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch
import torch.fx as fx

from ..leir.analysis import LeirSemanticError, analyze
from ..leir.fileformat import LeirModule, Signature, TensorDecl
from .ir import LEIR_TO_TORCH, Buffer, Emitter, TranslationError, Value, leir_dtype
from .loader import cast_inputs, load_program, parse_dtype
from .naming import TensorNames
from .ops import OPS, OpContext
from .trace import live_nodes, node_tensor_meta, trace_model


@dataclass
class Translation:
    """A translated program.

    ``module``: the LEIR module (signature: inputs, params, constants, outputs).
    ``param_values``: real values of the ``param``/``constant`` tensors, by LEIR name.
    ``model``/``example_inputs``: the PyTorch program and the inputs it was traced with.
    ``input_names``: LEIR name of each ``forward`` argument (``None`` for non-tensor ones).
    ``output_names``: LEIR names of the outputs, in the order ``forward`` returns them.
    """

    module: LeirModule
    param_values: dict[str, np.ndarray]
    model: torch.nn.Module
    example_inputs: list[Any]
    input_names: list[str | None]
    output_names: list[str]
    graph: str = ""
    param_targets: dict[str, str] = field(default_factory=dict)

    @property
    def signature(self) -> Signature:
        """The module's signature."""
        return self.module.signature

    @property
    def text(self) -> str:
        """The ``.leir`` file text."""
        return self.module.text()

    def inputs_signature(self) -> Signature:
        """The signature restricted to the ``input`` tensors (those that get random values)."""
        sig = self.module.signature
        return Signature(sig.name, tuple(t for t in sig.tensors if t.role == "input"))

    def reference(self, inputs) -> dict[str, np.ndarray]:
        """Run the PyTorch model (its own parameters) on ``inputs`` and return the outputs by
        LEIR name as numpy arrays.

        ``inputs`` is a mapping from LEIR input names to arrays (extra entries such as
        parameter values are ignored) or a sequence of ``forward`` arguments. Inputs are
        copied, so a model that mutates its inputs does not alter the caller's arrays."""
        if isinstance(inputs, dict):
            args = []
            for name, example in zip(self.input_names, self.example_inputs):
                if name is None:
                    args.append(example)
                    continue
                if name not in inputs:
                    raise KeyError(f"no value for input {name}")
                dt = LEIR_TO_TORCH[self.module.signature.get(name).dtype]
                args.append(torch.as_tensor(np.array(inputs[name], copy=True)).to(dt))
        else:
            args = [torch.as_tensor(np.array(x, copy=True)) if isinstance(x, np.ndarray) else x for x in inputs]
        with torch.no_grad():
            out = self.model(*args)
        flat, _ = torch.utils._pytree.tree_flatten(out)
        tensors = [t for t in flat if isinstance(t, torch.Tensor)]
        if len(tensors) != len(self.output_names):
            raise RuntimeError(f"the model returned {len(tensors)} tensors, expected {len(self.output_names)}")
        return {n: t.detach().cpu().numpy() for n, t in zip(self.output_names, tensors)}

    def reference64(self, inputs: dict) -> dict[str, np.ndarray] | None:
        """:meth:`reference` computed in float64: a double copy of the model (floating point
        parameters and buffers) on the float inputs widened to float64; the truth of the
        float64 arbiter (:func:`steptp.verify.f64_arbiter`). Raises whatever PyTorch raises
        for an op without a double kernel (the arbiter then stays out)."""
        import copy  # noqa: PLC0415

        model = copy.deepcopy(self.model).double()
        args = []
        for name, example in zip(self.input_names, self.example_inputs):
            if name is None:
                args.append(example.double() if isinstance(example, torch.Tensor) and example.is_floating_point()
                            else example)
                continue
            t = torch.as_tensor(np.array(inputs[name], copy=True))
            args.append(t.double() if t.is_floating_point() else t)
        with torch.no_grad():
            out = model(*args)
        flat, _ = torch.utils._pytree.tree_flatten(out)
        tensors = [t for t in flat if isinstance(t, torch.Tensor)]
        return {n: t.detach().cpu().double().numpy() for n, t in zip(self.output_names, tensors)}

    def input_arrays(self, seed: int = 0, trial: int = 0) -> dict[str, np.ndarray]:
        """Inputs of one verification trial: seeded random ``input`` tensors
        (:func:`steptp.verify.random_inputs`) plus the real ``param``/``constant`` values."""
        from ..verify import random_inputs

        # the full signature lets integer inputs used as subscripts get in-range values
        arrays = dict(random_inputs(self.module.signature, seed, trial, [self.module.program]))
        arrays.update({k: v.copy() for k, v in self.param_values.items()})
        return arrays

    def verify(self, trials: int = 3, seed: int = 0, **kwargs):
        """Check the LEIR against PyTorch eager on ``trials`` seeded random inputs (the
        parameters keep their real values): returns ``steptp.verify.VerifyResult``.
        ``kwargs`` go to :func:`steptp.verify.verify_against` (``isolated``, ``timeout_s`` ...)."""
        from ..verify import verify_against

        kwargs.setdefault("reference64_fn", self.reference64)
        return verify_against(self.module, self.reference, input_fn=self.input_arrays, trials=trials, seed=seed,
                              **kwargs)


def _bind_args(node: fx.Node, env: dict) -> dict[str, Any]:
    """Bind a node's args/kwargs to its op schema's argument names (defaults filled in) and
    replace graph nodes by their lowered values."""

    def conv(a):
        if isinstance(a, fx.Node):
            return env[a]
        if isinstance(a, (list, tuple)):
            return type(a)(conv(x) for x in a)
        return a

    target = node.target
    schema = target._schema
    out: dict[str, Any] = {}
    pos = [a for a in schema.arguments if not a.kwarg_only]
    if len(node.args) > len(pos):
        raise TranslationError(f"too many positional arguments ({len(node.args)})", op=str(target), node=node)
    for a, v in zip(pos, node.args):
        out[a.name] = conv(v)
    for k, v in node.kwargs.items():
        out[k] = conv(v)
    for a in schema.arguments:
        if a.name not in out and a.has_default_value():
            out[a.name] = a.default_value
    return out


class _Lowering:
    """State of one translation: names, emitted nests, lowered values per node."""

    def __init__(self, traced, name: str):
        self.traced = traced
        self.name = name
        self.names = TensorNames()
        self.em = Emitter(self.names)
        self.env: dict[fx.Node, Any] = {}
        self.live = live_nodes(traced.graph, traced.outputs)
        self.decls: list[TensorDecl] = []
        self.param_values: dict[str, np.ndarray] = {}
        self.param_targets: dict[str, str] = {}
        self.out_name_of: dict[fx.Node, str] = {}
        self.claimed: set[str] = set()

    # -- callbacks for OpContext -------------------------------------------

    def meta(self, node: fx.Node, k: int | None = None) -> tuple[tuple[int, ...], str]:
        shape, dt = node_tensor_meta(node, k)
        return shape, leir_dtype(dt, node=node)

    def _getitem_user(self, node: fx.Node, k: int) -> fx.Node | None:
        for u in node.users:
            if u in self.live and u.op == "call_function" and u.target is __import__("operator").getitem \
                    and u.args[1] == k:
                return u
        return None

    def needs(self, node: fx.Node, k: int) -> bool:
        return self._getitem_user(node, k) is not None

    def result(self, node: fx.Node, k: int | None = None) -> Buffer:
        shape, dt = self.meta(node, k)
        target = node if k is None else self._getitem_user(node, k)
        oname = self.out_name_of.get(target) if target is not None else None
        if oname is not None and oname not in self.claimed:
            self.claimed.add(oname)
            return Buffer(oname, shape, dt)
        return self.em.temp(shape, dt)

    # -- steps ---------------------------------------------------------------

    def declare_known(self) -> None:
        for ph in self.traced.placeholders:
            val = ph.node.meta.get("val")
            if ph.kind == "input":
                if not isinstance(val, torch.Tensor):
                    self.env[ph.node] = ph.value  # a Python value baked in by export
                    continue
                shape, dt = self.meta(ph.node)
                nm = self.names.fresh()
                self.env[ph.node] = Buffer(nm, shape, dt)
                self.decls.append(TensorDecl(nm, "input", dt, shape))
        for role in ("param", "constant"):
            for ph in self.traced.placeholders:
                if ph.kind != role or ph.node not in self.live:
                    continue
                shape, dt = self.meta(ph.node)
                nm = self.names.fresh()
                self.env[ph.node] = Buffer(nm, shape, dt)
                self.decls.append(TensorDecl(nm, role, dt, shape))
                value = ph.value
                if not isinstance(value, torch.Tensor):
                    raise TranslationError(f"no value for {role} {ph.target}", node=ph.node)
                if value.is_meta:  # traced on the meta device: shapes only, no values to keep
                    self.param_targets[nm] = ph.target
                    continue
                value = value.detach().cpu()
                if value.dtype == torch.bfloat16:
                    raise TranslationError(f"bfloat16 {role} {ph.target} cannot be held in numpy", node=ph.node)
                self.param_values[nm] = value.numpy().copy()
                self.param_targets[nm] = ph.target
        self.out_names: list[str] = []
        for o in self.traced.outputs:
            if not isinstance(o, fx.Node):
                raise TranslationError(f"forward returns a non-tensor value {o!r}")
            nm = self.names.fresh()
            self.out_names.append(nm)
            self.out_name_of.setdefault(o, nm)

    def lower_node(self, node: fx.Node) -> None:
        import operator

        if node.op != "call_function":
            raise TranslationError(f"unsupported graph node kind {node.op}", op=str(node.target), node=node)
        if node.target is operator.getitem:
            op, overload = "getitem", ""
            src = node.args[0]
            args = {"self": self.env[src] if isinstance(src, fx.Node) else src, "index": node.args[1]}
        elif isinstance(node.target, torch._ops.OpOverload):
            schema_name = node.target._schema.name
            op = schema_name.split("::", 1)[1]
            overload = node.target._overloadname
            if op not in OPS:
                raise TranslationError("no lowering for this operator", op=f"aten.{op}.{overload}", node=node)
            args = _bind_args(node, self.env)
        else:
            raise TranslationError("no lowering for this operator", op=str(node.target), node=node)
        fn = OPS[op]
        ctx = OpContext(node, op, overload, args, self.em, self.result, self.meta, self.needs)
        value = fn(ctx)
        if value is None:
            raise TranslationError("lowering produced no value", op=ctx.qualname, node=node)
        self._check_meta(node, value, ctx.qualname)
        self.env[node] = value

    def _check_meta(self, node: fx.Node, value, op: str) -> None:
        val = node.meta.get("val")
        pairs = []
        if isinstance(val, torch.Tensor):
            pairs = [(None, value)]
        elif isinstance(val, (tuple, list)) and isinstance(value, tuple):
            pairs = [(k, v) for k, v in enumerate(value) if v is not None]
        for k, v in pairs:
            shape, dt = self.meta(node, k)
            if not isinstance(v, Value) or v.shape != shape or v.dtype != dt:
                got = (getattr(v, "shape", None), getattr(v, "dtype", None))
                raise TranslationError(f"internal: lowering gave {got}, PyTorch says {(shape, dt)}", op=op,
                                       node=node)

    def finish_outputs(self) -> None:
        for o, nm in zip(self.traced.outputs, self.out_names):
            v = self.env[o]
            if isinstance(v, Buffer) and v.name == nm:
                continue
            if not isinstance(v, Value):
                raise TranslationError(f"output is not a tensor ({type(v).__name__})", node=o)
            shape, dt = self.meta(o)
            self.em.copy(Buffer(nm, shape, dt), v)
        for o, nm in zip(self.traced.outputs, self.out_names):
            shape, dt = self.meta(o)
            self.decls.append(TensorDecl(nm, "output", dt, shape))

    def run(self) -> LeirModule:
        self.declare_known()
        for node in self.traced.graph.nodes:
            if node.op in ("placeholder", "output") or node not in self.live:
                continue
            self.lower_node(node)
        self.finish_outputs()
        sig = Signature(self.name, tuple(self.decls))
        prog = self.em.program()
        try:
            analyze(prog, sig)
        except LeirSemanticError as e:
            raise TranslationError(f"internal: the generated LEIR is not valid: {e}") from e
        return LeirModule(sig, prog)


def translate_model(model: torch.nn.Module, inputs: Sequence[Any], name: str = "program") -> Translation:
    """Translate ``model(*inputs)`` to LEIR.

    ``inputs`` are the example ``forward`` arguments (their shapes and dtypes are baked into
    the program; Python scalars are specialised as constants). The model's parameters and
    its train/eval mode are used as they are. Returns a :class:`Translation`.

    Raises :class:`TranslationError` for anything that cannot be translated (unknown op,
    unsupported argument, export failure), naming the op, argument and node.
    Source: paper §3.2 (PyTorch-to-LEIR translator); reference-notes §5 for what the paper's
    translator did (we raise instead of returning ``None``, bind within hardware limits,
    support several outputs)."""
    traced = trace_model(model, inputs)
    low = _Lowering(traced, name)
    module = low.run()
    input_names = []
    it = iter(d.name for d in module.signature.tensors if d.role == "input")
    for ph in traced.placeholders:
        if ph.kind == "input":
            input_names.append(next(it) if isinstance(ph.node.meta.get("val"), torch.Tensor) else None)
    return Translation(module, low.param_values, model, list(inputs), input_names, list(low.out_names),
                       graph=str(traced.graph), param_targets=low.param_targets)


def translate_file(path: str | Path, dtype: Any = None, eval_mode: bool = False, meta: bool = False) -> Translation:
    """Load a KernelBench-style file (``Model``, ``get_inputs``, ``get_init_inputs``; see
    ``loader.py``) and translate it; ``dtype`` (``"f16"``, ``"f32"``, ``"f64"`` or a
    ``torch.dtype``) casts the model and its floating inputs first. The model keeps the mode
    it is constructed in (training, as KernelBench runs it: batch norm uses batch statistics)
    unless ``eval_mode`` (running statistics; dropout becomes the identity). ``meta``: traced
    on PyTorch's meta device (no data: the translation of a GPU-size program without its
    gigabytes; the Translation's model and inputs then hold no values to run).

    Raises ``FileNotFoundError`` or :class:`TranslationError`. Source: paper §3.2 (stage i)."""
    prog = load_program(path, dtype, meta=meta)
    if eval_mode:
        prog.model.eval()
    return translate_model(prog.model, prog.inputs, prog.name)


__all__ = ["Translation", "translate_model", "translate_file", "TranslationError", "parse_dtype", "cast_inputs"]
