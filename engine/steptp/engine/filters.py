"""Python-side candidate filters and extra parameter domains (generic registries).

Some preconditions cannot be Datalog facts because they need a computation on the site:
"the sympy normal form changes this equation" is one. A rule lists such checks under
``filter:``; each is ``{name: args}`` naming an entry of :data:`FILTERS`. A (site,
parameters) pair is a candidate only when every filter returns True, so
:func:`~steptp.engine.apply.list_candidates` never lists, and
:func:`~steptp.engine.apply.apply_rule` never picks, a site the rewrite would leave
unchanged. Filters run after egglog matching and parameter enumeration, with every
binding (``eq``, ``nest``, ``site``, parameters) in ``env``.

:data:`EXTRA_DOMAINS` adds parameter domains computed in Python (e.g. the subterms of an
equation a ``collect`` may collect on); :func:`steptp.engine.primitives.domain_values`
consults it after its built-in domains.

Registration: ``@candidate_filter("name", required=(...), optional=(...))`` and
``@extra_domain("key")``. The math registrations live in :mod:`steptp.engine.mathprims`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable


@dataclass(frozen=True)
class FilterSpec:
    """A candidate filter: ``fn(module, env, **args) -> bool`` and its argument names."""

    name: str
    fn: Callable
    required: tuple[str, ...] = ()
    optional: tuple[str, ...] = ()
    doc: str = ""


FILTERS: dict[str, FilterSpec] = {}
#: domain key -> fn(spec: dict, ctx: EvalContext) -> list of values
EXTRA_DOMAINS: dict[str, Callable] = {}
#: extra keys a domain spec may carry beside its domain key (checked by the schema)
EXTRA_DOMAIN_KEYS: dict[str, tuple[str, ...]] = {}


def candidate_filter(name: str, required=(), optional=()):
    """Register a candidate filter under ``name`` (decorator)."""

    def deco(fn):
        FILTERS[name] = FilterSpec(name, fn, tuple(required), tuple(optional), (fn.__doc__ or "").strip())
        return fn

    return deco


def extra_domain(key: str, modifiers: tuple[str, ...] = ()):
    """Register a parameter domain ``params.<name>.<key>`` (decorator)."""

    def deco(fn):
        EXTRA_DOMAINS[key] = fn
        EXTRA_DOMAIN_KEYS[key] = tuple(modifiers)
        return fn

    return deco


def rule_filters(rule) -> list[tuple[str, dict]]:
    """The ``filter:`` steps of a rule as ``(name, args)`` pairs."""
    out = []
    for step in rule.raw.get("filter", ()) or ():
        name = next(iter(step))
        args = step[name]
        out.append((name, dict(args) if isinstance(args, dict) else {}))
    return out


def check_filters(rule) -> list[tuple[str, str]]:
    """Static problems of a rule's ``filter:`` list as ``(field, message)`` pairs."""
    problems = []
    for i, (name, args) in enumerate(rule_filters(rule)):
        spec = FILTERS.get(name)
        fld = f"filter[{i}].{name}"
        if spec is None:
            problems.append((fld, f"unknown filter {name!r}; known: {', '.join(sorted(FILTERS))}"))
            continue
        missing = [a for a in spec.required if a not in args]
        unknown = [a for a in args if a not in spec.required + spec.optional]
        if missing:
            problems.append((fld, f"missing argument(s) {missing}"))
        if unknown:
            problems.append((fld, f"unknown argument(s) {unknown}; allowed {list(spec.required + spec.optional)}"))
    return problems


def passes_filters(rule, env: dict, module) -> bool:
    """True when every ``filter:`` step of ``rule`` accepts the bindings ``env``."""
    for name, args in rule_filters(rule):
        if not FILTERS[name].fn(module, env, **args):
            return False
    return True


__all__ = ["FilterSpec", "FILTERS", "EXTRA_DOMAINS", "EXTRA_DOMAIN_KEYS", "candidate_filter", "extra_domain",
           "rule_filters", "check_filters", "passes_filters"]
