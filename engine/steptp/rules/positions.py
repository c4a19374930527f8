"""Where a problem of a rule file is in its text: :func:`locate_error` places each problem of a
:class:`~steptp.rules.schema.RuleError` (``rule.yaml:27:5: where[3]: unknown relation 'compund';
did you mean 'compound'?``) with the YAML field locator of :mod:`steptp.positions`, whose
names this module re-exports for the rule checks.
"""

from __future__ import annotations

import re

from ..positions import (compose, did_you_mean, field_parts, field_span, inner_position, line_col,
                         locate_field)

_QUOTED = re.compile(r"'([^'\s]+)'")


def locate_error(e, text: str):
    """The :class:`~steptp.rules.schema.RuleError` ``e`` with each problem located in the
    rule text ``text`` (``FILE:LINE:COL: field: message``); ``e`` itself when it already
    has positions or the text does not parse. The name looked for in a field is ``e.name``
    for the first problem; without one, a parse error inside a one-line scalar (``at line 1,
    column 14``) points into the scalar, else the first quoted word of the message is looked
    for."""
    from .schema import RuleError

    if any(e.positions):
        return e
    root = compose(text)
    if root is None:
        return e
    positions = []
    for i, (fld, msg) in enumerate(e.problems):
        name = e.name if i == 0 and e.name else None
        inner = None if name else inner_position(text, fld, msg, root)
        if inner is not None:
            positions.append(inner)
            continue
        if name is None:
            m = _QUOTED.search(msg)
            name = m.group(1) if m else None
        positions.append(locate_field(text, fld, name, root))
    return RuleError(e.source, e.field, e.message, e.problems, name=e.name, positions=positions)


__all__ = ["field_parts", "line_col", "field_span", "locate_field", "locate_error", "did_you_mean"]
