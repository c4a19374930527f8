"""The ``.leir`` file format: a ``%`` signature header (LaTeX comments) and the program.

Example::

    % program: Gemm ReLU
    % input A: f32[8,12]
    % param W: f32[16,12]
    % output C: f32[8,16]
    B^{8}_{tx=0}L^{16}_{a=0}L^{12}_{c=0}[D^{f32,g}_{tx,a}=D^{f32,g}_{tx,a}+A^{f32,g}_{tx,c}*W^{f32,g}_{a,c};];
    B^{8}_{tx=0}L^{16}_{a=0}[C^{f32,g}_{tx,a}=max(D^{f32,g}_{tx,a},0.0);];

Header lines: ``% program: NAME`` once, then ``% ROLE NAME: DTYPE[d0,d1,...]`` with ROLE in
``input | param | constant | output`` (``DTYPE[]`` is a scalar). Known tensors are the
function parameters of the lowered program, in header order (inputs, params and constants
are read; outputs are written). Every other tensor is an intermediate whose shape is
inferred from its index ranges. Other ``%`` lines are free comments.
"""

from __future__ import annotations

import functools
import math
import re
from dataclasses import dataclass
from pathlib import Path

from . import ast as A
from .limits import MAX_ELEMENTS, MAX_EXTENT, MAX_SOURCE_CHARS
from .parser import LeirSyntaxError, parse_program
from .printer import format_program

ROLES = ("input", "param", "constant", "output")


@dataclass(frozen=True)
class TensorDecl:
    """A known tensor: ``role`` in :data:`ROLES`, LEIR ``dtype`` code, ``shape`` (elements)."""

    name: str
    role: str
    dtype: str
    shape: tuple[int, ...]

    @property
    def is_output(self) -> bool:
        return self.role == "output"


@dataclass(frozen=True)
class Signature:
    """Program name and known tensors (in function-parameter order)."""

    name: str
    tensors: tuple[TensorDecl, ...] = ()

    def get(self, name: str) -> TensorDecl | None:
        """The declaration of tensor ``name``, or None."""
        return self._by_name.get(name)

    @functools.cached_property
    def _by_name(self) -> dict[str, TensorDecl]:
        out: dict[str, TensorDecl] = {}
        for t in self.tensors:
            out.setdefault(t.name, t)  # the first declaration, as a scan would find
        return out

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(t.name for t in self.tensors)

    @property
    def inputs(self) -> tuple[TensorDecl, ...]:
        return tuple(t for t in self.tensors if not t.is_output)

    @property
    def outputs(self) -> tuple[TensorDecl, ...]:
        return tuple(t for t in self.tensors if t.is_output)

    def header(self) -> str:
        lines = [f"% program: {self.name}"]
        for t in self.tensors:
            lines.append(f"% {t.role} {t.name}: {t.dtype}[{','.join(map(str, t.shape))}]")
        return "\n".join(lines)


@dataclass(frozen=True)
class LeirModule:
    """A parsed ``.leir`` file: signature + program."""

    signature: Signature
    program: A.Program

    def text(self) -> str:
        return format_leir(self)


_PROGRAM_RE = re.compile(r"^\s*%\s*program\s*:\s*(?P<name>.*?)\s*$")
_DECL_RE = re.compile(
    r"^\s*%\s*(?P<role>input|param|constant|output)\s+(?P<name>[A-Z][A-Za-z0-9]*)\s*:\s*"
    r"(?P<dtype>[a-z0-9]+)\s*\[(?P<shape>[^\]]*)\]\s*$", re.ASCII)


def _shape(shape_txt: str, source: str, lineno: int, col: int, line: str) -> tuple[int, ...]:
    """Dimensions of a header shape ``d0,d1,...`` (empty: a scalar). Each must be a positive
    integer up to :data:`~steptp.leir.limits.MAX_EXTENT`, their product up to
    :data:`~steptp.leir.limits.MAX_ELEMENTS`; raises :class:`LeirSyntaxError` otherwise."""
    if not shape_txt.strip():
        return ()
    dims = []
    offset = 0
    for part in shape_txt.split(","):
        c = col + offset + (len(part) - len(part.lstrip()))
        offset += len(part) + 1
        p = part.strip()
        if not p:
            raise LeirSyntaxError("empty tensor dimension", source, lineno, c, ["a positive integer"], f"  {line}")
        if not re.fullmatch(r"[0-9]+", p):
            bad = next(i for i, ch in enumerate(p) if ch not in "0123456789")
            raise LeirSyntaxError(f"tensor dimension {p[:24]!r} is not an integer", source, lineno, c + bad,
                                  ["a positive integer (digits 0-9)"], f"  {line}")
        if len(p.lstrip("0")) > len(str(MAX_EXTENT)) or int(p) > MAX_EXTENT:
            raise LeirSyntaxError(f"tensor dimension {p[:24]} exceeds the limit {MAX_EXTENT}", source, lineno, c,
                                  None, f"  {line}")
        if int(p) <= 0:
            raise LeirSyntaxError("tensor dimensions must be positive", source, lineno, c, None, f"  {line}")
        dims.append(int(p))
    if math.prod(dims) > MAX_ELEMENTS:
        raise LeirSyntaxError(f"tensor of {math.prod(dims)} elements exceeds the limit {MAX_ELEMENTS}", source,
                              lineno, col, None, f"  {line}")
    return tuple(dims)


def parse_leir(text: str, source: str = "<string>") -> LeirModule:
    """Parse ``.leir`` text (header + program).

    Raises :class:`LeirSyntaxError` (with source, line, column) for a malformed header
    line or program, a dtype code that does not exist, or a duplicated tensor.
    """
    if len(text) > MAX_SOURCE_CHARS:
        raise LeirSyntaxError(f"file of {len(text)} characters exceeds the limit {MAX_SOURCE_CHARS}", source, 1, 1)
    name = None
    decls: list[TensorDecl] = []
    body_lines: list[str] = []
    for lineno, line in enumerate(text.splitlines(), 1):
        stripped = line.lstrip()
        if not stripped.startswith("%"):
            body_lines.append(line)
            continue
        body_lines.append("")  # keep line numbers of the program intact
        col = len(line) - len(stripped) + 1
        m = _PROGRAM_RE.match(line)
        if m:
            name = m.group("name")
            continue
        if re.match(r"^\s*%\s*(input|param|constant|output)\b", line):
            m = _DECL_RE.match(line)
            if not m:
                raise LeirSyntaxError("malformed tensor declaration", source, lineno, col,
                                      ["'% ROLE NAME: DTYPE[d0,d1,...]'"], f"  {line}")
            if m.group("dtype") not in A.DTYPES:
                raise LeirSyntaxError(f"unknown dtype {m.group('dtype')!r}", source, lineno,
                                      m.start("dtype") + 1, sorted(A.DTYPES), f"  {line}")
            shape = _shape(m.group("shape"), source, lineno, m.start("shape") + 1, line)
            if any(d.name == m.group("name") for d in decls):
                raise LeirSyntaxError(f"tensor {m.group('name')} declared twice", source, lineno, col, None,
                                      f"  {line}")
            decls.append(TensorDecl(m.group("name"), m.group("role"), m.group("dtype"), shape))
    prog = parse_program("\n".join(body_lines), source)
    if name is None:
        name = Path(source).stem if source != "<string>" else "program"
    return LeirModule(Signature(name, tuple(decls)), prog)


def format_leir(module: LeirModule) -> str:
    """``.leir`` text: header lines, then one top-level nest per line."""
    return module.signature.header() + "\n" + format_program(module.program, sep="\n") + "\n"


def load_leir(path: str | Path) -> LeirModule:
    """Read and parse a ``.leir`` file; errors name the file, line and column."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise LeirSyntaxError(f"not a UTF-8 text file (byte {e.start})", str(p), 1, 1) from None
    return parse_leir(text, str(p))


def save_leir(module: LeirModule, path: str | Path) -> None:
    """Write a ``.leir`` file atomically (temp file + rename)."""
    p = Path(path)
    tmp = p.with_name(p.name + ".tmp")
    tmp.write_text(format_leir(module))
    tmp.replace(p)


__all__ = ["ROLES", "TensorDecl", "Signature", "LeirModule", "parse_leir", "format_leir",
           "load_leir", "save_leir"]
