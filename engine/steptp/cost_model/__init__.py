"""Cost models of LEIR programs (TVM MetaSchedule's ``CostModel`` role): one interface,
chosen by :func:`create`.

A cost model predicts, for a base program and candidate programs derived from it, the natural
log of each candidate's speedup over the base (``predict``), and learns from measured
programs (``update``). Kinds (``stp search --rank KIND``):

=========  ===================================================================================
random     seeded noise: the baseline of model-scored selection (:class:`learned.RandomScorer`)
cost       the static model: a roofline per equation on the CPU (:mod:`.static`), grid,
           occupancy, coalescing and launches on a GPU (:mod:`.gpu`) (:class:`learned.CostScorer`)
model      the learned model, LightGBM over :mod:`.features` (MetaSchedule's XGBModel),
           ``model:PATH`` starting from a model file of ``stp costmodel train``; refitted
           online on the measured samples (:class:`learned.ModelScorer`)
=========  ===================================================================================

Every kind also offers the search's adapters ``score(node, proposals)`` (predicted ln speedup
of each proposal's program over ``node``'s) and ``observe(root, parent, child)`` (one timed
sample). Nothing here imports :mod:`steptp.search` or :mod:`steptp.policy` (the layer test
checks it): the search and the policies sit above the cost models.

Source: Chen et al., "Learning to Optimize Tensor Programs" (NeurIPS 2018); TVM
``tvm.meta_schedule.cost_model`` (``CostModel.predict``/``update``, ``create(kind)``).
"""

from __future__ import annotations

from typing import Protocol

from ..leir import ast as A

#: The kinds :func:`create` knows (``--rank``).
KINDS = ("random", "cost", "model")


class CostModel(Protocol):
    """What every kind implements (MetaSchedule's ``CostModel``)."""

    def predict(self, base: A.Program, programs: list[A.Program]) -> list[float]:
        """Predicted ln speedup of each of ``programs`` over ``base`` (same signature)."""
        ...

    def update(self, rows: list[tuple[A.Program, A.Program, float]]) -> None:
        """Learn from measured ``(base, program, ln speedup of program over base)`` rows."""
        ...


def parse_kind(rank: str) -> tuple[str, str | None]:
    """``(kind, model path)`` of a ``--rank`` value (``random``, ``cost``, ``model`` or
    ``model:PATH``). Raises ``ValueError`` with one line otherwise."""
    from .learned import parse_rank

    return parse_rank(rank)


def create(kind: str, device: str = "cpu", seed: int = 0, roots=()):
    """The cost model of ``kind`` (a ``--rank`` value, :data:`KINDS`, ``model:PATH`` included)
    for ``device`` (``cpu`` or ``cuda``: the static model's target, the learned model's
    features). Raises ``ValueError`` for an unknown kind,
    :class:`~steptp.cost_model.learned.CostModelError` for a bad model file or one for another
    device and :class:`~steptp.cost_model.learned.CostModelUnavailable` without LightGBM."""
    from .learned import make_scorer, require_lightgbm

    default = None
    if kind == "model" and device == "cuda":
        from .samples import learned_model, shipped_rows

        require_lightgbm()
        default = learned_model(shipped_rows(list(roots)))
    return make_scorer(kind, device, seed, default)


__all__ = ["KINDS", "CostModel", "create", "parse_kind"]
