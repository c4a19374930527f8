"""``stp dataset``, ``stp corpus``, ``stp report`` and ``stp split``: many programs in, dataset files, their
report and a held-out train/test split out."""

from __future__ import annotations

import json
from pathlib import Path
from typing import List, Optional

import typer

from .app import app
from .common import fail, guard_rule, internal_errors_exit, rules_option, use_rule_dirs


@app.command()
def dataset(inputs: List[Path] = typer.Argument(..., help=".py model files, .leir files or directories."),
            outdir: Path = typer.Option(..., "-o", "--out", help="Output directory (resumable)."),
            seed: int = typer.Option(0, "--seed"),
            rules: Optional[List[Path]] = typer.Option(None, "--rule", help="Rule file(s) or rule id(s); default: all "
                                                                           "rules (shipped and --rules folders)."),
            rule_dirs: Optional[List[Path]] = rules_option(),
            workers: int = typer.Option(1, "-j", "--workers", min=1,
                                        help="Parallel worker processes (spawn), a count."),
            batch: int = typer.Option(8, "--programs-per-task", min=1,
                                      help="Programs per worker task, a count; their candidates share one nvcc run "
                                           "(the output does not depend on it)."),
            per_rule: int = typer.Option(1, "--per-rule", min=1,
                                         help="Verified steps per program and rule: N candidates (sites x parameters) "
                                              "sampled with the seed."),
            max_tries: int = typer.Option(4, "--max-tries", min=1,
                                          help="Candidates tried per verified step wanted (per rule: N x this)."),
            trials: int = typer.Option(3, "--trials", min=1,
                                       help="Seeded random verification trials per check (plus 2 ordered ones)."),
            no_cuda: bool = typer.Option(False, "--no-cuda", help="Skip the CUDA source / GPU TIR in entries."),
            no_nvcc: bool = typer.Option(False, "--no-nvcc", help="Build pass without nvcc --ptx (faster)."),
            in_process: bool = typer.Option(False, "--in-process",
                                            help="Run checks in the generating process (faster, no time limit)."),
            timeout: float = typer.Option(60.0, "--timeout",
                                          help="Seconds: time limit of one verification check (the pair built and "
                                               "run in the worker); in isolated mode it also bounds each rule's "
                                               "site listing and each application."),
            parquet: bool = typer.Option(False, "--parquet", help="Also write dictionary.parquet (needs pyarrow)."),
            quiet: bool = typer.Option(False, "-q", "--quiet", help="No progress bar."),
            use_ray: bool = typer.Option(False, "--ray", help="Distribute programs over a Ray cluster (a local one "
                                                             "with -j CPUs unless --ray-address is given)."),
            ray_address: Optional[str] = typer.Option(None, "--ray-address",
                                                      help="Ray cluster address (ray://host:10001, host:6379, auto); "
                                                           "implies --ray."),
            profile: str = typer.Option("default", "--profile",
                                        help="Composition of the chat sets: default (the §3.4 filter, one multi-answer "
                                             "record per program) or paper (composed to the released dataset: 87/12/0.5 % "
                                             "difficult/medium/easy items, 2.3 multi-answer records per single-answer "
                                             "one, without repetition: one single-answer record per prompt, multi-answer "
                                             "records of distinct sizes, each step in at most two). Part of the run's "
                                             "options."),
            max_tokens: Optional[int] = typer.Option(None, "--max-tokens", min=1,
                                                     help="With --profile paper: most tokens of a multi-answer record "
                                                          "(prompt + label, Qwen tokenizer; characters / 2 without it); "
                                                          "a longer record is split into smaller sets or dropped. "
                                                          "Default 16384."),
            rounds: int = typer.Option(1, "--rounds", min=1,
                                       help="Rounds of steps: round k+1 applies every rule again to a seeded sample "
                                            "of each program's verified transformed programs of round k (derived "
                                            "originals, recorded with derived_from). 1: single steps from the "
                                            "source programs only."),
            follow_ups: Optional[bool] = typer.Option(None, "--follow-ups/--no-follow-ups",
                                                      help="Try each rule that names strategies it `follows` (and has "
                                                           "no verified step on a program) on up to 2 verified outputs "
                                                           "of those strategies: operator_fission and set_storage_scope "
                                                           "after operator_fusion, the prefix matmul after "
                                                           "online_softmax. Default: on with --profile paper."),
            time_steps: bool = typer.Option(False, "--time",
                                            help="Time every entry's original and transformed program on --device "
                                                 "(median us, performance build) and record timing {original_us, "
                                                 "transformed_us, speedup, device}; stp report tabulates speedups."),
            negatives: bool = typer.Option(False, "--negatives",
                                           help="Keep every rejected candidate (negatives.jsonl: both programs, "
                                                "failing stage, reason) and write preference pairs "
                                                "(chat_pairs.jsonl for TRL DPO, chat_pairs_swift.jsonl for ms-swift)."),
            device: str = typer.Option("cpu", "--device",
                                       help="Where transformed programs run during verification: cpu or cuda "
                                            "(the GPU form on the GPU; references stay on the CPU).")):
    """Generate the dictionary dataset and the single/multi-answer chat sets (ms-swift messages).

    The output files do not depend on -j or --ray: programs are recorded in input order.
    Exit 1 when every program failed with an internal error (report.json: internal_errors), when a
    rule failed on every attempt with a rule error such as a broken CoT template (report.json:
    rule_errors), or when a worker process died; 2 for bad input. A resume after a rule file changed
    refuses (run.json records each rule file's content hash)."""
    from .timing import device_problem

    problem = device_problem(device)
    if problem:
        fail(problem)  # before anything is created or changed under OUTDIR
    from ..dataset.generate import Options
    from ..dataset.pipeline import DatasetError, DatasetInterrupted, WorkerCrashed, generate_dataset
    from ..rules import load_rule
    from ..rules.loader import find_rule

    in_effect = use_rule_dirs(rule_dirs)
    try:
        rule_paths = [str(find_rule(p)) for p in rules] if rules else [str(p) for p in in_effect]
    except FileNotFoundError as e:
        fail(str(e))
    for p in rule_paths:
        # a broken rule file is bad input (exit 2 before anything is written), not an internal
        # error of every program
        guard_rule(Path(p), lambda p=p: load_rule(p))
    opts = Options(seed=seed, trials=trials, per_rule=per_rule, max_tries=max_tries, with_cuda=not no_cuda, rule_paths=rule_paths,
                   isolated=not in_process, timeout_s=timeout, nvcc=not no_nvcc, device=device, time=time_steps,
                   rounds=rounds, negatives=negatives,
                   follow_ups=(profile == "paper") if follow_ups is None else follow_ups)
    from ..dataset.difficulty import DEFAULT_MAX_TOKENS, PROFILES, FilterPolicy
    from ..dataset.distributed import RayUnavailable

    if profile not in PROFILES:
        fail(f"--profile {profile}: expected one of {', '.join(PROFILES)}")
    if max_tokens is not None and profile != "paper":
        fail("--max-tokens bounds the multi-answer records of --profile paper; the default profile does not use it")
    policy = FilterPolicy(seed=seed, profile=profile, max_tokens=max_tokens or DEFAULT_MAX_TOKENS)

    import signal

    def _interrupt(signum, frame):  # SIGTERM as Ctrl-C: stop, keep what was recorded, summarise it
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, _interrupt)
    try:
        report = generate_dataset([str(i) for i in inputs], outdir, opts, policy=policy, workers=workers,
                                  progress=not quiet,
                                  use_ray=use_ray or ray_address is not None, ray_address=ray_address,
                                  batch=batch)
    except DatasetInterrupted as e:
        fail(str(e), 130)
    except KeyboardInterrupt:
        fail(f"interrupted; what was recorded in {outdir} is kept; rerun the same command to resume", 130)
    except WorkerCrashed as e:
        fail(str(e), 1)  # internal (killed, out of memory), not bad input
    except (DatasetError, FileNotFoundError, ValueError) as e:
        fail(str(e))
    except RayUnavailable as e:
        fail(str(e), 1)
    except OSError as e:
        fail(f"{e.filename or outdir}: {e.strerror or e}")
    if parquet:
        from ..dataset.writers import to_parquet

        try:
            to_parquet(outdir / "dictionary.jsonl", outdir / "dictionary.parquet")
        except OSError as e:
            fail(f"{e.filename or outdir / 'dictionary.parquet'}: cannot write: {e.strerror or e}")
    typer.echo(json.dumps({k: report[k] for k in ("programs", "entries", "chat_single", "chat_multi",
                                                   "by_strategy", "by_level")}, indent=2))
    if report["programs_failed"]:
        typer.echo(f"{len(report['programs_failed'])} program(s) skipped; see {outdir}/report.json", err=True)
    internal_errors_exit(report.get("internal_errors", 0), report["programs"], outdir / "report.json")
    broken = report.get("rule_errors") or {}
    if broken:
        for rid, reason in broken.items():
            typer.echo(f"error: rule {rid}: every attempt failed with a rule error: {reason.splitlines()[0]}", err=True)
        fail(f"{len(broken)} rule(s) failed on every attempt ({', '.join(broken)}); fix the rule file(s) "
             f"(stp rules lint names the line) and rerun into a new output directory", 1)


@app.command()
def corpus(outdir: Path = typer.Option(..., "-o", "--out", help="Directory for the generated .py programs."),
           count: int = typer.Option(100, "--count", min=1, help="Number of programs."),
           seed: int = typer.Option(0, "--seed"),
           budget: Optional[int] = typer.Option(None, "--budget", min=1,
                                                help="Work budget per program (estimated FLOPs + input elements)."),
           gpu: bool = typer.Option(False, "--gpu", help="The GPU benchmark sizes: work budget 2^38, sizes fitted to an "
                                                "estimated 0.5-3 ms of PyTorch eager on an H200."),
           types: Optional[List[str]] = typer.Option(None, "--type", help="Restrict to these program types."),
           do_verify: bool = typer.Option(False, "--verify", help="Translate and verify every program; report the rate."),
           workers: int = typer.Option(1, "-j", "--workers", min=1,
                                       help="Parallel worker processes (spawn), a count (--verify)."),
           report: Optional[Path] = typer.Option(None, "--report", help="Write the verification report (JSON)."),
           quiet: bool = typer.Option(False, "-q", "--quiet", help="No progress bar.")):
    """Generate KernelBench-style PyTorch programs (paper §3.1) with seeded shapes and dtypes."""
    from tqdm import tqdm

    from ..dataset.corpus import DEFAULT_BUDGET, GPU_BUDGET, CorpusError, format_report, generate_corpus, verify_corpus

    b = budget if budget is not None else (GPU_BUDGET if gpu else DEFAULT_BUDGET)
    try:
        paths = generate_corpus(outdir, count, seed=seed, budget=b, types=types)
    except CorpusError as e:
        fail(str(e))
    typer.echo(f"wrote {len(paths)} programs to {outdir}", err=True)
    if not do_verify:
        return
    bar = tqdm(total=len(paths), desc="verify", unit="prog", disable=quiet, dynamic_ncols=True)

    def progress(done, total, rec):
        bar.update(1)

    rep = verify_corpus(paths, seed=seed, workers=workers, progress=progress)
    bar.close()
    typer.echo(format_report(rep))
    if report:
        from ..io import write_json_atomic

        write_json_atomic(report, rep)
    if rep["ok"] < rep["total"]:
        raise typer.Exit(1)


@app.command()
def report(outdir: Path = typer.Argument(..., help="Output directory of `stp dataset` (finished or interrupted)."),
           no_plots: bool = typer.Option(False, "--no-plots", help="Only report.md, no PNG plots."),
           no_tokens: bool = typer.Option(False, "--no-tokens", help="Skip the token-efficiency table."),
           tokenizer: Optional[Path] = typer.Option(None, "--tokenizer",
                                                    help="A tokenizer.json to count tokens with (default: Qwen).")):
    """Summarise a dataset run: counts before/after filtering, per strategy/category/level, strategy
    diversity, pass rates per stage, first failure reasons and token efficiency (LEIR vs TIR vs CUDA).

    Prints and writes OUTDIR/report.md, OUTDIR/report_stats.json and PNG plots."""
    from ..dataset.report import ReportError, build_report

    if tokenizer is not None and not tokenizer.exists():
        fail(f"{tokenizer}: no such file")
    try:
        text, _ = build_report(outdir, plots=not no_plots, tokenizer=tokenizer, tokens=not no_tokens)
    except (ReportError, ValueError) as e:
        fail(str(e))
    typer.echo(text, nl=False)


@app.command()
def split(dataset: Path = typer.Argument(..., help="Output directory of `stp dataset` (its chat sets are split)."),
          outdir: Path = typer.Option(..., "-o", "--out",
                                      help="Directory for train.jsonl, test.jsonl, testset/, split.json and "
                                           "README.md; must not exist or be empty."),
          seed: int = typer.Option(..., "--seed", help="Seed of the choice of held-out program types."),
          test_fraction: float = typer.Option(0.1, "--test-fraction",
                                              help="Share of the chat records to hold out (whole program types), "
                                                   "between 0 and 1."),
          variants: int = typer.Option(3, "--variants", min=1,
                                       help="Variants (dtype / shape) per held-out program in testset/, as stp "
                                            "testset."),
          quiet: bool = typer.Option(False, "-q", "--quiet", help="No progress bar.")):
    """Split a dataset's chat records into train and test by holding out whole program types.

    A seeded choice of program types (the stp corpus type, else the program's name) whose records are
    about --test-fraction of all goes to test.jsonl, the rest to train.jsonl (single- and multi-answer
    records together, meta.kind says which); testset/ holds the held-out programs' evaluation cases
    (stp testset's format). Before anything is written a leak check makes sure that no test program type,
    no test prompt and no program alpha-equivalent to a test program occurs in train (a leaking type is
    moved to test); split.json and the data set card README.md report it. Exit 2 for bad input (not a
    dataset, an empty one, a fraction outside (0, 1), a non-empty OUT), 1 if a leak remained."""
    from ..dataset.split import LeakError, SplitError, make_split

    try:
        s = make_split(dataset, outdir, seed=seed, test_fraction=test_fraction, variants=variants,
                       progress=not quiet)
    except LeakError as e:
        fail(str(e), 1)
    except SplitError as e:
        fail(str(e))
    except OSError as e:
        fail(f"{e.filename or outdir}: {e.strerror or e}")
    lk = s["leak_check"]
    typer.echo(json.dumps({"records": s["records"], "held_out_types": s["held_out_types"],
                           "moved_types": [m["type"] for m in s["moved_types"]],
                           "leaks": {k: lk[k] for k in ("types", "prompts", "alpha_equivalent_programs",
                                                        "testset_cases")},
                           "testset_cases": s["testset"]["cases"]}, indent=2))
