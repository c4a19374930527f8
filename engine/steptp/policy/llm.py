"""Proposals from a chat model (:class:`LLMPolicy`): the multi-step search prompt
(:func:`render_prompt`, paper App. B.2) and its answers read tolerantly
(:func:`parse_proposals`)."""

from __future__ import annotations

from typing import Any

from .base import Proposal, module_of
from .names import StrategyNames, strategy_table


#: One sentence per algorithm, opening the prompt (paper App. B.2).
ALGORITHM_TEXT = {
    "greedy": "Greedy-based optimization",
    "beam": "Beam-search-based optimization",
    "bfs": "Breadth-first-based optimization",
    "dfs": "Depth-first-based optimization",
    "mcts": "Monte-Carlo-tree-search-based optimization",
    "chain": "Chain-based optimization",
    "chain-no-parent": "Chain-based optimization",
    "evolutionary": "Evolutionary optimization (a population of measured programs, mutated step by step)",
}


def render_prompt(algorithm: str, node, parent, strategies: list[dict], target: str = "cpu", count: int = 2) -> str:
    """The multi-step prompt of paper App. B.2 for a search node (``text``, ``module``,
    ``depth``, ``speedup``, ``strategy``; ``parent`` the same or None), from
    ``templates/search_prompt.j2``; ``strategies``: :func:`strategy_table` rows."""
    from ..backend.hardware import DEFAULT_GPU
    from ..leir.ast import DTYPES
    from ..resources import render

    sig = node.module.signature
    tensors = [{"name": t.name, "role": t.role, "torch_dtype": "torch." + DTYPES[t.dtype], "shape": list(t.shape)}
               for t in sig.tensors]
    return render("search_prompt.j2", algorithm=ALGORITHM_TEXT.get(algorithm, "Search-based optimization"),
                  name=sig.name, leir=node.text, tensors=tensors,
                  parent=None if parent is None else {"leir": parent.text, "depth": parent.depth,
                                                       "speedup": parent.speedup or 1.0,
                                                       "is_root": parent.parent is None},
                  current={"depth": node.depth, "speedup": node.speedup or 1.0, "strategy": node.strategy},
                  target=target, gpu=DEFAULT_GPU, strategies=strategies, count=count)


def _wrap_json(text: str) -> str | None:
    """A bare JSON answer (the B.2 prompt asks for JSON only) wrapped in <answer> tags."""
    s = text
    if "</think>" in s:
        s = s.rsplit("</think>", 1)[1]
    starts = [i for i in (s.find("["), s.find("{")) if i >= 0]
    if not starts:
        return None
    i = min(starts)
    j = max(s.rfind("]"), s.rfind("}"))
    if j <= i:
        return None
    return "<answer>" + s[i:j + 1] + "</answer>"


def parse_proposals(text: str, signature, k: int, names: StrategyNames | None = None) -> tuple[list[Proposal], str]:
    """At most ``k`` proposals read from a model answer (``<answer>`` JSON, fenced JSON or
    bare JSON; keys ``transformed_IR`` and ``applied_strategies``/``applied_strategy``);
    strategies in rule-id spelling through ``names``. Returns ``(proposals, reason)``; never
    raises."""
    from ..llm.answers import parse_candidates

    try:
        cands, why = parse_candidates(text, signature)
        if not cands and "<answer>" not in (text or ""):
            wrapped = _wrap_json(text or "")
            if wrapped is not None:
                cands, why = parse_candidates(wrapped, signature)
    except Exception as e:  # noqa: BLE001 - hostile text never crashes a search
        return [], f"unreadable answer: {type(e).__name__}"
    names = names or StrategyNames([])
    out = []
    reasons = [why] if why else []
    for c in cands:
        if c.ok:
            out.append(Proposal(c.module, names.strategy_id(c.strategy), None, {}))
        elif c.reason:
            reasons.append(c.reason)
        if len(out) >= k:
            break
    return out, "; ".join(reasons)[:500]


class LLMPolicy:
    """Proposals from a chat model (see the module docstring).

    ``client``: anything with ``complete(messages, n, temperature, max_tokens, seed)``
    returning objects with ``.text`` (:class:`steptp.llm.client.ChatClient`); ``prompt``:
    ``search`` (App. B.2, ``algorithm`` names the search in it, one request per call, at
    most ``k`` proposals, none from an unreadable answer) or ``single`` (the single-answer
    prompt, ``program.prompt`` when it has one: ``k`` sampled answers in one request, one
    proposal each with its raw ``answer`` and token counts in ``info``; a failed request
    gives ``k`` proposals with ``error``); ``temperature`` (paper: 0.3); ``max_tokens``;
    ``target``; ``rules`` (the strategies listed and looked up); ``seed``: sent with
    single-answer requests. ``log``: one dict per search request (prompt and answer sizes,
    proposals, reason, tokens)."""

    threaded = True

    def __init__(self, client, *, prompt: str = "search", algorithm: str = "greedy", temperature: float = 0.3,
                 max_tokens: int | None = None, target: str = "cpu", rules=None, seed: int | None = None):
        if prompt not in ("search", "single"):
            raise ValueError(f"prompt must be 'search' or 'single', not {prompt!r}")
        self.client, self.prompt, self.algorithm = client, prompt, algorithm
        self.temperature, self.max_tokens, self.target, self.seed = temperature, max_tokens, target, seed
        self.strategies = strategy_table(rules) if prompt == "search" else []
        self.names = StrategyNames(self.strategies) if prompt == "search" else None
        self.log: list[dict] = []

    def _single(self, program: Any, k: int) -> list[Proposal]:
        from ..llm import RequestError, parse_single, single_prompt, user_messages

        module = module_of(program)
        prompt = getattr(program, "prompt", None) or single_prompt(module)
        try:
            comps = self.client.complete(user_messages(prompt), n=k, temperature=self.temperature,
                                         max_tokens=self.max_tokens, seed=self.seed)
        except RequestError as e:
            return [Proposal(None, "", answer="", error=f"request: {e}") for _ in range(k)]
        out = []
        for c in comps:
            cand = parse_single(c.text, module.signature)
            out.append(Proposal(cand.module if cand.ok else None, cand.strategy, answer=c.text,
                                info={"prompt_tokens": c.prompt_tokens, "completion_tokens": c.completion_tokens,
                                      "finish_reason": c.finish_reason}))
        return out

    def propose(self, program: Any, history: list, k: int) -> list[Proposal]:
        """At most ``k`` proposals for ``program`` (see the class docstring)."""
        if self.prompt == "single":
            return self._single(program, k)
        from ..llm.client import RequestError

        parent = history[-1] if history else None
        prompt = render_prompt(self.algorithm, program, parent, self.strategies, self.target, count=max(2, k))
        rec = {"node": program.id, "prompt_chars": len(prompt)}
        try:
            comps = self.client.complete([{"role": "user", "content": prompt}], n=1, temperature=self.temperature,
                                         max_tokens=self.max_tokens)
        except RequestError as e:
            rec["reason"] = f"request failed: {e}"
            self.log.append(rec)
            return []
        text = comps[0].text if comps else ""
        props, why = parse_proposals(text, program.module.signature, k, self.names)
        rec.update({"answer_chars": len(text or ""), "proposals": len(props), "reason": why,
                    "prompt_tokens": getattr(comps[0], "prompt_tokens", None) if comps else None,
                    "completion_tokens": getattr(comps[0], "completion_tokens", None) if comps else None})
        self.log.append(rec)
        return props


__all__ = ["ALGORITHM_TEXT", "render_prompt", "parse_proposals", "LLMPolicy"]
