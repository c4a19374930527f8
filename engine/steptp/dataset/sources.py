"""Input discovery for ``stp dataset``: :mod:`steptp.programs` (one rule set for every
command), re-exported here for the dataset modules and older imports."""

from __future__ import annotations

from ..programs import Source, discover

__all__ = ["Source", "discover"]
