"""``stp roofline``: the speed of light of one program (FLOPs by dtype, compulsory DRAM bytes,
``sol_us``) on a GPU of the datasheet table (:mod:`steptp.roofline`)."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from .app import app
from .common import fail


@app.command()
def roofline(file: Path = typer.Argument(..., help="A .leir file or a KernelBench-style .py model file."),
             gpu_model: str = typer.Option("h200", "--gpu-model", help="Device of the table: h200, h100 or a100."),
             as_json: bool = typer.Option(False, "--json", help="Print JSON (flops, flops_by_dtype, bytes, sol_us, "
                                                                "compute_us, memory_us, bound, device figures).")):
    """Speed of light: exact FLOPs by dtype, compulsory DRAM bytes (inputs read once, outputs
    written once) and sol_us = max(FLOPs / peak(dtype), bytes / DRAM bandwidth) from NVIDIA
    datasheet figures. Launch overhead is not included."""
    from .. import programs
    from ..roofline import RooflineError, format_roofline, gpu_spec, roofline as roofline_of

    try:
        spec = gpu_spec(gpu_model)
    except RooflineError as e:
        fail(str(e))
    if not file.exists():
        fail(f"{file}: no such file")
    if file.suffix not in (".leir", ".py"):
        fail(f"{file}: expected a .leir file or a .py model file")
    try:
        module, _tr = programs.load(file)
    except (ValueError, OSError) as e:  # LeirSyntaxError (FILE:LINE:COL), LeirSemanticError, TranslationError
        msg = str(e).splitlines()[0] if str(e) else type(e).__name__  # the first line: FILE:LINE:COL: message
        fail(msg if msg.startswith(str(file)) else f"{file}: {msg}")
    except Exception as e:  # noqa: BLE001 - a .py model runs user code: any failure is bad input, one line
        first = str(e).splitlines()[0] if str(e) else ""
        fail(f"{file}: cannot load the model: {type(e).__name__}: {first}")
    roof = roofline_of(module, spec.key)
    if as_json:
        typer.echo(json.dumps({"program": module.signature.name, **roof.to_json(), "device": spec.to_json()},
                              indent=1))
    else:
        typer.echo(format_roofline(roof, module.signature.name))
