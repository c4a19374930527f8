"""The typer applications ``stp`` and ``stp rules``; command modules register on them."""

from __future__ import annotations

import typer

app = typer.Typer(add_completion=False, no_args_is_help=True, rich_markup_mode=None,
                  help="Step-TP: build a step-level, verified LEIR transformation dataset from PyTorch programs.")
rules_app = typer.Typer(no_args_is_help=True, help="Inspect and self-test the rule files.")
app.add_typer(rules_app, name="rules")
