"""Verification through the translator: translate every corpus program, verify it against
PyTorch (3 seeded trials) and group the failures by op (:func:`verify_corpus`,
:func:`format_report`)."""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any, Callable, Iterable

from .generate import parse_header


# --------------------------------------------------------------------------------------
# verification through the translator
# --------------------------------------------------------------------------------------

_OP_PATTERNS = (
    re.compile(r"\bop(?:erator)?\s*[`'\"]([\w.:<>-]+)[`'\"]", re.I),
    re.compile(r"\bunsupported (?:op|operator|function|method|module)\s*[:=]?\s*[`'\"]?([\w.:<>-]+)", re.I),
    re.compile(r"\b(?:op|operator|target)\s*[:=]\s*[`'\"]?([\w.:<>-]+)", re.I),
)


def _failure_op(exc: BaseException) -> str:
    for attr in ("op", "op_name", "target", "operator"):
        v = getattr(exc, attr, None)
        if v:
            return str(v)
    msg = str(exc)
    for pat in _OP_PATTERNS:
        m = pat.search(msg)
        if m:
            return m.group(1)
    return type(exc).__name__


def _short(msg: str, n: int = 200) -> str:
    """First line of a failure message, with paths and standalone numbers normalized."""
    lines = str(msg).strip().splitlines()
    msg = " ".join(lines[0].split()) if lines else ""
    msg = re.sub(r"[^\s'\"]*/[^\s'\"]+", "<path>", msg)        # paths differ per program
    msg = re.sub(r"(?<![\w.])[-+]?\d+(?:\.\d+)?(?:e[-+]?\d+)?(?![\w.])", "N", msg)
    return msg[:n]


def _verify_one(path: str, trials: int, seed: int, verify_kwargs: dict | None = None) -> dict:
    info = parse_header(Path(path))
    rec: dict[str, Any] = {"path": str(path), "type": info.get("type", Path(path).stem),
                           "category": info.get("category", "?"), "dtype": info.get("dtype", "?"),
                           "components": info.get("components", []), "ok": False}
    t0 = time.perf_counter()
    try:
        from steptp.frontend import translate_file  # type: ignore[attr-defined]
    except Exception as e:  # translator not there (yet)
        rec.update(stage="import", op="translator", reason=f"{type(e).__name__}: {e}")
        return rec
    try:
        tr = translate_file(Path(path))
    except Exception as e:
        rec.update(stage="translate", op=_failure_op(e), reason=f"{type(e).__name__}: {e}")
        rec["seconds"] = round(time.perf_counter() - t0, 3)
        return rec
    try:
        res = tr.verify(trials=trials, seed=seed, **(verify_kwargs or {}))
    except Exception as e:
        rec.update(stage="verify", op=_failure_op(e), reason=f"{type(e).__name__}: {e}")
        rec["seconds"] = round(time.perf_counter() - t0, 3)
        return rec
    rec["seconds"] = round(time.perf_counter() - t0, 3)
    if getattr(res, "equal", False):
        rec["ok"] = True
        return rec
    stage = "mismatch"
    for name in ("build", "exec"):
        if hasattr(res, name) and not getattr(res, name):
            stage = name
            break
    reason = getattr(res, "reason", "") or ""
    err = getattr(res, "max_abs_err", None)
    if not reason and err is not None:
        reason = f"max_abs_err {err:.3g}, max_rel_err {getattr(res, 'max_rel_err', float('nan')):.3g}"
    rec.update(stage=stage, op="+".join(rec["components"]) if stage == "mismatch" else stage, reason=reason)
    return rec


def verify_corpus(paths: Iterable[str | Path], *, trials: int = 3, seed: int = 0, workers: int = 1,
                  progress: Callable[[int, int, dict], None] | None = None,
                  verify_kwargs: dict | None = None) -> dict:
    """Translate and verify corpus programs with ``steptp.frontend.translate_file``.

    For each path: ``translate_file(path)`` then ``.verify(trials=trials, seed=seed,
    **verify_kwargs)``; a program succeeds when the result's ``equal`` is true. ``workers > 1``
    runs programs in spawned worker processes. ``progress(done, total, record)`` is called
    after each one. :func:`format_report` renders the result as text.

    Returns a JSON-serialisable report: ``total``, ``ok``, ``success_rate``, ``translated``
    (programs whose translation did not raise), ``by_category`` and ``by_dtype``
    (``{"total", "ok"}``), ``failures_by_op`` (op -> ``{"count", "stages", "types",
    "reasons" (normalized message -> count), "example"}``; the op is the one named by the
    translator's error, or for a numeric mismatch the program's component chain),
    ``failures`` (one record per failed program) and ``seconds``.
    """
    plist = [str(p) for p in paths]
    t0 = time.perf_counter()
    records: list[dict] = []
    if workers > 1 and len(plist) > 1:
        import multiprocessing as mp
        from concurrent.futures import ProcessPoolExecutor

        with ProcessPoolExecutor(max_workers=workers, mp_context=mp.get_context("spawn")) as ex:
            n = len(plist)
            for i, rec in enumerate(ex.map(_verify_one, plist, [trials] * n, [seed] * n, [verify_kwargs] * n)):
                records.append(rec)
                if progress:
                    progress(i + 1, len(plist), rec)
    else:
        for i, p in enumerate(plist):
            rec = _verify_one(p, trials, seed, verify_kwargs)
            records.append(rec)
            if progress:
                progress(i + 1, len(plist), rec)
    return _report(records, time.perf_counter() - t0)


def _report(records: list[dict], seconds: float) -> dict:
    def tally(key: str) -> dict:
        out: dict[str, dict] = {}
        for r in records:
            d = out.setdefault(str(r.get(key)), {"total": 0, "ok": 0})
            d["total"] += 1
            d["ok"] += bool(r["ok"])
        return dict(sorted(out.items()))

    by_op: dict[str, dict] = {}
    for r in records:
        if r["ok"]:
            continue
        g = by_op.setdefault(r.get("op", "?"), {"count": 0, "stages": {}, "types": [], "reasons": {},
                                                "example": r["path"]})
        g["count"] += 1
        g["stages"][r.get("stage", "?")] = g["stages"].get(r.get("stage", "?"), 0) + 1
        if r["type"] not in g["types"]:
            g["types"].append(r["type"])
        reason = _short(r.get("reason", ""))
        g["reasons"][reason] = g["reasons"].get(reason, 0) + 1
    for g in by_op.values():
        g["types"].sort()
        g["reasons"] = dict(sorted(g["reasons"].items(), key=lambda kv: (-kv[1], kv[0])))
    total = len(records)
    ok = sum(bool(r["ok"]) for r in records)
    return {
        "total": total,
        "ok": ok,
        "success_rate": round(ok / total, 4) if total else 0.0,
        "translated": sum(r.get("stage") not in ("translate", "import") for r in records),
        "by_category": tally("category"),
        "by_dtype": tally("dtype"),
        "failures_by_op": dict(sorted(by_op.items(), key=lambda kv: (-kv[1]["count"], kv[0]))),
        "failures": [r for r in records if not r["ok"]],
        "seconds": round(seconds, 2),
    }


def format_report(report: dict, max_reasons: int = 2) -> str:
    """A human-readable summary of a :func:`verify_corpus` report (success rate, per category
    and dtype, failures grouped by op with their most common reasons)."""
    lines = [f"verified {report['ok']}/{report['total']} programs "
             f"({100 * report['success_rate']:.1f}%), translated {report['translated']}, "
             f"{report['seconds']:.1f}s"]
    for key in ("by_category", "by_dtype"):
        parts = [f"{k} {v['ok']}/{v['total']}" for k, v in report[key].items()]
        lines.append(f"  {key[3:]}: " + ", ".join(parts))
    if report["failures_by_op"]:
        lines.append("failures by op:")
    for op, g in report["failures_by_op"].items():
        stages = ", ".join(f"{k} {v}" for k, v in g["stages"].items())
        types = ", ".join(g["types"][:6]) + (" ..." if len(g["types"]) > 6 else "")
        lines.append(f"  {g['count']:4d}  {op}  [{stages}]  types: {types}")
        for r in list(g["reasons"])[:max_reasons]:
            lines.append(f"          {r}")
    return "\n".join(lines)
