"""The dataset's Parquet export; the crash-safe JSONL and atomic writers it uses are
:mod:`steptp.io`."""

from __future__ import annotations

import json
from pathlib import Path

from ..io import read_jsonl


def to_parquet(jsonl_path: str | Path, parquet_path: str | Path,
               json_columns: tuple[str, ...] = ("params", "site", "original_verification", "figures")) -> int:
    """Convert a JSONL file to Parquet (needs ``pyarrow``: ``pip install steptp[parquet]``).

    Nested fields are kept as structs/lists, except ``json_columns`` whose shape differs
    from rule to rule: those are stored as JSON strings. Returns the number of rows."""
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise RuntimeError("Parquet output needs pyarrow: pip install 'steptp[parquet]'") from e
    rows = [{k: (json.dumps(v) if k in json_columns else v) for k, v in r.items()}
            for r in read_jsonl(jsonl_path)]
    table = pa.Table.from_pylist(rows)
    tmp = Path(str(parquet_path) + ".tmp")
    pq.write_table(table, tmp)
    tmp.replace(parquet_path)
    return len(rows)


__all__ = ["to_parquet"]
