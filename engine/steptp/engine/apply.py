"""Apply one rule at exactly one site: candidates, seeded sampling, rewrite, checks, CoT.

Flow (paper §3.2 "decompose-modify-reassemble"; egglog-notes, recommended architecture):

1. :func:`~steptp.engine.match.find_sites` enumerates the sites (egglog: patterns and
   preconditions).
2. Parameters are enumerated in Python from their domains (``params:``), in YAML order;
   a domain may use the site's bindings, earlier parameters and ``let:`` values.
3. The chosen site and parameters are drawn with the package's seeded generator
   (:func:`steptp.seeds.seeded_rng` of ``(seed, rule id)``) - the same seed
   gives the same step, bit for bit.
4. Fresh names are drawn (never colliding with any program or signature name), the
   ``rewrite:`` primitives run in order, and the result is checked: it must differ from
   the input, re-parse to itself, and pass :func:`steptp.leir.analysis.analyze` with the
   unchanged signature.
5. The CoT is rendered from the actual change (:mod:`steptp.engine.cot`).
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass, field
from typing import Any

from ..leir import ast as A
from ..leir.analysis import LeirSemanticError, analyze
from ..leir.fileformat import LeirModule
from ..leir.parser import LeirSyntaxError, parse_program
from ..leir.printer import format_program
from . import patterns as P
from .domains import DOMAIN_MODIFIERS, DOMAINS
from .filters import EXTRA_DOMAINS, check_filters, passes_filters, rule_filters
from .match import CompileError, Site, check_in_egglog, compile_rule, find_sites
from ..seeds import seeded_rng
from .navigation import EqRef, NestRef
from .primitives import (PRIMITIVES, Change, EvalContext, RewriteContext, RewriteError, ValueExprError, domain_values,
                         eval_let, eval_value, fresh_index_name, fresh_tensor_name, is_expression, normalize_args,
                         parse_template, parse_value, program_names, run_primitive, split_as, split_when,
                         value_vars)


class NoMatch(LookupError):
    """The rule matches nothing in the program (or not at the requested site)."""


class PreflightRejected(RewriteError):
    """The rewrite is well-formed LEIR but the result fails the backend's GPU preflight
    (:func:`steptp.backend.preflight.preflight`: thread limits, one binding per axis,
    scopes, parallel/vector hazards) where the input passed it. ``problems`` lists the
    new reasons."""

    def __init__(self, message: str, problems: list[str]):
        self.problems = list(problems)
        super().__init__(message)


_PREFLIGHT_CACHE: dict = {}


def gpu_preflight_problems(module: LeirModule) -> list[str]:
    """Every GPU preflight problem of a program (:mod:`steptp.backend.preflight`:
    ``loop_hazards`` + ``gpu_problems``), cached per program; [] when it passes."""
    hit = _PREFLIGHT_CACHE.get(module)
    if hit is not None:
        return hit
    from ..backend.errors import BackendError
    from ..backend.preflight import analyze_or_raise, gpu_problems, loop_hazards

    try:
        info = analyze_or_raise(module.program, module.signature)
        probs = loop_hazards(module.program, module.signature, info) + \
            gpu_problems(module.program, module.signature, info=info)
    except BackendError as e:
        probs = [str(e)]
    if len(_PREFLIGHT_CACHE) > 256:
        _PREFLIGHT_CACHE.clear()
    _PREFLIGHT_CACHE[module] = probs
    return probs


def new_preflight_problems(before: LeirModule, after: LeirModule) -> list[str]:
    """Preflight problems of ``after`` that ``before`` does not have (a rewrite must not
    make a buildable program unbuildable; a program that already fails keeps its own
    problems, which are not blamed on the rule)."""
    def key(p: str) -> str:          # nest numbers shift when a rule inserts or removes a nest
        return re.sub(r"\bnests? [\d, ]+", "nest #", p)

    old = {key(p) for p in gpu_preflight_problems(before)}
    return [p for p in gpu_preflight_problems(after) if key(p) not in old]


@dataclass(frozen=True)
class Step:
    """One verified-to-be-well-formed transformation step.

    ``before``/``after`` are :class:`~steptp.leir.fileformat.LeirModule` (same
    signature); ``site`` the :class:`~steptp.engine.match.Site`; ``params`` the
    parameter values (JSON-friendly: ints, strings, tuples); ``cot`` the rendered chain
    of thought; ``changes`` the primitive log; ``bindings`` every binding used; ``figures``
    the step's figures (:func:`steptp.engine.figures.step_figures`, JSON-ready), the ones its
    CoT states.
    """

    rule: Any
    before: LeirModule
    after: LeirModule
    site: Site
    params: dict
    cot: str
    changes: tuple[Change, ...] = ()
    bindings: dict = field(default_factory=dict)
    seed: int = 0
    figures: dict = field(default_factory=dict)

    @property
    def site_description(self) -> str:
        return str(self.site)

    @property
    def rule_id(self) -> str:
        return self.rule.id


def _rng(seed: int, rule_id: str, *purpose) -> random.Random:
    return seeded_rng(seed, rule_id, *purpose)


def _as_rule(rule):
    """The engine takes loaded rules (the loader sits above it: ``steptp.rules.load_rule``)."""
    if isinstance(rule, (str, bytes)) or hasattr(rule, "__fspath__"):
        raise TypeError(f"expected a loaded rule, got the path {rule!r}: use steptp.rules.load_rule(path)")
    return rule


# ---------------------------------------------------------------------------
# Environments: let values and parameter domains
# ---------------------------------------------------------------------------


def let_vars(spec) -> set[str]:
    """Metavariables a ``let:`` entry reads (its value expression, or a lookup table's key and values)."""
    if isinstance(spec, dict):
        out: set[str] = set()
        for v in [spec.get("lookup"), spec.get("default"), *spec.get("table", {}).values()]:
            if is_expression(v):
                out |= value_vars(parse_value(v))
        return out
    return value_vars(parse_value(spec)) if is_expression(spec) else set()


_LETS: dict[str, tuple] = {}


def _lets(rule) -> tuple:
    """``(name, spec, the metavariables it reads)`` of every ``let:`` entry (cached per rule)."""
    hit = _LETS.get(rule.key)
    if hit is None:
        hit = _LETS[rule.key] = tuple((name, spec, frozenset(let_vars(spec))) for name, spec in rule.let.items())
    return hit


def _settle_let(rule, env: dict, module: LeirModule) -> None:
    """Evaluate every ``let`` entry whose inputs are available (repeat until stable)."""
    lets = _lets(rule)
    changed = bool(lets)
    while changed:
        changed = False
        for name, spec, needs in lets:
            if name in env:
                continue
            if needs <= env.keys():
                env[name] = eval_let(spec, EvalContext(module, env))
                changed = True


def _domain(rule, name: str, env: dict, module: LeirModule) -> list:
    _settle_let(rule, env, module)
    try:
        return domain_values(rule.params[name], EvalContext(module, env), name)
    except ValueExprError as e:
        raise RewriteError(f"rule {rule.id}: parameter {name}: {e}") from None


_DEPS: dict[tuple, tuple | None] = {}


def _expression_vars(v) -> set[str]:
    """Metavariables read by the value expressions anywhere in a YAML value."""
    if isinstance(v, dict):
        return set().union(*[_expression_vars(x) for x in v.values()]) if v else set()
    if isinstance(v, list):
        return set().union(*[_expression_vars(x) for x in v]) if v else set()
    return value_vars(parse_value(v)) if is_expression(v) else set()


def _domain_deps(rule, name: str) -> tuple | None:
    """The other parameters (sorted) the domain of ``name`` depends on (directly or through
    ``let:`` entries), or None when unknown (a domain computed in Python may read any
    binding). Cached per rule."""
    key = (rule.key, name)
    if key in _DEPS:
        return _DEPS[key]
    spec = rule.params[name]
    deps: tuple | None = None
    if all(k in DOMAINS or k in DOMAIN_MODIFIERS for k in spec):
        seen: set[str] = set()
        todo = list(_expression_vars(spec))
        while todo:
            v = todo.pop()
            if v in seen:
                continue
            seen.add(v)
            if v in rule.let:
                todo.extend(let_vars(rule.let[v]))
        deps = tuple(sorted(v for v in seen if v in rule.params and v != name))
    _DEPS[key] = deps
    return deps


def _enumerate_params(rule, env: dict, module: LeirModule, names: list[str], fixed: dict,
                      limit: int | None = None) -> list[dict]:
    """All parameter assignments (product over the domains, in YAML order). A domain is
    computed once per value of the parameters it depends on (:func:`_domain_deps`), not
    once per assignment of every earlier parameter."""
    filtered = bool(rule_filters(rule))
    if len(names) <= 1 and not fixed and limit is None:  # most rules: no closures, no memo
        if not names:
            return [{}] if not filtered or passes_filters(rule, dict(env), module) else []
        n = names[0]
        dom = _domain(rule, n, dict(env), module)
        if not filtered:
            return [{n: v} for v in dom]
        return [{n: v} for v in dom if passes_filters(rule, {**env, n: v}, module)]
    out: list[dict] = []
    memo: dict[tuple, list] = {}

    def domain(n: str, cur: dict) -> list:
        deps = _domain_deps(rule, n)
        key = None
        if deps is not None:
            try:
                key = (n, tuple([cur.get(d) for d in deps]))
                hit = memo.get(key)
            except TypeError:  # an unhashable value: no memo
                key = hit = None
            if hit is not None:
                return hit
        dom = _domain(rule, n, {**env, **cur}, module)
        if key is not None:
            memo[key] = dom
        return dom

    def rec(i: int, cur: dict):
        if limit is not None and len(out) >= limit:
            return
        if i == len(names):
            if not filtered or passes_filters(rule, {**env, **cur}, module):
                out.append(dict(cur))
            return
        n = names[i]
        dom = domain(n, cur)
        vals = [_in_domain(fixed[n], dom)] if n in fixed else dom
        if n in fixed and vals[0] is None:
            return
        for v in vals:
            cur[n] = v
            rec(i + 1, cur)
            del cur[n]

    rec(0, {})
    return out


def _in_domain(v, dom: list):
    """The domain value ``v`` names: ``v`` itself, or for a domain of LEIR subterms (e.g.
    ``atoms_of``) the one whose canonical LEIR text is ``v``; None when absent."""
    if v in dom:
        return v
    if isinstance(v, str):
        from ..leir.printer import format_node

        for d in dom:
            if not isinstance(d, (str, int, tuple)) and format_node(d) == v:
                return d
    return None


def _normalize_param(v):
    if isinstance(v, list):
        return tuple(_normalize_param(x) for x in v)
    return v


def list_candidates(rule, module: LeirModule, check: bool = False) -> list[tuple[Site, dict]]:
    """Every (site, params) pair the rule can be applied with, deterministic order.

    Sites come from :func:`~steptp.engine.match.find_sites`; parameters are the full
    product of their domains (e.g. loop_split: every proper divisor of the extent;
    loop_reorder: every non-identity permutation). With ``check=True`` each candidate is
    applied and only those whose result is valid and passes the GPU preflight are kept
    (what ``stp apply --all`` lists; see :func:`checked_candidates`). Raises
    :class:`NoMatch` when there is none.
    """
    rule = _as_rule(rule)
    out = []
    names = list(rule.params)
    for s in find_sites(rule, module):
        for p in _enumerate_params(rule, s.env, module, names, {}):
            out.append((s, p))
    if check and out:
        rows = checked_candidates(rule, module, out)
        kept = [(s, p) for s, p, step, _ in rows if step is not None]
        if not kept:
            raise NoMatch(_no_match_message(rule, module, f"all {len(out)} candidate(s) are rejected: {rows[0][3]}"))
        return kept
    if not out:
        raise NoMatch(_no_match_message(rule, module))
    return out


def checked_candidates(rule, module: LeirModule, candidates=None) -> list[tuple[Site, dict, "Step | None", str | None]]:
    """Apply every candidate: ``(site, params, step, None)`` when the result is valid and
    passes the GPU preflight, ``(site, params, None, reason)`` otherwise."""
    rule = _as_rule(rule)
    if candidates is None:
        try:
            candidates = list_candidates(rule, module)
        except NoMatch:
            return []
    out = []
    for s, p in candidates:
        try:
            out.append((s, p, apply_rule(rule, module, site=s, params=p), None))
        except (RewriteError, NoMatch, ValueError) as e:
            out.append((s, p, None, str(e)))
    return out


def _no_match_message(rule, module: LeirModule, detail: str = "") -> str:
    pre = ", ".join(rule.preconditions) or "none"
    what = {"expr": f"no subexpression matches {rule.match!r}",
            "equation": f"no equation matches {rule.match!r}",
            "loop": f"no loop matches {rule.match!r}",
            "nest": "no nest", "nests": f"no run of {len(rule.match)} consecutive nests", "tensor": "no tensor"}[rule.scope]
    if rule.scope in ("nest", "nests", "tensor") or rule.where:
        what += " satisfies the preconditions" if rule.scope in ("nest", "nests", "tensor") else \
            " with the preconditions satisfied"
    filters = [name for name, _ in rule_filters(rule)]
    if filters:
        what += f" and passes the candidate filter(s) {', '.join(filters)}"
    return (f"rule '{rule.id}' matches nothing in program '{module.signature.name}': {what} "
            f"(preconditions: {pre}){'; ' + detail if detail else ''}")


def _resolve_site(rule, module: LeirModule, sites: list[Site], site) -> Site:
    if isinstance(site, Site):
        if site in sites:
            return site
        for s in sites:
            if s.location == site.location:
                return s
        raise NoMatch(f"rule '{rule.id}': {site} is not a match site in program '{module.signature.name}' "
                      f"({len(sites)} site(s): {', '.join(map(str, sites[:5]))}{'...' if len(sites) > 5 else ''})")
    if isinstance(site, int) and not isinstance(site, bool):
        if not 0 <= site < len(sites):
            raise NoMatch(f"rule '{rule.id}': site index {site} out of range ({len(sites)} site(s))")
        return sites[site]
    if isinstance(site, dict):
        hits = [s for s in sites if s.matches_spec(site)]
        if not hits:
            raise NoMatch(f"rule '{rule.id}': no site matches {site}; sites: {', '.join(map(str, sites))}")
        return hits[0]
    raise TypeError(f"site must be a Site, an index or a dict, not {type(site).__name__}")


# ---------------------------------------------------------------------------
# apply
# ---------------------------------------------------------------------------


def site_nests(site: Site, env: dict) -> set[int] | None:
    """The top-level nests a rewrite at ``site`` can touch: those of the site's nest, nests and
    equation paths and of every nest or equation the bindings ``env`` name; None (the whole
    program) when there are none (a tensor-scope site). Fresh loop indices avoid only these
    nests' names (:func:`program_names`): binding the same loop of two identical nests gives
    them the same new index, so they stay identical and fusion remains possible."""
    paths = [p for p in (site.nest, site.equation) if p] + [p for p in site.nests if p]
    todo = list(env.values())
    while todo:
        v = todo.pop()
        if isinstance(v, (NestRef, EqRef)) and v.path:
            paths.append(v.path)
        elif isinstance(v, (list, tuple)):
            todo.extend(v)
    return {p[0] for p in paths} or None


def apply_rule(rule, module: LeirModule, seed: int = 0, site=None, params: dict | None = None) -> Step:
    """Apply ``rule`` to ``module`` at exactly one site.

    Args:
        rule: a loaded :class:`~steptp.rules.loader.Rule` (``steptp.rules.load_rule(path)``
            loads a file; the engine sits below the loader and takes no paths).
        module: the program with its signature; the signature is unchanged by the step.
        seed: chooses the site (when ``site`` is None) and the unspecified parameters;
            the same seed gives the same output bit for bit.
        site: a :class:`Site` from :func:`find_sites`/:func:`list_candidates`, an index
            into :func:`find_sites`, or a partial description dict (``{"loop": 1}``).
        params: some or all parameter values; each must lie in its domain.

    Returns: a :class:`Step`.

    Raises:
        NoMatch: the rule matches nothing, the site is not a match site, or no site has
            an admissible parameter.
        ValueError: a given parameter is unknown or outside its domain.
        RewriteError: the rewrite is ill-formed or yields an invalid / unchanged program.
        TypeError: ``rule`` is a path (``str``, ``bytes`` or path-like), not a loaded rule.
    """
    rule = _as_rule(rule)
    try:
        return _apply_once(rule, module, seed, site, params)
    except PreflightRejected as e:
        if site is not None:
            raise
        first = e
    # the seeded draw failed the GPU preflight: try the other candidates in a seeded order
    fixed = {k: _normalize_param(v) for k, v in (params or {}).items()}
    cands = [(s, p) for s, p in list_candidates(rule, module)
             if all(p.get(k) == v for k, v in fixed.items())]
    order = list(range(len(cands)))
    _rng(seed, rule.id, "retry").shuffle(order)
    for k in order:
        s, p = cands[k]
        try:
            return _apply_once(rule, module, seed, s, p)
        except (PreflightRejected, RewriteError, NoMatch):
            continue
    raise NoMatch(_no_match_message(rule, module, f"every candidate fails the GPU preflight, e.g. {first}"))


def _apply_once(rule, module: LeirModule, seed: int, site, params: dict | None) -> Step:
    sites = find_sites(rule, module)
    if not sites:
        raise NoMatch(_no_match_message(rule, module))
    rng = _rng(seed, rule.id)
    names = list(rule.params)
    fixed = {k: _normalize_param(v) for k, v in (params or {}).items()}
    unknown = [k for k in fixed if k not in rule.params]
    if unknown:
        raise ValueError(f"rule '{rule.id}' has no parameter(s) {unknown}; parameters: {names or 'none'}")

    if site is None:
        viable = [s for s in sites if _enumerate_params(rule, dict(s.env), module, names, fixed, limit=1)]
        if not viable:
            detail = "no site admits the given parameters" if fixed else "no site has an admissible parameter value"
            raise NoMatch(_no_match_message(rule, module, detail))
        chosen = viable[rng.randrange(len(viable))]
    else:
        chosen = _resolve_site(rule, module, sites, site)

    env: dict[str, Any] = dict(chosen.env)
    chosen_params: dict[str, Any] = {}
    for i, n in enumerate(names):
        dom = _domain(rule, n, {**env, **chosen_params}, module)
        if n in fixed:
            v = _in_domain(fixed[n], dom)
            if v is None:
                raise ValueError(f"rule '{rule.id}': parameter {n}={fixed[n]!r} is not in its domain {dom} at {chosen}")
            chosen_params[n] = v
            continue
        # keep only values that leave the later parameters a non-empty domain
        ok = [v for v in dom if _enumerate_params(rule, {**env, **chosen_params, n: v}, module, names[i + 1:],
                                                  fixed, limit=1)]
        if not ok:
            raise NoMatch(_no_match_message(rule, module, f"parameter {n} has no admissible value at {chosen}"))
        chosen_params[n] = ok[rng.randrange(len(ok))]
    env.update(chosen_params)
    if not passes_filters(rule, env, module):
        raise NoMatch(_no_match_message(rule, module, f"the candidate filter rejects {chosen} with {chosen_params}"))
    _settle_let(rule, env, module)

    taken = program_names(module, site_nests(chosen, env))
    ectx = EvalContext(module, env)
    for name, spec in rule.fresh.items():
        kind, opts = (spec, {}) if isinstance(spec, str) else next(iter(spec.items()))
        opts = opts or {}
        if kind == "tensor":
            env[name] = fresh_tensor_name(taken)
        else:
            env[name] = fresh_index_name(taken, kind=eval_value(opts["kind"], ectx) if "kind" in opts else None,
                                         like=eval_value(opts["like"], ectx) if "like" in opts else None,
                                         prefix=eval_value(opts["prefix"], ectx) if "prefix" in opts else None)
    _settle_let(rule, env, module)  # let values that use fresh names (e.g. subst_index(?t, ?i, ?new))
    missing_let = [k for k in rule.let if k not in env]
    if missing_let:
        raise RewriteError(f"rule '{rule.id}': let value(s) {missing_let} could not be evaluated")

    ctx = RewriteContext(module=module, program=module.program, site=chosen, env=env, taken=taken)
    for prim, args in rule.rewrite:
        run_primitive(ctx, prim, args)
    new_prog = ctx.program
    if new_prog == module.program:
        raise RewriteError(f"rule '{rule.id}' at {chosen} with {chosen_params} leaves the program unchanged")
    # the printed text of every new or changed top-level nest must parse back to it
    old_nests = set(module.program.nests)
    changed = tuple(n for n in new_prog.nests if n not in old_nests)
    if changed:
        text = format_program(A.Program(changed))
        try:
            if parse_program(text).nests != changed:
                raise RewriteError(f"rule '{rule.id}' produced a program that does not re-parse to itself: {text}")
        except LeirSyntaxError as e:
            raise RewriteError(f"rule '{rule.id}' produced unparsable LEIR: {e}") from None
    after = LeirModule(module.signature, new_prog)
    try:
        analyze(new_prog, module.signature)
    except LeirSemanticError as e:
        raise RewriteError(f"rule '{rule.id}' at {chosen} produced an invalid program: {e}") from None
    probs = new_preflight_problems(module, after)
    if probs:
        raise PreflightRejected(f"rule '{rule.id}' at {chosen} with {chosen_params or 'no parameters'} fails the GPU "
                                f"preflight: {'; '.join(probs)}", probs)

    from .cot import render_cot
    from .figures import step_figures

    figures = step_figures(module, after)
    cot = render_cot(rule, module, after, chosen, chosen_params, env, ctx.changes, figures)
    return Step(rule=rule, before=module, after=after, site=chosen, params=chosen_params, cot=cot,
                changes=tuple(ctx.changes), bindings=env, seed=seed, figures=figures)


__all__ = ["NoMatch", "PreflightRejected", "Step", "list_candidates", "checked_candidates", "apply_rule", "site_nests",
           "gpu_preflight_problems", "new_preflight_problems"]
