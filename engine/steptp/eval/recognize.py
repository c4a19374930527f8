"""Which shipped rules turn a program into a given answer in one step (paper §4.3, Fig. 5).

For a program, every rule's candidates (sites x parameters,
:func:`steptp.engine.list_candidates`) are applied (:func:`steptp.engine.apply_rule`) and
the canonical LEIR text of each result (:func:`steptp.leir.printer.format_program`) is
remembered. An answer is *recognised* as rule R when its canonical text equals one of R's
results. The work runs in the engine service (:class:`steptp.rules.service.EngineService`:
a worker process with a time and a memory limit) and is bounded (``max_candidates`` per
rule, ``time_s`` per program, ``rule_time_s`` per rule, checked between candidates; a rule
that raises or exceeds a limit costs only that rule) and cached per program text, so many
samples of one program pay once.
"""

from __future__ import annotations

import time
from collections import OrderedDict

from ..leir.fileformat import LeirModule


class Recognizer:
    """Recognise the rule(s) behind a transformed program; see the module docstring.

    ``rules``: loaded rules (default: :func:`steptp.rules.load_rules`); ``max_candidates``:
    candidates applied per rule and program (a sample drawn with
    ``seeded_rng(seed, rule id)`` when there are more); ``time_s``: wall-clock budget per
    program and ``rule_time_s`` per rule (seconds); ``cache_size``: programs kept;
    ``isolated``: run the engine in a worker process (else in this process, main thread
    limits only). Call :meth:`close` to stop the worker."""

    def __init__(self, rules=None, max_candidates: int = 64, time_s: float = 30.0, cache_size: int = 16,
                 seed: int = 0, rule_time_s: float = 5.0, isolated: bool = True):
        from ..rules.service import EngineService
        from ..policy import StrategyNames

        if rules is None:
            from ..rules import load_rules

            rules = load_rules()
        self.rules = list(rules)
        self.max_candidates = max_candidates
        self.time_s = time_s
        self.seed = seed
        self.rule_time_s = rule_time_s
        self.service = EngineService(self.rules, isolated=isolated)
        self.names = StrategyNames(self.rules)
        self._cache: OrderedDict[str, tuple[dict[str, list[str]], bool]] = OrderedDict()
        self._cache_size = cache_size

    def close(self) -> None:
        """Stop the engine worker."""
        self.service.close()

    def rule_for_name(self, name: str):
        """The rule whose id or name matches a claimed strategy name (case, spaces, ``-``/``_``
        ignored; :class:`steptp.policy.StrategyNames`), or None."""
        return self.names.rule_for(name)

    def results(self, module: LeirModule) -> tuple[dict[str, list[str]], bool]:
        """``({canonical result text: [rule ids]}, complete)`` for ``module``; ``complete`` is
        False when a bound (candidates per rule, time, memory) cut the enumeration short."""
        key = module.text()
        hit = self._cache.get(key)
        if hit is not None:
            self._cache.move_to_end(key)
            return hit
        table: dict[str, list[str]] = {}
        complete = True
        deadline = time.monotonic() + self.time_s
        for rule in self.rules:
            left = deadline - time.monotonic()
            if left <= 0:
                complete = False
                break
            texts, done = self.service.results(module, rule.id, self.max_candidates, self.seed,
                                               min(left, self.rule_time_s))
            complete = complete and done
            for text in texts:
                ids = table.setdefault(text, [])
                if rule.id not in ids:
                    ids.append(rule.id)
        self._cache[key] = (table, complete)
        while len(self._cache) > self._cache_size:
            self._cache.popitem(last=False)
        return table, complete

    def recognise(self, module: LeirModule, answer_leir: str) -> tuple[list[str], bool]:
        """``(rule ids that produce answer_leir from module in one step, complete)``;
        ``answer_leir`` is canonical LEIR text (``format_program``)."""
        table, complete = self.results(module)
        return list(table.get(answer_leir, [])), complete

    def rule_info(self, rule_id: str) -> dict | None:
        """``{"id", "name", "category", "level"}`` of a rule id, or None."""
        for r in self.rules:
            if r.id == rule_id:
                return {"id": r.id, "name": r.name, "category": r.category, "level": r.level}
        return None


__all__ = ["Recognizer"]
