"""The seven search algorithms of paper §4.4 / App. B.2, and MetaSchedule's evolutionary
search, over a :class:`~steptp.search.core.Search`.

Each function drives ``search.expand(node, k)`` (ask the policy for ``k`` proposals at
``node``, verify and time them as one batch; returns the Equal children, fastest first; a beam
expands its whole frontier as one batch, the evolutionary search measures its picks as one) and
stops at its budget. A batch the runner has not measured yet raises
:class:`steptp.runner.base.Pending` out of the algorithm: the driver (:mod:`steptp.search.run`)
runs it again from the start once the results are in, every earlier proposal and measurement
answered from its caches, so every algorithm works with a runner that answers in rounds; the best node and the tree live in the :class:`Search`. No algorithm knows
about HTTP, TVM or rules. Defaults are the paper's (App. B.2):

=================  ==========================================================================
greedy             20 iterations, breadth 2: expand the current node with 2 candidates, move
                   to the fastest Equal child (the locally best one, even when slower than
                   the current node); an iteration without an Equal child stays put.
beam               20 iterations, 3 candidates per node, keep the top k=2 children (by time)
                   of the whole frontier as the next frontier.
bfs / dfs          max depth 20, 2 candidates per node; FIFO / LIFO order of expansion. The
                   paper gives no node budget; ``iterations`` (default 20) bounds the number
                   of expansions so that a search ends (2^20 nodes otherwise).
mcts               20 iterations of UCT (Kocsis & Szepesvári 2006): selection by
                   ``Q/N + c*sqrt(ln N_parent / N_child)`` with c = sqrt(2) (UCB1, Auer et
                   al. 2002), expansion of one new child per iteration (a node is fully
                   expanded at 2 children or when the policy has nothing more), a rollout
                   of ``rollout_depth`` (default 1) further policy steps from the new child,
                   reward = log(speedup) of the best program met on the expansion + rollout
                   (0 when nothing verified), backed up along the path (mean value Q/N).
chain              20 iterations, 1 candidate per step, the prompt shows the parent; the
                   chain moves to the new program whenever it verifies.
chain-no-parent    as chain, but the policy sees no history (no parent).
evolutionary       (not in the paper) TVM MetaSchedule's EvolutionarySearch: 20 rounds; the
                   population is the ``population`` (4) fastest measured programs (root
                   included); mutation = the policy's proposals (rule applications) at
                   each member, up to ``screen`` (32) per member, pooled with the unmeasured
                   candidates of earlier rounds; model-scored selection: every pooled
                   candidate is scored by the search's scorer (predicted ln speedup over
                   the root = ln speedup of its parent + the scorer's ln speedup over the
                   parent), and only the top ``measure`` (2) are verified and timed, one of
                   them replaced by a random pooled candidate with probability
                   ``eps_greedy`` (0.05). A round without any new candidate asks the
                   population again; with none anywhere the search ends.
=================  ==========================================================================

Every parameter is a keyword argument; :data:`DEFAULTS` lists them per algorithm.
"""

from __future__ import annotations

import math
from collections import deque

from .core import Node, Search, log_speedup

#: Paper defaults (App. B.2) per algorithm; override any with keyword arguments.
DEFAULTS: dict[str, dict] = {
    "greedy": {"iterations": 20, "breadth": 2},
    "beam": {"iterations": 20, "per_node": 3, "k": 2},
    "bfs": {"iterations": 20, "max_depth": 20, "per_node": 2},
    "dfs": {"iterations": 20, "max_depth": 20, "per_node": 2},
    "mcts": {"iterations": 20, "per_node": 1, "max_children": 2, "rollout_depth": 1, "c": math.sqrt(2)},
    "chain": {"iterations": 20},
    "chain-no-parent": {"iterations": 20},
    "evolutionary": {"iterations": 20, "population": 4, "screen": 32, "measure": 2, "eps_greedy": 0.05, "seed": 0},
}

ALGORITHMS = tuple(DEFAULTS)


def _tick(s: Search, it: int) -> None:
    s.iteration = it


def greedy(s: Search, iterations: int = 20, breadth: int = 2) -> None:
    """Greedy search (see the module table)."""
    cur = s.root
    for it in range(iterations):
        _tick(s, it)
        if s.exhausted:
            return
        kids = s.expand(cur, breadth)
        if kids:
            cur = kids[0]


def beam(s: Search, iterations: int = 20, per_node: int = 3, k: int = 2) -> None:
    """Beam search (see the module table)."""
    frontier = [s.root]
    for it in range(iterations):
        _tick(s, it)
        if s.exhausted:
            return
        pool = s.expand_all([(n, per_node) for n in frontier])  # the frontier measured as one batch
        if pool:
            pool.sort(key=lambda n: n.time_us)
            frontier = pool[:k]


def _tree_search(s: Search, lifo: bool, iterations: int, max_depth: int, per_node: int) -> None:
    todo = deque([s.root])
    for it in range(iterations):
        if not todo or s.exhausted:
            return
        _tick(s, it)
        node = todo.pop() if lifo else todo.popleft()
        kids = s.expand(node, per_node)
        kids = [c for c in kids if c.depth < max_depth]
        # DFS visits the fastest child first (it is pushed last)
        todo.extend(reversed(kids) if lifo else kids)


def bfs(s: Search, iterations: int = 20, max_depth: int = 20, per_node: int = 2) -> None:
    """Breadth-first search (see the module table)."""
    _tree_search(s, False, iterations, max_depth, per_node)


def dfs(s: Search, iterations: int = 20, max_depth: int = 20, per_node: int = 2) -> None:
    """Depth-first search (see the module table)."""
    _tree_search(s, True, iterations, max_depth, per_node)


class _Stats:
    __slots__ = ("n", "w", "kids", "closed")

    def __init__(self):
        self.n = 0
        self.w = 0.0
        self.kids: list[Node] = []
        self.closed = False  # the policy has nothing more here


def mcts(s: Search, iterations: int = 20, per_node: int = 1, max_children: int = 2, rollout_depth: int = 1,
         c: float = math.sqrt(2)) -> None:
    """Monte Carlo tree search with UCT (see the module table)."""
    st: dict[int, _Stats] = {}

    def stats(n: Node) -> _Stats:
        return st.setdefault(n.id, _Stats())

    def expandable(n: Node) -> bool:
        x = stats(n)
        return not x.closed and len(x.kids) < max_children

    for it in range(iterations):
        if s.exhausted:
            return
        _tick(s, it)
        # selection
        path = [s.root]
        node = s.root
        while not expandable(node):
            x = stats(node)
            live = [k for k in x.kids if not (stats(k).closed and not stats(k).kids)]
            if not live:
                break
            ln = math.log(max(x.n, 1))

            def uct(k: Node) -> float:
                y = stats(k)
                if y.n == 0:
                    return math.inf
                return y.w / y.n + c * math.sqrt(ln / y.n)

            node = max(live, key=lambda k: (uct(k), -k.id))
            path.append(node)
        # expansion
        reward = 0.0
        if expandable(node):
            kids = s.expand(node, per_node)
            if not kids:
                stats(node).closed = True
            else:
                stats(node).kids.extend(kids)
                child = kids[0]
                path.append(child)
                reward = max(log_speedup(k) for k in kids)
                # rollout: the policy continues from the new child; its nodes stay in the tree
                cur = child
                for _ in range(rollout_depth):
                    if s.exhausted:
                        break
                    more = s.expand(cur, 1)
                    if not more:
                        break
                    cur = more[0]
                    reward = max(reward, log_speedup(cur))
        else:
            stats(node).closed = True
        for n in path:
            x = stats(n)
            x.n += 1
            x.w += reward


def chain(s: Search, iterations: int = 20, with_parent: bool = True) -> None:
    """Chain-based search (see the module table)."""
    cur = s.root
    for it in range(iterations):
        if s.exhausted:
            return
        _tick(s, it)
        kids = s.expand(cur, 1, with_parent=with_parent)
        if kids:
            cur = kids[0]


def chain_no_parent(s: Search, iterations: int = 20) -> None:
    """Chain-based search without the parent in the prompt."""
    chain(s, iterations, with_parent=False)


def evolutionary(s: Search, iterations: int = 20, population: int = 4, screen: int = 32, measure: int = 2,
                 eps_greedy: float = 0.05, seed: int = 0) -> None:
    """Evolutionary search with model-scored selection (see the module table; source: TVM
    MetaSchedule ``EvolutionarySearch``: population, mutation, cost-model screening,
    epsilon-greedy pick of the measured batch; one mutation step per round, from measured
    programs only, so every measured program has a measured parent)."""
    from .core import canonical

    from ..seeds import seeded_rng

    rng = seeded_rng(seed, "evolutionary")
    pool: list[tuple[Node, object, str]] = []  # (measured parent, proposal, canonical text)
    pooled: set[str] = set()
    screened: set[int] = set()

    def mutate(parents: list[Node], again: bool) -> None:
        for parent in parents:
            if parent.id in screened and not again:
                continue
            screened.add(parent.id)
            for p in s.propose(parent, screen):
                try:
                    t = canonical(p.module)
                except Exception:  # noqa: BLE001 - a malformed proposal is never measured
                    continue
                if t not in pooled and t not in s.seen:
                    pooled.add(t)
                    pool.append((parent, p, t))
            if again and pool:
                return

    for it in range(iterations):
        if s.exhausted:
            return
        _tick(s, it)
        members = sorted((n for n in s.nodes if n.ok), key=lambda n: (-(n.speedup or 0.0), n.id))[:population]
        mutate(members, False)
        pool[:] = [x for x in pool if x[2] not in s.seen]
        if not pool:
            mutate(members, True)
        if not pool:
            return
        scores: list[float] = [0.0] * len(pool)
        by_parent: dict[int, list[int]] = {}
        for i, (parent, _, _) in enumerate(pool):
            by_parent.setdefault(parent.id, []).append(i)
        for idx in by_parent.values():
            parent = pool[idx[0]][0]
            pred = s.score(parent, [pool[i][1] for i in idx])
            for i, v in zip(idx, pred):
                scores[i] = log_speedup(parent) + v
        order = sorted(range(len(pool)), key=lambda i: (-scores[i], i))
        pick = order[:measure]
        rest = order[measure:]
        if rest and pick and rng.random() < eps_greedy:
            pick[-1] = rng.choice(rest)
        chosen = [pool[i] for i in pick]
        for i in sorted(pick, reverse=True):
            del pool[i]
        if s.exhausted:
            return
        s.add_batch([(parent, p) for parent, p, _ in chosen])  # the measured batch of the round


FUNCTIONS = {"greedy": greedy, "beam": beam, "bfs": bfs, "dfs": dfs, "mcts": mcts, "chain": chain,
             "chain-no-parent": chain_no_parent, "evolutionary": evolutionary}


def run_algorithm(name: str, s: Search, **overrides) -> None:
    """Run algorithm ``name`` on ``s`` with :data:`DEFAULTS` updated by ``overrides``
    (unknown keys raise ``ValueError``; ``None`` values keep the default)."""
    if name not in FUNCTIONS:
        raise ValueError(f"unknown algorithm {name!r}; one of {', '.join(ALGORITHMS)}")
    params = dict(DEFAULTS[name])
    for k, v in overrides.items():
        if v is None:
            continue
        if k not in params:
            raise ValueError(f"algorithm {name} has no parameter {k!r} (it has {', '.join(params)})")
        params[k] = v
    FUNCTIONS[name](s, **params)
