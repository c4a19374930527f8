"""Measured GPU samples for the learned cost model: the H200 timings shipped with the package,
their export from a search directory, and how well each model ranked what a GPU measured.

A *sample* row is ``(root .leir, candidate .leir, ln speedup of the candidate over the root)``:
a candidate that ran Equal on the GPU and was timed interleaved with its root. A search with the
``pack`` runner writes them in ``OUT/<program>/tree.jsonl`` (status ``equal``, ``speedup``)
beside ``OUT/<program>/root.leir``; :func:`search_rows` reads them back."""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path
from typing import Any

from ..leir.fileformat import parse_leir


def _key(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def search_rows(out: str | Path) -> dict[str, tuple[str, list[tuple[str, float]]]]:
    """``{program: (root text, [(candidate text, ln speedup)])}`` of every program directory
    under the search directory ``out`` (``root.leir`` and ``tree.jsonl``; the Equal, timed
    nodes with a speedup). Programs without both files are left out."""
    res = {}
    for tree in sorted(Path(out).glob("*/tree.jsonl")):
        root = tree.parent / "root.leir"
        if not root.exists():
            continue
        rows = []
        for line in tree.read_text(encoding="utf-8").splitlines():
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            if rec.get("status") == "equal" and rec.get("speedup") and rec["speedup"] > 0:
                rows.append((rec["leir"], math.log(float(rec["speedup"]))))
        res[tree.parent.name] = (root.read_text(encoding="utf-8"), rows)
    return res


def _training_rows(groups: dict, exclude: str | None = None) -> list[tuple[str, str, float]]:
    """``(root text, candidate text, ln speedup)`` of every program of :func:`search_rows` but
    ``exclude``."""
    return [(root, text, ls) for name, (root, rows) in groups.items() if name != exclude for text, ls in rows]


#: GPU timings shipped with the package (``stp-gpu-samples/1``, gzipped JSON): the samples of
#: the 40-program corpus search measured on an NVIDIA H200 (issue 37), written by
#: :func:`export_samples`. ``--rank model`` starts from them (the default GPU model).
SHIPPED_SAMPLES = Path(__file__).with_name("data") / "gpu_samples_h200.json.gz"


def export_samples(out_dir: str | Path, path: str | Path, device: str) -> dict:
    """Write the GPU samples of a search directory (:func:`search_rows`) to ``path`` as
    ``stp-gpu-samples/1`` (gzipped JSON: ``roots`` by key, ``rows`` ``[root key, candidate
    .leir, ln speedup]``, ``device``). Returns the counts. Raises ``OSError`` when ``path``
    cannot be written."""
    import gzip  # noqa: PLC0415

    roots, rows = {}, []
    for root, cands in search_rows(out_dir).values():
        key = _key(root)
        for text, ls in cands:
            roots[key] = root
            rows.append([key, text, round(ls, 6)])
    doc = {"format": "stp-gpu-samples/1", "device": device, "roots": roots, "rows": rows}
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(path, "wt", encoding="utf-8") as fh:
        json.dump(doc, fh, separators=(",", ":"))
    return {"programs": len(roots), "rows": len(rows)}


_SHIPPED: list | None = None  # [(root key, root text, candidate text, ln speedup)]


def shipped_rows(exclude_roots=()) -> list[tuple[str, str, float]]:
    """``(root text, candidate text, ln speedup)`` of :data:`SHIPPED_SAMPLES` (empty when the
    file is missing), without the rows of programs whose root text is in ``exclude_roots``
    (a search of those programs is not helped by their own timings)."""
    global _SHIPPED
    if _SHIPPED is None:
        import gzip  # noqa: PLC0415

        try:
            with gzip.open(SHIPPED_SAMPLES, "rt", encoding="utf-8") as fh:
                doc = json.load(fh)
            _SHIPPED = [(k, doc["roots"][k], text, float(ls)) for k, text, ls in doc["rows"]]
        except (OSError, ValueError, KeyError):
            _SHIPPED = []
    skip = {_key(t) for t in exclude_roots}
    return [(root, text, ls) for k, root, text, ls in _SHIPPED if k not in skip]


def learned_model(rows: list[tuple[str, str, float]]):
    """A :class:`steptp.cost_model.learned.LearnedModel` for ``cuda`` fitted on ``rows``
    (:func:`_training_rows`), or None with fewer than 4 rows or without LightGBM."""
    from .learned import CostModelUnavailable, LearnedModel, features_of, require_lightgbm  # noqa: PLC0415

    if len(rows) < 4:
        return None
    try:
        require_lightgbm()
    except CostModelUnavailable:
        return None
    m = LearnedModel("cuda")
    for root, cand, ls in rows:
        m.add_row(_features(root, features_of), _features(cand, features_of), ls)
    return m.fit()


_FEATURES: dict[str, Any] = {}  # LEIR text -> features_of(..., "cuda"): the shipped rows are refitted per program


def _features(text: str, features_of):
    hit = _FEATURES.get(text)
    if hit is None:
        if len(_FEATURES) >= 50_000:
            _FEATURES.clear()
        hit = _FEATURES[text] = features_of(parse_leir(text).program, "cuda")
    return hit


def _scores(root_text: str, texts: list[str], model) -> list[float]:
    """Predicted ln speedups over the root: the learned model's, else the static GPU model's
    (:func:`steptp.cost_model.static.static_scores` on ``cuda``)."""
    from .static import static_scores  # noqa: PLC0415

    root = parse_leir(root_text).program
    progs = [parse_leir(t).program for t in texts]
    return model.predict(root, progs) if model is not None else static_scores(root, progs, "cuda")


def ranking_quality(out_dir: str | Path, k: int = 3) -> dict:
    """How well the GPU cost models ranked what the node measured, per program of the search
    directory ``out_dir`` (its Equal, timed candidates; programs with at least two distinct
    speedups): mean
    Kendall τ and top-``k`` recall of the static GPU model (``ln(est_root / est_cand)``), of
    the learned model fitted on the *other* programs' samples only (held out by program; None
    with the reason without LightGBM or with too few samples) and of the shipped model
    (:data:`SHIPPED_SAMPLES` without the program's own rows)."""
    from .learned import kendall_tau, top_k_recall  # noqa: PLC0415

    out = {"static": {"tau": [], "recall": []}, "learned": {"tau": [], "recall": []},
           "shipped": {"tau": [], "recall": []}}
    learned_ok, why = True, ""
    groups = search_rows(out_dir)
    for name, (root, items) in groups.items():
        true = [ls for _, ls in items]
        if len(items) < 2 or len(set(true)) < 2:
            continue
        texts = [t for t, _ in items]
        for kind, model in (("static", None), ("learned", "held-out"), ("shipped", None)):
            if kind == "shipped":
                rows = shipped_rows([root])
                if not rows:
                    continue
                model = learned_model(rows)  # refitted without this program's rows: held out
                if model is None:
                    continue
            if kind == "learned":
                if not learned_ok:
                    continue
                model = learned_model(_training_rows(groups, exclude=name))
                if model is None:
                    learned_ok, why = False, "fewer than 4 samples of other programs, or no LightGBM"
                    continue
            pred = _scores(root, texts, model)
            tau = kendall_tau(pred, true)
            if tau is not None:
                out[kind]["tau"].append(tau)
            out[kind]["recall"].append(top_k_recall(pred, true, k))
    res = {}
    for kind, v in out.items():
        n = len(v["recall"])
        res[kind] = {"groups": n, "k": k, "tau": sum(v["tau"]) / len(v["tau"]) if v["tau"] else None,
                     f"recall_at_{k}": sum(v["recall"]) / n if n else None}
    if not learned_ok:
        res["learned"]["reason"] = why
    if not res["shipped"]["groups"]:
        res["shipped"]["reason"] = "no shipped GPU samples of other programs, or no LightGBM"
    return res


__all__ = ["SHIPPED_SAMPLES", "search_rows", "export_samples", "shipped_rows", "learned_model", "ranking_quality"]
