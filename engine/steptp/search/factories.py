"""What a search is built from, by its configuration: the scorer (:func:`make_scorer`) and the
policy (:func:`make_policy`)."""

from __future__ import annotations

from ..leir import LeirModule
from .config import POLICIES, SearchConfig, SearchInputError


def make_scorer(cfg: SearchConfig, roots=()):
    """The scorer of ``cfg.rank`` (:func:`steptp.cost_model.create`, the one ranking home) when the
    search screens with one (``--rank model``, or ``--algorithm evolutionary`` with any
    rank), else None. Raises :class:`SearchInputError` for a bad model file or a missing
    LightGBM."""
    if cfg.rank_kind != "model" and cfg.algorithm != "evolutionary":
        return None
    from ..cost_model import create
    from ..cost_model.learned import CostModelError, CostModelUnavailable

    try:
        return create(cfg.rank, cfg.device, cfg.seed, roots)
    except (CostModelError, CostModelUnavailable, ValueError) as e:
        raise SearchInputError(str(e)) from None


def make_policy(cfg: SearchConfig, root: LeirModule, client=None, rules=None, scorer=None, check=None):
    """The policy ``cfg.policy`` for ``root`` (``client``: the chat client of the LLM policy).
    With ``--rank model`` and one of the paper's seven algorithms the engine policy is wrapped
    in a :class:`~steptp.policy.ScreeningPolicy` (``cfg.screen`` candidates
    screened per node by ``scorer``); ``evolutionary`` screens by itself. On ``cuda`` the
    engine also proposes its multi-step proposals (:mod:`steptp.engine.macros`). ``check``:
    ``fn(module) -> bool``, the search's verification: the engine policy proposes (and its
    lookahead expands) only programs that pass it (:class:`~steptp.policy.EnginePolicy`)."""
    from ..policy import EnginePolicy, LLMPolicy, ReplayError, ReplayPolicy, ScreeningPolicy

    if cfg.policy == "engine":
        static = cfg.rank_kind == "cost" and cfg.algorithm != "evolutionary"
        pol = EnginePolicy(rules, rank="cost" if static else "random", seed=cfg.seed, per_rule=cfg.per_rule,
                           target=cfg.device, skip_binding_only=cfg.device == "cpu", macros=cfg.device == "cuda",
                           lookahead=cfg.lookahead if static else 1, expand=cfg.expand, check=check)
        if cfg.rank_kind == "model" and cfg.algorithm != "evolutionary" and scorer is not None:
            return ScreeningPolicy(pol, scorer, cfg.screen)
        return pol
    if cfg.policy == "replay":
        if not cfg.replay:
            raise SearchInputError("--policy replay needs --replay FILE.jsonl")
        try:
            return ReplayPolicy(cfg.replay, root.signature)
        except ReplayError as e:
            raise SearchInputError(str(e)) from None
    if cfg.policy == "llm":
        if client is None:
            raise SearchInputError("--policy llm needs --endpoint URL and --model NAME")
        return LLMPolicy(client, algorithm=cfg.algorithm, temperature=cfg.temperature, max_tokens=cfg.max_tokens,
                         target=cfg.device, rules=rules, seed=cfg.seed)
    raise SearchInputError(f"unknown policy {cfg.policy!r}; one of {', '.join(POLICIES)}")


__all__ = ["make_scorer", "make_policy"]
