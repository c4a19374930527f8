"""A reward for online RL from the step verifier (TRL ``GRPOTrainer`` ``reward_funcs``, verl).

:func:`step_reward` scores model completions of the single-answer prompt (the chat set's
user turn) by what the verifier says of the program they propose. Correct by construction
(issue 34): a wrong program never earns more than the unchanged one, and doing nothing
(renaming a loop variable) earns what unchanged earns:

    unparsable 0  <=  not Equal (any stage)  <=  unchanged  <  Equal

========================================================  ======================
completion                                                reward (:data:`REWARDS`)
========================================================  ======================
unparsable (no ``<answer>``, bad JSON or LEIR, a          0.0
signature that does not fit the prompt's)
changed, does not build (lowering, preflight, LLVM)       0.02
builds, does not run on every trial (its own crash or     0.04
hang, reproduced in a fresh worker)
runs, not Equal to the original                           0.06
unchanged: the same text, or alpha-equivalent (the same   0.1
program up to renaming loop variables and intermediate
tensors, :func:`steptp.leir.alpha.alpha_equivalent`)
Equal (3 random + 2 ordered trials, :func:`verify_pair`)  1.0
Equal and ``timing=True``                                 1.0 + clip(log speedup, 0, 1)
infrastructure (see below)                                ``None``
========================================================  ======================

The small steps below *unchanged* keep a gradient towards programs that build and run, and
can never outweigh correctness. (``log`` natural; the speedup from
:func:`steptp.runner.timing.compare`, interleaved, run in the worker under ``timeout_s``, and
only when its 95 % interval lies above 1.)

**Infrastructure is not the program.** A worker killed at its time limit or crashed is
judged again in a fresh worker (:func:`steptp.verify.confirm_failure`): if the failure
reproduces it is the completion's own (scored as not Equal, a hanging completion is never
let off); if it does not, the machine was at fault and the reward is ``None``, as it is when
the *original* program does not build or run. The pinned TRL (1.16) leaves a completion whose
rewards are all ``None`` out of the advantage (``nansum`` over NaN). :data:`STATS` counts
them.

The same inputs give the same rewards (seeded inputs, ``seed``). Completions are verified
one after the other; the build and the trials of each run in a worker process
(:class:`steptp.runner.worker.IsolatedRunner`, reused between calls, replaced when it dies or
hangs) with a time limit per call, so a hostile completion (huge text, deep nesting,
non-terminating loop extents) costs at most its time limit and never the trainer's process:
parsing is linear and bounded (:func:`steptp.llm.parse_single`), oversized programs are
refused before they are built (:func:`steptp.verify.resource_problem`).

Which program a completion transforms comes from a dataset column that TRL passes as a
keyword argument: ``original`` (the ``.leir`` text, header included) per prompt. Every
``stp dataset`` run writes ``rl_prompts.jsonl`` with that column beside the conversational
``prompt`` (:func:`steptp.dataset.chat.rl_record`), so
``GRPOTrainer(train_dataset=load_dataset("json", data_files=".../rl_prompts.jsonl")["train"],
reward_funcs=step_reward)`` needs no join.
"""

from __future__ import annotations

import math
from collections import Counter
from typing import Any, Sequence

#: The graded rewards (module docstring). Infrastructure failures get ``None``, not a value.
REWARDS = {"unparsable": 0.0, "build": 0.02, "exec": 0.04, "not_equal": 0.06, "unchanged": 0.1, "equal": 1.0}

#: Counts of completions by stage since the process started (``infrastructure`` included:
#: completions that got ``None``). Read it to see how many were left out of the advantage.
STATS: Counter = Counter()



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
    """The reward's worker: the pool's ``"rewards"`` worker (:func:`steptp.runner.pool.shared`),
    reused between calls, restarted when it dies or hangs; ``timeout_s`` per call."""
    from .runner.pool import shared  # noqa: PLC0415

    return shared("rewards", timeout_s)


def close() -> None:
    """Stop the worker process of earlier calls (it starts again when next used)."""
    from .runner.pool import shared  # noqa: PLC0415

    shared("rewards").close()


def timed_speedup(original_text: str, candidate_text: str, seed: int) -> tuple[float, str]:
    """``(speedup, verdict)`` of ``candidate_text`` over ``original_text`` (``.leir`` texts)
    by :func:`steptp.runner.timing.compare` on the CPU, interleaved. The unit of work the
    reward runs in its worker (module-level, so it pickles). Raises what ``compare`` raises
    (a performance form that disagrees with the verification form included)."""
    from .leir.fileformat import parse_leir  # noqa: PLC0415
    from .runner.timing import compare  # noqa: PLC0415

    c = compare(parse_leir(original_text), parse_leir(candidate_text), seed=seed)
    return c.speedup, c.verdict


def _stage(res) -> str:
    if not res.build:
        return "build"
    if not res.exec:
        return "exec"
    return "not_equal" if not res.equal else "equal"


def score(original_text: str, completion: str, *, timing: bool = False, seed: int = 0,
          timeout_s: float = 60.0) -> tuple[float | None, str]:
    """``(reward, stage)`` of one completion for the program ``original_text`` (``.leir``
    text); ``stage`` is a key of :data:`REWARDS` (``equal`` also with timing), or
    ``infrastructure`` with reward ``None`` (module docstring). Never raises for a bad
    completion; raises ``ValueError`` when ``original_text`` is not a valid program (a
    dataset defect, not the model's)."""
    from .leir.alpha import alpha_equivalent  # noqa: PLC0415
    from .leir.fileformat import parse_leir  # noqa: PLC0415
    from .llm import parse_single  # noqa: PLC0415
    from .verify import confirm_failure, verify_pair  # noqa: PLC0415

    try:
        original = parse_leir(original_text, "original")
    except Exception as e:  # noqa: BLE001
        raise ValueError(f"the original program does not parse: {e}") from None
    cand = parse_single(completion, original.signature)
    if not cand.ok:
        STATS["unparsable"] += 1
        return REWARDS["unparsable"], "unparsable"
    if alpha_equivalent(original.program, cand.module.program, original.signature.names):
        STATS["unchanged"] += 1
        return REWARDS["unchanged"], "unchanged"
    run = _runner(timeout_s)

    def check():
        return verify_pair(original, cand.module, seed=seed, timeout_s=timeout_s, runner=run)

    res = confirm_failure(check(), check, run)
    if res.infrastructure or res.reason.startswith("original program failed"):
        STATS["infrastructure"] += 1
        return None, "infrastructure"
    stage = _stage(res)
    STATS[stage] += 1
    if stage != "equal" or not timing:
        return REWARDS[stage], stage
    try:
        speedup, verdict = run.call(timed_speedup, original.text(), cand.module.text(), seed, timeout_s=timeout_s)
    except Exception:  # noqa: BLE001 - Equal but not timeable (limit, form mismatch): no speed bonus
        return REWARDS["equal"], "equal"
    bonus = min(1.0, max(0.0, math.log(speedup))) if verdict == "faster" else 0.0
    return REWARDS["equal"] + bonus, "equal"


def step_reward(prompts: Sequence[Any], completions: Sequence[Any], *, original: Sequence[str] | None = None,
                timing: bool = False, seed: int = 0, timeout_s: float = 60.0, **kwargs) -> list[float | None]:
    """Rewards of ``completions`` (one per prompt; strings or conversational message lists),
    with the signature TRL's ``GRPOTrainer`` expects of ``reward_funcs``:
    ``reward(prompts, completions, **dataset_columns) -> list[float]``. ``original``: the
    ``.leir`` text of each prompt's program (a dataset column); ``timeout_s`` per worker call.
    Graded as in the module docstring (``None`` for an infrastructure failure, which TRL
    leaves out of the advantage); deterministic for ``seed``. Other dataset columns
    (``signature``, ``entry_id``...) are accepted and ignored. Raises ``ValueError`` when
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
    r = score(ground_truth, solution_str, timing=bool(info.get("timing", False)), seed=int(info.get("seed", 0)))[0]
    return 0.0 if r is None else r  # verl needs a number


__all__ = ["REWARDS", "STATS", "score", "step_reward", "compute_score", "close", "timed_speedup"]
