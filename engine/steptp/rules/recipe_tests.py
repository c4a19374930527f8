"""Run each recipe's own tests (``tests:`` of ``rules/recipes/*.yaml``, as a rule's tests): the
proposal the recipe alone makes for the test's program
(:func:`steptp.engine.macros.recipe_proposal`), its rules in order (``rules:``), its last
program (``after:``, canonical LEIR), snippets of it (``contains:``) or a refusal whose reason
names a text (``refused:``); and, unless ``verify: false``, numeric verification of the last
program against the test's program (:func:`steptp.verify.verify_pair`: seeded, ordered and
edge-case trials on the CPU, plus the GPU preflight and CUDA code generation).

Command line: ``stp rules recipes --test [FILES...] [--no-verify]``."""

from __future__ import annotations

import time
from dataclasses import dataclass

from ..leir.fileformat import LeirModule, parse_leir
from ..leir.parser import parse_program
from ..leir.printer import format_program


@dataclass
class RecipeTestOutcome:
    """One recipe test's result: ``ok``, ``message`` (why not), ``verified`` (None: not run),
    ``seconds``, the steps' rules (``got``)."""

    recipe: str
    index: int
    name: str
    ok: bool
    message: str = ""
    verified: bool | None = None
    seconds: float = 0.0
    got: tuple = ()
    where: str = ""


def run_recipe_test(recipe, index: int, by_id: dict, verify: bool = True) -> RecipeTestOutcome:
    """Run test ``index`` of ``recipe`` (:class:`steptp.engine.recipes.Recipe`) with the rules
    ``by_id`` (id -> rule). Never raises for a failing test: the outcome says why."""
    from ..engine.macros import recipe_proposal

    t = recipe.spec["tests"][index]
    t0 = time.perf_counter()
    out = RecipeTestOutcome(recipe.id, index, t["name"], False, where=f"{recipe.source_path}:{t['line']}")
    try:
        before = parse_leir(t["before"], f"{recipe.id} tests[{index}].before")
        steps, why = recipe_proposal(recipe, by_id, before, seed=t.get("seed", 0), nest=t.get("nest", 0))
    except Exception as e:  # noqa: BLE001 - any failure is the test's failure
        out.message = f"{type(e).__name__}: {e}"
        out.seconds = time.perf_counter() - t0
        return out
    out.got = tuple(s["rule"] for s in steps)
    if "refused" in t:
        if steps:
            out.message = f"expected a refusal, got {len(steps)} step(s): {list(out.got)}"
        elif t["refused"] not in (why or ""):
            out.message = f"refused, but the reason lacks {t['refused']!r}: {why}"
        else:
            out.ok = True
        out.seconds = time.perf_counter() - t0
        return out
    if not steps:
        out.message = f"no proposal: {why}"
        out.seconds = time.perf_counter() - t0
        return out
    last = steps[-1]["leir"]
    problems = []
    if "rules" in t and list(out.got) != list(t["rules"]):
        problems.append(f"rules differ\n  expected: {t['rules']}\n  got:      {list(out.got)}")
    if "after" in t:
        want = format_program(parse_program(t["after"]))
        if last != want:
            problems.append(f"last program differs\n  expected: {want}\n  got:      {last}")
    missing = [c for c in t.get("contains", []) if c not in last]
    if missing:
        problems.append(f"the last program lacks {missing!r}: {last}")
    if not problems and verify and t.get("verify", True):
        from ..verify import verify_pair

        after = LeirModule(before.signature, parse_program(last))
        res = verify_pair(before, after, trials=3, seed=0)
        out.verified = bool(res.equal)
        if not res.equal:
            problems.append(f"not numerically equivalent: {res.reason}")
    out.ok = not problems
    out.message = "\n".join(problems)
    out.seconds = time.perf_counter() - t0
    return out


def run_recipe_tests(recipes, by_id: dict, verify: bool = True, progress=None) -> list[RecipeTestOutcome]:
    """Every test of every recipe of ``recipes``, in order; ``progress(outcome)`` after each."""
    out = []
    for r in recipes:
        for i in range(len(r.spec.get("tests", []))):
            o = run_recipe_test(r, i, by_id, verify)
            out.append(o)
            if progress is not None:
                progress(o)
    return out


__all__ = ["RecipeTestOutcome", "run_recipe_test", "run_recipe_tests"]
