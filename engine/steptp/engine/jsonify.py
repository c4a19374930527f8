"""JSON-ready values of engine objects (a step's parameters, a site)."""

from __future__ import annotations

from typing import Any


def plain(v: Any):
    """``v`` as JSON-ready data: dict keys as text, tuples as lists, LEIR subterms (math-rule
    parameter values) as their LEIR text, anything else as ``str``."""
    if isinstance(v, dict):
        return {str(k): plain(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [plain(x) for x in v]
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    try:
        from ..leir.printer import format_node

        return format_node(v)
    except Exception:  # noqa: BLE001 - any other value is recorded as its text
        return str(v)


__all__ = ["plain"]
