"""``stp apply`` (one rule at one site) and ``stp verify`` (Diff/Build/Exec/Equal of a step)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import List, Optional

import typer

from .app import app
from .common import fail, guard_rule, load, param_text, print_verification, rules_option, semantic, use_rule_dirs


@app.command()
def verify(original: Path = typer.Argument(..., help="Original .leir file."),
           transformed: Path = typer.Argument(..., help="Transformed .leir file (same known tensors)."),
           seed: int = typer.Option(0, "--seed"),
           trials: int = typer.Option(3, "--trials", min=1),
           no_nvcc: bool = typer.Option(False, "--no-nvcc", help="Build pass without nvcc --ptx."),
           timeout: float = typer.Option(300.0, "--timeout", min=1.0,
                                         help="Seconds: time limit of the verification check (the pair built and "
                                              "run in the worker)."),
           device: str = typer.Option("cpu", "--device",
                                      help="Where the transformed program runs: cpu (LLVM) or cuda (its GPU form on "
                                           "the GPU; the reference is the original on the CPU).")):
    """Check a transformed program against its original: prints Diff/Build/Exec/Equal; exit 0 only on Equal.

    Build = CPU (llvm) build + GPU preflight + TVM CUDA codegen + nvcc --ptx (when nvcc is on PATH).
    Both programs run in a worker process with a time limit (a crash or hang is an Exec failure),
    intermediates and outputs start as NaN (a read of an element never written fails), and
    programs whose buffers exceed 2 GiB are refused before anything runs."""
    from ..verify import verify_pair
    from .timing import device_problem

    problem = device_problem(device)
    if problem:
        fail(problem)
    a, b = load(original), load(transformed)
    res = verify_pair(a, b, trials=trials, seed=seed, nvcc=not no_nvcc, isolated=True, timeout_s=timeout,
                      device=device)
    print_verification(res)
    if device != "cpu":
        typer.echo(f"device {res.device}")
    if not res.equal:
        raise typer.Exit(1)


@app.command()
def apply(rule: Path = typer.Argument(..., help="A rule YAML file (e.g. rules/loop_split.yaml) or a rule id "
                                                 "(e.g. loop_split: the shipped rules and those of --rules)."),
          program: Path = typer.Argument(..., help="A .leir file."),
          seed: int = typer.Option(0, "--seed", help="Seed for choosing the site and parameters."),
          site: Optional[int] = typer.Option(None, "--site", help="Apply at candidate K (see --all)."),
          all_: bool = typer.Option(False, "--all", help="List every candidate (site and parameters) and exit."),
          output: Optional[Path] = typer.Option(None, "-o", "--output", help="Write the transformed .leir here."),
          do_verify: bool = typer.Option(False, "--verify", help="Also verify the step numerically."),
          rule_dirs: Optional[List[Path]] = rules_option()):
    """Apply one rule at one site: print the transformed LEIR and its chain of thought.

    ``--all`` lists the candidates: index, site (path), parameters and the site's text (the
    matched subexpression, equation, loop or nest)."""
    from ..engine import NoMatch, RewriteError, apply_rule, list_candidates
    from ..leir import format_program, save_leir
    from ..rules import load_rule
    from ..rules.loader import find_rule

    use_rule_dirs(rule_dirs)
    try:
        rule = find_rule(rule)
    except FileNotFoundError as e:
        fail(str(e))
    r = guard_rule(rule, lambda: load_rule(rule))
    m = load(program)
    semantic(program, m)
    try:
        cands = guard_rule(rule, lambda: list_candidates(r, m))
    except NoMatch as e:
        fail(str(e), 1)
    if not cands:
        fail(f"rule {r.id} does not match {program}", 1)
    if all_ or site is not None:
        # list (and index) only candidates whose result is valid and passes the GPU preflight
        from ..engine import checked_candidates

        rows = checked_candidates(r, m, cands)
        cands = [(s, p) for s, p, st, _ in rows if st is not None]
        rejected = [(s, p, why) for s, p, st, why in rows if st is None]
        if rejected:
            typer.echo(f"{len(rejected)} candidate(s) omitted (invalid result or GPU preflight), e.g. "
                       f"site={rejected[0][0]} params={json.dumps(rejected[0][1], default=str)}: {rejected[0][2]}",
                       err=True)
        if not cands:
            fail(f"rule {r.id}: every candidate in {program} is rejected", 1)
    if all_:
        from ..rules.tools import site_text

        for i, (s, params) in enumerate(cands):
            typer.echo(f"[{i}] site={s} params={json.dumps(params, default=param_text)}  {site_text(m, s)}".rstrip())
        return
    chosen = None
    params = None
    if site is not None:
        if not 0 <= site < len(cands):
            fail(f"--site {site} out of range: {len(cands)} candidate(s), see --all")
        chosen, params = cands[site]
    try:
        step = guard_rule(rule, lambda: apply_rule(r, m, seed=seed, site=chosen, params=params))
    except NoMatch as e:
        fail(str(e), 1)
    except RewriteError as e:
        fail(str(e), 1)
    typer.echo(format_program(step.after.program))
    typer.echo("")
    typer.echo(step.cot)
    if output:
        output.parent.mkdir(parents=True, exist_ok=True)
        save_leir(step.after, output)
        typer.echo(f"wrote {output}", err=True)
    if do_verify:
        from ..verify import verify_pair

        res = verify_pair(m, step.after, trials=3, seed=seed, isolated=True, timeout_s=300.0)
        print_verification(res)
        if not res.equal:
            raise typer.Exit(1)
