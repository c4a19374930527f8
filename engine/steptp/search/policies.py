"""The policies of ``stp search``: ``Policy.propose(node, history, k) -> list[Proposal]``.

They live in :mod:`steptp.policy` (one protocol and one engine, LLM and replay policy for
``stp search`` and ``stp eval``); this module names them for the search package. A search
node is a policy's ``program``; ``history`` is the path root..parent (empty for the root
and for the chain-without-parent algorithm)."""

from __future__ import annotations

from ..policy import (ALGORITHM_TEXT, EnginePolicy, LLMPolicy, Proposal, ReplayError, ReplayPolicy, StrategyNames,
                      parse_proposals, render_prompt, strategy_table)


def _lookup(strategies: list[dict]) -> StrategyNames:
    """The claimed-name lookup of ``strategies`` (``[{"id", "name"}]``)."""
    return StrategyNames(strategies)


def _strategy_id(name: str, lookup: StrategyNames | None = None) -> str:
    """Rule id(s) of a claimed strategy (:meth:`steptp.policy.StrategyNames.strategy_id`)."""
    return (lookup or StrategyNames([])).strategy_id(name)


__all__ = ["ALGORITHM_TEXT", "EnginePolicy", "LLMPolicy", "Proposal", "ReplayError", "ReplayPolicy", "StrategyNames",
           "parse_proposals", "render_prompt", "strategy_table"]
