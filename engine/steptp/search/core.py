"""Search state shared by policies, algorithms and the evaluator: :class:`Node`, the
:class:`Search` context that algorithms drive, and the evaluator and scorer protocols
(proposals and policies are :class:`steptp.policy.Proposal` and :class:`steptp.policy.Policy`).

Nothing here knows about HTTP or TVM: a :class:`Search` is given a policy (anything with
``propose(node, history, k)``), an evaluator (anything with ``root_time_us`` and
``evaluate_batch([(module, steps)]) -> [Evaluation]``) and optionally a scorer (anything with
``score(node, proposals) -> [predicted ln speedup over node]`` and, to learn online,
``observe(root, parent, child)``: :mod:`steptp.cost_model.learned`) and records every node it
sees.

Metrics (paper §4.4): a *sample* is a candidate that verified Equal against the root and
was timed; speedup = Runtime_root / Runtime_node; the best trajectory is the path from the
root to the fastest node.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Protocol

from ..leir import LeirModule, format_program
from ..policy import Policy, Proposal
from ..policy.steps import Step


def canonical(module: LeirModule) -> str:
    """Canonical program text (the printer's output, no header): the dedupe key."""
    return format_program(module.program)


@dataclass
class Evaluation:
    """What the evaluator says about one candidate: ``status`` is ``equal`` (verified and
    timed: a sample) or a rejection (``not_equal``, ``timing_failed``); ``time_us`` the
    runtime in microseconds (equal only); ``reason`` the first failure."""

    status: str
    time_us: float | None = None
    reason: str = ""
    verify: dict | None = None
    seconds: dict = field(default_factory=dict)  # time spent per stage (verify, time)
    speedup: float | None = None  # root/candidate timed interleaved, when the runner did (else root_time/time)
    steps: int = 0  # of a multi-step proposal: the steps kept (each verified); 0 for a single step


class Evaluator(Protocol):
    """Verifies and measures proposals (:class:`steptp.search.evaluate.Measure`):
    ``evaluate_batch([(module, steps)])`` returns one :class:`Evaluation` each, or raises
    :class:`steptp.runner.base.Pending` when the runner's answer is not there yet."""

    root_time_us: float | None

    def evaluate_batch(self, items: list[tuple[LeirModule, list]]) -> list[Evaluation]: ...


class Scorer(Protocol):
    def score(self, node: "Node", proposals: list[Proposal]) -> list[float]: ...


@dataclass
class Node:
    """A program in the search tree. ``status``: ``root``, ``equal`` (a sample), or why it
    was rejected (``revert`` to an ancestor, ``duplicate`` of a program already seen,
    ``not_equal``, ``timing_failed``, ``invalid``). ``speedup`` = root time / ``time_us``."""

    id: int
    parent: int | None
    depth: int
    module: LeirModule
    text: str
    strategy: str | None = None
    site: str | None = None
    params: dict = field(default_factory=dict)
    cot: str = ""
    status: str = "root"
    reason: str = ""
    time_us: float | None = None
    speedup: float | None = None
    sample: int | None = None  # 1-based sample index (equal nodes only)
    iteration: int = 0
    steps: list = field(default_factory=list)  # a multi-step proposal's steps (steptp.policy.steps.Step)

    @property
    def ok(self) -> bool:
        return self.status in ("root", "equal")

    def record(self) -> dict:
        """One ``tree.jsonl`` line."""
        from ..engine.jsonify import plain  # the engine package loads egglog: only when recording
        from ..policy.steps import steps_to_records

        return {"id": self.id, "parent": self.parent, "depth": self.depth, "status": self.status,
                "reason": self.reason, "strategy": self.strategy, "site": self.site,
                "params": plain(self.params), "time_us": self.time_us, "speedup": self.speedup,
                "sample": self.sample, "iteration": self.iteration, "leir": self.text,
                **({"steps": steps_to_records(self.steps)} if self.steps else {})}


@dataclass
class Timer:
    """Seconds spent per stage (``propose``, ``verify``, ``time``)."""

    seconds: dict = field(default_factory=lambda: {"propose": 0.0, "verify": 0.0, "time": 0.0})

    def add(self, stage: str, s: float) -> None:
        self.seconds[stage] = self.seconds.get(stage, 0.0) + s


class Search:
    """The state of one search: the tree, the sample count, the best node.

    Algorithms call :meth:`expand` (ask the policy for ``k`` proposals at a node and
    evaluate each) and read :attr:`best`. Each proposal is checked in this order:
    same canonical text as the node or an ancestor -> ``revert`` (the paper's prompt
    forbids reverting to the parent; we reject any ancestor); same text as any other node
    already seen -> ``duplicate`` (not verified again, not a sample); otherwise the
    evaluator verifies it against the root and times it (``equal`` nodes are samples).
    ``max_samples`` (optional) stops the search once reached, ``deadline`` (a
    ``time.monotonic()`` value) when passed (:attr:`exhausted`, :attr:`stop_reason`).
    ``scorer`` (optional) predicts proposals' speedups (:meth:`score`) and is told every
    sample (``observe``); algorithms that screen (``evolutionary``) call :meth:`propose`,
    :meth:`score` and :meth:`add` themselves.
    """

    def __init__(self, root: LeirModule, policy: Policy, evaluator: Evaluator, *, max_samples: int | None = None,
                 progress=None, timer: Timer | None = None, scorer: Scorer | None = None,
                 deadline: float | None = None):
        self.deadline = deadline  # time.monotonic() after which the search stops (a time limit)
        self.stop_reason = ""     # why it stopped early ('' while running or when it finished)
        self.policy = policy
        self.evaluator = evaluator
        self.scorer = scorer
        self.max_samples = max_samples
        self.progress = progress
        self.timer = timer or Timer()
        self.nodes: list[Node] = []
        self.seen: dict[str, int] = {}
        self.samples = 0
        self.iteration = 0
        self.curve: list[tuple[int, float]] = []  # (samples, best speedup so far)
        t = root.text if isinstance(root, Node) else canonical(root)
        r = Node(0, None, 0, root, t, time_us=getattr(evaluator, "root_time_us", None), speedup=1.0)
        self.nodes.append(r)
        self.seen[t] = 0
        self.best = r

    @property
    def root(self) -> Node:
        return self.nodes[0]

    @property
    def exhausted(self) -> bool:
        """True once ``max_samples`` samples exist, the ``deadline`` has passed or
        :meth:`request_stop` was called: algorithms stop at their next check and the caller
        writes what the search has (a partial summary is a summary)."""
        if self.deadline is not None and not self.stop_reason and time.monotonic() >= self.deadline:
            self.stop_reason = "time limit"
        return bool(self.stop_reason) or (self.max_samples is not None and self.samples >= self.max_samples)

    def request_stop(self, reason: str) -> None:
        """Stop at the algorithm's next check (a signal handler calls it: SIGTERM)."""
        self.stop_reason = self.stop_reason or reason

    def path(self, node: Node) -> list[Node]:
        """Root ... node (inclusive)."""
        out = []
        cur: Node | None = node
        while cur is not None:
            out.append(cur)
            cur = self.nodes[cur.parent] if cur.parent is not None else None
        return out[::-1]

    def children(self, node: Node) -> list[Node]:
        return [n for n in self.nodes if n.parent == node.id and n.ok]

    def expand(self, node: Node, k: int, *, with_parent: bool = True) -> list[Node]:
        """Ask the policy for ``k`` proposals at ``node`` (history: the path root..node, or
        only ``node`` when ``with_parent`` is False) and evaluate them as one batch; returns
        the new ``equal`` children (fastest first). Raises
        :class:`steptp.runner.base.Pending` when the runner has not measured the batch yet."""
        return self.expand_all([(node, k)], with_parent=with_parent)

    def expand_all(self, requests: list[tuple[Node, int]], *, with_parent: bool = True) -> list[Node]:
        """:meth:`expand` of several ``(node, k)`` at once: every node's proposals, then one
        batch (a beam's frontier measured together); the new ``equal`` children, fastest first."""
        if self.exhausted:
            return []
        pairs = [(node, p) for node, k in requests if k > 0 for p in self.propose(node, k, with_parent=with_parent)]
        kids = self.add_batch(pairs)
        out = [c for c in kids if c.status == "equal"]
        out.sort(key=lambda n: n.time_us)
        return out

    def propose(self, node: Node, k: int, *, with_parent: bool = True) -> list[Proposal]:
        """At most ``k`` proposals of the policy at ``node``, not evaluated (see :meth:`expand`)."""
        if k <= 0:
            return []
        history = self.path(node)[:-1] if with_parent else []
        t0 = time.perf_counter()
        try:
            return list(self.policy.propose(node, history, k))[:k]
        finally:
            self.timer.add("propose", time.perf_counter() - t0)

    def score(self, node: Node, proposals: list[Proposal]) -> list[float]:
        """The scorer's predicted ln speedup of each proposal over ``node`` (all 0 without a
        scorer: the policy's order stands)."""
        if self.scorer is None or not proposals:
            return [0.0] * len(proposals)
        t0 = time.perf_counter()
        try:
            return [float(x) for x in self.scorer.score(node, proposals)]
        finally:
            self.timer.add("model", time.perf_counter() - t0)

    def add(self, node: Node, proposal: Proposal) -> Node:
        """Evaluate ``proposal`` as a child of ``node`` (:meth:`add_batch` of one)."""
        return self.add_batch([(node, proposal)])[0]

    def add_batch(self, pairs: list[tuple[Node, Proposal]]) -> list[Node]:
        """Evaluate proposals as children of their nodes, as one batch: revert, duplicate and
        no-op checks first, then the evaluator verifies (every step of a multi-step proposal)
        and measures the rest together; records and returns the new nodes (any status), as
        many as the budget (``max_samples``) leaves room for. Raises
        :class:`steptp.runner.base.Pending` (nothing recorded) when the runner has not
        answered yet."""
        room = None if self.max_samples is None else max(0, self.max_samples - self.samples)
        kids: list[tuple[Node, Node]] = []
        batch: list[tuple[Node, Node]] = []
        seen = dict(self.seen)
        for node, p in pairs:
            child = self._screen(node, p, {n.text for n in self.path(node)}, seen)
            if not child.status:
                if room is not None and len(batch) >= room:
                    break
                batch.append((node, child))
            kids.append((node, child))
        evs = self._evaluate([(c.module, c.steps or ([Step(c.strategy, leir=c.text, signature=c.module.signature,
                                                            _program=c.module)] if c.strategy else []))
                              for _, c in batch]) if batch else []
        for (node, child), ev in zip(batch, evs):
            for stage, s in (getattr(ev, "seconds", None) or {}).items():
                self.timer.add(stage, s)
            self._record(node, child, ev)
        out = []
        for node, child in kids:
            child.id = len(self.nodes)
            if child.text and child.text not in self.seen:
                self.seen[child.text] = child.id
            self.nodes.append(child)
            out.append(child)
            if child.status == "equal":
                self.samples += 1
                child.sample = self.samples
                if child.speedup is not None and child.speedup > (self.best.speedup or 0):
                    self.best = child
                self.curve.append((self.samples, self.best.speedup or 1.0))
                if self.progress is not None:
                    self.progress.update(1)
                    self.progress.set_postfix(best=f"{self.best.speedup:.2f}x")
                self._observe(node, child)
        return out

    def _evaluate(self, items: list) -> list[Evaluation]:
        """The evaluator's ``evaluate_batch``, or its ``evaluate`` per item for one that
        measures one program at a time (single-step proposals only)."""
        batch = getattr(self.evaluator, "evaluate_batch", None)
        if batch is not None:
            return list(batch(items))
        return [self.evaluator.evaluate(m) for m, _ in items]

    def _screen(self, node: Node, p: Proposal, ancestors: set[str], seen: dict) -> Node:
        """The child of ``node`` for ``p`` with its status when it is rejected before any
        verification (invalid, revert, duplicate, noop), else an empty status. ``seen``: texts
        met so far in this batch too (updated)."""
        try:
            text = canonical(p.module)
        except Exception as e:  # noqa: BLE001 - a malformed proposal is one rejected node
            text, status, reason = "", "invalid", f"cannot print the program: {e}"
        else:
            status, reason = "", ""
        steps = list(p.steps or ())
        child = Node(-1, node.id, node.depth + 1, p.module, text, p.strategy, p.site, dict(p.params),
                     p.cot, status="", iteration=self.iteration, steps=steps)
        if status:
            child.status, child.reason = status, reason
        elif text in ancestors:
            child.status, child.reason = "revert", "same program as an ancestor (reverting is not allowed)"
        elif text in seen:
            child.status, child.reason = "duplicate", f"same program as {'node ' + str(seen[text]) if seen[text] >= 0 else 'another proposal of this batch'}"
        elif self._same_code(node, p.module):
            child.status, child.reason = "noop", "builds to the same code as its parent on this device (not timed)"
        if text and text not in seen:
            seen[text] = -1
        return child

    def _record(self, node: Node, child: Node, ev: Evaluation) -> None:
        """Fill ``child`` from its evaluation (a multi-step proposal cut at its first step
        that did not verify becomes its verified prefix)."""
        child.status, child.reason = ev.status, ev.reason
        if child.steps and 0 < ev.steps < len(child.steps):
            child.steps = child.steps[:ev.steps]
            child.module = child.steps[-1].program
            child.text = canonical(child.module)
            child.strategy = "+".join(dict.fromkeys(st.rule for st in child.steps))
        if ev.status == "equal":
            child.time_us = ev.time_us
            root_us = self.root.time_us
            child.speedup = ev.speedup if ev.speedup else (root_us / ev.time_us if root_us and ev.time_us else None)

    def _observe(self, parent: Node, child: Node) -> None:
        """Tell the scorer a new sample (online learning of the cost model)."""
        obs = getattr(self.scorer, "observe", None)
        if obs is None:
            return
        t0 = time.perf_counter()
        try:
            obs(self.root, parent, child)
        finally:
            self.timer.add("model", time.perf_counter() - t0)

    def _same_code(self, node: Node, module) -> bool:
        """The evaluator's ``same_code(parent, module)`` when it has one (a step that changes
        nothing the device runs, e.g. a thread binding on the CPU, is no step: ``noop``)."""
        same = getattr(self.evaluator, "same_code", None)
        if same is None:
            return False
        t0 = time.perf_counter()
        try:
            return bool(same(node.module, module))
        finally:
            self.timer.add("verify", time.perf_counter() - t0)

    def trajectory(self, node: Node | None = None) -> list[Node]:
        """The best trajectory: root ... best node."""
        return self.path(node or self.best)


def log_speedup(node: Node) -> float:
    """Natural log of a node's speedup (0 when unknown)."""
    s = node.speedup
    return math.log(s) if s and s > 0 else 0.0
