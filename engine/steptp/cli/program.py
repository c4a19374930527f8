"""``stp parse``, ``stp lower`` and ``stp translate``: one program in, one program (or its TIR / CUDA) out."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from .app import app
from .common import fail, load, print_verification, semantic


@app.command()
def parse(file: Path = typer.Argument(..., help="A .leir file.")):
    """Parse a .leir file and print its canonical form (or the syntax error with line and column)."""
    from ..leir import format_leir

    m = load(file)
    semantic(file, m)
    typer.echo(format_leir(m), nl=False)


@app.command()
def lower(file: Path = typer.Argument(..., help="A .leir file."),
          cuda: bool = typer.Option(False, "--cuda", help="Print the CUDA source instead of TVMScript."),
          cpu: bool = typer.Option(False, "--cpu", help="Print the CPU variant (thread bindings made serial).")):
    """Lower LEIR to TVM TIR (TVMScript text), or to CUDA source with --cuda."""
    from ..backend import BackendError, cuda_source, lower as lower_fn
    from ..leir.analysis import LeirSemanticError

    m = load(file)
    semantic(file, m)
    try:
        if cuda:
            typer.echo(cuda_source(m))
        else:
            typer.echo(lower_fn(m, target="cpu" if cpu else "cuda"))
    except (BackendError, LeirSemanticError) as e:
        fail(f"{file}: {e}", 1)


@app.command()
def translate(model: Path = typer.Argument(..., help="KernelBench-style .py file (Model, get_inputs, get_init_inputs)."),
              output: Optional[Path] = typer.Option(None, "-o", "--output", help="Write the .leir file here."),
              do_verify: bool = typer.Option(False, "--verify", help="Check the LEIR against PyTorch (3 seeded trials)."),
              seed: int = typer.Option(0, "--seed", help="Seed of the verification inputs."),
              dtype: Optional[str] = typer.Option(None, "--dtype", help="Cast the model and inputs: f16, f32 or f64."),
              eval_mode: bool = typer.Option(False, "--eval", help="Put the model in eval() mode first (dropout off, "
                                                                   "running batch-norm statistics).")):
    """Translate a PyTorch program to LEIR; with --verify exit non-zero unless it matches PyTorch."""
    from ..frontend import TranslationError, translate_file
    from ..leir import format_leir, save_leir

    if not model.exists():
        fail(f"{model}: no such file")
    try:
        tr = translate_file(model, dtype=dtype, eval_mode=eval_mode)
    except TranslationError as e:
        fail(f"{model}: {e}", 1)
    if output:
        output.parent.mkdir(parents=True, exist_ok=True)
        save_leir(tr.module, output)
        typer.echo(f"wrote {output}", err=True)
    else:
        typer.echo(format_leir(tr.module), nl=False)
    if do_verify:
        res = tr.verify(trials=3, seed=seed)
        print_verification(res)
        if not res.equal:
            raise typer.Exit(1)
