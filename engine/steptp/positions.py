"""Where a field of a YAML file (a rule, a recipe) is in its text: ``field.path`` ->
``(line, column)``.

Errors name a field (``where[3]``, ``filter[0].no_overflw``, ``steps[2].params.f``); this module
maps such a path onto the YAML text through the composed node tree (PyYAML's
``yaml.compose``, whose marks carry character offsets), so that an error reads
``rule.yaml:27:5: where[3]: unknown relation 'compund'; did you mean 'compound'?``. When the
error is about a name (an unknown relation, function or key), the name is looked for inside
the field's text and the position is that of the name.

Also :func:`did_you_mean`, the closest registered names to a misspelled one
(:func:`difflib.get_close_matches`), for the messages of the name checks.
"""

from __future__ import annotations

import difflib
import re
from typing import Iterable

import yaml

_PART = re.compile(r"\[(\d+)\]|([^.\[\]]+)")


def field_parts(field: str) -> list:
    """``"where[0].check"`` -> ``["where", 0, "check"]`` (the inverse of
    :func:`steptp.rules.schema.field_path`); ``""`` and ``"(top level)"`` -> ``[]``."""
    if not field or field == "(top level)":
        return []
    return [int(m.group(1)) if m.group(1) is not None else m.group(2) for m in _PART.finditer(field)]


def compose(text: str):
    try:
        return yaml.compose(text, Loader=yaml.SafeLoader)
    except (yaml.YAMLError, RecursionError):
        return None


def line_col(text: str, index: int) -> tuple[int, int]:
    """1-based ``(line, column)`` of the character offset ``index`` of ``text``."""
    line = text.count("\n", 0, index) + 1
    return line, index - (text.rfind("\n", 0, index) + 1) + 1


def _walk(root, field: str):
    """``(start offset, node)``: the deepest node ``field`` reaches from ``root``; ``start``
    is its key's offset when the last step was a mapping key."""
    node = root
    start = node.start_mark.index
    for part in field_parts(field):
        if isinstance(node, yaml.MappingNode):
            hit = next(((k, v) for k, v in node.value if isinstance(k, yaml.ScalarNode) and k.value == str(part)), None)
            if hit is None:
                break
            start, node = hit[0].start_mark.index, hit[1]
        elif isinstance(node, yaml.SequenceNode) and isinstance(part, int) and 0 <= part < len(node.value):
            node = node.value[part]
            start = node.start_mark.index
        else:
            break
    return start, node


def field_span(text: str, field: str, root=None) -> tuple[int, int] | None:
    """``(start, end)`` character offsets of the deepest node of ``text`` that ``field``
    reaches (from its key when the last step was a mapping key, so that the span holds the
    key too); the whole document for the top level; None when the text does not parse."""
    root = root if root is not None else compose(text)
    if root is None:
        return None
    start, node = _walk(root, field)
    return start, max(start, node.end_mark.index)


def locate_field(text: str, field: str, name: str | None = None, root=None) -> tuple[int, int] | None:
    """1-based ``(line, column)`` of ``field`` in the YAML text ``text``: of ``name`` when it
    occurs (as a whole word) inside the field, else of the field's key or item; None when the
    text does not parse as YAML."""
    span = field_span(text, field, root)
    if span is None:
        return None
    start, end = span
    if name:
        m = re.compile(r"(?<![A-Za-z0-9_?])" + re.escape(name) + r"(?![A-Za-z0-9_])").search(text, start, end)
        if m is not None:
            return line_col(text, m.start())
    return line_col(text, start)


_INNER = re.compile(r"at line 1, column (\d+)")


def inner_position(text: str, field: str, message: str, root) -> tuple[int, int] | None:
    """Where a parse error inside a one-line scalar points (``... at line 1, column 14`` of
    a pattern or value expression): the scalar's own text must stand verbatim in the file
    (plain or quoted, no escapes); None otherwise."""
    m = _INNER.search(message)
    if m is None:
        return None
    _, node = _walk(root, field)
    if not isinstance(node, yaml.ScalarNode) or node.style not in (None, "'", '"') or "\n" in node.value:
        return None
    vstart = node.start_mark.index + (1 if node.style else 0)
    if text[vstart:vstart + len(node.value)] != node.value:
        return None
    col = int(m.group(1)) - 1
    return line_col(text, vstart + col) if 0 <= col <= len(node.value) else None


def did_you_mean(name: str, known: Iterable[str], n: int = 3) -> str:
    """``"; did you mean 'compound'?"`` (up to ``n`` closest of ``known``, best first), or ``""``
    when none is close (:func:`difflib.get_close_matches`, cutoff 0.6)."""
    close = difflib.get_close_matches(name, sorted(set(known)), n=n, cutoff=0.6)
    if not close:
        return ""
    if len(close) == 1:
        return f"; did you mean {close[0]!r}?"
    return "; did you mean " + ", ".join(repr(c) for c in close[:-1]) + f" or {close[-1]!r}?"


__all__ = ["field_parts", "line_col", "compose", "field_span", "locate_field", "inner_position", "did_you_mean"]
