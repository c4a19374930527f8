"""One rule set for finding programs (steptp.programs): every command sees the same ones."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from steptp.programs import discover, load

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


@pytest.fixture
def folder(tmp_path):
    d = tmp_path / "progs"
    (d / "sub").mkdir(parents=True)
    (d / ".hidden").mkdir()
    shutil.copy(EXAMPLES / "softmax.py", d / "softmax.py")
    shutil.copy(EXAMPLES / "softmax.leir", d / "softmax.leir")      # the .py wins
    shutil.copy(EXAMPLES / "matmul.leir", d / "sub" / "matmul.leir")  # found recursively
    shutil.copy(EXAMPLES / "matmul.leir", d / ".hidden" / "copy.leir")  # hidden: skipped
    shutil.copy(EXAMPLES / "softmax.py", d / "_private.py")            # private: skipped
    (d / "helpers.py").write_text("def f():\n    return 1\n")           # no class Model: skipped
    return d


def test_discover_rules(folder):
    got = [(s.path.relative_to(folder).as_posix(), s.kind) for s in discover([folder])]
    assert got == [("softmax.py", "torch"), ("sub/matmul.leir", "leir")]
    leir_only = [s.path.relative_to(folder).as_posix() for s in discover([folder], kinds=("leir",))]
    assert leir_only == ["softmax.leir", "sub/matmul.leir"]
    with pytest.raises(FileNotFoundError):
        discover([folder / "nope"])
    with pytest.raises(ValueError, match="expected"):
        discover([folder / "helpers.txt"] if (folder / "helpers.txt").write_text("x") else [])


def test_every_command_sees_the_same_programs(folder):
    from steptp.eval.runner import load_cases
    from steptp.search.run import collect_programs

    want = [s.path for s in discover([folder])]
    assert collect_programs([folder]) == want
    cases, skipped = load_cases([str(folder)])
    assert [Path(c.source) for c in cases] == want and not skipped


def test_load_parses_or_translates():
    m, tr = load(EXAMPLES / "softmax.leir")
    assert tr is None and m.signature.name
    m2, tr2 = load(EXAMPLES / "softmax.py")
    assert tr2 is not None and m2.signature.outputs
