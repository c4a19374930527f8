"""Run each rule's own tests: exact rewritten LEIR, expected no-match, CoT snippets, and
(optionally) numeric verification of every before/after pair with
:func:`steptp.verify.verify_pair`.

Command line: ``stp rules test [FILES...] [--no-verify]`` or
``python -m steptp.rules.selftest [FILES...] [--no-verify]``.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from typing import Callable

from ..leir.fileformat import LeirModule, parse_leir
from ..leir.parser import parse_program
from ..leir.printer import format_program
from .loader import Rule, RuleTest, load_rule, load_rules


@dataclass
class TestOutcome:
    """Result of one rule test: ``ok``; ``message`` explains a failure; ``verified`` is
    None when numeric verification did not run, else whether it said Equal."""

    rule: str
    index: int
    name: str
    ok: bool
    message: str = ""
    verified: bool | None = None
    seconds: float = 0.0
    symbolic: str | None = None  # math rules: proved / unknown / disproved (steptp.engine.algebra)

    def __str__(self) -> str:
        status = "ok" if self.ok else "FAIL"
        v = "" if self.verified is None else (" verified" if self.verified else " NOT EQUAL")
        if self.symbolic is not None:
            v += f" symbolic={self.symbolic}"
        return f"{status:4} {self.rule} test {self.index} ({self.name}){v}{': ' + self.message if self.message else ''}"


def run_rule_test(rule: Rule, test: RuleTest, verify: bool = False) -> TestOutcome:
    """Run one test of ``rule`` (see :class:`~steptp.rules.loader.RuleTest`)."""
    from ..engine import NoMatch, apply_rule

    t0 = time.perf_counter()
    out = TestOutcome(rule.id, test.index, test.name, False)
    before = parse_leir(test.before, f"{rule.id} tests[{test.index}].before")
    try:
        step = apply_rule(rule, before, seed=test.seed, site=test.site, params=test.params)
    except NoMatch as e:
        out.ok = test.no_match
        out.message = "" if test.no_match else f"unexpected NoMatch: {e}"
        out.seconds = time.perf_counter() - t0
        return out
    except Exception as e:  # noqa: BLE001 - report any failure as a test failure
        out.message = f"{type(e).__name__}: {e}"
        out.seconds = time.perf_counter() - t0
        return out
    if test.no_match:
        out.message = f"expected no match, but the rule applied at {step.site}: {format_program(step.after.program)}"
        out.seconds = time.perf_counter() - t0
        return out
    got = format_program(step.after.program)
    want = format_program(parse_program(test.after))
    if got != want:
        out.message = f"rewritten LEIR differs\n  expected: {want}\n  got:      {got}"
    else:
        missing = [c for c in test.cot_contains if c not in step.cot]
        if missing:
            out.message = f"CoT lacks {missing!r}; CoT was:\n{step.cot}"
        else:
            out.ok = True
    if out.ok and rule.category == "math":
        from ..engine.algebra import symbolic_check_programs

        out.symbolic = symbolic_check_programs(before.program, step.after.program)
        if out.symbolic == "disproved":
            out.ok = False
            out.message = "the symbolic check disproves the rewrite (before - after is not zero)"
    if out.ok and verify and test.verify:
        from ..verify import verify_pair

        res = verify_pair(before, LeirModule(before.signature, step.after.program), trials=3, seed=0)
        out.verified = bool(res.equal)
        if not res.equal:
            out.ok = False
            out.message = f"not numerically equivalent: {res.reason}"
    out.seconds = time.perf_counter() - t0
    return out


def run_rule_tests(rule: Rule, verify: bool = False) -> list[TestOutcome]:
    """Run every test of one rule."""
    return [run_rule_test(rule, t, verify) for t in rule.tests]


def run_selftests(files: list[str] | None = None, verify: bool = True,
                  echo: Callable[[str], None] = print) -> bool:
    """Run the tests of the given rule files (default: all shipped rules); print one line
    per test via ``echo``; return True when all pass."""
    rules = [load_rule(f) for f in files] if files else load_rules()
    ok = True
    n = 0
    for r in rules:
        for o in run_rule_tests(r, verify):
            n += 1
            ok &= o.ok
            echo(str(o))
    echo(f"{n} test(s), {'all passed' if ok else 'FAILURES'}")
    return ok


def main(argv: list[str] | None = None) -> int:  # pragma: no cover - thin CLI wrapper
    args = list(sys.argv[1:] if argv is None else argv)
    verify = "--no-verify" not in args
    files = [a for a in args if a != "--no-verify"] or None
    return 0 if run_selftests(files, verify=verify) else 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())


__all__ = ["TestOutcome", "run_rule_test", "run_rule_tests", "run_selftests", "main"]
