"""Where candidate next programs come from: one interface,
``Policy.propose(node, history, k) -> list[Proposal]``, three implementations.

* :class:`EnginePolicy`: the rule engine. Every shipped rule x site x parameter that
  applies (valid result, GPU preflight passes) is a candidate; ``k`` of them are drawn at
  random with the seed (``rank="random"``) or the ``k`` with the lowest static cost
  (:mod:`steptp.search.cost`, ``rank="cost"``). Candidate lists are cached per canonical
  program text and capped at ``per_rule`` (seeded sample) per rule; a node never gets the
  same candidate twice.
* :class:`ReplayPolicy`: proposals read from a JSONL file (one object per line:
  ``{"parent": LEIR or null, "leir": LEIR, "strategy": S, "site": ..., "params": {...}}``;
  ``parent`` null or absent means "any node"; each line is used once).
* :class:`LLMPolicy`: a chat model behind an OpenAI-compatible endpoint, prompted with
  the paper's multi-step prompt (App. B.2; ``templates/search_prompt.j2``); answers are
  parsed tolerantly (:func:`steptp.llm.answers.parse_candidates`), at most ``k`` kept;
  an unreadable answer or a failed request gives zero proposals.

``history`` is the path root..parent of ``node`` (empty for the root, and for the
chain-without-parent algorithm); the LLM prompt shows at most its last element (the parent).
"""

from __future__ import annotations

import hashlib
import json
import random
from pathlib import Path

from ..leir import LeirModule
from .core import Node, Proposal, canonical


def _rng(seed: int, *parts) -> random.Random:
    h = hashlib.sha256(":".join(map(str, (seed,) + parts)).encode()).digest()
    return random.Random(int.from_bytes(h[:8], "big"))


# ---------------------------------------------------------------------------
# engine
# ---------------------------------------------------------------------------


class EnginePolicy:
    """Candidates from the rule engine (see the module docstring).

    ``rules``: rules to use (default: every shipped rule; rule objects or ids, looked up in
    ``rules_dir``); ``rank``: ``random`` or ``cost``; ``seed``; ``per_rule``: at most this
    many (site, params) candidates per rule and program (a seeded sample; default 8);
    ``target``: the cost model's target (``cpu``/``cuda``).

    Matching and application run in a worker process (:mod:`.engine_worker`) with
    ``apply_timeout_s`` seconds per candidate (``list_timeout_s`` to list a program's
    candidates) and an address space of ``mem_bytes``; a candidate over a limit is skipped.
    """

    def __init__(self, rules=None, *, rank: str = "random", seed: int = 0, per_rule: int = 8, target: str = "cpu",
                 rules_dir: str | None = None, apply_timeout_s: float = 30.0, list_timeout_s: float = 120.0,
                 mem_bytes: int = 3 << 30, cache_size: int = 256):
        if rank not in ("random", "cost"):
            raise ValueError(f"rank must be 'random' or 'cost', not {rank!r}")
        if rules is None:
            from ..rules import load_rules

            rules = load_rules(rules_dir)
        self.rule_ids = [r if isinstance(r, str) else r.id for r in rules]
        self.rank = rank
        self.seed = seed
        self.per_rule = per_rule
        self.target = target
        self.rules_dir = rules_dir
        self.apply_timeout_s = apply_timeout_s
        self.list_timeout_s = list_timeout_s
        self.mem_bytes = mem_bytes
        self.cache_size = cache_size
        self.skipped: dict[str, int] = {}  # why candidates were skipped (time, memory, failed)
        self._runner = None
        self._cands: dict[str, list] = {}
        self._used: dict[str, set] = {}
        self._calls: dict[str, int] = {}
        self._ranked: dict[str, list] = {}  # rank="cost": applied candidates not yet proposed, cheapest first

    def _call(self, fn, *args, timeout_s: float):
        from ..backend.build import IsolatedRunner
        from ..backend.errors import BackendError

        if self._runner is None:
            self._runner = IsolatedRunner()
        try:
            return self._runner.call(fn, *args, timeout_s=timeout_s)
        except BackendError as e:  # time limit (worker killed) or crash: restarted on the next call
            return e

    def close(self) -> None:
        if self._runner is not None:
            self._runner.close()
            self._runner = None

    def candidates(self, module: LeirModule) -> list[tuple[str, int]]:
        """``(rule id, candidate index)`` pairs for ``module`` (at most ``per_rule`` per
        rule, a seeded sample), cached per canonical text."""
        from . import engine_worker as W

        key = canonical(module)
        hit = self._cands.get(key)
        if hit is not None:
            return hit
        text = module.text()
        counts = self._call(W.count_candidates, text, self.rule_ids, self.rules_dir, self.mem_bytes,
                            timeout_s=self.list_timeout_s)
        if isinstance(counts, Exception) or counts.get("memory"):
            self._restart()
            counts = {}
            for rid in self.rule_ids:  # one rule at a time, to lose only the one that explodes
                c = self._call(W.count_candidates, text, [rid], self.rules_dir, self.mem_bytes,
                               timeout_s=self.apply_timeout_s)
                if isinstance(c, Exception) or c.get("memory"):
                    self._skip("list: time or memory limit")
                    self._restart()
                    continue
                counts.update(c)
        out = []
        for rid in self.rule_ids:
            n = int(counts.get(rid, 0))
            idx = list(range(n))
            if n > self.per_rule:
                idx = sorted(_rng(self.seed, "cap", rid, key).sample(idx, self.per_rule))
            out.extend((rid, i) for i in idx)
        if len(self._cands) >= self.cache_size:
            self._cands.pop(next(iter(self._cands)))
        self._cands[key] = out
        return out

    def _skip(self, why: str) -> None:
        self.skipped[why] = self.skipped.get(why, 0) + 1

    def _restart(self) -> None:
        if self._runner is not None:
            self._runner.close()

    def _apply(self, module: LeirModule, rule_id: str, index: int) -> Proposal | None:
        from ..leir import parse_leir
        from . import engine_worker as W

        r = self._call(W.apply_candidate, module.text(), rule_id, index, self.seed, self.rules_dir, self.mem_bytes,
                       timeout_s=self.apply_timeout_s)
        if isinstance(r, Exception):
            self._skip("apply: time limit or crash")
            return None
        if r[0] == "memory":
            self._skip("apply: memory limit")
            self._restart()
            return None
        if r[0] != "ok":
            self._skip("apply: rewrite failed")
            return None
        _, text, cot, site, params = r
        after = parse_leir(text, "<search>")
        return Proposal(LeirModule(module.signature, after.program), rule_id, site, params, cot)

    def propose(self, node: Node, history: list[Node], k: int) -> list[Proposal]:
        key = node.text
        cands = self.candidates(node.module)
        used = self._used.setdefault(key, set())
        call = self._calls[key] = self._calls.get(key, 0) + 1
        order = [i for i in range(len(cands)) if i not in used]
        _rng(self.seed, "draw", key, call).shuffle(order)
        out: list[Proposal] = []
        if self.rank == "cost":
            ranked = self._ranked.get(key)
            if ranked is None:
                from .cost import estimate_ns

                scored = []
                for i in order:  # seeded order breaks ties between equal costs
                    p = self._apply(node.module, *cands[i])
                    if p is not None:
                        scored.append((estimate_ns(p.module.program, self.target), len(scored), p))
                scored.sort(key=lambda x: (x[0], x[1]))
                ranked = self._ranked[key] = [p for _, _, p in scored]
            out, ranked[:] = ranked[:k], ranked[k:]
            return out
        for i in order:
            used.add(i)
            p = self._apply(node.module, *cands[i])
            if p is not None:
                out.append(p)
                if len(out) >= k:
                    break
        return out


# ---------------------------------------------------------------------------
# replay
# ---------------------------------------------------------------------------


class ReplayError(ValueError):
    """A replay file that cannot be read (path, line, what is wrong)."""


class ReplayPolicy:
    """Proposals read from a JSONL file (format in the module docstring). Each record is a
    candidate for nodes whose canonical text equals its ``parent`` (any node when the
    parent is null/absent) and is proposed at most once. The LEIR texts may carry a ``%``
    header or not; the root's signature is used."""

    def __init__(self, path: str | Path, signature):
        self.path = Path(path)
        self.signature = signature
        self.records: list[dict] = []
        self._used: set[int] = set()
        try:
            lines = self.path.read_text(encoding="utf-8").splitlines()
        except OSError as e:
            raise ReplayError(f"{self.path}: cannot read: {e.strerror or e}") from None
        except UnicodeDecodeError:
            raise ReplayError(f"{self.path}: not UTF-8 text") from None
        for n, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as e:
                raise ReplayError(f"{self.path}:{n}: not JSON: {e.msg}") from None
            if not isinstance(rec, dict) or not isinstance(rec.get("leir"), str):
                raise ReplayError(f"{self.path}:{n}: expected an object with a string 'leir'")
            try:
                mod = self._module(rec["leir"])
                parent = self._module(rec["parent"]) if isinstance(rec.get("parent"), str) else None
            except Exception as e:  # noqa: BLE001 - LeirSyntaxError and friends, one line each
                raise ReplayError(f"{self.path}:{n}: {str(e).splitlines()[0]}") from None
            self.records.append({"module": mod, "parent": canonical(parent) if parent is not None else None,
                                 "strategy": str(rec.get("strategy") or "replay"),
                                 "site": rec.get("site"), "params": rec.get("params") or {}})

    def _module(self, text: str) -> LeirModule:
        from ..leir import parse_leir

        m = parse_leir(text, str(self.path))
        return LeirModule(self.signature, m.program)

    def propose(self, node: Node, history: list[Node], k: int) -> list[Proposal]:
        out = []
        for i, r in enumerate(self.records):
            if len(out) >= k:
                break
            if i in self._used or (r["parent"] is not None and r["parent"] != node.text):
                continue
            self._used.add(i)
            out.append(Proposal(r["module"], r["strategy"], None if r["site"] is None else str(r["site"]),
                                dict(r["params"]) if isinstance(r["params"], dict) else {}))
        return out


# ---------------------------------------------------------------------------
# LLM
# ---------------------------------------------------------------------------

#: One sentence per algorithm, opening the prompt (paper App. B.2).
ALGORITHM_TEXT = {
    "greedy": "Greedy-based optimization",
    "beam": "Beam-search-based optimization",
    "bfs": "Breadth-first-based optimization",
    "dfs": "Depth-first-based optimization",
    "mcts": "Monte-Carlo-tree-search-based optimization",
    "chain": "Chain-based optimization",
    "chain-no-parent": "Chain-based optimization",
}


def strategy_table(rules=None) -> list[dict]:
    """``[{"id", "name"}]`` of the shipped strategies (43), in rule-file order."""
    if rules is None:
        from ..rules import load_rules

        rules = load_rules()
    return [{"id": r.id, "name": r.name} for r in rules]


def render_prompt(algorithm: str, node: Node, parent: Node | None, strategies: list[dict], target: str = "cpu",
                  count: int = 2) -> str:
    """The multi-step prompt of paper App. B.2 for ``node`` (``templates/search_prompt.j2``)."""
    from ..leir.ast import DTYPES
    from ..resources import render

    sig = node.module.signature
    tensors = [{"name": t.name, "role": t.role, "torch_dtype": "torch." + DTYPES[t.dtype], "shape": list(t.shape)}
               for t in sig.tensors]
    from ..backend.hardware import DEFAULT_GPU

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


def parse_proposals(text: str, signature, k: int, lookup: dict | None = None) -> tuple[list[Proposal], str]:
    """At most ``k`` proposals read from a model answer (``<answer>`` JSON, fenced JSON or
    bare JSON; keys ``transformed_IR`` and ``applied_strategies``/``applied_strategy``).
    Returns ``(proposals, reason)``; never raises."""
    try:
        from ..llm.answers import parse_candidates
    except ImportError:  # pragma: no cover - the llm package is part of the project
        return [], "steptp.llm.answers is not installed"
    try:
        cands, why = parse_candidates(text, signature)
        if not cands and "<answer>" not in (text or ""):
            wrapped = _wrap_json(text or "")
            if wrapped is not None:
                cands, why = parse_candidates(wrapped, signature)
    except Exception as e:  # noqa: BLE001 - hostile text never crashes a search
        return [], f"unreadable answer: {type(e).__name__}"
    out = []
    reasons = [why] if why else []
    for c in cands:
        if c.ok:
            out.append(Proposal(c.module, _strategy_id(c.strategy, lookup), None, {}))
        elif c.reason:
            reasons.append(c.reason)
        if len(out) >= k:
            break
    return out, "; ".join(reasons)[:500]


def _strategy_id(name: str, lookup: dict | None = None) -> str:
    """Rule id of a claimed strategy (``"Loop Split"`` -> ``loop_split``, ``"power
    simplification"`` -> ``powsimp`` through ``lookup``: normalised rule names and ids ->
    id); an unknown name is kept in id spelling; several are joined with ``+``."""
    parts = [p.strip().lower().replace("-", " ") for p in (name or "").replace(";", ",").split(",")]
    ids = []
    for p in parts:
        key = "_".join(p.split())
        if key:
            ids.append((lookup or {}).get(key, key))
    return "+".join(ids) or "llm"


def _lookup(strategies: list[dict]) -> dict:
    out = {}
    for s in strategies:
        out["_".join(s["name"].lower().replace("-", " ").split())] = s["id"]
        out[s["id"].lower()] = s["id"]
    return out


class LLMPolicy:
    """Proposals from a chat model (see the module docstring).

    ``client``: anything with ``complete(messages, n, temperature, max_tokens)`` returning
    objects with ``.text`` (:class:`steptp.llm.client.ChatClient`); ``algorithm``: the name
    shown in the prompt; ``temperature`` (paper: 0.3); ``max_tokens``; ``target``.
    ``log``: list receiving one dict per request (prompt, answer, reason, tokens).
    """

    def __init__(self, client, *, algorithm: str = "greedy", temperature: float = 0.3, max_tokens: int | None = None,
                 target: str = "cpu", rules=None, seed: int | None = None):
        self.client = client
        self.algorithm = algorithm
        self.temperature = temperature
        self.max_tokens = max_tokens
        self.target = target
        self.strategies = strategy_table(rules)
        self._lookup = _lookup(self.strategies)
        self.seed = seed
        self.log: list[dict] = []

    def propose(self, node: Node, history: list[Node], k: int) -> list[Proposal]:
        from ..llm.client import RequestError

        parent = history[-1] if history else None
        prompt = render_prompt(self.algorithm, node, parent, self.strategies, self.target, count=max(2, k))
        rec = {"node": node.id, "prompt_chars": len(prompt)}
        try:
            comps = self.client.complete([{"role": "user", "content": prompt}], n=1, temperature=self.temperature,
                                         max_tokens=self.max_tokens)
        except RequestError as e:
            rec["reason"] = f"request failed: {e}"
            self.log.append(rec)
            return []
        text = comps[0].text if comps else ""
        props, why = parse_proposals(text, node.module.signature, k, self._lookup)
        rec.update({"answer_chars": len(text or ""), "proposals": len(props), "reason": why,
                    "prompt_tokens": getattr(comps[0], "prompt_tokens", None) if comps else None,
                    "completion_tokens": getattr(comps[0], "completion_tokens", None) if comps else None})
        self.log.append(rec)
        return props
