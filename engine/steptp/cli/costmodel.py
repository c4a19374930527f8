"""``stp costmodel train`` / ``eval``: the learned cost model of :mod:`steptp.cost_model.learned`
(LightGBM over LEIR program features, trained on ``stp dataset --time`` measurements; used by
``stp search --rank model:PATH``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import List

import typer

from .common import fail

costmodel_app = typer.Typer(no_args_is_help=True, help="Train and evaluate the learned cost model (LightGBM over "
                                                       "LEIR features; stp search --rank model:PATH).")


def _errors():
    from ..cost_model.learned import CostModelError, CostModelUnavailable

    return CostModelError, CostModelUnavailable


@costmodel_app.command("train")
def train(datasets: List[Path] = typer.Argument(..., help="stp dataset --time output directories (or their "
                                                          "dictionary.jsonl)."),
          out: Path = typer.Option(..., "-o", "--out", help="Model file to write (JSON)."),
          device: str = typer.Option("cpu", "--timings-of",
                                     help="cpu or cuda: which device's timings to learn from (one model per "
                                          "device; nothing runs here)."),
          siblings: int = typer.Option(64, "--siblings", min=0, help="Pairs of two transformations of the same "
                                                                     "original per program (besides each entry "
                                                                     "and its reverse)."),
          rounds: int = typer.Option(100, "--trees", min=1, help="Boosting rounds, a count of trees."),
          seed: int = typer.Option(0, "--seed")):
    """Fit the model on every timed entry of DATASETS (pairs original -> transformed with
    their measured speedups) and write it to OUT. Exit 2 without LightGBM, without timed
    entries or for an unreadable dataset."""
    from ..cost_model import learned as C

    if device not in ("cpu", "cuda"):
        fail(f"--timings-of {device}: expected cpu or cuda")
    try:
        m = C.train(datasets, device=device, siblings=siblings, seed=seed, rounds=rounds)
        m.save(out)
    except _errors() as e:
        fail(str(e))
    except OSError as e:
        fail(f"{getattr(e, 'filename', None) or out}: {e.strerror or e}")
    meta = m.meta
    typer.echo(f"trained on {meta['measurements']} measurement(s) of {meta['groups']} program(s) "
               f"({meta['pairs']} pairs, {m.rounds} trees); wrote {out}")


@costmodel_app.command("eval")
def evaluate(model: Path = typer.Argument(..., help="Model file (stp costmodel train)."),
             datasets: List[Path] = typer.Argument(..., help="Held-out stp dataset --time outputs."),
             k: int = typer.Option(3, "-k", "--top-k", min=1, help="k of top-k recall."),
             as_json: bool = typer.Option(False, "--json", help="Print the figures as JSON.")):
    """Ranking quality of MODEL on the measurements of DATASETS, per original program:
    Kendall's tau-b between predicted and measured speedups and top-k recall, beside the
    static cost model (``--rank cost``). Exit 2 for a bad model or dataset."""
    from ..cost_model import learned as C

    try:
        m = C.LearnedModel.load(model)
        groups = C.measured_groups(datasets, m.target)
        if not groups:
            raise C.CostModelError(f"{', '.join(map(str, datasets))}: no timed entries for device {m.target}")
        res = {"model": C.evaluate(groups, m.predict, k), "static": C.evaluate(groups, C.static_score(m.target), k)}
    except _errors() as e:
        fail(str(e))
    if as_json:
        typer.echo(json.dumps(res, indent=1))
        return

    def fmt(x):
        return "n/a" if x is None else f"{x:.3f}"

    typer.echo(f"{res['model']['groups']} program(s), {res['model']['measurements']} measurement(s)")
    for name, r in res.items():
        typer.echo(f"{name:7} kendall tau {fmt(r['tau'])}  top-{k} recall {fmt(r['recall_at_k'])}")
