"""A learned cost model of LEIR programs (TVM MetaSchedule's ``XGBModel``, with LightGBM):
gradient-boosted trees over program features (:mod:`steptp.cost_model.features`) that predict
how much faster a candidate runs than its base program, trained on measured pairs.

Model: ``f(x_base, x_cand) -> log(t_base / t_cand)`` (natural log of the speedup), the input
being ``x_cand - x_base`` followed by ``x_base`` (both :func:`program_features`). The trees
are boosted from a prior, ``PRIOR`` (0.5) times the static roofline model's ln speedup (LightGBM's
``init_score``): they learn its correction, and a candidate unlike any measured one (a larger
program, a stride change that matters only out of cache) keeps half the static model's
estimate instead of the trees' flat extrapolation. Each
measured pair also gives its reverse (``-log speedup``), which keeps the model close to
antisymmetric. Ranking candidates at a node = sorting them by the predicted log speedup over
that node (MetaSchedule ranks by predicted normalised throughput within a task; a pair model
fits the data we have: ``stp dataset --time`` times each step *interleaved* with its
original, a ratio far less noisy than two separate absolute times).

Training data:

* offline, :func:`load_pairs`: entries of ``stp dataset --time`` runs
  (``dictionary.jsonl``; ``timing.speedup`` = original/transformed, the median of paired
  ratios); per original program (a *group*) every (original, transformed) pair, its
  reverse, and up to ``siblings`` pairs of two transformations of the same original
  (label ``log s_j - log s_i``);
* online, :meth:`ModelScorer.observe`: the search's own samples (parent -> child and root
  -> child, from the 3-measurement times), weighted 10x; the model is refitted every
  ``retrain_every`` samples (MetaSchedule updates its model after every measured batch).

Ranking quality (:func:`evaluate`): per group, Kendall's τ-b between predicted and measured
log speedups and top-k recall (|predicted top-k ∩ measured top-k| / k), averaged over the
groups with at least two distinct measurements.

Scorers (``score(node, proposals) -> [predicted log speedup over node]``, used by
:class:`ScreeningPolicy` and the ``evolutionary`` algorithm): :class:`ModelScorer` (the
learned model; before it has a model or enough online samples it falls back to the static
model), :class:`CostScorer` (the static roofline model, :mod:`steptp.cost_model.static`),
:class:`RandomScorer` (seeded noise: the baseline).

LightGBM is optional (``pip install 'steptp[costmodel]'``); :func:`require_lightgbm` raises
:class:`CostModelUnavailable` with one line when it is missing.

Sources: Chen et al., "Learning to Optimize Tensor Programs" (NeurIPS 2018) and TVM
MetaSchedule ``tvm.meta_schedule.cost_model.XGBModel`` (features, online updates, ranking
metrics); Ke et al., "LightGBM" (NeurIPS 2017).
"""

from __future__ import annotations

import json
import math
import random
import time
from dataclasses import dataclass
from pathlib import Path

from ..leir import ast as A
from .features import FEATURE_NAMES, program_features

FORMAT = "steptp-costmodel"
VERSION = 1
#: LightGBM parameters (regression on log speedup; deterministic, one thread).
PARAMS = {"objective": "regression", "learning_rate": 0.05, "num_leaves": 15, "min_data_in_leaf": 5,
          "feature_fraction": 0.8, "bagging_fraction": 0.8, "bagging_freq": 1, "lambda_l2": 1.0,
          "deterministic": True, "num_threads": 1, "verbose": -1, "seed": 0}
ROUNDS = 100
ONLINE_WEIGHT = 10.0
PRIOR = 0.5  # weight of the static model's ln speedup in the prediction (the trees' init_score)
LABEL_CLIP = 3.0  # |log speedup| above e^3 = 20x is clipped (a few wild timings must not dominate)


class CostModelUnavailable(RuntimeError):
    """LightGBM is not installed (one line: what to install)."""


class CostModelError(ValueError):
    """A missing, unreadable or corrupt model file, or a dataset without timed entries."""


def require_lightgbm():
    """The ``lightgbm`` module; raises :class:`CostModelUnavailable` when it is missing."""
    try:
        import lightgbm
    except ImportError:
        raise CostModelUnavailable("the learned cost model needs lightgbm: pip install 'steptp[costmodel]' "
                                   "(or pip install lightgbm)") from None
    return lightgbm


# ---------------------------------------------------------------------------
# features of pairs
# ---------------------------------------------------------------------------

_FEATURE_CACHE: dict[tuple[str, str], list[float]] = {}


def features_of(program: A.Program | str, target: str = "cpu") -> list[float]:
    """:func:`program_features` of a program or of its LEIR text (parsed; raises the
    parser's ``LeirSyntaxError`` for bad text), cached per text."""
    from ..leir import format_program, parse_program

    text = program if isinstance(program, str) else format_program(program)
    hit = _FEATURE_CACHE.get((text, target))
    if hit is None:
        prog = parse_program(text) if isinstance(program, str) else program
        hit = program_features(prog, target)
        if len(_FEATURE_CACHE) > 20000:
            _FEATURE_CACHE.clear()
        _FEATURE_CACHE[(text, target)] = hit
    return hit


def pair_vector(base: list[float], cand: list[float]) -> list[float]:
    """The model input of a (base, candidate) pair: ``cand - base`` then ``base``
    (``2 * len(FEATURE_NAMES)`` floats)."""
    return [c - b for b, c in zip(base, cand)] + list(base)


#: Names of the pair features (the model's columns).
PAIR_NAMES = tuple(f"d_{n}" for n in FEATURE_NAMES) + tuple(f"b_{n}" for n in FEATURE_NAMES)


@dataclass
class Pair:
    """One measured pair: ``group`` (the original program's key), ``base`` and ``cand``
    (canonical LEIR program texts), ``log_speedup`` = ln(t_base / t_cand)."""

    group: str
    base: str
    cand: str
    log_speedup: float


def _rng(seed, *scope) -> random.Random:
    from ..seeds import seeded_rng

    return seeded_rng(seed, *scope)


def _entries(path: Path):
    from ..io import read_jsonl

    files = [path] if path.is_file() else (sorted(path.glob("dictionary.jsonl"))
                                           + sorted(path.glob("*/dictionary.jsonl")))
    if not files:
        raise CostModelError(f"{path}: no dictionary.jsonl (a stp dataset --time output directory or its "
                             "dictionary.jsonl)")
    for f in files:
        try:
            yield from read_jsonl(f)
        except (OSError, ValueError) as e:
            raise CostModelError(f"{f}: cannot read: {' '.join(str(e).split())[:200]}") from None


def measured_groups(paths: list[str | Path], device: str = "cpu") -> dict[str, list[tuple[str, float]]]:
    """``{original LEIR text: [(transformed LEIR text, ln speedup), ...]}`` of the timed
    entries (``timing.speedup`` > 0, no ``timing.error``, ``timing.device`` == ``device``;
    a pair met twice counts once) of ``stp dataset --time`` outputs (directories or ``dictionary.jsonl`` files). Raises
    :class:`CostModelError` for a missing path or an unreadable file."""
    groups: dict[str, list[tuple[str, float]]] = {}
    seen: set[tuple[str, str]] = set()
    for raw in paths:
        p = Path(raw)
        if not p.exists():
            raise CostModelError(f"{p}: no such file or directory")
        for e in _entries(p):
            t = e.get("timing") if isinstance(e, dict) else None
            if not isinstance(t, dict) or t.get("error") or t.get("device", "cpu") != device:
                continue
            try:
                sp = float(t["speedup"])
                orig, trans = e["original"]["leir"], e["transformed"]["leir"]
            except (KeyError, TypeError, ValueError):
                continue
            if sp > 0 and math.isfinite(sp) and isinstance(orig, str) and isinstance(trans, str) \
                    and (orig, trans) not in seen:  # a dataset given twice counts once
                seen.add((orig, trans))
                groups.setdefault(orig, []).append((trans, math.log(sp)))
    return groups


def pairs_of(groups: dict[str, list[tuple[str, float]]], siblings: int = 64, seed: int = 0) -> list[Pair]:
    """Training pairs of :func:`measured_groups` (see the module docstring): each
    (original, transformed), its reverse and up to ``siblings`` seeded sibling pairs per group."""
    out: list[Pair] = []
    for orig, items in groups.items():
        for trans, ls in items:
            out.append(Pair(orig, orig, trans, ls))
            out.append(Pair(orig, trans, orig, -ls))
        sib = [(i, j) for i in range(len(items)) for j in range(len(items)) if i != j]
        if len(sib) > siblings:
            sib = _rng(seed, orig, "siblings").sample(sib, siblings)
        for i, j in sib:
            out.append(Pair(orig, items[i][0], items[j][0], items[j][1] - items[i][1]))
    return out


def load_pairs(paths: list[str | Path], device: str = "cpu", siblings: int = 64, seed: int = 0) -> list[Pair]:
    """:func:`pairs_of` :func:`measured_groups` of ``paths``; raises :class:`CostModelError`
    when there is no timed entry."""
    groups = measured_groups(paths, device)
    if not groups:
        raise CostModelError(f"{', '.join(map(str, paths))}: no timed entries for device {device} "
                             "(build them with stp dataset --time)")
    return pairs_of(groups, siblings, seed)


# ---------------------------------------------------------------------------
# the model
# ---------------------------------------------------------------------------


class LearnedModel:
    """LightGBM gradient-boosted trees over pair features (see the module docstring).

    ``X`` / ``y`` / ``w``: the training rows (kept, so that online samples refit on old and
    new data together), ``target``: ``cpu`` or ``cuda`` (one model per target)."""

    def __init__(self, target: str = "cpu", params: dict | None = None, rounds: int = ROUNDS, prior: float = PRIOR):
        self.target = target
        self.params = dict(PARAMS, **(params or {}))
        self.rounds = rounds
        self.prior = prior
        self.X: list[list[float]] = []
        self.y: list[float] = []
        self.w: list[float] = []
        self.booster = None
        self.meta: dict = {}

    @property
    def trained(self) -> bool:
        return self.booster is not None

    def add_pairs(self, pairs: list[Pair], weight: float = 1.0) -> None:
        """Append the rows of ``pairs`` (labels clipped to ±:data:`LABEL_CLIP`)."""
        for p in pairs:
            self.add_row(features_of(p.base, self.target), features_of(p.cand, self.target), p.log_speedup, weight)

    def add_row(self, base: list[float], cand: list[float], log_speedup: float, weight: float = 1.0) -> None:
        """Append one row: base and candidate features, ln(t_base / t_cand), weight."""
        self.X.append(pair_vector(base, cand))
        self.y.append(max(-LABEL_CLIP, min(LABEL_CLIP, float(log_speedup))))
        self.w.append(weight)

    def _prior(self, X):
        """``prior`` x the static model's ln(est_base / est_cand) of pair rows (column 0 is
        the difference of ``log2_est_ns``)."""
        return -self.prior * math.log(2.0) * X[:, 0]

    def fit(self) -> "LearnedModel":
        """Fit the trees on every row; raises :class:`CostModelError` without rows and
        :class:`CostModelUnavailable` without LightGBM."""
        lgb = require_lightgbm()
        import numpy as np

        if len(self.y) < 2:
            raise CostModelError("no training data: at least one measured pair is needed")
        X = np.asarray(self.X, dtype=np.float64)
        ds = lgb.Dataset(X, label=np.asarray(self.y), weight=np.asarray(self.w), init_score=self._prior(X),
                         feature_name=list(PAIR_NAMES), params={"verbose": -1, "min_data_in_bin": 1})
        params = dict(self.params)
        if len(self.y) < 4 * params.get("min_data_in_leaf", 5):
            params["min_data_in_leaf"] = 1
        self.booster = lgb.train(params, ds, num_boost_round=self.rounds)
        return self

    def predict_rows(self, rows: list[list[float]]) -> list[float]:
        """Predicted ln speedups of pair rows (0 for every row of an untrained model)."""
        if not rows:
            return []
        if self.booster is None:
            return [0.0] * len(rows)
        import numpy as np

        X = np.asarray(rows, dtype=np.float64)
        return [float(v) for v in self.booster.predict(X) + self._prior(X)]

    def predict(self, base: A.Program | str, cands: list) -> list[float]:
        """Predicted ln(t_base / t_cand) of each candidate (programs or LEIR texts) over ``base``."""
        b = features_of(base, self.target)
        return self.predict_rows([pair_vector(b, features_of(c, self.target)) for c in cands])

    # -- persistence --------------------------------------------------------------

    def save(self, path: str | Path) -> Path:
        """Write the model (trees, training rows, metadata) as JSON to ``path``."""
        from ..io import write_text_atomic

        if self.booster is None:
            raise CostModelError("the model is not trained")
        lgb = require_lightgbm()
        doc = {"format": FORMAT, "version": VERSION, "library": "lightgbm", "library_version": lgb.__version__,
               "target": self.target, "features": list(FEATURE_NAMES), "params": self.params, "rounds": self.rounds,
               "prior": self.prior,
               "meta": self.meta, "booster": self.booster.model_to_string(),
               "train": {"X": [[round(v, 5) for v in r] for r in self.X], "y": [round(v, 5) for v in self.y],
                         "w": self.w}}
        p = Path(path)
        if p.parent and not p.parent.exists():
            p.parent.mkdir(parents=True, exist_ok=True)
        write_text_atomic(p, json.dumps(doc, separators=(",", ":")) + "\n")
        return p

    @classmethod
    def load(cls, path: str | Path) -> "LearnedModel":
        """Read a model written by :meth:`save`. Raises :class:`CostModelError` (one line)
        for a missing, unreadable or corrupt file or one of other features, and
        :class:`CostModelUnavailable` without LightGBM."""
        p = Path(path)
        lgb = require_lightgbm()
        if not p.is_file():
            raise CostModelError(f"{p}: no such model file")
        try:
            doc = json.loads(p.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
            raise CostModelError(f"{p}: not a cost model file ({type(e).__name__})") from None
        if not isinstance(doc, dict) or doc.get("format") != FORMAT:
            raise CostModelError(f"{p}: not a cost model file (written by stp costmodel train)")
        if doc.get("features") != list(FEATURE_NAMES):
            raise CostModelError(f"{p}: written for other features (retrain it with this version of stp)")
        try:
            m = cls(str(doc.get("target", "cpu")), dict(doc.get("params") or {}), int(doc.get("rounds", ROUNDS)),
                    float(doc.get("prior", PRIOR)))
        except (TypeError, ValueError):
            raise CostModelError(f"{p}: corrupt cost model (bad parameters)") from None
        try:
            tr = doc["train"]
            m.X, m.y, m.w = [list(map(float, r)) for r in tr["X"]], list(map(float, tr["y"])), list(map(float, tr["w"]))
            m.booster = lgb.Booster(model_str=doc["booster"])
            if m.booster.num_feature() != len(PAIR_NAMES) or len(m.X) != len(m.y):
                raise ValueError("shape")
        except Exception as e:  # noqa: BLE001 - any damage is one line
            raise CostModelError(f"{p}: corrupt cost model ({type(e).__name__})") from None
        m.meta = doc.get("meta") or {}
        return m


def train(paths: list[str | Path], device: str = "cpu", siblings: int = 64, seed: int = 0,
          rounds: int = ROUNDS) -> LearnedModel:
    """A :class:`LearnedModel` fitted on the timed entries of ``stp dataset --time`` outputs
    ``paths`` (see :func:`load_pairs`); ``meta`` records the datasets, groups and pairs.
    Raises :class:`CostModelError` (no data) or :class:`CostModelUnavailable`."""
    require_lightgbm()
    groups = measured_groups(paths, device)
    if not groups:
        raise CostModelError(f"{', '.join(map(str, paths))}: no timed entries for device {device} "
                             "(build them with stp dataset --time)")
    m = LearnedModel(device, {"seed": seed}, rounds)
    pairs = pairs_of(groups, siblings, seed)
    m.add_pairs(pairs)
    m.fit()
    m.meta = {"datasets": [str(p) for p in paths], "groups": len(groups),
              "measurements": sum(len(v) for v in groups.values()), "pairs": len(pairs), "device": device}
    return m


# ---------------------------------------------------------------------------
# ranking quality
# ---------------------------------------------------------------------------


def kendall_tau(a: list[float], b: list[float]) -> float | None:
    """Kendall's τ-b of two equally long sequences (ties in either count as in τ-b);
    None when either is constant or shorter than 2."""
    n = len(a)
    conc = disc = ta = tb = 0
    for i in range(n):
        for j in range(i + 1, n):
            da, db = a[i] - a[j], b[i] - b[j]
            if da == 0 and db == 0:
                continue
            if da == 0:
                ta += 1
            elif db == 0:
                tb += 1
            elif (da > 0) == (db > 0):
                conc += 1
            else:
                disc += 1
    den = math.sqrt((conc + disc + ta) * (conc + disc + tb))
    return (conc - disc) / den if den > 0 else None


def top_k_recall(pred: list[float], true: list[float], k: int) -> float:
    """|top-k by ``pred`` ∩ top-k by ``true``| / k (k capped at the length; higher is better)."""
    k = min(k, len(pred))
    if k <= 0:
        return 0.0
    tp = set(sorted(range(len(pred)), key=lambda i: (-pred[i], i))[:k])
    tt = set(sorted(range(len(true)), key=lambda i: (-true[i], i))[:k])
    return len(tp & tt) / k


def evaluate(groups: dict[str, list[tuple[str, float]]], score, k: int = 3) -> dict:
    """Ranking quality of ``score(original_text, [transformed_text]) -> [predicted ln
    speedup]`` on measured groups (:func:`measured_groups`): ``{groups, measurements, tau,
    recall_at_k, k}``, means over the groups with at least two distinct measurements."""
    taus, recalls, n = [], [], 0
    for orig, items in groups.items():
        true = [ls for _, ls in items]
        if len(items) < 2 or len(set(true)) < 2:
            continue
        pred = score(orig, [t for t, _ in items])
        tau = kendall_tau(pred, true)
        if tau is not None:
            taus.append(tau)
        recalls.append(top_k_recall(pred, true, k))
        n += len(items)
    return {"groups": len(recalls), "measurements": n, "k": k,
            "tau": sum(taus) / len(taus) if taus else None,
            "recall_at_k": sum(recalls) / len(recalls) if recalls else None}


def static_score(target: str = "cpu"):
    """``score(base, cands)`` of the static model (:func:`steptp.cost_model.static.static_scores`)
    over program texts or parsed programs: ln(est(base) / est(cand))."""
    from ..leir import parse_program
    from .static import static_scores

    def score(base, cands):
        return static_scores(parse_program(base) if isinstance(base, str) else base,
                             [parse_program(c) if isinstance(c, str) else c for c in cands], target)

    return score


# ---------------------------------------------------------------------------
# scorers for the search
# ---------------------------------------------------------------------------


def _last_if_unchanged(node, proposals, scores: list[float], target: str) -> list[float]:
    """Scores with the proposals whose features equal ``node``'s (nothing the model sees
    changes: e.g. a thread binding on the CPU, usually a no-op) moved below every other."""
    base = features_of(node.module.program, target)
    low = min(scores, default=0.0) - 1.0
    return [low if features_of(p.module.program, target) == base else s for p, s in zip(proposals, scores)]


class RandomScorer:
    """Seeded random scores (the baseline of model-scored selection)."""

    def __init__(self, seed: int = 0):
        self.seed = seed

    def predict(self, base: A.Program, programs: list[A.Program]) -> list[float]:
        """A seeded random number in [0, 1) per program (a function of the seed and both texts)."""
        from ..leir import format_program

        b = format_program(base)
        return [_rng(self.seed, b, format_program(p), "score").random() for p in programs]

    def update(self, rows) -> None:
        """Nothing to learn."""

    def score(self, node, proposals) -> list[float]:
        """A seeded random number per proposal (a function of the seed, node and program)."""
        from ..leir import format_program

        return [_rng(self.seed, node.text, format_program(p.module.program), "score").random() for p in proposals]


class CostScorer:
    """The static roofline model (:mod:`steptp.cost_model.static`): ln(est(node) / est(candidate))."""

    def __init__(self, target: str = "cpu"):
        self.target = target
        self._score = static_score(target)

    def predict(self, base: A.Program, programs: list[A.Program]) -> list[float]:
        """ln(est(base) / est(program)) of the static model for ``self.target``."""
        return list(self._score(base, programs))

    def update(self, rows) -> None:
        """Nothing to learn (a static model)."""

    def score(self, node, proposals) -> list[float]:
        """Predicted ln speedup of each proposal over ``node`` by the static model (ranked
        last when its features equal the node's)."""
        return _last_if_unchanged(node, proposals, self._score(node.module.program,
                                                               [p.module.program for p in proposals]), self.target)


class ModelScorer:
    """The learned model, refitted online on the search's own samples.

    ``model``: a trained :class:`LearnedModel` (offline, ``--rank model:PATH``) or None (online
    only: the static model ranks until ``min_samples`` samples have been seen);
    ``retrain_every``: samples between refits. ``stats``: online rows, refits, seconds."""

    def __init__(self, model: LearnedModel | None = None, target: str = "cpu", retrain_every: int = 4,
                 min_samples: int = 4):
        require_lightgbm()
        self.model = model if model is not None else LearnedModel(target)
        self.target = target
        self.retrain_every = retrain_every
        self.min_samples = min_samples
        self.static = CostScorer(target)
        self.samples = 0
        self._pending = 0
        self.stats = {"offline_rows": len(self.model.y), "online_rows": 0, "refits": 0, "seconds": 0.0}

    def score(self, node, proposals) -> list[float]:
        """Predicted ln speedup of each proposal over ``node`` (the static model while the
        learned one has neither offline data nor ``min_samples`` samples; ranked last when
        its features equal the node's)."""
        if not proposals:
            return []
        if not self.model.trained:
            return self.static.score(node, proposals)
        t0 = time.perf_counter()
        try:
            pred = self.model.predict(node.module.program, [p.module.program for p in proposals])
            return _last_if_unchanged(node, proposals, pred, self.target)
        finally:
            self.stats["seconds"] += time.perf_counter() - t0

    def predict(self, base: A.Program, programs: list[A.Program]) -> list[float]:
        """Predicted ln speedups over ``base``: the learned model's once trained, else the
        static model's."""
        if not self.model.trained:
            return self.static.predict(base, programs)
        return list(self.model.predict(base, programs))

    def update(self, rows) -> None:
        """Add measured ``(base, program, ln speedup)`` rows (and their reverses, weighted
        ``ONLINE_WEIGHT``) and refit once ``min_samples`` rows are in."""
        for a, b, ls in rows:
            fa, fb = features_of(a, self.target), features_of(b, self.target)
            self.model.add_row(fa, fb, ls, ONLINE_WEIGHT)
            self.model.add_row(fb, fa, -ls, ONLINE_WEIGHT)
            self.stats["online_rows"] += 2
            self.samples += 1
        if self.samples >= self.min_samples and rows:
            self.model.fit()
            self.stats["refits"] += 1

    def observe(self, root, parent, child) -> None:
        """Learn from one timed sample ``child`` of ``parent`` (nodes with ``time_us``):
        rows parent -> child (and root -> child) with their reverses; refit every
        ``retrain_every`` samples once ``min_samples`` are in."""
        t0 = time.perf_counter()
        pairs = [(parent, child)] + ([(root, child)] if root is not parent else [])
        for a, b in pairs:
            if not (a.time_us and b.time_us and a.time_us > 0 and b.time_us > 0):
                continue
            fa, fb = features_of(a.module.program, self.target), features_of(b.module.program, self.target)
            ls = math.log(a.time_us / b.time_us)
            self.model.add_row(fa, fb, ls, ONLINE_WEIGHT)
            self.model.add_row(fb, fa, -ls, ONLINE_WEIGHT)
            self.stats["online_rows"] += 2
        self.samples += 1
        self._pending += 1
        if self.samples >= self.min_samples and self._pending >= self.retrain_every:
            self._pending = 0
            self.model.fit()
            self.stats["refits"] += 1
        self.stats["seconds"] += time.perf_counter() - t0


__all__ = ["LearnedModel", "CostModelError", "CostModelUnavailable", "CostScorer", "ModelScorer", "Pair",
           "RandomScorer", "evaluate", "features_of", "kendall_tau", "load_pairs",
           "measured_groups", "pair_vector", "pairs_of", "require_lightgbm",
           "static_score", "top_k_recall", "train"]
