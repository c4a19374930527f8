"""``stp rules list|lint|coverage|test|docs``: inspect, self-test and document the rule files."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer

from .app import rules_app
from .common import fail, guard_rule, rules_option, use_rule_dirs


@rules_app.command("list")
def rules_list(directory: Optional[Path] = typer.Option(None, "--dir", help="Rule directory (default: the shipped "
                                                                           "rules and those of --rules)."),
               rule_dirs: Optional[List[Path]] = rules_option()):
    """List the rules: id, category, K, P, S, score (paper eq. 1) and level; a rule from a
    user folder (--rules, $STP_RULES_PATH) also shows its file."""
    from ..rules import RuleError, load_rules
    from ..rules.loader import default_rules_dir
    from ..rules.tools import rule_rows

    use_rule_dirs(rule_dirs)
    try:
        rules = load_rules(directory)
    except RuleError as e:
        fail(str(e))
    rows = rule_rows(rules)
    shipped = default_rules_dir().resolve()
    w = max([len("id")] + [len(r["id"]) for r in rows])
    typer.echo(f"{'id':{w}}  {'category':8}  {'K':>2} {'P':>2} {'S':>2}  {'score':>5}  level")
    for r, rule in zip(rows, rules):
        user = directory is None and rule.path and Path(rule.path).resolve().parent != shipped
        typer.echo(f"{r['id']:{w}}  {r['category']:8}  {r['K']:2d} {r['P']:2d} {r['S']:2d}  {r['score']:5.1f}  "
                   f"{r['level']:9}{'  ' + str(rule.path) if user else ''}".rstrip())
    typer.echo(f"{len(rows)} rule(s)")


def _rule_paths(files, rule_dirs, load: bool = True) -> list:
    """The rule files that FILES names (files, directories of them, or rule ids looked up
    among the shipped rules and the user folders), or every rule in effect without FILES;
    ``--rules`` folders are added first (:func:`~steptp.cli.common.use_rule_dirs`)."""
    from ..rules.loader import find_rule

    in_effect = use_rule_dirs(rule_dirs, load=load)
    if not files:
        return in_effect
    out = []
    for f in files:
        if Path(f).is_dir():
            found = sorted(Path(f).glob("*.yaml"))
            if not found:
                fail(f"{f}: no rule files (*.yaml)")
            out += found
            continue
        try:
            out.append(find_rule(f))
        except FileNotFoundError as e:
            fail(str(e))
    return out


def _rule_files(files, rule_dirs=None) -> list:
    from ..rules import RuleError, load_rule

    try:
        return [load_rule(f) for f in _rule_paths(files, rule_dirs)]
    except (RuleError, FileNotFoundError) as e:
        fail(str(e))


def _programs(inputs) -> list:
    """The ``.leir`` programs of ``inputs`` (:func:`steptp.programs.discover`, LEIR only)."""
    from ..leir import LeirSyntaxError, load_leir
    from ..programs import discover

    for i in inputs:
        if not Path(i).exists():
            fail(f"{i}: no such file or directory")
    try:
        sources = discover(inputs, kinds=("leir",))
    except (FileNotFoundError, ValueError) as e:
        fail(str(e))
    out = []
    for src in sources:
        try:
            out.append(load_leir(src.path))
        except LeirSyntaxError as e:
            fail(str(e))
    return out


@rules_app.command("lint")
def rules_lint(files: Optional[List[Path]] = typer.Argument(None, help="Rule files, directories of them or rule ids "
                                                                       "(default: every rule in effect)."),
               program: Optional[List[Path]] = typer.Option(None, "--program",
                                                            help=".leir files/directories; the largest is the "
                                                                 "yardstick (default: examples/ if present)."),
               slow_ms: float = typer.Option(1000.0, "--slow-ms", help="Warn above this matching time on the "
                                                                       "scaled program."),
               nests: int = typer.Option(120, "--nests", help="Scale the yardstick program to this many nests."),
               strict: bool = typer.Option(False, "--strict", help="Exit 1 on warnings."),
               rule_dirs: Optional[List[Path]] = rules_option()):
    """Validate rule files and warn about preconditions whose matching cost explodes.

    Each rule is loaded (schema; every name it uses: relations, filters, value functions,
    primitives, template variables; patterns, tests' LEIR): a broken file is an error
    ``FILE:LINE:COL: field: message`` naming the unknown name and the closest known ones, and
    the other files are still checked. Each rule is then applied to its own tests: a CoT template
    that cannot render, a where: clause that rejects every site of a test expecting a rewrite, or
    a rewrite the symbolic check disproves (math and expr-scope rules) is an error naming the file
    and line: exit 1. Last, the rules are matched on the largest bundled program and on a copy
    scaled to --nests nests (warnings)."""
    from ..rules import RuleError, load_rule
    from ..rules.tools import largest_program, lint_rules, lint_tests

    rules, broken = [], 0
    for p in _rule_paths(files, rule_dirs, load=False):  # a broken file is reported below, the others linted
        try:
            rules.append(load_rule(p))
        except RuleError as e:
            broken += 1
            typer.echo(f"error: {e}", err=True)
        except OSError as e:
            broken += 1
            typer.echo(f"error: {p}: cannot read: {e.strerror or e}", err=True)
    typer.echo(f"{len(rules)} rule file(s) load and validate" + (f"; {broken} do not" if broken else ""))
    errors = lint_tests(rules)
    for f in errors:
        typer.echo(str(f), err=True)
    failed = bool(errors or broken)
    paths = program or ([Path("examples")] if Path("examples").is_dir() else [])
    mod = largest_program(paths) if paths and rules else None
    if mod is None:
        typer.echo("no .leir program given (--program): matching cost not checked" if rules else
                   "no rule loads: matching cost not checked")
        if failed:
            raise typer.Exit(1)
        return
    findings, fig = lint_rules(rules, mod, slow_ms=slow_ms, scale_nests=nests)
    slowest = sorted(fig["big"]["rules"].items(), key=lambda kv: -kv[1])[:3]
    typer.echo(f"matching on '{fig['program']}' ({fig['nests']} nests): {fig['small']['total_ms']:.1f} ms; "
               f"scaled to {fig['scaled_nests']} nests: {fig['big']['total_ms']:.1f} ms (slowest: "
               f"{', '.join(f'{k} {v:.1f} ms' for k, v in slowest)})")
    for f in findings:
        typer.echo(str(f))
    if not findings:
        typer.echo("no warnings")
    if failed:
        raise typer.Exit(1)
    if findings and strict:
        raise typer.Exit(1)


@rules_app.command("coverage")
def rules_coverage(inputs: List[Path] = typer.Argument(..., help=".leir files or directories."),
                   rules: Optional[List[Path]] = typer.Option(None, "--rule", help="Rule file(s) or id(s); default: "
                                                                              "every rule in effect."),
                   per_program: int = typer.Option(3, "--per-program", min=1,
                                                   help="Candidates tried per rule and program."),
                   seed: int = typer.Option(0, "--seed"),
                   trials: int = typer.Option(3, "--trials", min=1),
                   nvcc: bool = typer.Option(False, "--nvcc", help="Also run nvcc --ptx in the Build pass."),
                   rule_dirs: Optional[List[Path]] = rules_option()):
    """Apply every rule to every program it matches, verify, and tabulate per strategy."""
    from ..rules.tools import coverage, format_coverage

    rs = _rule_files(rules, rule_dirs)
    progs = _programs(inputs)
    if not progs:
        fail("no .leir programs found")
    rows = coverage(rs, progs, per_program=per_program, seed=seed, trials=trials, nvcc=nvcc)
    typer.echo(format_coverage(rows))
    if any(r.tried > r.equal for r in rows):
        raise typer.Exit(1)


@rules_app.command("test")
def rules_test(files: Optional[List[Path]] = typer.Argument(None, help="Rule files, directories of them or rule ids "
                                                                       "(default: every rule in effect)."),
               no_verify: bool = typer.Option(False, "--no-verify", help="Skip numeric verification."),
               update: bool = typer.Option(False, "--update", help="Rewrite each test's after: text with what the "
                                           "engine now produces (after a deliberate printer change); every rewrite "
                                           "is verified numerically, and no file is written if one fails."),
               rule_dirs: Optional[List[Path]] = rules_option()):
    """Run each rule's own before/after tests (exact LEIR) and verify them numerically;
    ``--update`` rewrites the after: texts in place (the rest of each file is kept byte for byte)."""
    from ..rules import RuleError, load_rule
    from ..rules.selftest import run_selftests

    if update and no_verify:
        fail("--update verifies every rewrite numerically: drop --no-verify")
    paths = _rule_paths(files, rule_dirs)
    for f in paths:
        guard_rule(f, lambda f=f: load_rule(f))
    try:
        ok = run_selftests([str(f) for f in paths], verify=not no_verify, echo=typer.echo, update=update)
    except RuleError as e:
        fail(str(e))
    if not ok:
        raise typer.Exit(1)


@rules_app.command("docs")
def rules_docs(output: Optional[Path] = typer.Option(None, "-o", "--output",
                                                     help="Write the page here (default: print it)."),
               check: bool = typer.Option(False, "--check", help="Write nothing; exit 1 when OUTPUT is not the "
                                                                 "page the engine generates now (stale)."),
               rule_dirs: Optional[List[Path]] = typer.Option(None, "--rules", file_okay=False,
                                                              help="A folder of your own rule files (repeatable): "
                                                                   "their uses are shown as examples too.")):
    """The rule language reference (docs/rule-language.md), generated from the engine's registries:
    every rule-file field, where: relation, filter, parameter domain, value function and rewrite
    primitive, with its meaning and an example from the shipped rules."""
    from ..rules.docgen import rule_language_page, undocumented, write_rule_language

    examples = None
    if rule_dirs:  # only an explicit --rules: the committed page is the shipped rules' ($STP_RULES_PATH aside)
        examples = [str(p) for p in use_rule_dirs(rule_dirs)]
    text = rule_language_page(examples)
    missing = undocumented()
    if missing:
        typer.echo(f"warning: no documentation for {'; '.join(missing)} (add a docstring)", err=True)
    if check:
        if output is None:
            fail("--check needs -o FILE (the committed page to compare)")
        current = output.read_text(encoding="utf-8") if output.is_file() else None
        if current != text:
            typer.echo(f"{output}: stale; regenerate with: stp rules docs -o {output}", err=True)
            raise typer.Exit(1)
        typer.echo(f"{output}: up to date")
        return
    if output is None:
        typer.echo(text, nl=False)
        return
    try:
        changed = write_rule_language(output, examples)
    except OSError as e:
        fail(f"{output}: {e.strerror or e}")
    typer.echo(f"{output}: {'written' if changed else 'unchanged'} ({len(text.splitlines())} lines)")


@rules_app.command("recipes")
def rules_recipes(files: Optional[List[Path]] = typer.Argument(None, help="Recipe files or directories of them "
                                                                         "(default: every recipe in effect)."),
                  test: bool = typer.Option(False, "--test", help="Run each recipe's own tests (exit 1 if one "
                                                                   "fails)."),
                  no_verify: bool = typer.Option(False, "--no-verify", help="With --test: skip numeric "
                                                                            "verification."),
                  rule_dirs: Optional[List[Path]] = rules_option()):
    """List the multi-step recipes (rules/recipes/*.yaml and the recipes/ folder of each --rules
    folder): kind, id, the rules each chains; with --test run their own tests (the proposal the
    recipe alone makes, its rules, its result, numeric verification)."""
    from ..engine.recipes import RecipeError, load_recipe, recipes_in_effect
    from ..rules import load_rules
    from ..rules.recipe_tests import run_recipe_tests

    use_rule_dirs(rule_dirs)
    try:
        if files:
            recipes = []
            for f in files:
                found = sorted(Path(f).glob("*.yaml")) if Path(f).is_dir() else [Path(f)]
                if not found or not all(p.is_file() for p in found):
                    fail(f"{f}: no recipe files (*.yaml)")
                recipes += [load_recipe(p) for p in found]
        else:
            recipes = recipes_in_effect()
    except RecipeError as e:
        fail(str(e))
    from ..positions import did_you_mean

    by_id = {r.id: r for r in load_rules()}
    for r in recipes:  # a recipe naming a rule that is not loaded would propose nothing, silently
        for rid in r.rules:
            if rid not in by_id:
                fail(f"{r.source_path}: recipe {r.id}: no rule {rid!r} is loaded" + did_you_mean(rid, by_id, n=1))
    if not test:
        w = max([len("id")] + [len(r.id) for r in recipes])
        typer.echo(f"{'kind':8}  {'id':{w}}  rules")
        for r in recipes:
            typer.echo(f"{r.kind:8}  {r.id:{w}}  {', '.join(r.rules)}")
        typer.echo(f"{len(recipes)} recipe(s)")
        return

    def show(o):
        mark = "ok  " if o.ok else "FAIL"
        ver = {None: "", True: "  verified", False: "  NOT verified"}[o.verified]
        typer.echo(f"{mark} {o.recipe} [{o.index}] {o.name} ({o.seconds:.1f} s){ver}")
        if not o.ok:
            typer.echo(f"     {o.where}: " + o.message.replace("\n", "\n     "))

    outcomes = run_recipe_tests(recipes, by_id, verify=not no_verify, progress=show)
    bad = [o for o in outcomes if not o.ok]
    untested = [r.id for r in recipes if not r.spec.get("tests")]
    typer.echo(f"{len(outcomes) - len(bad)} of {len(outcomes)} recipe test(s) passed"
               + (f"; no tests: {', '.join(untested)}" if untested else ""))
    if bad or not outcomes:
        raise typer.Exit(1)


@rules_app.command("tiling")
def rules_tiling(inputs: List[Path] = typer.Argument(..., help=".leir files or directories."),
                 as_json: bool = typer.Option(False, "--json", help="One JSON object per program."),
                 rule_dirs: Optional[List[Path]] = rules_option()):
    """The GPU tiling proposal of every GEMM-like and convolution nest (the multi-step
    proposal that the search's round 0 holds: loop partition, block/thread binding, register
    and shared-memory tiles), or the reason it has none: the form, the extents, or the step
    that failed and its error (steptp.engine.macros.tiling_report)."""
    import json

    from ..engine.macros import tiling_report
    from ..rules import load_rules

    use_rule_dirs(rule_dirs)
    by_id = {r.id: r for r in load_rules()}
    for mod in _programs(inputs):
        rep = tiling_report(by_id, mod)
        name = mod.signature.name or "program"
        if as_json:
            typer.echo(json.dumps({"program": name, "nests": [
                {"nest": r["nest"], "tiled": "steps" in r, "tensor_cores": bool(r.get("tensor_core")),
                 **({"steps": [{k: s[k] for k in ("rule", "site", "params")} for s in r["steps"]],
                     "leir": r["steps"][-1]["leir"]} if "steps" in r else {"reason": r["reason"]})}
                for r in rep]}))
            continue
        nests = sorted({r["nest"] for r in rep})
        tiled = {r["nest"] for r in rep if "steps" in r and not r.get("tensor_core")}
        cores = {r["nest"] for r in rep if r.get("tensor_core")}
        typer.echo(f"{name}: {len(tiled)} of {len(nests)} GEMM/convolution nest(s) tiled"
                   + (f", {len(cores)} on tensor cores" if cores else ""))
        for r in rep:
            if "steps" in r:
                what = "on tensor cores" if r.get("tensor_core") else "tiled"
                typer.echo(f"  nest {r['nest']}: {what} in {len(r['steps'])} steps: "
                           + ", ".join(s["rule"] for s in r["steps"]))
            else:
                typer.echo(f"  nest {r['nest']}: not tiled: {r['reason']}")
