"""Where candidate next programs come from: one protocol,
``Policy.propose(program, history, k) -> list[Proposal]``, and its three implementations,
shared by ``stp search`` (:mod:`steptp.search`) and ``stp eval`` (:mod:`steptp.eval`, which
renders a proposal as an answer text through a thin adapter, :mod:`steptp.eval.policies`).

``program`` is a :class:`~steptp.leir.LeirModule` or anything holding one in ``.module``: a
search node (:class:`steptp.search.core.Node`: ``text``, ``depth``, ``speedup``, ...) or an
eval case (:class:`steptp.eval.policies.Case`: ``id``, ``source``, ``prompt``, ...).
``history`` is the path root..parent of ``program`` (empty for the root, for the
chain-without-parent algorithm and in eval).

* :class:`EnginePolicy`: the rule engine, through :class:`steptp.rules.service.EngineService`
  (a worker process with time and memory limits). ``pick="candidate"`` (search): every rule
  x site x parameter that applies is a candidate, at most ``per_rule`` (a seeded sample) per
  rule; ``k`` of them are drawn with the seed (``rank="random"``) or the ``k`` with the
  lowest static cost (:mod:`steptp.cost_model.static`, ``rank="cost"``); a program never gets the
  same candidate twice. ``pick="rule"`` (eval baseline): a rule drawn at random among those
  that match, applied at its own seeded site (:func:`steptp.engine.apply_rule`).
* :class:`ReplayPolicy`: proposals read from a JSONL file: search records ``{"parent": LEIR
  or null, "leir": LEIR, "strategy": S, "site": ..., "params": {...}}`` and eval answer
  records ``{"case"|"source"|"program"|"prompt": ..., "answer": TEXT, "sample": N}``.
* :class:`LLMPolicy`: a chat model behind an OpenAI-compatible endpoint, prompted with the
  paper's multi-step prompt (App. B.2, ``templates/search_prompt.j2``; answers parsed
  tolerantly, at most ``k`` kept, garbage gives no proposal) or with the chat set's
  single-answer prompt (``prompt="single"``: ``k`` sampled answers, one proposal each,
  carrying the raw answer text).

Modules, one job each: :mod:`.base` (the protocol, :class:`Proposal`), :mod:`.steps` (the
typed steps of a multi-step proposal), :mod:`.names` (claimed strategy names), :mod:`.engine`,
:mod:`.screening`, :mod:`.replay`, :mod:`.llm`.

Every seeded draw uses :func:`steptp.seeds.seeded_rng` (seed, program, rule, purpose). The claimed-strategy ->
rule-id lookup is :class:`StrategyNames`.
"""

from .base import Policy, Proposal, module_of, program_key
from .engine import MACRO, EnginePolicy
from .llm import ALGORITHM_TEXT, LLMPolicy, parse_proposals, render_prompt
from .names import StrategyNames, normalise_name, strategy_table
from .replay import ReplayError, ReplayPolicy
from .screening import ScreeningPolicy
from .steps import Step, steps_of_records, steps_to_records

__all__ = ["Proposal", "Policy", "module_of", "program_key", "normalise_name", "StrategyNames", "strategy_table",
           "EnginePolicy", "ReplayError", "ReplayPolicy", "ALGORITHM_TEXT", "render_prompt", "parse_proposals",
           "LLMPolicy", "ScreeningPolicy", "MACRO", "Step", "steps_of_records", "steps_to_records"]
