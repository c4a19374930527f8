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


_KINDS: dict[str, tuple] = {}  # kind -> (factory, takes a model path)


def register(kind: str, factory, *, path: bool = False) -> None:
    """Make ``factory(device=..., seed=..., roots=..., path=...) -> CostModel`` the cost model
    ``kind`` (``--rank KIND``; ``path``: the kind also takes ``KIND:PATH``, a model file);
    registering a kind again replaces it."""
    _KINDS[kind] = (factory, path)


def kinds() -> tuple[str, ...]:
    """The registered kinds, in registration order (:data:`KINDS` first)."""
    return tuple(_KINDS)


def parse_kind(rank: str) -> tuple[str, str | None]:
    """``(kind, model path)`` of a ``--rank`` value (a registered kind, or ``KIND:PATH`` for a
    kind that takes a model file: ``model:PATH``). Raises ``ValueError`` with one line
    otherwise."""
    kind, sep, path = rank.partition(":")
    with_path = [k for k, (_, p) in _KINDS.items() if p]
    if kind not in _KINDS or (path and kind not in with_path) or (sep and not path):
        expected = ", ".join(_KINDS) + "".join(f" or {k}:PATH" for k in with_path)
        raise ValueError(f"--rank {rank}: expected {expected}")
    return kind, path or None


def create(kind: str, device: str = "cpu", seed: int = 0, roots=()):
    """The cost model of ``kind`` (a ``--rank`` value: a registered kind, ``model:PATH``
    included) for ``device`` (``cpu`` or ``cuda``: the static model's target, the learned
    model's features); ``seed`` for the seeded kinds, ``roots`` (program texts) for a model
    fitted on shipped samples. Every ranking of the search and of the engine policy comes from
    here. Raises ``ValueError`` for an unknown kind,
    :class:`~steptp.cost_model.learned.CostModelError` for a bad model file or one for another
    device and :class:`~steptp.cost_model.learned.CostModelUnavailable` without LightGBM."""
    name, path = parse_kind(kind)
    factory, _ = _KINDS[name]
    return factory(device=device, seed=seed, roots=roots, path=path)


def _random(*, seed: int = 0, **_):
    from .learned import RandomScorer  # noqa: PLC0415

    return RandomScorer(seed)


def _cost(*, device: str = "cpu", **_):
    from .learned import CostScorer  # noqa: PLC0415

    return CostScorer(device)


def _model(*, device: str = "cpu", roots=(), path: str | None = None, **_):
    """The learned model (``path``: a model file of ``stp costmodel train``; without one, on
    ``cuda``, the model fitted on the shipped GPU samples; refitted online)."""
    from .learned import CostModelError, LearnedModel, ModelScorer, require_lightgbm  # noqa: PLC0415

    default = None
    if path is None and device == "cuda":
        from .samples import learned_model, shipped_rows  # noqa: PLC0415

        require_lightgbm()
        default = learned_model(shipped_rows(list(roots)))
    model = LearnedModel.load(path) if path else default
    if model is not None and model.target != device:
        raise CostModelError(f"{path}: a model for {model.target}, not {device}")
    return ModelScorer(model, device)


register("random", _random)
register("cost", _cost)
register("model", _model, path=True)

__all__ = ["KINDS", "CostModel", "register", "kinds", "create", "parse_kind"]
