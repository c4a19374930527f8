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
  simplification: the rules marked ``expansion: true``, the ``expand_`` rules and ``apart``); keep every medium and
  difficult item.

That is the ``default`` profile: one multi-answer record per program, every medium and
difficult entry a single-answer record. Over translated corpus programs it gives about half
medium items and 14 single-answer records per multi-answer one, because the paper's
dataset was not made by this filter alone. The ``paper`` profile (:func:`paper_sets`)
composes the sets to the released dataset's composition without repeating a prompt's
answers: one single-answer record per prompt, multi-answer records of distinct sizes over
distinct steps, each step in at most two of them, and a token bound on each.
"""

from __future__ import annotations

import functools
import hashlib
import itertools
import json
import random
from collections import Counter, defaultdict
from dataclasses import dataclass
from typing import Callable, Sequence

from ..rules.loader import difficulty_level, difficulty_score  # paper Eq. (1), one definition

EASY, MEDIUM, DIFFICULT = "easy", "medium", "difficult"


def is_expansion(strategy_id: str) -> bool:
    """Whether ``strategy_id`` is an expansion-type strategy (the inverse of a simplification:
    its rule file says ``expansion: true``), whose easy steps §3.4's filter keeps at the lower
    rate. False for an id no rule in effect has."""
    return strategy_id in _expansions()


@functools.lru_cache(maxsize=8)
def _expansion_ids(paths: tuple[str, ...]) -> frozenset[str]:
    from ..rules.loader import load_rule

    return frozenset(r.id for r in (load_rule(p) for p in paths) if r.expansion)


def _expansions() -> frozenset[str]:
    """The ids of the expansion rules in effect (shipped rules and ``$STP_RULES_PATH``'s)."""
    from ..rules.loader import rule_paths

    return _expansion_ids(tuple(str(p) for p in rule_paths()))


#: Profiles of ``stp dataset --profile``: ``default`` is the §3.4 filter over one
#: multi-answer record per program; ``paper`` adds the sampling that gives the composition
#: of the paper's released dataset (see :func:`paper_sets`).
PROFILES = ("default", "paper")

#: The paper's dataset (§3.4, Fig. 4): final level shares and record counts.
PAPER_LEVEL_SHARES = {DIFFICULT: 0.8732, MEDIUM: 0.1217, EASY: 0.0051}
PAPER_SINGLE, PAPER_MULTI = 7537, 17416

#: Default bound on the tokens of one multi-answer record (``stp dataset --max-tokens``).
DEFAULT_MAX_TOKENS = 16384


@dataclass(frozen=True)
class FilterPolicy:
    """Ratios of the difficulty-aware rebalancing (paper §3.4 defaults); ``profile`` picks
    the sampling of :data:`PROFILES`; ``max_multi_per_program`` bounds the multi-answer
    records the ``paper`` profile draws from one program and ``max_tokens`` the tokens of
    each of them (user prompt + assistant label, :func:`steptp.dataset.chat.multi_tokens`)."""

    easy_keep_simplify: float = 0.20
    easy_keep_expand: float = 0.04
    medium_cap_multi: int = 2000
    min_multi: int = 2
    seed: int = 0
    profile: str = "default"
    max_multi_per_program: int = 32
    max_tokens: int = DEFAULT_MAX_TOKENS

    def __post_init__(self):
        if self.profile not in PROFILES:
            raise ValueError(f"unknown dataset profile {self.profile!r}; expected one of {', '.join(PROFILES)}")
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be at least 1, got {self.max_tokens}")

    def recorded(self) -> dict:
        """The fields run.json records: those of the ``default`` profile, plus ``profile``
        and its own knobs when another profile is chosen (runs made before profiles existed
        keep resuming); ``max_tokens`` only when it is not :data:`DEFAULT_MAX_TOKENS` (runs
        made before the bound existed keep resuming)."""
        from dataclasses import asdict

        d = asdict(self)
        if self.profile == "default":
            del d["profile"], d["max_multi_per_program"]
        if self.profile == "default" or self.max_tokens == DEFAULT_MAX_TOKENS:
            del d["max_tokens"]
        return d


class FilteredSets(tuple):
    """``(single, multi)``, the result of :func:`paper_sets` and
    :func:`steptp.dataset.pipeline.filtered_sets`: a 2-tuple (``singles, multis = ...``
    works, equality is the tuple's) that also carries ``stats``, a JSON-ready dict of how
    the sets came out (:func:`composition_stats`; with the ``paper`` profile also the
    medium join rate and the ``--max-tokens`` counts: ``tokens {max_tokens, measure,
    over, split, parts, dropped, dropped_steps, max}``)."""

    def __new__(cls, single, multi, stats: dict | None = None):
        self = super().__new__(cls, (single, multi))
        self.stats = dict(stats or {})
        return self

    def __getnewargs__(self):
        return (self[0], self[1], self.stats)


def prompt_key(e: dict) -> tuple:
    """What a chat prompt is made of (program name, original LEIR, signature): entries with
    the same key get the same user prompt."""
    return (e["original"]["leir"], e.get("program", ""), json.dumps(e.get("signature"), sort_keys=True))


def composition_stats(singles: Sequence[dict], multis: Sequence[Sequence[dict]]) -> dict:
    """How a pair of chat sets is composed, counted the paper's way (each step of a
    multi-answer record counts as one item, §3.4 "Dataset Summary"):

    * ``single_records``, ``single_prompts`` (distinct prompts), ``single_answers_per_prompt``
      (mean) and ``single_answers_max``;
    * ``multi_records``, ``multi_prompts`` (distinct prompts: program and count asked),
      ``multi_slots`` (answers in all records), ``multi_distinct_steps``,
      ``multi_step_max_records`` (most records one step is in), ``multi_duplicate_sets``
      (records of a program with the same steps as another), ``multi_same_prompt`` (records
      whose prompt another record of the program also has), ``multi_subset_pairs`` (pairs
      of records of one program, one's steps inside the other's);
    * ``items``, ``level_items``, ``level_pct`` against ``paper_level_pct`` (``level_pct_gap``:
      ours minus the paper's, points) and ``multi_per_single`` against the paper's 2.31."""
    single_prompts = Counter(prompt_key(e) for e in singles)
    by_prog: dict[tuple, list[frozenset]] = defaultdict(list)
    for g in multis:
        by_prog[prompt_key(g[0])].append(frozenset(e["id"] for e in g))
    steps = Counter(e["id"] for g in multis for e in g)
    dup = same = sub = 0
    for sets in by_prog.values():
        dup += len(sets) - len(set(sets))
        sizes = Counter(len(s) for s in sets)
        same += sum(c for c in sizes.values() if c > 1)
        sub += sum(1 for a, b in itertools.permutations(sets, 2) if a < b)
    items = list(singles) + [e for g in multis for e in g]
    level = Counter(e["difficulty"]["level"] for e in items)
    pct = {lv: round(100 * level.get(lv, 0) / len(items), 2) if items else 0.0 for lv in (DIFFICULT, MEDIUM, EASY)}
    paper_pct = {lv: round(100 * s, 2) for lv, s in PAPER_LEVEL_SHARES.items()}
    return {
        "single_records": len(singles), "single_prompts": len(single_prompts),
        "single_answers_per_prompt": round(len(singles) / len(single_prompts), 3) if single_prompts else 0.0,
        "single_answers_max": max(single_prompts.values(), default=0),
        "multi_records": len(multis),
        "multi_prompts": len({(k, len(s)) for k, sets in by_prog.items() for s in sets}),
        "multi_slots": sum(steps.values()), "multi_distinct_steps": len(steps),
        "multi_step_max_records": max(steps.values(), default=0),
        "multi_duplicate_sets": dup, "multi_same_prompt": same, "multi_subset_pairs": sub,
        "items": len(items), "level_items": {lv: level.get(lv, 0) for lv in (DIFFICULT, MEDIUM, EASY)},
        "level_pct": pct, "paper_level_pct": paper_pct,
        "level_pct_gap": {lv: round(pct[lv] - paper_pct[lv], 2) for lv in pct},
        "multi_per_single": round(len(multis) / len(singles), 3) if singles else 0.0,
        "paper_multi_per_single": round(PAPER_MULTI / PAPER_SINGLE, 3),
    }


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


def _u(*parts) -> float:
    """A seeded uniform number in [0, 1) from ``parts`` (order-free sampling: a choice made
    with it does not depend on the order the entries come in)."""
    h = hashlib.blake2b("\x1f".join(map(str, parts)).encode(), digest_size=8).digest()
    return int.from_bytes(h, "big") / 2.0 ** 64


@dataclass
class _Prog:
    """One prompt's entries (a program: name, original LEIR, signature) by level."""

    h: str  # hash of the prompt key: the program's seed
    d: list[dict]
    m: list[dict]
    e: list[dict]


def _capacity(n: int, policy: FilterPolicy) -> int:
    """Most multi-answer records ``n`` steps can give under the paper profile's rules:
    distinct sizes (a program's prompts differ only in the count asked for, so one record
    per count), each at least ``min_multi`` and at most ``n``, together at most ``2 n``
    answers (each step in at most two records); at most ``max_multi_per_program``."""
    m, r = policy.min_multi, 0
    while r < policy.max_multi_per_program and m + r <= n and (r + 1) * m + r * (r + 1) // 2 <= 2 * n:
        r += 1
    return r


def _sizes(n: int, r: int, rng: random.Random, policy: FilterPolicy) -> list[int]:
    """``r`` distinct record sizes for a pool of ``n`` steps: from ``min_multi, min_multi+1,
    ...`` grown one step at a time (a seeded record each time) until they cover the pool
    once (sum ``n``); the sizes stay below ``n`` where ``r`` of them fit there, so that no
    record is the whole pool (which would hold every other one)."""
    m = policy.min_multi
    cap = n - 1 if r >= 2 and m + r - 1 <= n - 1 else n
    sizes = list(range(m, m + r))
    while sum(sizes) < n:
        grow = [i for i, k in enumerate(sizes) if k + 1 <= cap and k + 1 not in sizes]
        if not grow:
            break
        sizes[rng.choice(grow)] += 1
    return sizes


def _subset_pairs(recs: list[list[dict]]) -> list[tuple[int, int]]:
    """Pairs ``(i, j)`` of records where record i's steps all lie in record j."""
    sets = [frozenset(e["id"] for e in rec) for rec in recs]
    return [(i, j) for i, j in itertools.permutations(range(len(sets)), 2) if sets[i] < sets[j]]


def _arrange(pool: list[dict], sizes: list[int], rng: random.Random) -> list[list[dict]]:
    """Records of the given sizes over ``pool``: consecutive windows on a seeded cyclic order
    of the pool. Sizes sum to at most ``2 n``, so each step is in at most two records and no
    record repeats a step; of the size orders tried (all up to 4 records, else 24 seeded
    ones) the first where no record's steps lie inside another's, else the one with fewest
    such pairs, then repaired while that lowers the number of such pairs (at most 64
    tries): a step of the inner record in the outer one is swapped for a step of the pool
    that the outer one lacks and fewer than two records hold, or, where every step is in
    two records, traded with a third record for one of its steps the outer one lacks."""
    order = pool[:]
    rng.shuffle(order)
    n = len(order)
    if len(sizes) <= 4:
        perms = list(itertools.permutations(sizes))
        rng.shuffle(perms)
    else:
        perms = []
        for _ in range(24):
            p = sizes[:]
            rng.shuffle(p)
            perms.append(tuple(p))
    best: tuple[int, list[list[dict]]] | None = None
    for perm in perms:
        recs, s = [], 0
        for k in perm:
            recs.append([order[(s + j) % n] for j in range(k)])
            s += k
        bad = len(_subset_pairs(recs))
        if best is None or bad < best[0]:
            best = (bad, recs)
            if bad == 0:
                break
    if best is None:
        return []
    recs = best[1]
    pairs = _subset_pairs(recs)
    uses = Counter(e["id"] for rec in recs for e in rec)
    for _ in range(64):
        if not pairs:
            break
        i, j = rng.choice(pairs)
        outer = {e["id"] for e in recs[j]}
        x = rng.choice(recs[i])
        spare = [e for e in order if e["id"] not in outer and uses[e["id"]] < 2]
        if spare:  # the outer record takes a step fewer than two records hold
            y = rng.choice(spare)
            trial = recs[:j] + [[y if e is x else e for e in recs[j]]] + recs[j + 1:]
        else:  # every step in two records: the outer record trades x for a step of a third one
            swaps = [(c, y) for c, rec in enumerate(recs) if c not in (i, j) and x not in rec
                     for y in rec if y["id"] not in outer]
            if not swaps:
                continue
            c, y = rng.choice(swaps)
            trial = [[y if e is x else e for e in rec] if r == j else
                     [x if e is y else e for e in rec] if r == c else rec for r, rec in enumerate(recs)]
        trial_pairs = _subset_pairs(trial)
        if len(trial_pairs) < len(pairs):
            if spare:
                uses[x["id"]] -= 1
                uses[y["id"]] += 1
            recs, pairs = trial, trial_pairs
    return recs


def _compose(progs: list[_Prog], singles: list[dict | None], medium_order: list[tuple[float, dict]],
             p_m: float, policy: FilterPolicy) -> list[list[list[dict]]]:
    """The multi-answer records of every program (``singles[i]``: program ``i``'s
    single-answer entry, left out of its records) when medium steps join at rate ``p_m``."""
    joined: set[str] = set()
    per_strategy: Counter = Counter()
    taken = {s["id"] for s in singles if s is not None}
    for u, e in medium_order:
        if u >= p_m:
            break
        if e["id"] in taken or per_strategy[e["strategy"]["id"]] >= policy.medium_cap_multi:
            continue
        joined.add(e["id"])
        per_strategy[e["strategy"]["id"]] += 1
    pools = [[e for e in p.d if e["id"] not in taken] + [e for e in p.m if e["id"] in joined] for p in progs]
    caps = [_capacity(len(pool), policy) for pool in pools]
    # as many records as make them PAPER_MULTI : PAPER_SINGLE to the single-answer ones, spread
    # evenly: every program that can take one more gets one, a seeded subset at the last level
    want = round(sum(s is not None for s in singles) * PAPER_MULTI / PAPER_SINGLE)
    counts = [0] * len(progs)
    level = 1
    while want > 0:
        cands = [i for i, c in enumerate(caps) if c >= level]
        if not cands:
            break
        cands.sort(key=lambda i: _u("alloc", policy.seed, level, progs[i].h))
        for i in cands[:want]:
            counts[i] += 1
        want -= min(want, len(cands))
        level += 1
    out = []
    for p, pool, r in zip(progs, pools, counts):
        if not r:
            out.append([])
            continue
        rng = random.Random(f"paper:{policy.seed}:{p.h}")
        out.append(_arrange(pool, _sizes(len(pool), r, rng, policy), rng))
    return out


def _level_counts(singles: list[dict | None], records: list[list[list[dict]]]) -> Counter:
    c = Counter(s["difficulty"]["level"] for s in singles if s is not None)
    c.update(e["difficulty"]["level"] for recs in records for rec in recs for e in rec)
    return c


def _tune(progs, singles, medium_order, policy) -> tuple[float, list[list[list[dict]]]]:
    """The medium join rate whose items come closest to the paper's medium share (bisection
    over [0, 1], the best rate seen kept: the share is only nearly monotone in the rate)."""
    target = PAPER_LEVEL_SHARES[MEDIUM]

    def share(p):
        recs = _compose(progs, singles, medium_order, p, policy)
        c = _level_counts(singles, recs)
        n = sum(c.values())
        return (c[MEDIUM] / n if n else 0.0), recs

    best = None
    lo, hi = 0.0, 1.0
    for p in [0.0, 1.0] + [None] * 20:
        if p is None:
            p = (lo + hi) / 2
        s, recs = share(p)
        if best is None or abs(s - target) < best[0] - 1e-12:
            best = (abs(s - target), p, recs)
        if p == 0.0 and s >= target or p == 1.0 and s <= target:
            break
        if 0.0 < p < 1.0:
            lo, hi = (p, hi) if s < target else (lo, p)
    return best[1], best[2]


def _part_sizes(k: int, allowed: list[int]) -> list[int]:
    """Distinct sizes from ``allowed`` (ascending) with the largest sum at most ``k``, fewest
    parts among those, then the largest sizes; ``[]`` when none fits."""
    best: tuple = ()
    best_key = (0, 0, ())

    def walk(i: int, chosen: list[int], total: int) -> None:
        nonlocal best, best_key
        key = (total, -len(chosen), tuple(sorted(chosen, reverse=True)))
        if key > best_key:
            best, best_key = tuple(chosen), key
        for j in range(i, len(allowed)):
            if total + allowed[j] > k:
                break
            walk(j + 1, chosen + [allowed[j]], total + allowed[j])

    walk(0, [], 0)
    return sorted(best, reverse=True)


def _bound_tokens(records: list[list[list[dict]]], measure: Callable[[list[list[dict]]], list[int]],
                  policy: FilterPolicy) -> tuple[list[list[list[dict]]], dict]:
    """Records longer than ``policy.max_tokens`` (by ``measure``) split into smaller ones or
    dropped. A record of ``k`` steps and ``t`` tokens is cut, in its order, into parts of
    distinct sizes that its program has no other record of (a prompt keeps one answer),
    each at least ``min_multi`` and at most ``k * max_tokens / t`` (so each part is
    expected to fit), as many steps kept as such sizes allow and in as few parts; steps
    left over leave this record (they may be in another one). A part still too long is cut
    again; a record with no such size left is dropped. Returns the records and the counts
    ``over`` (records over the bound as composed), ``split`` (records replaced by smaller
    ones), ``parts`` (records made so), ``dropped`` (records dropped whole),
    ``dropped_steps`` (answers lost: those of dropped records and those a split left out)
    and ``max`` (tokens of the longest record kept)."""
    limit, m = policy.max_tokens, policy.min_multi
    flat = [rec for recs in records for rec in recs]
    tokens = measure(flat) if flat else []
    stats = {"over": 0, "split": 0, "parts": 0, "dropped": 0, "dropped_steps": 0}
    it = iter(tokens)
    out, longest = [], 0
    for recs in records:
        alive = [(rec, next(it)) for rec in recs]
        kept = [(rec, t) for rec, t in alive if t <= limit]
        work = [(rec, t) for rec, t in alive if t > limit]
        stats["over"] += len(work)
        while work:
            rec, t = work.pop(0)
            k = len(rec)
            used = {len(r) for r, _ in kept} | {len(r) for r, _ in work}
            fit = max(m, k * limit // t)
            sizes = _part_sizes(k, [a for a in range(m, min(fit, k - 1) + 1) if a not in used])
            if not sizes:
                stats["dropped"] += 1
                stats["dropped_steps"] += k
                continue
            stats["split"] += 1
            stats["dropped_steps"] += k - sum(sizes)
            parts, s0 = [], 0
            for a in sizes:
                parts.append(rec[s0:s0 + a])
                s0 += a
            for part, pt in zip(parts, measure(parts)):
                if pt <= limit:
                    kept.append((part, pt))
                    stats["parts"] += 1
                else:
                    work.append((part, pt))
        out.append([rec for rec, _ in kept])
        longest = max([longest] + [t for _, t in kept])
    stats["max"] = longest
    return out, stats


def paper_sets(groups: list[list[dict]], policy: FilterPolicy,
               measure: Callable[[list[list[dict]]], list[int]] | None = None,
               measure_name: str | None = None) -> FilteredSets:
    """The ``paper`` profile: the paper's composition (§3.4 "Dataset Summary": 87.32 / 12.17 /
    0.51 % difficult / medium / easy items, a multi-answer record's steps counted singly;
    17,416 multi- to 7,537 single-answer records) reached without repeating answers.

    ``groups``: the dictionary entries grouped by prompt (program name, original LEIR,
    signature: :func:`prompt_key`). ``measure``: token counts of multi-answer records
    (lists of entries), for the ``policy.max_tokens`` bound; ``None`` leaves them unbounded.
    Seeded by ``policy.seed``; the same for the same groups in any order.

    * single-answer: one record per prompt, so a prompt has one answer: a seeded difficult
      entry of the program, else a medium one. Easy entries that pass the §3.4 rates (20 %
      of simplifications, 4 % of expansions) replace as many of them as make 0.51 % of the
      items easy (programs with nothing else first).
    * multi-answer: from the program's other difficult entries and the medium ones that
      join at the rate giving 12.17 % medium items (at most ``medium_cap_multi`` per
      strategy), records of distinct sizes (no two prompts of a program alike, sizes at
      least ``min_multi``) that cover the pool about once: consecutive windows on a seeded
      cyclic order, so each step is in at most two records of its program (answers at most
      twice the distinct steps) and, where the sizes allow, no record lies inside another.
      As many as make them 17,416 : 7,537 to the single-answer records, spread evenly over
      the programs, at most ``max_multi_per_program`` each and as many as the pool allows.
    * a record above ``policy.max_tokens`` is split into smaller ones of sizes its program
      has no record of, or dropped (:func:`_bound_tokens`).

    Returns :class:`FilteredSets` with ``stats``: :func:`composition_stats`, ``medium_join_rate``
    and ``tokens {max_tokens, measure, over, split, parts, dropped, dropped_steps, max}``; where the
    rules keep the mix or the ratio from the paper's, the stats show how far."""
    seed = policy.seed
    progs = []
    for g in groups:
        if not g:
            continue
        h = hashlib.blake2b(repr(prompt_key(g[0])).encode(), digest_size=12).hexdigest()
        lv = {L: sorted((e for e in g if e["difficulty"]["level"] == L), key=lambda e: e["id"])
              for L in (EASY, MEDIUM, DIFFICULT)}
        progs.append(_Prog(h, lv[DIFFICULT], lv[MEDIUM], lv[EASY]))
    progs.sort(key=lambda p: p.h)

    def pick(entries: list[dict]) -> dict:
        return min(entries, key=lambda e: _u("single", seed, e["id"]))

    def easy_rate(e: dict) -> float:
        return policy.easy_keep_expand if is_expansion(e["strategy"]["id"]) else policy.easy_keep_simplify

    singles: list[dict | None] = [pick(p.d or p.m) if (p.d or p.m) else None for p in progs]
    medium_order = sorted(((_u("medium", seed, e["id"]), e) for p in progs for e in p.m),
                          key=lambda t: (t[0], t[1]["id"]))
    p_m, records = _tune(progs, singles, medium_order, policy)
    # easy single-answer items: 0.51 % of the items, from the entries the §3.4 rates keep
    n_items = sum(_level_counts(singles, records).values())
    n_easy = round(PAPER_LEVEL_SHARES[EASY] * n_items)
    easy_ok = [[e for e in p.e if _u("easy", seed, e["id"]) < easy_rate(e)] for p in progs]
    cands = sorted((i for i, ok in enumerate(easy_ok) if ok),
                   key=lambda i: (singles[i] is not None, _u("easy-single", seed, progs[i].h)))
    for i in cands[:n_easy]:
        singles[i] = pick(easy_ok[i])
    if n_easy and cands:
        p_m, records = _tune(progs, singles, medium_order, policy)
    tokens = {"max_tokens": policy.max_tokens, "measure": measure_name if measure else None,
              "over": 0, "split": 0, "parts": 0, "dropped": 0, "dropped_steps": 0, "max": None}
    if measure is not None:
        records, counted = _bound_tokens(records, measure, policy)
        tokens.update(counted)
    single_out = sorted((s for s in singles if s is not None), key=lambda e: e["id"])
    multi_out = [rec for recs in records for rec in recs]
    stats = {"profile": "paper", **composition_stats(single_out, multi_out), "medium_join_rate": round(p_m, 4),
             "tokens": tokens}
    return FilteredSets(single_out, multi_out, stats)


__all__ = ["EASY", "MEDIUM", "DIFFICULT", "difficulty_score", "difficulty_level", "is_expansion",
           "FilterPolicy", "FilteredSets", "keep_single", "filter_multi_items", "paper_sets", "composition_stats",
           "prompt_key", "PROFILES", "PAPER_LEVEL_SHARES", "DEFAULT_MAX_TOKENS"]
