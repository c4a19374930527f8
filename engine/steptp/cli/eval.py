"""``stp eval`` and ``stp testset``: single-step evaluation of a model or baseline policy on
held-out programs (paper §4.3), and the construction of such held-out cases."""

from __future__ import annotations

import json
from pathlib import Path
from typing import List, Optional

import typer

from .app import app
from .common import fail, internal_errors_exit, rules_option, use_rule_dirs


@app.command("eval")
def eval_(inputs: List[Path] = typer.Argument(..., help=".py model files, .leir files or directories (one case each)."),
          outdir: Path = typer.Option(..., "-o", "--out", help="Output directory (resumable)."),
          endpoint: Optional[str] = typer.Option(None, "--endpoint",
                                                 help="OpenAI-compatible base URL, e.g. http://127.0.0.1:8000/v1."),
          model: Optional[str] = typer.Option(None, "--model", help="Model name served at --endpoint."),
          answers: Optional[Path] = typer.Option(None, "--answers",
                                                 help="JSONL of answers ({case|source|program|prompt, answer, sample})."),
          policy: Optional[str] = typer.Option(None, "--policy", help="Baseline: engine (one random matching rule) "
                                                                     "or identity (the input unchanged)."),
          samples: int = typer.Option(1, "--samples", min=1, help="Samples per case (pass@k for k <= N)."),
          temperature: float = typer.Option(0.0, "--temperature", min=0.0),
          max_tokens: Optional[int] = typer.Option(None, "--max-tokens", min=1),
          workers: int = typer.Option(1, "--concurrency", min=1,
                                      help="Endpoint requests in flight at once (threads), a count."),
          request_timeout: float = typer.Option(600.0, "--request-timeout", min=0.1,
                                                help="Seconds: time limit of one endpoint request."),
          retries: int = typer.Option(2, "--retries", min=0, help="Retries per request on 429/5xx/connection errors."),
          seed: int = typer.Option(0, "--seed", help="Seed of the verification inputs and of --policy engine."),
          trials: int = typer.Option(3, "--trials", min=1,
                                     help="Seeded random verification trials per check (plus 2 ordered ones)."),
          timeout: float = typer.Option(60.0, "--timeout", "--verify-timeout", min=1.0,
                                        help="Seconds: time limit of one verification check (an answer built "
                                             "and run against its case in the worker), as in stp verify, dataset "
                                             "and search (--verify-timeout: deprecated alias; the per-request "
                                             "limit is --request-timeout)."),
          device: str = typer.Option("cpu", "--device", help="cpu or cuda: where answers are verified (cuda: their "
                                                            "GPU form runs on the GPU)."),
          no_recognise: bool = typer.Option(False, "--no-recognise", help="Skip the strategy recogniser."),
          quiet: bool = typer.Option(False, "-q", "--quiet", help="No progress bar."),
          rule_dirs: Optional[List[Path]] = rules_option()):
    """Evaluate single-step transformations: prompt with the chat set's single-answer prompt, score
    every answer with Diff / Build / Exec / Equal (paper Table 2), pass@k, and the strategies used
    (Fig. 5). Writes OUTDIR/results.jsonl, summary.json, report.md and plots.

    Exit 0 when the run completes (whatever the scores), 1 when the endpoint is unreachable or
    every case failed with an internal error (summary.json: internal_errors), 2 for bad input."""
    from ..eval import AnswersFilePolicy, EndpointPolicy, EngineAnswers, EvalError, EvalOptions, IdentityPolicy, evaluate
    from ..llm import ChatClient, EndpointError

    from ..runner.device import device_problem

    problem = device_problem(device)
    if problem:
        fail(problem)  # before anything is written
    use_rule_dirs(rule_dirs)  # the engine baseline and the strategy recogniser
    chosen = [x for x in (endpoint, answers, policy) if x is not None]
    if len(chosen) != 1:
        fail("give exactly one of --endpoint URL --model NAME, --answers FILE.jsonl or --policy engine|identity")
    try:
        if endpoint is not None:
            if not model:
                fail("--endpoint needs --model NAME")
            pol = EndpointPolicy(ChatClient(endpoint, model, timeout_s=request_timeout, max_retries=retries),
                                 temperature=temperature, max_tokens=max_tokens)
        elif answers is not None:
            pol = AnswersFilePolicy(answers)
        elif policy == "engine":
            pol = EngineAnswers(seed=seed)
        elif policy == "identity":
            pol = IdentityPolicy()
        else:
            fail(f"unknown --policy {policy!r}: expected engine or identity")
        opts = EvalOptions(samples=samples, workers=workers, seed=seed, trials=trials, verify_timeout_s=timeout,
                           device=device, recognise=not no_recognise, progress=not quiet)
        s = evaluate([str(i) for i in inputs], outdir, pol, opts)
    except EndpointError as e:
        fail(str(e), 1)
    except (EvalError, FileNotFoundError, ValueError) as e:
        fail(str(e))
    except OSError as e:
        fail(f"{e.filename or outdir}: {e.strerror or e}")
    keys = ("cases", "samples", "diff", "build", "exec", "equal")
    typer.echo(json.dumps({**{k: s[k] for k in keys}, "pass_at_k": s["pass_at_k"]["equal"]}, indent=2))
    if s["skipped"]:
        typer.echo(f"{len(s['skipped'])} input(s) skipped; see {outdir}/summary.json", err=True)
    internal_errors_exit(s.get("internal_errors", 0), s["cases"] + len(s["skipped"]), outdir / "summary.json")


@app.command()
def testset(inputs: List[Path] = typer.Argument(..., help=".py model files, .leir files or directories."),
            outdir: Path = typer.Option(..., "-o", "--out", help="Directory for the .leir cases and testset.json."),
            variants: int = typer.Option(3, "--variants", min=1, help="Variants (dtype / shape) per program."),
            exclude: Optional[Path] = typer.Option(None, "--exclude",
                                                   help="An stp dataset output directory: no case may occur in it."),
            allow_overlap: bool = typer.Option(False, "--allow-overlap", help="Write cases found in --exclude anyway."),
            quiet: bool = typer.Option(False, "-q", "--quiet", help="No progress bar.")):
    """Build held-out single-step cases: dtype variants (f16/f32/f64) of every program and, for
    stp corpus programs, shape variants (the program type redrawn with other seeds). With --exclude,
    exit 1 and write nothing when a case occurs in the training dataset."""
    from ..dataset.testset import OverlapError, TestsetError, build_testset

    try:
        m = build_testset([str(i) for i in inputs], outdir, variants=variants, exclude=exclude,
                          allow_overlap=allow_overlap, progress=not quiet)
    except OverlapError as e:
        for o in e.overlap[:20]:
            typer.echo(f"overlap: {o['source']} ({o['variant']}, {o['dtype']})", err=True)
        fail(str(e), 1)
    except TestsetError as e:
        fail(str(e))
    except OSError as e:
        fail(f"{e.filename or outdir}: {e.strerror or e}")
    typer.echo(f"wrote {len(m['cases'])} case(s) from {len(m['inputs'])} program(s) to {outdir}"
               + (f"; {len(m['overlap'])} overlap the training set" if m["overlap"] else ""))
    if m["failed"]:
        typer.echo(f"{len(m['failed'])} program(s) failed; see {outdir}/testset.json", err=True)
