"""A reward for online RL from the step verifier (TRL ``GRPOTrainer`` ``reward_funcs``, verl).

:func:`step_reward` scores model completions of the single-answer prompt (the chat set's
user turn) by what the verifier says of the program they propose, graded so that a policy
is rewarded for each stage it gets right (paper §4.2's progressive metrics):

========================================================  ======================
completion                                                reward (:data:`REWARDS`)
========================================================  ======================
unparsable (no ``<answer>``, bad JSON or LEIR, a          0.0
signature that does not fit the prompt's)
parsed, but the program is unchanged                      0.1
changed, does not build (lowering, preflight, LLVM)       0.2
builds, does not run on every trial                       0.4
runs, not Equal to the original                           0.5
Equal (3 random + 2 ordered trials, :func:`verify_pair`)  1.0
Equal and ``timing=True``                                 1.0 + clip(log speedup, 0, 1)
========================================================  ======================

(``log`` natural; the speedup from :func:`steptp.runner.timing.compare`, interleaved, and only
when its 95 % interval lies above 1.) The same inputs give the same rewards (seeded inputs,
``seed``). Completions are verified one after the other; the build and the trials of each
run in a worker process (:class:`steptp.runner.worker.IsolatedRunner`, reused between calls,
replaced when it dies or hangs) with a time limit per call, so a hostile completion
(huge text, deep nesting, non-terminating loop extents) costs at most its time limit and
never the trainer's process: parsing is linear and bounded (:func:`steptp.llm.parse_single`),
oversized programs are refused before they are built (:func:`steptp.verify.resource_problem`).

Which program a completion transforms comes from a dataset column that TRL passes as a
keyword argument: ``original`` (the ``.leir`` text, header included) per prompt.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

#: The graded rewards (module docstring).
REWARDS = {"unparsable": 0.0, "unchanged": 0.1, "build": 0.2, "exec": 0.4, "not_equal": 0.5, "equal": 1.0}

_RUNNER: list = []


def _text(x: Any) -> str:
    """A completion or prompt as text: a string, or the last message's content of a
    conversational one (``[{"role", "content"}, ...]``)."""
    if isinstance(x, str):
        return x
    if isinstance(x, dict):
        return str(x.get("content", ""))
    if isinstance(x, (list, tuple)) and x:
        return _text(x[-1])
    return ""


def _runner(timeout_s: float):
    if not _RUNNER:
        from .runner.worker import IsolatedRunner  # noqa: PLC0415

        _RUNNER.append(IsolatedRunner(timeout_s=timeout_s))
    return _RUNNER[0]


def close() -> None:
    """Stop the worker process of earlier calls (it is reused between calls)."""
    while _RUNNER:
        _RUNNER.pop().close()


def score(original_text: str, completion: str, *, timing: bool = False, seed: int = 0,
          timeout_s: float = 60.0) -> tuple[float, str]:
    """``(reward, stage)`` of one completion for the program ``original_text`` (``.leir``
    text); ``stage`` is a key of :data:`REWARDS` (``equal`` also with timing). Never raises
    for a bad completion; raises ``ValueError`` when ``original_text`` is not a valid
    program (a dataset defect, not the model's)."""
    from .leir.fileformat import parse_leir  # noqa: PLC0415
    from .llm import parse_single  # noqa: PLC0415
    from .verify import verify_pair  # noqa: PLC0415

    try:
        original = parse_leir(original_text, "original")
    except Exception as e:  # noqa: BLE001
        raise ValueError(f"the original program does not parse: {e}") from None
    cand = parse_single(completion, original.signature)
    if not cand.ok:
        return REWARDS["unparsable"], "unparsable"
    res = verify_pair(original, cand.module, seed=seed, timeout_s=timeout_s, runner=_runner(timeout_s))
    if not res.diff:
        return REWARDS["unchanged"], "unchanged"
    if not res.build:
        return REWARDS["build"], "build"
    if not res.exec:
        return REWARDS["exec"], "exec"
    if not res.equal:
        return REWARDS["not_equal"], "not_equal"
    if not timing:
        return REWARDS["equal"], "equal"
    from .runner.timing import compare  # noqa: PLC0415

    try:
        c = compare(original, cand.module, seed=seed)
    except Exception:  # noqa: BLE001 - Equal but not timeable: no speed bonus
        return REWARDS["equal"], "equal"
    bonus = min(1.0, max(0.0, math.log(c.speedup))) if c.verdict == "faster" else 0.0
    return REWARDS["equal"] + bonus, "equal"


def step_reward(prompts: Sequence[Any], completions: Sequence[Any], *, original: Sequence[str] | None = None,
                timing: bool = False, seed: int = 0, timeout_s: float = 60.0, **kwargs) -> list[float]:
    """Rewards of ``completions`` (one per prompt; strings or conversational message lists),
    with the signature TRL's ``GRPOTrainer`` expects of ``reward_funcs``:
    ``reward(prompts, completions, **dataset_columns) -> list[float]``. ``original``: the
    ``.leir`` text of each prompt's program (a dataset column); ``timeout_s`` per worker call.
    Graded as in the module docstring; deterministic for ``seed``. Raises ``ValueError`` when
    ``original`` is missing or of another length."""
    if original is None:
        raise ValueError("step_reward needs the dataset column 'original' (the .leir text of each prompt's program)")
    if len(original) != len(completions):
        raise ValueError(f"{len(completions)} completions but {len(original)} originals")
    return [score(o, _text(c), timing=timing, seed=seed, timeout_s=timeout_s)[0]
            for o, c in zip(original, completions)]


def compute_score(data_source: str, solution_str: str, ground_truth: str, extra_info: dict | None = None) -> float:
    """verl's custom reward signature: ``ground_truth`` is the original ``.leir`` text and
    ``solution_str`` the completion; ``extra_info`` may set ``timing`` and ``seed``."""
    info = extra_info or {}
    return score(ground_truth, solution_str, timing=bool(info.get("timing", False)), seed=int(info.get("seed", 0)))[0]


__all__ = ["REWARDS", "score", "step_reward", "compute_score", "close"]
