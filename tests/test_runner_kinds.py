"""A runner kind is one module and one registration (issue 53): a third kind, registered here
from the test file with :func:`steptp.runner.kinds.register`, runs a real search through the
one driver, and every decision that depends on the kind is the runner's (its attributes and
methods: where candidates verify, the entry it ships, the summary fields and run files it adds,
what a round does)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from steptp.runner import kinds
from steptp.runner.base import MeasureResult, RunnerFuture

ROOT = Path(__file__).resolve().parents[1]


class CountingRunner:
    """A third kind: measures here with a fixed protocol (a timer by program text), counts what it
    was asked, ships an entry per candidate and adds one summary field and one run file."""

    kind = "counting"
    measures_here = True
    retimes = True
    per_program_dirs = True
    parallel_programs = False

    def __init__(self, device: str = "cpu", **_):
        self.device = device
        self.calls: list[str] = []
        self.entries: dict[str, dict] = {}

    @staticmethod
    def _us(module) -> float:
        return 50.0 + (sum(map(ord, module.text())) % 97)

    def identity(self) -> dict:
        return {"runner": self.kind}

    def root_time_us(self, program, root):
        return self._us(root)

    def run(self, batch):
        out = []
        for x in batch:
            self.calls.append(x.purpose)
            if x.entry is not None:
                self.entries[x.key] = x.entry
            t, r = self._us(x.module), self._us(x.root)
            verdict = "faster" if r / t > 1 else "same"
            out.append(RunnerFuture(MeasureResult("equal", t, r, r / t, [r / t, r / t], verdict)))
        return out

    def entry(self, name, root, source, seed):
        return lambda module, steps: {"program": name, "steps": len(steps)}

    def summary_fields(self, outcome):
        return {"counting_calls": len(self.calls), "counting_best": outcome.best.id}

    def run_files(self, summaries, out):
        return {"counting.json": {"programs": len(summaries), "calls": len(self.calls)}}

    def pending(self):
        return {}

    def add_pending(self, entries):
        pass

    def submit(self):
        return None

    def worker_spec(self):
        return self.kind, {"device": self.device}

    def reopen(self):
        return self


@pytest.fixture
def counting():
    made: list[CountingRunner] = []

    def factory(**options):
        made.append(CountingRunner(**options))
        return made[-1]

    kinds.register("counting", factory)
    yield made
    kinds._FACTORIES.pop("counting", None)


def test_a_third_kind_runs_a_search(tmp_path, counting):
    from steptp.search import SearchConfig
    from steptp.search.run import search_many

    assert "counting" in kinds.names() and kinds.names()[:2] == ("local", "pack")
    cfg = SearchConfig(algorithm="greedy", iterations=2, seed=1, progress=False, runner="counting")
    sms = search_many([str(ROOT / "examples" / "softmax.leir")], tmp_path, cfg)
    assert len(counting) == 1
    r = counting[0]
    (sm,) = sms
    assert sm["runner"] == "counting" and sm["samples"] >= 1 and sm["counting_calls"] == len(r.calls)
    assert r.calls.count("search") == sm["samples"]  # every sample measured by the kind
    assert set(r.calls) <= {"search", "retime"} and len(r.entries) >= 1  # entries built by the kind
    # per_program_dirs: the program's files under OUT/<program>/, the kind's own file in OUT
    assert json.loads((tmp_path / "softmax" / "summary.json").read_text()) == sm
    assert json.loads((tmp_path / "counting.json").read_text())["programs"] == 1
    if sm["best"]["node"]:
        assert "retime" in r.calls and sm["confirmed"]["verdict"] in ("faster", "same")


def test_unknown_kinds_are_refused(tmp_path):
    with pytest.raises(ValueError, match="unknown runner 'nope'; one of local, pack"):
        kinds.create("nope")
    r = subprocess.run([str(ROOT / ".venv" / "bin" / "stp"), "search", str(ROOT / "examples" / "softmax.leir"),
                        "-o", str(tmp_path / "x"), "--runner", "nope"], capture_output=True, text=True)
    assert r.returncode == 2 and "--runner nope: expected local or pack" in r.stderr


def test_the_search_never_asks_for_the_kind():
    """Every kind-specific decision is behind the runner's protocol: the search package names
    no kind and reads no kind (issue 53's check)."""
    import re

    pat = re.compile(r'runner\.kind|cfg\.runner|"pack"|\.local\b')
    found = [f"{p.name}:{i}" for p in sorted((ROOT / "engine" / "steptp" / "search").glob("*.py"))
             for i, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1) if pat.search(line)]
    assert found == []
