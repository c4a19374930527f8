"""Capture a PyTorch model as an ATen-level fx graph with static shapes and dtypes.

We use :func:`torch.export.export` (not ``torch.fx.symbolic_trace``):

* every op arrives in one spelling (``aten.relu.default``) whether the user wrote
  ``nn.ReLU``, ``F.relu``, ``torch.relu`` or ``x.relu()``, so the op table has one entry per op;
* shapes and dtypes of every node are static and already propagated (``node.meta["val"]``
  is a FakeTensor), including ``x.size(0)``-style shape arithmetic, which export evaluates;
* parameters, buffers and lifted constant tensors become explicit placeholders with their
  fully qualified names, so they map directly to LEIR ``param``/``constant`` tensors.

When the captured graph mutates something (in-place ops such as ``relu_`` or ``x += 1``, or
batch-norm running statistics in training mode), it is functionalised with
``run_decompositions({})``, which removes the mutations but keeps high-level ops such as
``linear``, ``softmax`` and ``gelu`` intact. Buffer mutations (running-stat updates) are side
effects and are not outputs of the translation.
"""

from __future__ import annotations

import contextlib
import io
import logging
import warnings
from dataclasses import dataclass
from typing import Any, Sequence

import torch
import torch.fx as fx

from .ir import TranslationError


@dataclass(frozen=True)
class Placeholder:
    """A graph input: ``kind`` is ``input`` (user input), ``param`` (parameter or buffer) or
    ``constant`` (a tensor constant lifted out of ``forward``); ``target`` is the user-input
    position or the parameter's qualified name; ``value`` the real tensor (params/constants)
    or the example input."""

    node: fx.Node
    kind: str
    target: str
    value: Any


@dataclass
class TracedProgram:
    """Result of :func:`trace_model`: the graph, its placeholders in order and its user outputs."""

    exported: torch.export.ExportedProgram
    graph: fx.Graph
    placeholders: list[Placeholder]
    outputs: list[fx.Node | Any]
    functionalized: bool


@contextlib.contextmanager
def _quiet_logging():
    """Silence torch's own logging and prints during export (its failures are re-raised as
    :class:`TranslationError` with the message; stdout stays clean for ``stp translate``)."""
    prev = logging.root.manager.disable
    logging.disable(logging.CRITICAL)
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            yield
    finally:
        logging.disable(prev)


def _short(e: Exception) -> str:
    """First paragraph of an export error plus the user frame it names, if any."""
    text = str(e).strip()
    head = text.split("\n\n", 1)[0].strip()
    marker = "The following call raised this error:"
    if marker in text:
        frame = text.split(marker, 1)[1].strip().splitlines()[:2]
        head += " | " + " ".join(l.strip() for l in frame)
    return f"{type(e).__name__}: {head}"


def _is_mutating(graph: fx.Graph) -> bool:
    for n in graph.nodes:
        if n.op == "call_function" and isinstance(n.target, torch._ops.OpOverload) and n.target._schema.is_mutable:
            return True
    return False


def trace_model(model: torch.nn.Module, inputs: Sequence[Any]) -> TracedProgram:
    """Export ``model`` called on ``inputs`` (a sequence of tensors / Python values).

    Raises :class:`TranslationError` when ``torch.export`` cannot capture the model (data-
    dependent control flow, unsupported Python), with export's message."""
    args = tuple(inputs)
    try:
        with warnings.catch_warnings(), _quiet_logging():
            warnings.simplefilter("ignore")
            ep = torch.export.export(model, args)
            functionalized = False
            if _is_mutating(ep.graph) or any(
                    s.kind.name != "USER_OUTPUT" for s in ep.graph_signature.output_specs):
                ep = ep.run_decompositions({})
                functionalized = True
    except TranslationError:
        raise
    except Exception as e:  # export raises many different types
        raise TranslationError(f"torch.export could not capture the model: {_short(e)}") from e

    sig = ep.graph_signature
    by_name = {n.name: n for n in ep.graph.nodes if n.op == "placeholder"}
    placeholders: list[Placeholder] = []
    user_pos = 0
    for spec in sig.input_specs:
        node = by_name[spec.arg.name]
        kind = spec.kind.name
        if kind == "USER_INPUT":
            placeholders.append(Placeholder(node, "input", str(user_pos), args[user_pos] if user_pos < len(args) else None))
            user_pos += 1
        elif kind in ("PARAMETER", "BUFFER"):
            val = ep.state_dict.get(spec.target)
            if val is None:
                val = ep.constants.get(spec.target)  # non-persistent buffers
            placeholders.append(Placeholder(node, "param", spec.target, val))
        elif kind == "CONSTANT_TENSOR":
            placeholders.append(Placeholder(node, "constant", spec.target, ep.constants[spec.target]))
        else:
            raise TranslationError(f"unsupported graph input kind {kind} ({spec.target})", node=node)
    out_node = next(n for n in ep.graph.nodes if n.op == "output")
    out_args = list(out_node.args[0])
    outputs = [a for a, s in zip(out_args, sig.output_specs) if s.kind.name == "USER_OUTPUT"]
    return TracedProgram(ep, ep.graph, placeholders, outputs, functionalized)


def node_tensor_meta(node: fx.Node, k: int | None = None) -> tuple[tuple[int, ...], torch.dtype]:
    """Static (shape, dtype) of a node's tensor result (element ``k`` of a tuple result).

    Raises :class:`TranslationError` if the node has no tensor metadata or a symbolic shape."""
    val = node.meta.get("val")
    if k is not None:
        if not isinstance(val, (tuple, list)) or k >= len(val):
            raise TranslationError(f"result {k} of the node has no metadata", node=node)
        val = val[k]
    if not isinstance(val, torch.Tensor):
        raise TranslationError(f"the node's result is not a tensor ({type(val).__name__})", node=node)
    try:
        shape = tuple(int(s) for s in val.shape)
    except Exception as e:  # symbolic sizes
        raise TranslationError(f"the node has a dynamic shape {tuple(val.shape)}", node=node) from e
    return shape, val.dtype


def live_nodes(graph: fx.Graph, outputs: Sequence[Any]) -> set[fx.Node]:
    """Nodes the user outputs depend on (dead code, e.g. unused max indices, is skipped)."""
    live: set[fx.Node] = set()
    stack = [o for o in outputs if isinstance(o, fx.Node)]
    while stack:
        n = stack.pop()
        if n in live:
            continue
        live.add(n)
        stack.extend(n.all_input_nodes)
    return live


__all__ = ["Placeholder", "TracedProgram", "trace_model", "node_tensor_meta", "live_nodes"]
