"""LLM access shared by ``stp eval`` and ``stp search``: an OpenAI-compatible chat client
(:mod:`.client`), the training-set prompts (:mod:`.prompts`) and tolerant answer parsing
(:mod:`.answers`).

Public API::

    ChatClient(endpoint, model, api_key=None, timeout_s=120, max_retries=2).check()
    ChatClient(...).complete(messages, n=1, temperature=0.0, max_tokens=None, seed=None) -> [Completion]
    single_prompt(module) / multi_prompt(module, count) / user_messages(prompt) / single_label(cot, ir, name)
    parse_single(text, signature) -> Candidate
    parse_candidates(text, signature) -> ([Candidate], reason)
"""

from .answers import Candidate, parse_candidates, parse_single
from .client import ChatClient, Completion, EndpointError, RequestError, normalize_endpoint
from .prompts import multi_prompt, signature_dict, single_label, single_prompt, user_messages

__all__ = ["ChatClient", "Completion", "EndpointError", "RequestError", "normalize_endpoint", "Candidate",
           "parse_single", "parse_candidates", "single_prompt", "multi_prompt", "user_messages", "single_label",
           "signature_dict"]
