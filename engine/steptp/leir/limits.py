"""Explicit size limits of LEIR input, checked before any recursive or memory-hungry work.

Every limit is a plain module constant so tools and tests can name it. A violation is
reported as a :class:`~steptp.leir.parser.LeirSyntaxError` (file, line, column) by the
parser and the ``.leir`` header reader, or as a
:class:`~steptp.leir.analysis.LeirSemanticError` by :func:`steptp.leir.analysis.analyze`.

* :data:`MAX_SOURCE_CHARS` - a ``.leir`` text longer than this is refused outright.
* :data:`MAX_EXPR_DEPTH` - nesting depth of one expression (operators, calls, subscripts).
  The AST, printer, analysis and lowering walk expressions recursively; 128 levels keep
  them far below Python's default recursion limit of 1000 frames. Translated programs
  stay below 30 levels.
* :data:`MAX_NEST_DEPTH` - nests inside nests.
* :data:`MAX_INT` - the largest integer literal (``2**63 - 1``, the int64 range of TIR
  index arithmetic; also keeps Python's 4300-digit ``int()`` limit out of reach).
* :data:`MAX_EXTENT` - the largest loop extent or tensor dimension (``2**31 - 1``: TVM
  loop variables and buffer dimensions are int32).
* :data:`MAX_ELEMENTS` - the largest element count of one tensor (``2**31 - 1``: int32 flat
  offsets in the generated kernels).
"""

from __future__ import annotations

MAX_SOURCE_CHARS = 4_000_000
MAX_EXPR_DEPTH = 128
MAX_NEST_DEPTH = 24
MAX_INT = 2**63 - 1
MAX_EXTENT = 2**31 - 1
MAX_ELEMENTS = 2**31 - 1

__all__ = ["MAX_SOURCE_CHARS", "MAX_EXPR_DEPTH", "MAX_NEST_DEPTH", "MAX_INT", "MAX_EXTENT", "MAX_ELEMENTS"]
