"""Multi-step engine proposals (issue 37's "reach"), driven by the recipes of
``rules/recipes/*.yaml`` (:mod:`steptp.engine.recipes`): *macros* (one rule applied at every
site in turn), *chains* (a step and the step it enables), *sequences* (rules in turn, each at
every site, canonically) and *tilings* (a schedule for one nest of a form, with the tails
its ``loop_partition`` peels off). Each proposal is a list of single rule applications,
recorded step by step: the proposer (:class:`steptp.policy.EnginePolicy`) offers it as one
proposal with its intermediate programs, and the search verifies every step against the root
before the last is measured (a step that does not verify ends the proposal there), so
trajectories stay step-level. No rule or recipe is named here, and no verification, TVM or
search code: the rules through :mod:`steptp.engine`, the chains' order by the static GPU
model (:mod:`steptp.cost_model`).

:func:`macro_proposals` is what the engine service's worker runs
(:func:`steptp.rules.service.macro_candidates`)."""

from __future__ import annotations

import random
import re

from ..leir.fileformat import LeirModule

def _step(rule_id: str, step) -> dict:
    """The trajectory record of one applied step (:class:`steptp.engine.Step`) with its result
    (``leir``: canonical text, no header)."""
    from .jsonify import plain  # noqa: PLC0415  (math-rule parameters are LEIR subterms)
    from ..leir.printer import format_program  # noqa: PLC0415

    return {"rule": rule_id, "site": str(step.site), "params": plain(step.params),
            "leir": format_program(step.after.program)}


def macro(rule, mod: LeirModule, rng: random.Random, max_steps: int = 48, canonical: bool = False,
          accept=None) -> tuple[LeirModule, list[dict]]:
    """``rule`` applied at every site of ``mod`` in turn (at most ``max_steps`` steps; it stops
    when nothing matches): a random site and parameters each time (seeded by ``rng``), or with
    ``canonical`` the first candidate of :func:`steptp.engine.list_candidates` (the first site,
    the first allowed parameter; with ``accept``, a site filter of
    :data:`steptp.engine.forms.SITE_FILTERS`, the first it accepts) whose rewrite passes the GPU preflight (a site whose result the preflight
    refuses, e.g. over the shared-memory limit, does not end the macro). Returns the last
    module and the steps (:func:`_step` records)."""
    from . import apply_rule, list_candidates  # noqa: PLC0415

    steps: list[dict] = []
    for _ in range(max_steps):
        step = None
        if canonical:
            try:
                cands = list_candidates(rule, mod)
            except Exception:  # noqa: BLE001 - NoMatch: every site done
                break
            if accept is not None:  # outside the try: a filter's own error is a bug, not "no site"
                cands = [c for c in cands if accept(mod.program, *c)]
            for site, params in cands:
                try:
                    step = apply_rule(rule, mod, seed=rng.randrange(2**31), site=site, params=params)
                    break
                except Exception:  # noqa: BLE001 - refused by the preflight (or the rewrite): next site
                    continue
        else:
            try:
                step = apply_rule(rule, mod, seed=rng.randrange(2**31))
            except Exception:  # noqa: BLE001 - NoMatch: every site done; preflight rejections
                break
        if step is None:
            break
        mod = LeirModule(mod.signature, step.after.program)
        steps.append(_step(rule.id, step))
    return mod, steps


def run_sequence(recipe, by_id: dict, mod: LeirModule, rng: random.Random,
                 max_steps: int = 48) -> tuple[LeirModule, list[dict]] | None:
    """One ``sequence`` recipe (:class:`steptp.engine.recipes.Recipe`) from ``mod``: each step's
    rule (``by_id``: rule id -> rule) applied canonically at every site in turn (:func:`macro`;
    a step's ``accept:`` names the site filter of :data:`steptp.engine.forms.SITE_FILTERS`).
    Returns the last module and the steps, or ``None`` when a rule is missing or a
    ``required`` step finds nothing (the rest would be another recipe)."""
    from .forms import SITE_FILTERS  # noqa: PLC0415

    steps_spec = recipe.spec["steps"]
    if not all(st["rule"] in by_id for st in steps_spec):
        return None
    steps: list[dict] = []
    for st in steps_spec:
        accept = SITE_FILTERS[st["accept"]] if "accept" in st else None
        mod, more = macro(by_id[st["rule"]], mod, rng, max_steps, canonical=True, accept=accept)
        if st.get("required") and not more:
            return None
        steps += more
    return mod, steps


def chains(rule, follow, cands, cur: LeirModule, rng: random.Random, best: int) -> list[list[dict]]:
    """Two-step proposals (a ``chain`` recipe): ``rule`` at each of its sites ``cands``, then each
    rule of ``follow`` at each of its sites in the top-level nests the first step changed (the
    step it enables); the ``best`` pairs by the static GPU model
    (:func:`steptp.cost_model.static.static_scores` on ``cuda``), best first."""
    from . import NoMatch, apply_rule, list_candidates, site_nests  # noqa: PLC0415
    from ..cost_model.static import static_scores  # noqa: PLC0415

    pairs = []
    before = set(cur.program.nests)
    for site, params in cands:
        try:
            first = apply_rule(rule, cur, seed=rng.randrange(2**31), site=site, params=params)
        except Exception:  # noqa: BLE001 - preflight rejections, rewrite errors
            continue
        mid = LeirModule(cur.signature, first.after.program)
        changed = {k for k, n in enumerate(mid.program.nests) if n not in before}
        for frule in follow:
            try:
                fcands = list_candidates(frule, mid)
            except NoMatch:
                continue
            except Exception:  # noqa: BLE001
                continue
            for fsite, fparams in fcands:
                if not (site_nests(fsite, fsite.env) or set()) & changed:
                    continue
                try:
                    second = apply_rule(frule, mid, seed=rng.randrange(2**31), site=fsite, params=fparams)
                except Exception:  # noqa: BLE001
                    continue
                pairs.append((second.after.program, [_step(rule.id, first), _step(frule.id, second)]))
    if not pairs:
        return []
    pred = static_scores(cur.program, [p[0] for p in pairs], "cuda")
    order = sorted(range(len(pairs)), key=lambda i: (-pred[i], i))
    return [pairs[i][1] for i in order[:best]]


def site_for(rule, module: LeirModule, spec: dict):
    """The one site of ``rule`` in ``module`` matching the filter ``spec``: ``nest`` (a path),
    ``loop`` (a position in that nest, negative from the innermost), ``bindings``
    (metavariable -> LEIR text). Raises ``LookupError`` when none or several match."""
    from . import find_sites  # noqa: PLC0415
    from .navigation import get_nest  # noqa: PLC0415

    want = dict(spec)
    binds = want.pop("bindings", {})
    hits = []
    for s in find_sites(rule, module):
        d = s.describe()
        if "nest" in want and tuple(want["nest"]) != tuple(d.get("nest", ())):
            continue
        if "loop" in want and want["loop"] % len(get_nest(module.program, s.nest).loops) != d.get("loop"):
            continue
        if any(d["bindings"].get(k) != v for k, v in binds.items()):
            continue
        hits.append(s)
    if len(hits) != 1:
        raise LookupError(f"{rule.id} {spec}: {len(hits)} matching site(s)")
    return hits[0]


def apply_steps(by_id: dict, module: LeirModule, steps) -> list[dict]:
    """Apply ``steps`` (``(rule id, site filter, params)``, :func:`site_for`; a filter with
    ``"optional": True`` is left out where it does not apply) in turn; returns their records
    (:func:`_step`). Raises ``LookupError``/``KeyError`` or the engine's errors
    when a step does not apply (a rewrite the preflight refuses included)."""
    from . import apply_rule  # noqa: PLC0415

    out, cur = [], module
    for rule_id, spec, params in steps:
        rule = by_id[rule_id]
        spec = dict(spec)
        optional = spec.pop("optional", False)
        try:
            st = apply_rule(rule, cur, site=site_for(rule, cur, spec), params=params)
        except Exception:  # noqa: BLE001 - an optional step that does not apply here is left out
            if optional:
                continue
            raise
        cur = LeirModule(module.signature, st.after.program)
        out.append(_step(rule_id, st))
    return out


def _recipes(kind: str, recipes=None) -> list:
    from .recipes import recipes_in_effect  # noqa: PLC0415

    if recipes is None:
        return recipes_in_effect(kind)
    return [r for r in recipes if r.kind == kind]


def _sequences(recipe, module: LeirModule, k: int):
    """:func:`steptp.engine.recipes.sequences`, with a recipe that fails on this nest (a loop
    name its form does not give, an unbound ``?name``: a user recipe's error) claiming the
    nest with the error as its reason instead of stopping every proposal."""
    from .domains import ValueExprError  # noqa: PLC0415
    from .recipes import RecipeError, sequences  # noqa: PLC0415

    try:
        return sequences(recipe, module, k)
    except (RecipeError, ValueExprError) as e:
        return [], f"recipe {recipe.id} ({recipe.source_path}): {e}", True


def tiling_report(by_id: dict, module: LeirModule, recipes=None) -> list[dict]:
    """For every top-level nest that a ``tiling`` recipe's form claims (``recipes``: the
    loaded recipes, default those in effect, :func:`steptp.engine.recipes.recipes_in_effect`):
    ``{"nest": k, "steps": [...], "sequence": [...], "recipe": id}`` (the first sequence of
    the recipes in order, each's tries best first, whose steps all apply, with the steps of
    the ``tail`` recipes for the nests its ``loop_partition`` peeled off; the rules' own checks
    and the GPU preflight decide) or ``{"nest": k, "reason": text}`` (why none applies: the
    form, the extents, or the first step that failed and its error); then one entry per
    ``alongside`` recipe that applies too (its ``marks`` added, e.g. ``tensor_core``)."""
    tilings = _recipes("tiling", recipes)
    tails = _recipes("tail", recipes)
    main = [r for r in tilings if not r.spec.get("alongside")]
    besides = [r for r in tilings if r.spec.get("alongside")]
    out = []
    for k in range(len(module.program.nests)):
        seqs, reasons, claimed = [], [], False
        for r in main:
            got, why, mine = _sequences(r, module, k)
            claimed |= mine
            missing = [x for x in r.rules if x not in by_id]
            if got and missing:
                got, why = [], f"{r.id}: the rules {', '.join(missing)} are not loaded"
            seqs += [(r, s) for s in got]
            if why is not None and not got:
                reasons.append(why)
        if not claimed:
            continue
        reason = "; ".join(dict.fromkeys(reasons)) or None
        for r, seq in seqs:
            try:
                steps = apply_steps(by_id, module, seq)
                out.append({"nest": k, "steps": steps + _tail_steps(by_id, module, k, steps, tails),
                            "sequence": seq, "recipe": r.id})
                reason = None
                break
            except Exception as e:  # noqa: BLE001 - these parameters do not apply here: the next
                reason = _refusal(e)
        if reason is not None:
            out.append({"nest": k, "reason": reason})
        for r in besides:
            if any(x not in by_id for x in r.rules):
                continue
            got, _why, _mine = _sequences(r, module, k)
            for seq in got[:1]:
                try:
                    out.append({"nest": k, "steps": apply_steps(by_id, module, seq), "sequence": seq,
                                "recipe": r.id, **r.spec.get("marks", {})})
                except Exception:  # noqa: BLE001 - the tiling above stands alone
                    pass
    return out


def _tail_steps(by_id: dict, module: LeirModule, k: int, steps: list[dict], tails: list) -> list[dict]:
    """Steps that parallelise the nests a tiling's steps added after nest ``k`` (the tails
    ``loop_partition`` peeled off, each run as it is by one thread per outer iteration): for
    each, the first ``tail`` recipe of ``tails`` whose form and conditions it meets (its
    first try). A tail where no recipe applies, or whose steps do not apply, stays as it is."""
    from ..leir import parse_leir  # noqa: PLC0415

    if not steps:
        return []
    cur = LeirModule(module.signature, parse_leir(steps[-1]["leir"], "<tiled>").program)
    added = len(cur.program.nests) - len(module.program.nests)
    out: list[dict] = []
    for j in range(k + 1, k + 1 + added):
        for r in tails:
            if any(x not in by_id for x in r.rules):
                continue
            got, _why, _mine = _sequences(r, cur, j)
            if not got:
                continue
            try:
                done = apply_steps(by_id, cur, got[0])
            except Exception:  # noqa: BLE001 - this tail stays as it is
                done = []
            if done:
                out += done
                cur = LeirModule(module.signature, parse_leir(done[-1]["leir"], "<tiled>").program)
            break
    return out


def _refusal(e: Exception) -> str:
    """The reason a tiling step failed, in words where the engine's error is terse."""
    msg = str(e).splitlines()[0][:300]
    m = re.search(r"'(\w+)': parameter (\w+)=.*domain \[\]", msg)
    if m:
        return (f"no value of {m.group(1)}'s parameter {m.group(2)} is allowed here (for a shared-memory tile: "
                f"the tile is above the shared memory per block or not covered by the block's threads) ({msg})")
    if isinstance(e, LookupError) and "0 matching site(s)" in msg:
        return (f"a step found no site: {msg} (the nest's form differs from what the tiling sequence "
                f"expects at that step)")
    return f"{type(e).__name__}: {msg}"


def tiling_proposals(by_id: dict, module: LeirModule, recipes=None) -> list[list[dict]]:
    """The tiled form of every nest a ``tiling`` recipe applies to, as one multi-step proposal
    each (:func:`tiling_report`: the nests it refuses are left out here), and first, where
    there are several, one that tiles them all (:func:`_every_nest_tiled`). Its records are
    the steps."""
    tiled = [r for r in tiling_report(by_id, module, recipes) if "steps" in r]
    out = [r["steps"] for r in tiled]
    first = [r for i, r in enumerate(tiled) if all(q["nest"] != r["nest"] for q in tiled[:i])]  # one per nest
    if len(first) > 1:
        every = _every_nest_tiled(by_id, module, first, _recipes("tail", recipes))
        if every:
            out.insert(0, every)
    return out


def _every_nest_tiled(by_id: dict, module: LeirModule, tiled: list[dict], tails: list) -> list[dict] | None:
    """One proposal that tiles every nest of ``tiled`` (:func:`tiling_report` entries), the
    last nest first (a ``loop_partition`` adds nests only after the one it splits, so the
    earlier nests keep their positions), each with its tails (``tails``: the ``tail``
    recipes); None where a sequence does not apply after another's. A program with several
    GEMMs (an attention's projections) is sped up by all of them together, which one nest
    alone never shows the cost model."""
    from ..leir import parse_leir  # noqa: PLC0415

    cur, steps = module, []
    for r in sorted(tiled, key=lambda r: -r["nest"]):
        if cur is module:  # the last nest's steps from the unchanged program: the report's own
            done = r["steps"]
        else:
            try:
                done = apply_steps(by_id, cur, r["sequence"])
                done += _tail_steps(by_id, cur, r["nest"], done, tails)
            except Exception:  # noqa: BLE001 - one proposal per nest still stands
                return None
        steps += done
        cur = LeirModule(module.signature, parse_leir(done[-1]["leir"], "<tiled>").program)
    return steps


def macro_proposals(rules, module: LeirModule, seed: int, per_rule: int = 4, max_steps: int = 48,
                    recipes=None) -> list[list[dict]]:
    """Every multi-step proposal of ``module`` as its list of steps (:func:`_step` records,
    each with its result), from the recipes (``recipes``: loaded recipes, default those in
    effect), kind by kind: each ``macro`` (random sites, seeded) that takes at least two
    steps, each ``chain`` (its best pairs, at most ``per_rule``), each ``sequence`` (at least
    two steps), then the tilings (:func:`tiling_proposals`). A recipe whose rules are not all
    loaded proposes nothing. Deterministic for ``seed`` and the program."""
    from . import NoMatch, list_candidates  # noqa: PLC0415
    from ..seeds import seeded_rng  # noqa: PLC0415

    by_id = {r.id: r for r in rules}
    out: list[list[dict]] = []
    for rc in _recipes("macro", recipes):
        rid = rc.spec["rule"]
        if rid in by_id:
            _, steps = macro(by_id[rid], module, seeded_rng(seed, "macro", rid), max_steps)
            if len(steps) > 1:
                out.append(steps)
    for rc in _recipes("chain", recipes):
        rid = rc.spec["first"]
        if rid not in by_id:
            continue
        try:
            cands = list_candidates(by_id[rid], module)
        except NoMatch:
            continue
        except Exception:  # noqa: BLE001 - a rule that fails on this program proposes nothing
            continue
        out += chains(by_id[rid], [by_id[f] for f in rc.spec["then"] if f in by_id], cands, module,
                      seeded_rng(seed, "chain", rid), min(per_rule, rc.spec.get("best", per_rule)))
    for i, rc in enumerate(_recipes("sequence", recipes)):
        got = run_sequence(rc, by_id, module, seeded_rng(seed, "sequence", str(i)), max_steps)
        if got is not None and len(got[1]) > 1:
            out.append(got[1])
    out += tiling_proposals(by_id, module, recipes)
    return out


def recipe_proposal(recipe, by_id: dict, module: LeirModule, seed: int = 0, nest: int = 0,
                    max_steps: int = 48) -> tuple[list[dict], str | None]:
    """The one proposal ``recipe`` alone makes for ``module`` (a recipe's own tests,
    ``stp rules recipes --test``): a ``macro`` with ``seeded_rng(seed, "macro", rule)``, a
    ``chain``'s best pair, a ``sequence`` (seed label ``"0"``), or a ``tiling``/``tail``
    recipe's first sequence for top-level nest ``nest`` whose steps all apply (no tails).
    Returns ``(steps, None)`` or ``([], reason)`` when it proposes nothing. Raises ``KeyError``
    for a rule the recipe uses that ``by_id`` lacks."""
    from . import NoMatch, list_candidates  # noqa: PLC0415
    from ..seeds import seeded_rng  # noqa: PLC0415
    from .recipes import sequences  # noqa: PLC0415

    for rid in recipe.rules:
        if rid not in by_id:
            raise KeyError(f"recipe {recipe.id}: rule {rid!r} is not loaded")
    spec = recipe.spec
    if recipe.kind == "macro":
        _, steps = macro(by_id[spec["rule"]], module, seeded_rng(seed, "macro", spec["rule"]), max_steps)
        return (steps, None) if steps else ([], "no site")
    if recipe.kind == "chain":
        try:
            cands = list_candidates(by_id[spec["first"]], module)
        except NoMatch as e:
            return [], f"{spec['first']}: {e}"
        pairs = chains(by_id[spec["first"]], [by_id[f] for f in spec["then"]], cands, module,
                       seeded_rng(seed, "chain", spec["first"]), 1)
        return (pairs[0], None) if pairs else ([], "no step of the first rule enables a step of the next")
    if recipe.kind == "sequence":
        got = run_sequence(recipe, by_id, module, seeded_rng(seed, "sequence", "0"), max_steps)
        if got is None or not got[1]:
            return [], "no step (a required step found no site)" if got is None else "no step"
        return got[1], None
    seqs, why, _claimed = sequences(recipe, module, nest)
    for seq in seqs:
        try:
            return apply_steps(by_id, module, seq), None
        except Exception as e:  # noqa: BLE001 - the next try
            why = _refusal(e)
    return [], why or "the nest is not of the recipe's form"


__all__ = ["recipe_proposal", "macro", "run_sequence", "chains", "macro_proposals", "site_for", "apply_steps", "tiling_proposals",
           "tiling_report"]
