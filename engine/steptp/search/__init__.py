"""Multi-step optimisation (paper §4.4, App. B.2): search algorithms over LEIR programs,
guided by a policy, every candidate verified against the root program and timed.

Layers (algorithms never know about HTTP, TVM or rules)::

    (policies)     steptp.policy, shared with stp eval: Policy.propose(node, history, k) ->
                   [Proposal]: EnginePolicy (rules and their multi-step macros, random or
                   static-cost ranking), ReplayPolicy (JSONL), LLMPolicy (chat endpoint,
                   templates/search_prompt.j2), ScreeningPolicy (a cost model screens)
    (cost models)  steptp.cost_model: create(kind) -> random / static (CPU, GPU) / learned
    (runners)      steptp.runner.base: kinds.create(KIND) (local, pack or a registered one) ->
                   Runner.run(batch) -> [RunnerFuture] (pending until a GPU node has measured
                   a pack); every kind-specific decision is the runner's
    algorithms.py  greedy, beam, bfs, dfs, mcts (UCT), chain, chain-no-parent (the paper's seven)
                   and evolutionary (MetaSchedule-style, model-screened) over a core.Search
    evaluate.py    Measure: verify_pair against the root (3 random + 2 ordered trials; every
                   step of a multi-step proposal), the Equal ones measured by the runner as a batch
    core.py        Node, Search (tree, dedupe, revert rejection, batches, samples, best)
    replay.py      the caches a search waiting for a runner is replayed from
    run.py         search_program / search_many (the one driver, any runner): summary.json,
                   best.leir, tree.jsonl, report.md, chat export

Typical use::

    from steptp.search import SearchConfig, search_program
    summary = search_program("examples/softmax.leir", "out/s", SearchConfig(algorithm="greedy", iterations=10))
"""

from .algorithms import ALGORITHMS, DEFAULTS, run_algorithm
from .core import Evaluation, Node, Search, canonical
from .evaluate import Measure, TargetUnavailable, cuda_problem
from .run import (POLICIES, SearchConfig, SearchInputError, export_chat, search_many, search_program,
                  write_report)

__all__ = ["ALGORITHMS", "DEFAULTS", "run_algorithm", "Evaluation", "Node", "Search", "canonical",
           "Measure", "TargetUnavailable", "cuda_problem", "POLICIES", "SearchConfig", "SearchInputError",
           "export_chat", "search_many", "search_program", "write_report"]
