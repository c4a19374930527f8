"""Run each rule's own tests: exact rewritten LEIR, expected no-match, CoT snippets, and
(optionally) numeric verification of every before/after pair with
:func:`steptp.verify.verify_pair`, in the test's dtypes and again in float64 (where a
perturbed constant cannot hide in the f32 tolerance).

Command line: ``stp rules test [FILES...] [--no-verify] [--update]`` or
``python -m steptp.rules.selftest [FILES...] [--no-verify] [--update]``.

``--update`` (as ``sg test --update-all`` for ast-grep snapshots): after a deliberate
printer change, rewrite each test's ``after:`` text with what the engine now produces.
Every other check still runs on the new output (CoT snippets, the symbolic check of math
rules, numeric verification, which ``--update`` requires); when a rewrite is disproved or
not numerically equal, :class:`~steptp.rules.schema.RuleError` names the file and test and
no file is written. The rest of each file is kept byte for byte (comments, key order,
quoting): only the ``after:`` scalars change, and the result is checked to load to the same
data with only those texts changed. Without FILES the shipped rule directory is rewritten,
which for a non-editable install is the installed copy: pass ``rules/*.yaml`` there.
"""

from __future__ import annotations

import json
import re
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import yaml

from ..leir.fileformat import LeirModule, parse_leir
from ..leir.parser import parse_program
from ..leir.printer import format_program
from .loader import Rule, RuleTest, load_rule, load_rules
from .schema import RuleError


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
    got: str | None = None  # the rewritten program as printed (None when the rule did not apply)
    updated: bool = False  # update mode: the test's after: text was rewritten to ``got``

    @property
    def refuted(self) -> bool:
        """The rewrite itself is wrong: numerically unequal or symbolically disproved."""
        return self.verified is False or self.symbolic == "disproved"

    def __str__(self) -> str:
        status = "ok" if self.ok else "FAIL"
        v = "" if self.verified is None else (" verified" if self.verified else " NOT EQUAL")
        if self.symbolic is not None:
            v += f" symbolic={self.symbolic}"
        if self.updated:
            v += " after: rewritten"
        return f"{status:4} {self.rule} test {self.index} ({self.name}){v}{': ' + self.message if self.message else ''}"


def run_rule_test(rule: Rule, test: RuleTest, verify: bool = False, update: bool = False) -> TestOutcome:
    """Run one test of ``rule`` (see :class:`~steptp.rules.loader.RuleTest`).

    ``update``: do not compare with the test's ``after:`` text; run every other check on
    what the engine produces (``got``), CoT snippets included but after the symbolic and
    numeric checks, so that :attr:`TestOutcome.refuted` tells whether ``got`` may replace it."""
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
    got = out.got = format_program(step.after.program)
    if not update:
        want = format_program(parse_program(test.after))
        if got != want:
            out.message = f"rewritten LEIR differs\n  expected: {want}\n  got:      {got}"
            out.seconds = time.perf_counter() - t0
            return out
    missing = [c for c in test.cot_contains if c not in step.cot]
    if missing and not update:
        out.message = f"CoT lacks {missing!r}; CoT was:\n{step.cot}"
        out.seconds = time.perf_counter() - t0
        return out
    out.ok = True
    if rule.category == "math":
        from ..engine.algebra import symbolic_check_programs

        out.symbolic = symbolic_check_programs(before.program, step.after.program, before.signature)
        if out.symbolic == "disproved":
            out.ok = False
            out.message = "the symbolic check disproves the rewrite (before - after is not zero)"
    if out.ok and verify and test.verify:
        from ..verify import verify_pair

        after = LeirModule(before.signature, step.after.program)
        res = verify_pair(before, after, trials=3, seed=0)
        out.verified = bool(res.equal)
        if not res.equal:
            out.ok = False
            out.message = f"not numerically equivalent: {res.reason}"
        else:
            reason = _float64_refutes(before, after)
            if reason:
                out.verified = False
                out.ok = False
                out.message = f"not numerically equivalent in float64: {reason}"
    if out.ok and missing:
        out.ok = False
        out.message = f"CoT lacks {missing!r}; CoT was:\n{step.cot}"
    out.seconds = time.perf_counter() - t0
    return out


def _float64_refutes(before: LeirModule, after: LeirModule) -> str:
    """The test's pair again with every float tensor in float64 (:func:`steptp.verify.promoted`),
    verified with the f64 tolerance (rtol 1e-9): a rewrite that perturbs a constant by 1e-5
    hides inside the f32 tolerance (1e-4), never inside this one. Returns the reason when the
    f64 pair is not Equal, '' when it is or when there is nothing to promote (integer programs,
    or a precision rule whose two sides become the same program in f64). Source: issue 34."""
    from ..verify import promoted, verify_pair

    high_before, high_after = promoted(before), promoted(after)
    if high_before is None or high_after is None or high_before.text() == high_after.text():
        return ""
    res = verify_pair(high_before, high_after, trials=3, seed=0)
    if res.equal or not res.build:
        # a form that does not build in f64 (an f64 intrinsic TVM lacks) decides nothing
        return ""
    return res.reason


def run_rule_tests(rule: Rule, verify: bool = False) -> list[TestOutcome]:
    """Run every test of one rule."""
    return [run_rule_test(rule, t, verify) for t in rule.tests]


def _mapping_get(node, key: str):
    if isinstance(node, yaml.MappingNode):
        for k, v in node.value:
            if isinstance(k, yaml.ScalarNode) and k.value == key:
                return k, v
    return None, None


_BLOCK_HEADER = re.compile(r"([|>])([1-9]?)([-+]?)([1-9]?)")


def _line_end(text: str, i: int) -> int:
    """Index just past the line break of the line holding ``i`` (or the end of ``text``)."""
    j = text.find("\n", i)
    return len(text) if j < 0 else j + 1


def _render_after(text: str, key, node, new: str) -> tuple[int, int, str]:
    """``(start, end, replacement)``: the span of ``node`` (the ``after:`` value) in
    ``text`` and its new source for the value ``new``, in the node's own style where the
    value allows it (block scalars keep their header line and indentation), else as a
    double-quoted scalar."""
    start = node.start_mark.index
    quoted = json.dumps(new)  # a JSON string is a valid YAML double-quoted scalar
    if node.style in ("|", ">"):
        header_end = _line_end(text, start)
        header = text[start:header_end]
        eol = "\r\n" if header.endswith("\r\n") else "\n"
        m = _BLOCK_HEADER.match(header)
        explicit = int(m.group(2) or m.group(4) or 0) if m else 0
        # content: the following lines that are blank or indented deeper than the key
        end = content_end = header_end
        indent = None
        while end < len(text):
            nxt = _line_end(text, end)
            line = text[end:nxt].rstrip("\r\n")
            if line.strip():
                col = len(line) - len(line.lstrip(" "))
                if col <= key.start_mark.column:
                    break
                indent = col if indent is None else indent
                content_end = nxt
            end = nxt
        pad = " " * (key.start_mark.column + explicit if explicit else
                     indent if indent is not None else key.start_mark.column + 2)
        lines = new.split("\n")
        if new and not new[0].isspace() and all(l.strip() for l in lines) and (node.style == "|" or len(lines) == 1):
            return header_end, content_end, "".join(pad + l + eol for l in lines)
        return start, content_end, quoted + eol
    end = node.end_mark.index
    if node.style == "'" and "\n" not in new:
        return start, end, "'" + new.replace("'", "''") + "'"
    if node.style is None and "\n" not in new and not any(c in new for c in ",[]{}"):
        try:
            if yaml.safe_load("k: " + new) == {"k": new}:
                return start, end, new
        except yaml.YAMLError:
            pass
    return start, end, quoted


def rewrite_after_texts(text: str, new_afters: dict[int, str], source: str = "<string>") -> str:
    """``text`` (a rule file) with the ``after:`` value of each test ``i`` in
    ``new_afters`` replaced by ``new_afters[i]``, everything else kept byte for byte.

    Raises :class:`RuleError` when a test has no ``after:`` or when the result does not load
    to the same data with exactly those values changed (a layout this textual edit does
    not handle)."""
    root = yaml.compose(text, Loader=yaml.SafeLoader)
    _, tests = _mapping_get(root, "tests")
    edits = []
    for i, new in sorted(new_afters.items()):
        key, node = _mapping_get(tests.value[i], "after") if isinstance(tests, yaml.SequenceNode) and \
            0 <= i < len(tests.value) else (None, None)
        if not isinstance(node, yaml.ScalarNode):
            raise RuleError(source, f"tests[{i}].after", "no after: text to rewrite")
        edits.append(_render_after(text, key, node, new))
    out = text
    for start, end, repl in sorted(edits, reverse=True):
        out = out[:start] + repl + out[end:]
    old_data, new_data = yaml.safe_load(text), yaml.safe_load(out)
    try:
        for i, new in new_afters.items():
            if new_data["tests"][i]["after"].rstrip("\n") != new:
                raise ValueError(f"tests[{i}].after")
            new_data["tests"][i]["after"] = old_data["tests"][i]["after"]
        if new_data != old_data:
            raise ValueError("other fields changed")
    except (ValueError, KeyError, TypeError, IndexError, AttributeError) as e:
        raise RuleError(source, "tests", f"cannot rewrite the after: texts in place ({e}); edit the file by hand") \
            from None
    return out


def run_selftests(files: list[str] | None = None, verify: bool = True,
                  echo: Callable[[str], None] = print, update: bool = False) -> bool:
    """Run the tests of the given rule files (default: all shipped rules); print one line
    per test via ``echo``; return True when all pass.

    ``update=True`` rewrites the ``after:`` texts that differ from the engine's output (see
    the module docstring; needs ``verify``). Raises :class:`RuleError` naming the file and
    test, and writes nothing, when a rewrite is refuted (not numerically equal or
    symbolically disproved); other failures (no match, a missing CoT snippet) are reported
    as usual and leave that test's text alone."""
    if update and not verify:
        raise ValueError("updating the after: texts needs numeric verification (drop --no-verify)")
    rules = [load_rule(f) for f in files] if files else load_rules()
    ok = True
    n = 0
    rewrites: list[tuple[Rule, dict[int, str]]] = []
    for r in rules:
        new_afters: dict[int, str] = {}
        for t in r.tests:
            o = run_rule_test(r, t, verify, update=update)
            if update:
                if o.refuted:
                    raise RuleError(r.display_source, f"tests[{t.index}].after",
                                    f"test {t.index} ({t.name}): {o.message}; no file was rewritten")
                if t.after is not None and o.got is not None and o.got != t.after.rstrip("\n"):
                    new_afters[t.index] = o.got
                    o.updated = True
            n += 1
            ok &= o.ok
            echo(str(o))
        if new_afters:
            rewrites.append((r, new_afters))
    echo(f"{n} test(s), {'all passed' if ok else 'FAILURES'}")
    if update:
        from ..io import write_text_atomic

        planned = [(Path(r.path), len(a), rewrite_after_texts(Path(r.path).read_bytes().decode("utf-8"), a,
                                                               r.display_source)) for r, a in rewrites]
        for path, k, text in planned:  # every file is rewritten only once all are checked
            write_text_atomic(path, text)
            echo(f"rewrote {k} after: text(s) in {path}")
        echo(f"{sum(len(a) for _, a in rewrites)} after: text(s) rewritten in {len(rewrites)} file(s)" if rewrites
             else "no after: text to rewrite")
    return ok


def main(argv: list[str] | None = None) -> int:  # pragma: no cover - thin CLI wrapper
    args = list(sys.argv[1:] if argv is None else argv)
    verify = "--no-verify" not in args
    files = [a for a in args if a not in ("--no-verify", "--update")] or None
    return 0 if run_selftests(files, verify=verify, update="--update" in args) else 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())


__all__ = ["TestOutcome", "run_rule_test", "run_rule_tests", "rewrite_after_texts", "run_selftests", "main"]
