"""The options of a search (``stp search``'s flags): :class:`SearchConfig`, and the error of a
bad program, replay file or option (:class:`SearchInputError`)."""

from __future__ import annotations

from dataclasses import dataclass, field

from .algorithms import DEFAULTS

POLICIES = ("engine", "llm", "replay")

#: ``stopped`` reasons of a search cut short by a signal (not by its own time limit): its
#: summary is kept as a partial one, the run stops there, and a rerun searches it again.
SIGNALLED = ("interrupted", "SIGTERM")


class SearchInputError(ValueError):
    """A bad program, replay file or option (the CLI exits 2 with this message)."""


@dataclass
class SearchConfig:
    """Options of a search (CLI flags of ``stp search``); ``overrides`` holds algorithm
    parameters (see :data:`steptp.search.algorithms.DEFAULTS`), ``iterations`` overrides
    the iteration budget of every algorithm."""

    algorithm: str = "greedy"
    policy: str = "engine"
    rank: str = "random"  # a cost model kind (steptp.cost_model.create): random, cost, model or model:PATH
    device: str = "cpu"  # cpu or cuda: where candidates are verified and timed (stp search --device)
    seed: int = 0
    iterations: int | None = None
    overrides: dict = field(default_factory=dict)
    per_rule: int = 8
    trials: int = 3
    timeout_s: float = 120.0
    max_samples: int | None = None
    temperature: float = 0.3
    max_tokens: int | None = None
    replay: str | None = None
    progress: bool = True
    confirm_repeat: int = 10
    time_limit_s: float | None = None  # per program: stop and write what the search has
    screen: int = 32  # --rank model with the paper's seven: candidates screened per node by the model
    runner: str = "local"  # a registered runner kind (local, pack, ...): where candidates are measured
    lookahead: int = 1  # engine policy, --rank cost: levels ranked by the static model before proposing
    expand: int = 3  # with lookahead > 1: programs of a level expanded at the next

    @property
    def rank_kind(self) -> str:
        """``random``, ``cost`` or ``model`` (without the model path), read by
        :func:`steptp.cost_model.parse_kind` (``ValueError`` for anything else)."""
        from ..cost_model import parse_kind

        return parse_kind(self.rank)[0]

    @property
    def rank_model(self) -> str | None:
        """The model file of ``--rank model:PATH``, else None."""
        from ..cost_model import parse_kind

        return parse_kind(self.rank)[1]

    @property
    def target(self) -> str:
        """The former name of :attr:`device` (read-only)."""
        return self.device

    def algorithm_params(self) -> dict:
        p = dict(DEFAULTS[self.algorithm])
        if "seed" in p:
            p["seed"] = self.seed
        p.update({k: v for k, v in self.overrides.items() if v is not None})
        if self.iterations is not None:
            p["iterations"] = self.iterations
        return p



__all__ = ["POLICIES", "SIGNALLED", "SearchInputError", "SearchConfig"]
