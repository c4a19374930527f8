"""Single-step evaluation (``stp eval``, paper §4.3) and held-out test sets (``stp testset``).

Public API::

    evaluate(inputs, outdir, policy, EvalOptions(...)) -> summary dict
    EndpointPolicy(ChatClient(...)), AnswersFilePolicy(path), EngineAnswers(seed), IdentityPolicy()
    pass_at_k(n, c, k) -> float                      # Chen et al. 2021
    Recognizer().recognise(module, answer_leir) -> (rule ids, complete)
    build_testset(inputs, outdir, variants=3, exclude=None, allow_overlap=False) -> manifest
"""

from .metrics import STAGES, mean_pass_at_k, pass_at_k
from .policies import AnswerSource, AnswersFilePolicy, Case, EndpointPolicy, EngineAnswers, IdentityPolicy
from .recognize import Recognizer
from .runner import EvalError, EvalOptions, evaluate, load_cases, summarise
from .testset import OverlapError, TestsetError, build_testset, with_dtype

__all__ = ["STAGES", "pass_at_k", "mean_pass_at_k", "AnswerSource", "Case", "EndpointPolicy", "AnswersFilePolicy",
           "EngineAnswers", "IdentityPolicy", "Recognizer", "EvalError", "EvalOptions", "evaluate", "load_cases",
           "summarise", "OverlapError", "TestsetError", "build_testset", "with_dtype"]
