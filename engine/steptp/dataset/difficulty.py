"""Strategy difficulty (paper §3.4, Eq. 1) and difficulty-aware filtering of the chat sets.

``score = 0.1*K + 0.5*(P - 1) + S`` where K = number of preconditions checked, P = number
of existing components the strategy modifies and S = number of categories of newly
synthesised elements. Levels: easy (score < 1), medium (1 <= score < 2.5), difficult
(score >= 2.5).

Filtering policy (paper §3.4; ratios configurable, sampling seeded):

* multi-answer: drop every easy item; keep medium items of a strategy until
  ``medium_cap_multi`` (2,000) have been kept; keep all difficult items; an entry survives
  with at least ``min_multi`` (2) items left.
* single-answer: keep ``easy_keep_simplify`` (20 %) of easy *simplification* strategies and
  ``easy_keep_expand`` (4 %) of easy *expansion* strategies (those that undo a
  simplification: rule ids starting with ``expand_`` plus ``apart``); keep every medium and
  difficult item.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from ..rules.loader import difficulty_level, difficulty_score  # paper Eq. (1), one definition

EASY, MEDIUM, DIFFICULT = "easy", "medium", "difficult"


def is_expansion(strategy_id: str) -> bool:
    """Expansion-type easy strategies (inverse of a simplification), kept at the lower rate."""
    return strategy_id.startswith("expand_") or strategy_id == "apart"


@dataclass(frozen=True)
class FilterPolicy:
    """Ratios of the difficulty-aware rebalancing (paper §3.4 defaults)."""

    easy_keep_simplify: float = 0.20
    easy_keep_expand: float = 0.04
    medium_cap_multi: int = 2000
    min_multi: int = 2
    seed: int = 0


def keep_single(entries: list[dict], policy: FilterPolicy) -> list[dict]:
    """Filter single-answer entries (dictionary rows with ``strategy`` and ``difficulty``).

    Deterministic for a given ``policy.seed`` and entry order."""
    rng = random.Random(f"single:{policy.seed}")
    kept = []
    for e in entries:
        level = e["difficulty"]["level"]
        if level == EASY:
            rate = policy.easy_keep_expand if is_expansion(e["strategy"]["id"]) else policy.easy_keep_simplify
            if rng.random() >= rate:
                continue
        kept.append(e)
    return kept


def filter_multi_items(items: list[dict], counts: dict[str, int], policy: FilterPolicy) -> list[dict]:
    """Filter the items of one multi-answer entry; ``counts`` (strategy id -> medium items
    kept so far) is updated in place. Returns [] when fewer than ``min_multi`` remain."""
    out = []
    for it in items:
        level = it["difficulty"]["level"]
        sid = it["strategy"]["id"]
        if level == EASY:
            continue
        if level == MEDIUM:
            if counts.get(sid, 0) >= policy.medium_cap_multi:
                continue
        out.append(it)
    if len(out) < policy.min_multi:
        return []
    for it in out:
        if it["difficulty"]["level"] == MEDIUM:
            counts[it["strategy"]["id"]] = counts.get(it["strategy"]["id"], 0) + 1
    return out


__all__ = ["EASY", "MEDIUM", "DIFFICULT", "difficulty_score", "difficulty_level", "is_expansion",
           "FilterPolicy", "keep_single", "filter_multi_items"]
