"""Claimed strategy names -> rule ids (:class:`StrategyNames`) and the strategy table of the
prompts (:func:`strategy_table`)."""

from __future__ import annotations

import re
from typing import Any


def normalise_name(name: str) -> str:
    """A strategy name in rule-id spelling: lower case, every run of other characters one
    ``_`` (``"Loop-Split "`` -> ``loop_split``)."""
    return re.sub(r"[^a-z0-9]+", "_", (name or "").lower()).strip("_")


class StrategyNames:
    """The claimed-strategy -> rule lookup: a rule's id or name, compared after
    :func:`normalise_name`. ``rules``: loaded rules or ``{"id", "name"}`` dicts (default:
    the shipped rules); the first rule of a name wins."""

    def __init__(self, rules=None):
        if rules is None:
            from ..rules import load_rules

            rules = load_rules()
        self.rules = list(rules)
        self._by_name: dict[str, Any] = {}
        for r in self.rules:
            rid, name = (r["id"], r["name"]) if isinstance(r, dict) else (r.id, r.name)
            self._by_name.setdefault(normalise_name(rid), r)
            self._by_name.setdefault(normalise_name(name), r)

    def rule_for(self, name: str):
        """The rule (or dict) whose id or name matches ``name``, or None."""
        return self._by_name.get(normalise_name(name))

    def rule_id(self, name: str) -> str | None:
        """The rule id that ``name`` names, or None."""
        r = self.rule_for(name)
        return None if r is None else (r["id"] if isinstance(r, dict) else r.id)

    def strategy_id(self, claimed: str) -> str:
        """Rule ids of a claimed strategy (``"Loop Split, loop-reorder"`` ->
        ``loop_split+loop_reorder``; ``,`` or ``;`` between several); an unknown name is kept
        in id spelling; ``llm`` when nothing is named."""
        ids = []
        for part in (claimed or "").replace(";", ",").split(","):
            key = normalise_name(part)
            if key:
                ids.append(self.rule_id(key) or key)
        return "+".join(ids) or "llm"


def strategy_table(rules=None) -> list[dict]:
    """``[{"id", "name"}]`` of the rules (default: the shipped 43), in rule-file order."""
    if rules is None:
        from ..rules import load_rules

        rules = load_rules()
    return [{"id": r.id, "name": r.name} for r in rules]


__all__ = ["normalise_name", "StrategyNames", "strategy_table"]
