"""The typer applications ``stp`` and ``stp rules``; command modules register on them."""

from __future__ import annotations

import typer

app = typer.Typer(add_completion=False, no_args_is_help=True, rich_markup_mode=None,
                  help="Step-TP: build a step-level, verified LEIR transformation dataset from PyTorch programs.")
rules_app = typer.Typer(no_args_is_help=True, help="Inspect and self-test the rule files.")
app.add_typer(rules_app, name="rules")
gpu_app = typer.Typer(no_args_is_help=True, help="Build here, run there: pack a dataset's GPU kernels, run a pack "
                                                 "with the TVM runtime only, merge the results.")
app.add_typer(gpu_app, name="gpu")

# stp costmodel train / eval (the learned cost model of stp search --rank model)
from .costmodel import costmodel_app  # noqa: E402

app.add_typer(costmodel_app, name="costmodel")
