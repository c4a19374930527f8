"""``stp gpu merge RESULTS DATASET``: write a GPU run's verdicts and timings into the dataset.

Every entry of ``DATASET/dictionary.jsonl`` that the run (``RESULTS/results.jsonl`` of
:mod:`steptp.gpu.run`) checked gets ``verification_gpu`` (``device``, ``device_name``,
``arch``, ``status``, ``exec``, ``equal``, ``max_abs_err``, ``max_rel_err``, ``trials``,
``reason``, ``first_call_ms``, whether the original also matched on the GPU,
``agrees_with_cpu``, ``sanitizer_clean``, ``schema``) and, when timed, ``timing_gpu``
(``original_us``, ``transformed_us``, their IQRs, ``speedup`` with its interval and verdict)
and, when PyTorch eager was timed beside the program, ``eager_gpu`` (``eager_us``,
``original_us``: microseconds per call, measured interleaved). The results are read through
:mod:`steptp.runner.record` (another schema version: :class:`MergeError`, one line). The CPU
``verification`` is left as it is; ``stp report`` lists the entries whose verdicts differ.
The file is rewritten atomically (a temporary file renamed over it), so an interrupted merge
leaves the dataset as it was; merging again replaces the fields.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import asdict
from pathlib import Path

from ..runner.record import SchemaError, read_entries


class MergeError(ValueError):
    """Unreadable results or dataset."""


def merge(results: str | os.PathLike, dataset: str | os.PathLike) -> dict:
    """Merge (module docstring). Returns ``{"entries", "merged", "timed", "disagreements",
    "unknown"}`` (``unknown``: result ids not in the dataset). Raises :class:`MergeError`."""
    rpath = Path(results) / "results.jsonl" if Path(results).is_dir() else Path(results)
    dpath = Path(dataset) / "dictionary.jsonl" if Path(dataset).is_dir() else Path(dataset)
    if not rpath.is_file():
        raise MergeError(f"{rpath}: cannot read GPU results (no such file)")
    try:
        recs = read_entries(rpath)
    except (OSError, SchemaError) as e:
        raise MergeError(f"{rpath}: cannot read GPU results ({e})") from None
    try:
        lines = dpath.read_text(encoding="utf-8").splitlines()
    except OSError as e:
        raise MergeError(f"{dpath}: cannot read the dataset ({e.strerror or e})") from None
    out, merged, timed, dis, seen = [], 0, 0, 0, set()
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            e = json.loads(line)
        except ValueError as err:
            raise MergeError(f"{dpath}:{n}: not JSON ({err})") from None
        r = recs.get(e.get("id"))
        if r is not None:
            seen.add(r.id)
            tr = r.transformed
            e["verification_gpu"] = {
                "device": r.device, "device_name": r.device_name, "arch": r.arch, "status": r.status,
                "exec": bool(tr.exec), "equal": bool(tr.equal), "max_abs_err": tr.max_abs_err,
                "max_rel_err": tr.max_rel_err, "trials": tr.trials, "reason": r.reason or tr.reason,
                "first_call_ms": tr.first_call_ms, "original_equal": bool(r.original.equal),
                "agrees_with_cpu": r.agree, "sanitizer_clean": r.sanitizer_clean(), "schema": r.schema}
            merged += 1
            dis += r.agree is False
            eg = r.eager or {}
            if eg.get("eager_us") is not None:
                e["eager_gpu"] = {"eager_us": eg["eager_us"], "original_us": eg.get("original_us")}
            if r.timing is not None and r.timing.speedup is not None:
                e["timing_gpu"] = asdict(r.timing)
                timed += 1
        out.append(json.dumps(e, ensure_ascii=False))
    fd, tmp = tempfile.mkstemp(prefix=".merge-", dir=dpath.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write("\n".join(out) + ("\n" if out else ""))
        os.replace(tmp, dpath)
    except OSError as err:
        Path(tmp).unlink(missing_ok=True)
        raise MergeError(f"{dpath}: cannot write ({err.strerror or err}); the dataset is unchanged") from None
    return {"entries": len(out), "merged": merged, "timed": timed, "disagreements": dis,
            "unknown": len(set(recs) - seen)}


__all__ = ["MergeError", "merge"]
