"""Load a KernelBench-style program file.

The file is a Python module defining ``class Model(nn.Module)``, ``get_inputs()`` (the forward
arguments) and ``get_init_inputs()`` (the constructor arguments); optionally a module-level
``dtype`` (a ``torch.dtype`` or a code such as ``"f32"``) and ``name`` (the program name).
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from .ir import LEIR_TO_TORCH, TranslationError

_DTYPE_ALIASES = {
    "f16": torch.float16, "float16": torch.float16, "half": torch.float16,
    "bf16": torch.bfloat16, "bfloat16": torch.bfloat16,
    "f32": torch.float32, "float32": torch.float32, "float": torch.float32,
    "f64": torch.float64, "float64": torch.float64, "double": torch.float64,
}


def parse_dtype(dtype: Any) -> torch.dtype | None:
    """``None``, a ``torch.dtype`` or a name (``f16``/``float16``/``half``, ``f32``, ``f64``, ``bf16``)
    -> ``torch.dtype`` (floating point only). Raises :class:`TranslationError` otherwise."""
    if dtype is None or isinstance(dtype, torch.dtype):
        if isinstance(dtype, torch.dtype) and not dtype.is_floating_point:
            raise TranslationError(f"model dtype must be floating point, got {dtype}")
        return dtype
    if isinstance(dtype, str) and dtype.lower().removeprefix("torch.") in _DTYPE_ALIASES:
        return _DTYPE_ALIASES[dtype.lower().removeprefix("torch.")]
    raise TranslationError(f"unknown dtype {dtype!r} (use f16, f32, f64 or a torch.dtype)")


@dataclass
class LoadedProgram:
    """A loaded program: the model (parameters cast to ``dtype``), example inputs, its name."""

    name: str
    model: torch.nn.Module
    inputs: list[Any]
    dtype: torch.dtype | None
    path: Path


def cast_inputs(inputs, dtype: torch.dtype | None) -> list[Any]:
    """Floating-point tensors cast to ``dtype``; other values unchanged."""
    if dtype is None:
        return list(inputs)
    return [x.to(dtype) if isinstance(x, torch.Tensor) and x.is_floating_point() else x for x in inputs]


def load_program(path: str | Path, dtype: Any = None, seed: int = 0, meta: bool = False) -> LoadedProgram:
    """Import ``path``, build ``Model(*get_init_inputs())`` and ``get_inputs()`` under
    ``torch.manual_seed(seed)`` (so parameter values are reproducible), and cast the model
    and floating inputs to ``dtype`` (argument first, else the file's ``dtype``, else as is).
    ``meta``: build them on PyTorch's meta device (shapes and dtypes, no data: a GPU-size
    program's gigabytes are never allocated; the translation needs only shapes).

    Raises ``FileNotFoundError`` for a missing file and :class:`TranslationError` when the
    module lacks ``Model``/``get_inputs``/``get_init_inputs`` or fails to import or build."""
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"{p}: no such file")
    mod_name = "steptp_program_" + hashlib.sha1(str(p.resolve()).encode()).hexdigest()[:12]
    spec = importlib.util.spec_from_file_location(mod_name, p)
    if spec is None or spec.loader is None:
        raise TranslationError(f"{p}: cannot be imported as a Python module")
    module = importlib.util.module_from_spec(spec)
    sys.modules[mod_name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as e:
        sys.modules.pop(mod_name, None)
        raise TranslationError(f"{p}: import failed: {type(e).__name__}: {e}") from e
    for attr in ("Model", "get_inputs", "get_init_inputs"):
        if not hasattr(module, attr):
            raise TranslationError(f"{p}: no {attr} defined (KernelBench-style files need Model, get_inputs, "
                                   "get_init_inputs)")
    dt = parse_dtype(dtype) if dtype is not None else parse_dtype(getattr(module, "dtype", None))
    try:
        torch.manual_seed(seed)
        with torch.device("meta") if meta else contextlib.nullcontext():
            model = module.Model(*module.get_init_inputs())
            inputs = list(module.get_inputs())
    except Exception as e:
        raise TranslationError(f"{p}: building the model or its inputs failed: {type(e).__name__}: {e}") from e
    if dt is not None:
        model = model.to(dt)
    inputs = cast_inputs(inputs, dt)
    name = getattr(module, "name", None) or p.stem
    return LoadedProgram(str(name), model, inputs, dt, p)


__all__ = ["LoadedProgram", "load_program", "parse_dtype", "cast_inputs", "LEIR_TO_TORCH"]
