"""Seeded mutation fuzzer for hostile input: LEIR files, rule files and model answers.

    python benchmarks/fuzz.py --fuzz 100000 [--seed 0] [--save DIR]

Each case mutates a seed input (the bundled ``examples/*.leir``, the shipped
``rules/*.yaml``, answers rendered from real programs) with a few random edits: deleting,
duplicating or swapping spans and lines, inserting hostile snippets (1,000 unary minus,
300 parentheses, 5,000-digit integers, NUL bytes, empty dimensions, division by zero,
deep YAML/JSON) and replacing numbers with huge or zero ones. Targets, in process:

* ``leir``: :func:`steptp.leir.parse_leir` + :func:`steptp.leir.analysis.analyze`, and on
  a share of the cases ``stp parse`` / ``stp lower --cpu`` / ``stp apply`` (typer's
  ``CliRunner``) and ``stp verify`` of the example against its mutant;
* ``rule``: ``stp apply MUTATED_RULE examples/matmul.leir`` and ``stp rules test``;
* ``answer``: :func:`steptp.dataset.chat.parse_answer` with the prompt's signature.

A case passes when it raises nothing but the documented errors (``LeirSyntaxError``,
``LeirSemanticError``, ``AnswerError``; CLI: exit code 0, 1 or 2 without a traceback)
within its time limit. Prints the counts as JSON; exit 1 if any case failed.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
import traceback
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

#: seconds per case and target (a case over its limit counts as a failure)
LIMITS = {"leir": 5.0, "parse": 5.0, "lower": 10.0, "apply": 30.0, "verify": 90.0, "rule": 30.0,
          "rules_test": 60.0, "answer": 2.0}

SNIPPETS = [
    "-" * 1000, "(" * 300, ")" * 300, "9" * 5000, "1" + "0" * 400, "\x00", "\u00e9", "\ufeff", "%", "\n%",
    "if_then_else(", "if_then_else(tx>=0,", "];", "[", "{", "}", "_{", "^{", "B^{", "L^{1}_{a=0}[", "L^{1}_{q=0}[" * 40,
    ",", ";", "inf", "-inf", "/0.0", "//0", "%0", "%(0)", "**", "e999", "\n% input Q: f32[4,]\n",
    "\n% output Z: f32[99999999999]\n", "\n% input A: f32[4]\n", "+A^{f32,g}_{tx}" * 600, "T^{f32,g}_{tx}",
    "A^{f32,g}_{tx+1000000}", "A^{f32,g}_{tx-1}", "_{tx,tx}", "^{f16,s}", "B^{2000}_{tx=0}", "V^{3}_{v=0}",
    "[" * 200 + "1" + "]" * 200, "{\"a\":" * 300, "\t" * 1000, " " * 5000, "<answer>", "</answer>", "<\\answer>",
    "```json", "```", "\"transformed_IR\"", "null", "[]", "{}", "\ud800".encode("utf-8", "surrogatepass").decode(
        "utf-8", "replace"),
]
NUMBERS = ["0", "1", "-1", "2", "3", "7", "4096", "65536", "2147483648", "9" * 30, "1" + "0" * 400]


def mutate(rng: random.Random, text: str) -> str:
    """A few random edits of ``text`` (module docstring)."""
    for _ in range(rng.randint(1, 4)):
        op = rng.randrange(7)
        n = len(text)
        i = rng.randrange(n + 1)
        j = min(n, i + rng.randint(0, 40))
        if op == 0:
            text = text[:i] + text[j:]
        elif op == 1:
            text = text[:i] + rng.choice(SNIPPETS) + text[i:]
        elif op == 2 and n:
            text = text[:i] + chr(rng.choice([rng.randrange(32, 127), rng.randrange(0, 0x2FF)])) + text[i + 1:]
        elif op == 3:
            text = text[:i] + text[i:j] * rng.randint(2, 6) + text[i:]
        elif op == 4:
            lines = text.split("\n")
            if len(lines) > 1:
                a, b = rng.randrange(len(lines)), rng.randrange(len(lines))
                lines[a], lines[b] = lines[b], lines[a]
                if rng.random() < 0.3:
                    del lines[rng.randrange(len(lines))]
            text = "\n".join(lines)
        elif op == 5:
            digits = [k for k, c in enumerate(text) if c.isdigit()]
            if digits:
                k = rng.choice(digits)
                e = k
                while e < n and text[e].isdigit():
                    e += 1
                text = text[:k] + rng.choice(NUMBERS) + text[e:]
        else:
            text = text[:i] + text[i:j][::-1] + text[j:]
    return text


SMALL = ["0", "1", "2", "3", "4", "5", "8", "16", "31", "1000"]
EDITS = ["+1", "-1", "*2", "//2", "%3", "+tx", "-a"]


def mutate_gentle(rng: random.Random, text: str) -> str:
    """One or two meaning-level edits that usually keep the text parseable: a number
    changed, an index shifted (``tx`` -> ``tx+1``), a read guarded by ``if_then_else``,
    two index names exchanged, or one equation dropped."""
    for _ in range(rng.randint(1, 2)):
        op = rng.randrange(5)
        if op == 0:
            spots = [k for k, c in enumerate(text) if c.isdigit() and (k == 0 or not text[k - 1].isdigit())]
            if spots:
                k = rng.choice(spots)
                e = k
                while e < len(text) and text[e].isdigit():
                    e += 1
                text = text[:k] + rng.choice(SMALL) + text[e:]
        elif op == 1:
            spots = [k for k in range(len(text) - 1) if text[k:k + 2] in ("tx", ",a", "_{a") or
                     (text[k] == "a" and text[k + 1] in ",}")]
            if spots:
                k = rng.choice(spots) + 2
                text = text[:k] + rng.choice(EDITS) + text[k:]
        elif op == 2:
            spots = [k for k in range(len(text) - 1) if text[k].isupper() and text[k + 1] == "^"
                     and k > 0 and text[k - 1] in "=+*-(,"]
            if spots:
                k = rng.choice(spots)
                e = text.find("}", text.find("_{", k)) + 1 if text.find("_{", k) >= 0 else -1
                if e > k:
                    guard = rng.choice(["tx>=1", "tx<2", "a-1<0", "tx+1<8", "a>=2"])
                    text = text[:k] + f"if_then_else({guard},{text[k:e]},0.0)" + text[e:]
        elif op == 3:
            a, b = rng.sample(["tx", "a", "c", "d", "bx"], 2)
            text = text.replace(a, "\x01").replace(b, a).replace("\x01", b)
        else:
            eqs = [k for k, c in enumerate(text) if c == ";" and k + 1 < len(text) and text[k + 1] != "]"]
            if eqs:
                k = rng.choice(eqs)
                start = max(text.rfind(";", 0, k), text.rfind("[", 0, k)) + 1
                text = text[:start] + text[k + 1:]
    return text


class Fuzzer:
    """Runs cases and keeps the counts (see :meth:`report`)."""

    def __init__(self, seed: int = 0, save: Path | None = None):
        from typer.testing import CliRunner

        from steptp.cli import app

        self.rng = random.Random(seed)
        self.app, self.cli = app, CliRunner()
        self.save = save
        self.tmp = Path(tempfile.mkdtemp(prefix="stp-fuzz-"))
        self.leirs = {p.name: p.read_text() for p in sorted((ROOT / "examples").glob("*.leir"))}
        self.rules = {p.name: p.read_text() for p in sorted((ROOT / "rules").glob("*.yaml"))}
        self.answers = self._answers()
        self.counts: Counter = Counter()
        self.outcomes: Counter = Counter()
        self.failures: list[dict] = []
        self.slowest: dict[str, float] = {}

    def _answers(self) -> list[tuple[str, object]]:
        from steptp.leir import parse_leir
        from steptp.leir.printer import format_program

        out = []
        for name, text in self.leirs.items():
            m = parse_leir(text, name)
            ir = format_program(m.program)
            one = json.dumps({"transformed_IR": ir, "applied_strategy": "Loop Split"})
            many = json.dumps([{"idx": 0, "transformed_IR": ir, "applied_strategy": "a"},
                               {"idx": 1, "transformed_IR": ir, "applied_strategy": "b"}])
            out.append((f"<think>step</think><answer>{one}</answer>", m.signature))
            out.append((f"<think>s</think><answer>```json\n{many}\n```<\\answer>", m.signature))
        return out

    # ------------------------------------------------------------------ running
    def _record(self, kind: str, seconds: float, outcome: str, ok: bool, detail: str, payload: str) -> None:
        self.counts[kind] += 1
        self.outcomes[f"{kind}:{outcome}"] += 1
        self.slowest[kind] = max(self.slowest.get(kind, 0.0), seconds)
        over = seconds > LIMITS[kind]
        if over:
            self.outcomes[f"{kind}:over_time"] += 1
        if not ok or over:
            rec = {"kind": kind, "outcome": outcome if ok else "uncaught", "seconds": round(seconds, 3),
                   "detail": detail[-2000:]}
            if self.save:
                self.save.mkdir(parents=True, exist_ok=True)
                f = self.save / f"case{len(self.failures)}_{kind}.txt"
                f.write_text(payload, errors="replace")
                rec["input"] = str(f)
            self.failures.append(rec)

    def _direct(self, kind: str, fn, allowed: tuple, payload: str) -> None:
        t0 = time.perf_counter()
        try:
            fn()
            outcome, ok, detail = "ok", True, ""
        except allowed as e:
            outcome, ok, detail = "rejected", True, str(e)[:200]
        except BaseException as e:  # noqa: BLE001 - counted as an uncaught exception
            if isinstance(e, KeyboardInterrupt):
                raise
            outcome, ok, detail = "uncaught", False, traceback.format_exc()
        self._record(kind, time.perf_counter() - t0, outcome, ok, detail, payload)

    def _cli(self, kind: str, args: list, payload: str) -> int | None:
        t0 = time.perf_counter()
        res = self.cli.invoke(self.app, [str(a) for a in args])
        dt = time.perf_counter() - t0
        clean = res.exception is None or isinstance(res.exception, SystemExit)
        ok = clean and res.exit_code in (0, 1, 2) and "Traceback" not in (res.output or "")
        detail = "" if ok else ("".join(traceback.format_exception(res.exception)) if res.exception else "")
        detail = detail or (res.output or "")[-2000:]
        self._record(kind, dt, f"exit{res.exit_code}" if ok else "uncaught", ok, detail, payload)
        return res.exit_code if ok else None

    def leir_case(self, i: int) -> None:
        from steptp.leir import parse_leir
        from steptp.leir.analysis import LeirSemanticError, analyze
        from steptp.leir.parser import LeirSyntaxError

        name = self.rng.choice(sorted(self.leirs))
        gentle = self.rng.random() < 0.5
        text = (mutate_gentle if gentle else mutate)(self.rng, self.leirs[name])

        def parse_and_analyze():
            m = parse_leir(text, "fuzz.leir")
            analyze(m.program, m.signature)

        self._direct("leir", parse_and_analyze, (LeirSyntaxError, LeirSemanticError), text)
        path = self.tmp / f"m{i % 8}.leir"
        path.write_text(text, errors="replace")
        r = self.rng.random()
        if r < 0.15:
            self._cli("parse", ["parse", path], text)
        elif r < 0.30:
            self._cli("lower", ["lower", path, "--cpu"], text)
        elif r < 0.36:
            rule = self.rng.choice(sorted(self.rules))
            self._cli("apply", ["apply", ROOT / "rules" / rule, path, "--seed", str(i)], text)
        elif r < 0.375 or (gentle and r < 0.40):
            self._cli("verify", ["verify", ROOT / "examples" / name, path, "--no-nvcc", "--trials", "1",
                                 "--timeout", "30"], text)

    def rule_case(self, i: int) -> None:
        name = self.rng.choice(sorted(self.rules))
        text = mutate(self.rng, self.rules[name])
        d = self.tmp / f"r{i % 8}"
        d.mkdir(exist_ok=True)
        path = d / name  # keep the file name: the id must match it
        path.write_text(text, errors="replace")
        if self.rng.random() < 0.2:
            self._cli("rules_test", ["rules", "test", path, "--no-verify"], text)
        else:
            self._cli("rule", ["apply", path, ROOT / "examples" / "matmul.leir", "--seed", str(i)], text)

    def answer_case(self, i: int) -> None:
        from steptp.dataset.chat import AnswerError, parse_answer

        text, sig = self.rng.choice(self.answers)
        text = mutate(self.rng, text)
        self._direct("answer", lambda: parse_answer(text, signature=sig), (AnswerError,), text)

    def run(self, n: int, mix: tuple[float, float] = (0.6, 0.1)) -> dict:
        """``n`` cases: a share ``mix[0]`` LEIR, ``mix[1]`` rule files, the rest answers."""
        for i in range(n):
            r = self.rng.random()
            if r < mix[0]:
                self.leir_case(i)
            elif r < mix[0] + mix[1]:
                self.rule_case(i)
            else:
                self.answer_case(i)
        return self.report()

    def report(self) -> dict:
        return {"cases": sum(self.counts.values()), "by_target": dict(sorted(self.counts.items())),
                "outcomes": dict(sorted(self.outcomes.items())),
                "uncaught": sum(v for k, v in self.outcomes.items() if k.endswith(":uncaught")),
                "over_time": sum(v for k, v in self.outcomes.items() if k.endswith(":over_time")),
                "slowest_s": {k: round(v, 3) for k, v in sorted(self.slowest.items())},
                "failures": self.failures[:20]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--fuzz", type=int, default=1000, help="number of cases")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--save", type=Path, default=None, help="write failing inputs here")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    rep = Fuzzer(args.seed, args.save).run(args.fuzz)
    rep["seconds"] = round(time.perf_counter() - t0, 1)
    print(json.dumps(rep, indent=2))
    return 0 if rep["uncaught"] == 0 and rep["over_time"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
