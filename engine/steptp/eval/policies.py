"""Where the answers of ``stp eval`` come from: a model behind an OpenAI-compatible
endpoint, a JSONL file of answers, or a baseline policy (``engine``: one random matching
rule, seeded; ``identity``: the input program unchanged, so Diff fails).

The first three are the policies of :mod:`steptp.policy` (``LLMPolicy``, ``ReplayPolicy``,
``EnginePolicy``, shared with ``stp search``) behind :class:`ProposalAnswers`, the thin
adapter that renders a proposal as an answer text."""

from __future__ import annotations

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


class AnswerSource:
    """Where eval answers come from (not a :class:`steptp.policy.Policy`: it answers cases,
    through :class:`ProposalAnswers` for the policies). Interface: :meth:`answers` returns ``n`` answers for a case. ``threaded`` policies
    (network-bound) are asked from ``--concurrency`` threads; the others run in the main thread."""

    name = "policy"
    threaded = False

    def describe(self) -> dict:
        """JSON-ready identity of the policy (stored in ``run.json``; a resumed run must match)."""
        return {"policy": self.name}

    def check(self) -> None:
        """Raise :class:`steptp.llm.EndpointError` when the policy cannot answer at all."""

    def answers(self, case: Case, n: int, first_sample: int = 0) -> list[Answer]:
        """``n`` answers for samples ``first_sample ..`` of ``case``."""
        raise NotImplementedError

    def close(self) -> None:
        """Release what the policy holds (a worker process)."""


class ProposalAnswers(AnswerSource):
    """The adapter from a :mod:`steptp.policy` policy (``propose(program, history, k)``) to
    eval answers: the case is the program, with no history. ``per_sample``: ask once per
    sample with ``draw=(...)`` (:meth:`draw`; seeded or recorded policies) rather than once
    for all ``n`` (a model). A proposal becomes an :class:`Answer` by :meth:`answer`: its raw
    answer text, or the dataset's single-answer label (:func:`steptp.llm.single_label`) of
    its program and CoT; a sample without a proposal gets :meth:`missing`."""

    per_sample = True

    def __init__(self, policy):
        self.policy = policy

    def draw(self, case: Case, sample: int) -> tuple:
        """The ``draw`` key of one sample."""
        return (sample,)

    def answer(self, p) -> Answer:
        """The answer of one proposal."""
        if p.error is not None:
            return Answer("", error=p.error)
        if p.answer is not None:
            return Answer(p.answer, p.info.get("prompt_tokens"), p.info.get("completion_tokens"),
                          p.info.get("finish_reason"))
        from ..llm import single_label

        return Answer(single_label(p.cot, p.module, p.strategy), extra=dict(p.info))

    def missing(self, case: Case, sample: int) -> Answer:
        """The answer of a sample the policy proposed nothing for."""
        return Answer("", error=f"{self.name}: no proposal for sample {sample}")

    def answers(self, case: Case, n: int, first_sample: int = 0) -> list[Answer]:
        if not self.per_sample:
            return [self.answer(p) for p in self.policy.propose(case, [], n)[:n]]
        out = []
        for k in range(first_sample, first_sample + n):
            props = self.policy.propose(case, [], 1, draw=self.draw(case, k))
            out.append(self.answer(props[0]) if props else self.missing(case, k))
        return out

    def close(self) -> None:
        close = getattr(self.policy, "close", None)
        if close is not None:
            close()


class EndpointPolicy(ProposalAnswers):
    """A model behind an OpenAI-compatible endpoint (:class:`steptp.llm.ChatClient`), asked
    with the single-answer prompt (:class:`steptp.policy.LLMPolicy`, ``prompt="single"``)."""

    name = "endpoint"
    threaded = True
    per_sample = False

    def __init__(self, client, temperature: float = 0.0, max_tokens: int | None = None, seed: int | None = None):
        from ..policy import LLMPolicy

        super().__init__(LLMPolicy(client, prompt="single", temperature=temperature, max_tokens=max_tokens, seed=seed))
        self.client, self.temperature, self.max_tokens, self.seed = client, temperature, max_tokens, seed

    def describe(self) -> dict:
        return {"policy": self.name, "endpoint": self.client.endpoint, "model": self.client.model,
                "temperature": self.temperature, "max_tokens": self.max_tokens}

    def check(self) -> None:
        self.client.check()


class AnswersFilePolicy(ProposalAnswers):
    """Answers read from a JSONL file (:class:`steptp.policy.ReplayPolicy`): one object per
    answer with ``answer`` (the model output text) and either ``case`` (the case id, as in
    results.jsonl), ``source`` (the input path), ``program`` (the program name) or ``prompt``
    (the exact prompt); optional ``sample`` (0-based). A case without an answer fails with
    that reason. Raises :class:`steptp.policy.ReplayError` (a ``ValueError``) for a file or
    line that cannot be read."""

    name = "answers"

    def __init__(self, path: str | Path):
        from ..policy import ReplayPolicy

        super().__init__(ReplayPolicy(path))
        self.path = Path(path)

    def describe(self) -> dict:
        return {"policy": self.name, "answers": str(self.path)}

    def missing(self, case: Case, sample: int) -> Answer:
        return Answer("", error=f"no answer for sample {sample} of this case in {self.path.name}")


class EngineAnswers(ProposalAnswers):
    """Baseline: one rule drawn at random among those that match the program, applied at a
    seeded site with seeded parameters, answered in the dataset's label format with the
    rule's CoT (:class:`steptp.policy.EnginePolicy`, ``pick="rule"``: a worker process with
    ``time_s`` seconds per application and a memory limit). Seeded by ``(seed, case id,
    sample)``."""

    name = "engine"

    def __init__(self, seed: int = 0, rules=None, time_s: float = 10.0):
        from ..policy import EnginePolicy

        super().__init__(EnginePolicy(rules, pick="rule", seed=seed, apply_timeout_s=time_s))
        self.seed, self.time_s = seed, time_s

    def describe(self) -> dict:
        return {"policy": self.name, "seed": self.seed}

    def draw(self, case: Case, sample: int) -> tuple:
        return (case.id, sample)

    def answer(self, p) -> Answer:
        from ..llm import single_label

        return Answer(single_label(p.cot, p.module, self.policy.rule_name(p.strategy)), extra={"rule": p.strategy})

    def missing(self, case: Case, sample: int) -> Answer:
        return Answer("", error="engine: no rule applies to this program")


class IdentityPolicy(AnswerSource):
    """Baseline: answers the input program unchanged (well-formed, Diff fails)."""

    name = "identity"

    def answers(self, case: Case, n: int, first_sample: int = 0) -> list[Answer]:
        from ..llm import single_label

        text = single_label("The program is returned unchanged.", case.module, "identity")
        return [Answer(text) for _ in range(n)]


__all__ = ["Case", "Answer", "AnswerSource", "ProposalAnswers", "EndpointPolicy", "AnswersFilePolicy", "EngineAnswers",
           "IdentityPolicy"]
