"""Where the answers of ``stp eval`` come from: a model behind an OpenAI-compatible
endpoint, a JSONL file of answers, or a baseline policy (``engine``: one random matching
rule, seeded; ``identity``: the input program unchanged, so Diff fails)."""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass, field
from pathlib import Path

from ..leir.fileformat import LeirModule


@dataclass
class Case:
    """One evaluation case: a program as given. ``id`` is the content key of its source file
    (:class:`steptp.dataset.sources.Source`), ``prompt`` the single-answer prompt."""

    id: str
    source: str
    program: str
    module: LeirModule
    prompt: str


@dataclass
class Answer:
    """One sampled answer (``error`` set when it could not be obtained; ``text`` is then '')."""

    text: str
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    finish_reason: str | None = None
    error: str | None = None
    extra: dict = field(default_factory=dict)


class Policy:
    """Interface: :meth:`answers` returns ``n`` answers for a case. ``threaded`` policies
    (network-bound) are asked from ``-j`` threads; the others run in the main thread."""

    name = "policy"
    threaded = False

    def describe(self) -> dict:
        """JSON-ready identity of the policy (stored in ``run.json``; a resumed run must match)."""
        return {"policy": self.name}

    def check(self) -> None:
        """Raise :class:`steptp.llm.EndpointError` when the policy cannot answer at all."""

    def answers(self, case: Case, n: int, first_sample: int = 0) -> list[Answer]:
        raise NotImplementedError


class EndpointPolicy(Policy):
    """A model behind an OpenAI-compatible endpoint (:class:`steptp.llm.ChatClient`)."""

    name = "endpoint"
    threaded = True

    def __init__(self, client, temperature: float = 0.0, max_tokens: int | None = None, seed: int | None = None):
        self.client, self.temperature, self.max_tokens, self.seed = client, temperature, max_tokens, seed

    def describe(self) -> dict:
        return {"policy": self.name, "endpoint": self.client.endpoint, "model": self.client.model,
                "temperature": self.temperature, "max_tokens": self.max_tokens}

    def check(self) -> None:
        self.client.check()

    def answers(self, case: Case, n: int, first_sample: int = 0) -> list[Answer]:
        from ..llm import RequestError, user_messages

        try:
            comps = self.client.complete(user_messages(case.prompt), n=n, temperature=self.temperature,
                                         max_tokens=self.max_tokens, seed=self.seed)
        except RequestError as e:
            return [Answer("", error=f"request: {e}") for _ in range(n)]
        return [Answer(c.text, c.prompt_tokens, c.completion_tokens, c.finish_reason) for c in comps]


class AnswersFilePolicy(Policy):
    """Answers read from a JSONL file: one object per answer with ``answer`` (the model
    output text) and either ``case`` (the case id, as in results.jsonl), ``source`` (the
    input path), ``program`` (the program name) or ``prompt`` (the exact prompt); optional
    ``sample`` (0-based). A case without an answer fails with that reason."""

    name = "answers"

    def __init__(self, path: str | Path):
        from ..dataset.writers import read_jsonl_lines

        self.path = Path(path)
        self.table: dict[tuple[str, str], dict[int, str]] = {}
        if not self.path.is_file():
            raise FileNotFoundError(f"{self.path}: no such answers file")
        for lineno, rec in read_jsonl_lines(self.path):
            if not isinstance(rec, dict) or not isinstance(rec.get("answer"), str):
                raise ValueError(f"{self.path}:{lineno}: expected an object with a string 'answer'")
            keys = [(k, str(rec[k])) for k in ("case", "source", "program") if k in rec]
            if isinstance(rec.get("prompt"), str):
                keys.append(("prompt", _sha(rec["prompt"])))
            if not keys:
                raise ValueError(f"{self.path}:{lineno}: names no case (case, source, program or prompt)")
            for key in keys:
                slot = self.table.setdefault(key, {})
                sample = rec.get("sample")
                slot[sample if isinstance(sample, int) and sample >= 0 else len(slot)] = rec["answer"]

    def describe(self) -> dict:
        return {"policy": self.name, "answers": str(self.path)}

    def answers(self, case: Case, n: int, first_sample: int = 0) -> list[Answer]:
        slot = None
        for key in (("case", case.id), ("source", case.source), ("prompt", _sha(case.prompt)),
                    ("program", case.program)):
            slot = self.table.get(key)
            if slot:
                break
        out = []
        for k in range(first_sample, first_sample + n):
            text = (slot or {}).get(k)
            out.append(Answer(text) if text is not None else
                       Answer("", error=f"no answer for sample {k} of this case in {self.path.name}"))
        return out


class EnginePolicy(Policy):
    """Baseline: one rule drawn at random among those that match the program, applied at a
    seeded site with seeded parameters (:func:`steptp.engine.apply_rule`), answered in the
    dataset's label format with the rule's CoT. Seeded by ``(seed, case id, sample)``."""

    name = "engine"

    def __init__(self, seed: int = 0, rules=None, time_s: float = 10.0):
        if rules is None:
            from ..rules import load_rules

            rules = load_rules()
        self.rules, self.seed, self.time_s = list(rules), seed, time_s
        self._matching: dict[str, list] = {}

    def describe(self) -> dict:
        return {"policy": self.name, "seed": self.seed}

    def _rules_for(self, case: Case) -> list:
        from ..engine import NoMatch, list_candidates
        from ..timelimit import WorkTimeout, time_limit

        if case.id not in self._matching:
            ok = []
            for r in self.rules:
                try:
                    with time_limit(self.time_s, f"rule {r.id}: matching"):
                        if list_candidates(r, case.module):
                            ok.append(r)
                except (NoMatch, WorkTimeout):
                    continue
                except Exception:  # noqa: BLE001 - a rule that crashes on this program is not offered
                    continue
            self._matching = {case.id: ok}  # one program at a time
        return self._matching[case.id]

    def answers(self, case: Case, n: int, first_sample: int = 0) -> list[Answer]:
        from ..engine import apply_rule
        from ..llm import single_label
        from ..timelimit import time_limit

        out = []
        for k in range(first_sample, first_sample + n):
            rng = random.Random(f"{self.seed}:{case.id}:{k}")
            pool = list(self._rules_for(case))
            rng.shuffle(pool)
            ans = None
            for rule in pool[:8]:
                try:
                    with time_limit(self.time_s, f"rule {rule.id}: application"):
                        step = apply_rule(rule, case.module, seed=rng.randrange(2**31))
                except Exception:  # noqa: BLE001 - try the next rule
                    continue
                ans = Answer(single_label(step.cot, step.after, rule.name), extra={"rule": rule.id})
                break
            out.append(ans or Answer("", error="engine: no rule applies to this program"))
        return out


class IdentityPolicy(Policy):
    """Baseline: answers the input program unchanged (well-formed, Diff fails)."""

    name = "identity"

    def answers(self, case: Case, n: int, first_sample: int = 0) -> list[Answer]:
        from ..llm import single_label

        text = single_label("The program is returned unchanged.", case.module, "identity")
        return [Answer(text) for _ in range(n)]


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


__all__ = ["Case", "Answer", "Policy", "EndpointPolicy", "AnswersFilePolicy", "EnginePolicy", "IdentityPolicy"]
