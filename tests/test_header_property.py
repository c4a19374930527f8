"""Header lines are parsed as strictly as programs (issue 34): a property test over header
lines and shapes. Every malformed ``% ROLE NAME: DTYPE[...]`` line gives a
:class:`LeirSyntaxError` naming the line and a column inside it, never another exception;
every well-formed one round-trips through the printer."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from steptp.leir import parse_leir
from steptp.leir.parser import LeirSyntaxError

BODY = "B^{8}_{tx=0}[C^{f32,g}_{tx}=A^{f32,g}_{tx}*2.0;];\n"

shape_chars = st.text(alphabet="0123456789, -+.x_eE\t\u0663\u00b2[", max_size=12)
roles = st.sampled_from(["input", "param", "constant", "output", "inptu", "Input"])
names = st.sampled_from(["B", "Q1", "a", "9B", "", "B C"])
dtypes = st.sampled_from(["f32", "f16", "i64", "f33", "F32", "", "f32 "])


@settings(max_examples=400, deadline=None)
@given(roles, names, dtypes, shape_chars, st.sampled_from([1, 2, 3]))
def test_any_header_line_parses_or_names_its_line_and_column(role, name, dtype, shape, where):
    line = f"% {role} {name}: {dtype}[{shape}]"
    lines = ["% program: p", "% input A: f32[8]", "% output C: f32[8]"]
    lines.insert(where, line)
    text = "\n".join(lines) + "\n" + BODY
    try:
        m = parse_leir(text, "h.leir")
    except LeirSyntaxError as e:
        assert e.line == where + 1, (line, str(e))
        assert 1 <= e.column <= len(line) + 1, (line, e.column)
        assert "h.leir" in str(e)
        return
    # accepted: the header printed again parses to the same signature
    assert parse_leir(m.text()).signature == m.signature


@pytest.mark.parametrize("shape", ["8,1 6", "8,1_6", "8,\u0663", "8,1e3", "8,+6", "8,-6", "8,1.5", "8,[6"])
def test_malformed_dimension_is_a_syntax_error_with_its_column(shape):
    line = f"% input B: f32[{shape}]"
    with pytest.raises(LeirSyntaxError) as ei:
        parse_leir(f"% program: p\n{line}\n% input A: f32[8]\n% output C: f32[8]\n{BODY}")
    e = ei.value
    assert e.line == 2
    assert line[e.column - 1] in shape.split(",")[1], (line, e.column)


def test_stp_parse_reports_a_header_typo_without_traceback(tmp_path: Path):
    f = tmp_path / "typo.leir"
    f.write_text(f"% program: p\n% input A: f32[8]\n% output C: f32[8,1 6]\n{BODY}")
    stp = Path(sys.executable).parent / "stp"
    r = subprocess.run([str(stp), "parse", str(f)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, r.stderr
    assert "Traceback" not in r.stderr + r.stdout
    assert "typo.leir" in r.stderr and ":3:" in r.stderr, r.stderr
