"""Seeded mutation fuzz (issue 10): a few hundred mutated LEIR files, rule files and model
answers through the parser, ``stp parse/lower/apply/verify`` (in process, CliRunner) and
``parse_answer``: no uncaught exception, no case over its time limit.

The same fuzzer runs at scale with ``python benchmarks/fuzz.py --fuzz 100000``."""

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _fuzz_module():
    spec = importlib.util.spec_from_file_location("stp_fuzz", ROOT / "benchmarks" / "fuzz.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_mutators_are_seeded_and_change_the_text():
    fz = _fuzz_module()
    import random

    text = (ROOT / "examples" / "matmul.leir").read_text()
    a = [fz.mutate(random.Random(5), text) for _ in range(3)]
    assert a[0] == a[1] == a[2] and a[0] != text
    assert fz.mutate_gentle(random.Random(1), text) != text or fz.mutate_gentle(random.Random(2), text) != text


def test_fuzz_few_hundred_cases_no_uncaught_exception_no_overrun():
    fz = _fuzz_module()
    rep = fz.Fuzzer(seed=0).run(300)
    assert rep["cases"] >= 300
    assert rep["uncaught"] == 0, rep["failures"]
    assert rep["over_time"] == 0, rep["failures"]
    # every target was exercised, and some mutants got through to a clean success
    assert {"leir", "answer", "rule", "lower", "parse", "apply", "verify"} <= set(rep["by_target"])
    assert any(k.endswith((":ok", ":exit0")) for k in rep["outcomes"])
