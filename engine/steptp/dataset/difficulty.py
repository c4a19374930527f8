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

That is the ``default`` profile: one multi-answer record per program, every medium and
difficult entry a single-answer record. Over translated corpus programs it gives about half
medium items and 14 single-answer records per multi-answer one, because the paper's
dataset was not made by this filter alone. The ``paper`` profile (:func:`paper_sets`)
samples on top of it to the released dataset's composition.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from ..rules.loader import difficulty_level, difficulty_score  # paper Eq. (1), one definition

EASY, MEDIUM, DIFFICULT = "easy", "medium", "difficult"


def is_expansion(strategy_id: str) -> bool:
    """Expansion-type easy strategies (inverse of a simplification), kept at the lower rate."""
    return strategy_id.startswith("expand_") or strategy_id == "apart"


#: Profiles of ``stp dataset --profile``: ``default`` is the §3.4 filter over one
#: multi-answer record per program; ``paper`` adds the sampling that gives the composition
#: of the paper's released dataset (see :func:`paper_sets`).
PROFILES = ("default", "paper")

#: The paper's dataset (§3.4, Fig. 4): final level shares and record counts.
PAPER_LEVEL_SHARES = {DIFFICULT: 0.8732, MEDIUM: 0.1217, EASY: 0.0051}
PAPER_SINGLE, PAPER_MULTI = 7537, 17416


@dataclass(frozen=True)
class FilterPolicy:
    """Ratios of the difficulty-aware rebalancing (paper §3.4 defaults); ``profile`` picks
    the sampling of :data:`PROFILES`; ``max_multi_per_program`` bounds the multi-answer
    records the ``paper`` profile draws from one program."""

    easy_keep_simplify: float = 0.20
    easy_keep_expand: float = 0.04
    medium_cap_multi: int = 2000
    min_multi: int = 2
    seed: int = 0
    profile: str = "default"
    max_multi_per_program: int = 32

    def __post_init__(self):
        if self.profile not in PROFILES:
            raise ValueError(f"unknown dataset profile {self.profile!r}; expected one of {', '.join(PROFILES)}")

    def recorded(self) -> dict:
        """The fields run.json records: those of the ``default`` profile, plus ``profile``
        and its own knobs when another profile is chosen (runs made before profiles existed
        keep resuming)."""
        from dataclasses import asdict

        d = asdict(self)
        if self.profile == "default":
            del d["profile"], d["max_multi_per_program"]
        return d


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


def paper_sets(groups: list[list[dict]], policy: FilterPolicy) -> tuple[list[dict], list[list[dict]]]:
    """The ``paper`` profile: single-answer entries and multi-answer groups whose final
    items (a multi-answer record's steps counted singly) have the paper's level shares
    (:data:`PAPER_LEVEL_SHARES`, 87.32 / 12.17 / 0.51 %) and whose multi-answer records
    outnumber single-answer ones as in the paper (17,416 : 7,537).

    ``groups``: the dictionary entries grouped by original program (each sorted). Seeded
    by ``policy.seed``; deterministic for the same groups.

    * single-answer: every difficult entry; medium entries sampled so that they are
      12.17/87.32 of the difficult ones; easy entries by the §3.4 rates (20 % of
      simplifications, 4 % of expansions), at most 0.51/87.32 of the difficult ones.
    * multi-answer: from each program with a difficult entry and at least ``min_multi``
      non-easy entries, up to
      ``max_multi_per_program`` distinct random subsets (sizes 2..n; the paper's records
      are "randomised subsets of several verified transformations of one program"), as many
      per program as the 17,416 : 7,537 ratio asks for. Difficult entries are always
      eligible; a medium entry joins a subset with the probability that keeps the medium
      share of the items at 12.17 %.
    """
    rng = random.Random(f"paper:{policy.seed}")
    entries = [e for g in groups for e in g]
    by_level = {lv: [e for e in entries if e["difficulty"]["level"] == lv] for lv in (EASY, MEDIUM, DIFFICULT)}
    n_d = len(by_level[DIFFICULT])
    share = PAPER_LEVEL_SHARES
    ratio_m = share[MEDIUM] / share[DIFFICULT]
    ratio_e = share[EASY] / share[DIFFICULT]

    def sample(items: list[dict], n: int) -> list[dict]:
        return items if n >= len(items) else rng.sample(items, n)

    def easy_rate(e: dict) -> float:
        return policy.easy_keep_expand if is_expansion(e["strategy"]["id"]) else policy.easy_keep_simplify

    easy = [e for e in by_level[EASY] if rng.random() < easy_rate(e)]
    singles = (by_level[DIFFICULT] + sample(by_level[MEDIUM], round(n_d * ratio_m))
               + sample(easy, round(n_d * ratio_e)))

    eligible = []
    for g in groups:
        d = [e for e in g if e["difficulty"]["level"] == DIFFICULT]
        m = [e for e in g if e["difficulty"]["level"] == MEDIUM]
        if d and len(d) + len(m) >= policy.min_multi:
            eligible.append((d, m))
    multis: list[list[dict]] = []
    if eligible:
        want = round(len(singles) * PAPER_MULTI / PAPER_SINGLE)
        per = max(1, min(policy.max_multi_per_program, -(-want // len(eligible))))
        # a medium item's chance of joining a subset, so that medium / difficult items ~ ratio_m
        n_m = sum(len(m) for _, m in eligible)
        p_m = min(1.0, ratio_m * sum(len(d) for d, _ in eligible) / n_m) if n_m else 0.0
        for d, m in eligible:
            seen: set[tuple] = set()
            for _ in range(4 * per):
                if len(seen) >= per:
                    break
                pool = d + [e for e in m if rng.random() < p_m]
                if len(pool) < policy.min_multi:
                    pool = d + rng.sample(m, policy.min_multi - len(d))
                k = rng.randint(policy.min_multi, len(pool))
                group = sorted(rng.sample(pool, k), key=lambda e: e["id"])
                key = tuple(e["id"] for e in group)
                if key in seen:
                    continue
                seen.add(key)
                multis.append(rng.sample(group, len(group)))
    return sorted(singles, key=lambda e: e["id"]), multis


__all__ = ["EASY", "MEDIUM", "DIFFICULT", "difficulty_score", "difficulty_level", "is_expansion",
           "FilterPolicy", "keep_single", "filter_multi_items", "paper_sets", "PROFILES", "PAPER_LEVEL_SHARES"]
