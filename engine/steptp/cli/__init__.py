"""``stp`` command line (typer): one module per command group, each a thin layer over a
library function.

Data flow: ``translate`` (PyTorch -> LEIR) -> ``apply`` (one rule step) -> ``lower``
(LEIR -> TIR / CUDA) -> ``verify`` -> ``dataset`` (all of it, in batch).
Exit codes: 0 success, 1 a check failed (verification, no match), 2 bad input.

| module | commands |
|---|---|
| ``program`` | parse, lower, translate |
| ``steps`` | apply, verify |
| ``data`` | dataset, corpus, report, split |
| ``rules`` | rules list / lint / coverage / test |
| ``eval`` | eval, testset |
| ``timing`` | time, doctor |
| ``search`` | search (multi-step optimisation) |
| ``gpu`` | gpu pack / run / merge (build here, run on a GPU node) |
| ``roofline`` | roofline (the speed of light of a program on a datasheet GPU) |
"""

from __future__ import annotations

from . import program, steps, data, rules, eval, timing, search, gpu, roofline  # noqa: F401,I001  (registers the commands, in --help order)
from .app import app, rules_app

__all__ = ["app", "rules_app", "main"]


def main() -> None:  # pragma: no cover
    """Run the ``stp`` command line."""
    app()
