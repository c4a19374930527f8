"""``stp`` command line (typer).

Data flow: ``translate`` (PyTorch -> LEIR) -> ``apply`` (one rule step) -> ``lower``
(LEIR -> TIR / CUDA) -> ``verify`` -> ``dataset`` (all of it, in batch).
Exit codes: 0 success, 1 a check failed (verification, no match), 2 bad input.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import List, Optional

import typer

app = typer.Typer(add_completion=False, no_args_is_help=True, rich_markup_mode=None,
                  help="Step-TP: build a step-level, verified LEIR transformation dataset from PyTorch programs.")
rules_app = typer.Typer(no_args_is_help=True, help="Inspect and self-test the rule files.")
app.add_typer(rules_app, name="rules")


def _fail(msg: str, code: int = 2) -> None:
    typer.echo(f"error: {msg}", err=True)
    raise typer.Exit(code)


def _load(path: Path):
    from .leir import LeirSyntaxError, load_leir

    if not path.exists():
        _fail(f"{path}: no such file")
    try:
        return load_leir(path)
    except LeirSyntaxError as e:
        _fail(str(e))
    except OSError as e:
        _fail(f"{path}: cannot read: {e.strerror or e}")


def _semantic(path: Path, m) -> None:
    """Exit 2 with ``FILE: message`` when the program is not meaningful (analysis)."""
    from .leir.analysis import LeirSemanticError, analyze

    try:
        analyze(m.program, m.signature)
    except LeirSemanticError as e:
        _fail(f"{_locate(path, str(e))}: {e}")


def _locate(path: Path, message: str) -> str:
    """``FILE:LINE:COLUMN`` of the first equation quoted in a semantic error message when
    it occurs verbatim in the file (canonical LEIR, as ``stp`` writes it), else ``FILE``."""
    import re

    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return str(path)
    for quoted in re.findall(r"'([^']*=[^']*;)'", message):
        pos = text.find(quoted)
        if pos >= 0:
            line = text.count("\n", 0, pos) + 1
            return f"{path}:{line}:{pos - (text.rfind(chr(10), 0, pos) + 1) + 1}"
    return str(path)


@app.command()
def parse(file: Path = typer.Argument(..., help="A .leir file.")):
    """Parse a .leir file and print its canonical form (or the syntax error with line and column)."""
    from .leir import format_leir

    m = _load(file)
    _semantic(file, m)
    typer.echo(format_leir(m), nl=False)


@app.command()
def lower(file: Path = typer.Argument(..., help="A .leir file."),
          cuda: bool = typer.Option(False, "--cuda", help="Print the CUDA source instead of TVMScript."),
          cpu: bool = typer.Option(False, "--cpu", help="Print the CPU variant (thread bindings made serial).")):
    """Lower LEIR to TVM TIR (TVMScript text), or to CUDA source with --cuda."""
    from .backend import BackendError, cuda_source, lower as lower_fn
    from .leir.analysis import LeirSemanticError

    m = _load(file)
    _semantic(file, m)
    try:
        if cuda:
            typer.echo(cuda_source(m))
        else:
            typer.echo(lower_fn(m, target="cpu" if cpu else "cuda"))
    except (BackendError, LeirSemanticError) as e:
        _fail(f"{file}: {e}", 1)


@app.command()
def translate(model: Path = typer.Argument(..., help="KernelBench-style .py file (Model, get_inputs, get_init_inputs)."),
              output: Optional[Path] = typer.Option(None, "-o", "--output", help="Write the .leir file here."),
              do_verify: bool = typer.Option(False, "--verify", help="Check the LEIR against PyTorch (3 seeded trials)."),
              seed: int = typer.Option(0, "--seed", help="Seed of the verification inputs."),
              dtype: Optional[str] = typer.Option(None, "--dtype", help="Cast the model and inputs: f16, f32 or f64."),
              eval_mode: bool = typer.Option(False, "--eval", help="Put the model in eval() mode first (dropout off, "
                                                                   "running batch-norm statistics).")):
    """Translate a PyTorch program to LEIR; with --verify exit non-zero unless it matches PyTorch."""
    from .frontend import TranslationError, translate_file
    from .leir import format_leir, save_leir

    if not model.exists():
        _fail(f"{model}: no such file")
    try:
        tr = translate_file(model, dtype=dtype, eval_mode=eval_mode)
    except TranslationError as e:
        _fail(f"{model}: {e}", 1)
    if output:
        output.parent.mkdir(parents=True, exist_ok=True)
        save_leir(tr.module, output)
        typer.echo(f"wrote {output}", err=True)
    else:
        typer.echo(format_leir(tr.module), nl=False)
    if do_verify:
        res = tr.verify(trials=3, seed=seed)
        _print_verification(res)
        if not res.equal:
            raise typer.Exit(1)


def _print_verification(res) -> None:
    for name in ("diff", "build", "exec", "equal"):
        if hasattr(res, name):
            val = getattr(res, name)
            typer.echo(f"{name.capitalize():6} {'pass' if val else 'FAIL'}")
    def num(x) -> str:
        return "n/a" if x is None else f"{x:.3g}"

    typer.echo(f"max_abs_err {num(res.max_abs_err)}  max_rel_err {num(res.max_rel_err)}  trials {res.trials}")
    if res.reason:
        typer.echo(f"reason: {res.reason}")


@app.command()
def verify(original: Path = typer.Argument(..., help="Original .leir file."),
           transformed: Path = typer.Argument(..., help="Transformed .leir file (same known tensors)."),
           seed: int = typer.Option(0, "--seed"),
           trials: int = typer.Option(3, "--trials", min=1),
           no_nvcc: bool = typer.Option(False, "--no-nvcc", help="Build pass without nvcc --ptx."),
           timeout: float = typer.Option(300.0, "--timeout", min=1.0,
                                         help="Time limit in seconds for building and running each program.")):
    """Check a transformed program against its original: prints Diff/Build/Exec/Equal; exit 0 only on Equal.

    Build = CPU (llvm) build + GPU preflight + TVM CUDA codegen + nvcc --ptx (when nvcc is on PATH).
    Both programs run in a worker process with a time limit (a crash or hang is an Exec failure),
    intermediates and outputs start as NaN (a read of an element never written fails), and
    programs whose buffers exceed 2 GiB are refused before anything runs."""
    from .verify import verify_pair

    a, b = _load(original), _load(transformed)
    res = verify_pair(a, b, trials=trials, seed=seed, nvcc=not no_nvcc, isolated=True, timeout_s=timeout)
    _print_verification(res)
    if not res.equal:
        raise typer.Exit(1)


def _guard_rule(path: Path, fn):
    """Run ``fn`` (loading or applying a rule); a broken rule file becomes ``FILE: field:
    message`` and exit 2, never a traceback. :class:`NoMatch` passes through."""
    from .rules.errors import rule_problem

    try:
        return fn()
    except FileNotFoundError:
        _fail(f"{path}: no such rule file")
    except Exception as e:  # noqa: BLE001 - classified below; NoMatch is re-raised
        msg = rule_problem(e, path)
        if msg is None:
            raise
        _fail(msg)


@app.command()
def apply(rule: Path = typer.Argument(..., help="A rule YAML file, e.g. rules/loop_split.yaml."),
          program: Path = typer.Argument(..., help="A .leir file."),
          seed: int = typer.Option(0, "--seed", help="Seed for choosing the site and parameters."),
          site: Optional[int] = typer.Option(None, "--site", help="Apply at candidate K (see --all)."),
          all_: bool = typer.Option(False, "--all", help="List every candidate (site and parameters) and exit."),
          output: Optional[Path] = typer.Option(None, "-o", "--output", help="Write the transformed .leir here."),
          do_verify: bool = typer.Option(False, "--verify", help="Also verify the step numerically.")):
    """Apply one rule at one site: print the transformed LEIR and its chain of thought."""
    from .engine import NoMatch, apply_rule, list_candidates
    from .leir import format_program, save_leir
    from .rules import load_rule

    r = _guard_rule(rule, lambda: load_rule(rule))
    m = _load(program)
    _semantic(program, m)
    try:
        cands = _guard_rule(rule, lambda: list_candidates(r, m))
    except NoMatch as e:
        _fail(str(e), 1)
    if not cands:
        _fail(f"rule {r.id} does not match {program}", 1)
    if all_:
        for i, (s, params) in enumerate(cands):
            typer.echo(f"[{i}] site={s} params={json.dumps(params, default=str)}")
        return
    chosen = None
    params = None
    if site is not None:
        if not 0 <= site < len(cands):
            _fail(f"--site {site} out of range: {len(cands)} candidate(s), see --all")
        chosen, params = cands[site]
    try:
        step = _guard_rule(rule, lambda: apply_rule(r, m, seed=seed, site=chosen, params=params))
    except NoMatch as e:
        _fail(str(e), 1)
    typer.echo(format_program(step.after.program))
    typer.echo("")
    typer.echo(step.cot)
    if output:
        output.parent.mkdir(parents=True, exist_ok=True)
        save_leir(step.after, output)
        typer.echo(f"wrote {output}", err=True)
    if do_verify:
        from .verify import verify_pair

        res = verify_pair(m, step.after, trials=3, seed=seed, isolated=True, timeout_s=300.0)
        _print_verification(res)
        if not res.equal:
            raise typer.Exit(1)


@app.command()
def dataset(inputs: List[Path] = typer.Argument(..., help=".py model files, .leir files or directories."),
            outdir: Path = typer.Option(..., "-o", "--out", help="Output directory (resumable)."),
            seed: int = typer.Option(0, "--seed"),
            rules: Optional[List[Path]] = typer.Option(None, "--rule", help="Rule file(s); default: all shipped rules."),
            workers: int = typer.Option(1, "-j", "--workers", min=1, help="Parallel worker processes (spawn)."),
            per_rule: int = typer.Option(1, "--per-rule", min=1, help="Verified steps kept per program and rule."),
            trials: int = typer.Option(3, "--trials", min=1, help="Seeded verification trials per check."),
            no_cuda: bool = typer.Option(False, "--no-cuda", help="Skip the CUDA source / GPU TIR in entries."),
            no_nvcc: bool = typer.Option(False, "--no-nvcc", help="Build pass without nvcc --ptx (faster)."),
            in_process: bool = typer.Option(False, "--in-process",
                                            help="Run checks in the generating process (faster, no time limit)."),
            timeout: float = typer.Option(60.0, "--timeout", help="Time limit per check in seconds (isolated mode)."),
            parquet: bool = typer.Option(False, "--parquet", help="Also write dictionary.parquet (needs pyarrow)."),
            quiet: bool = typer.Option(False, "-q", "--quiet", help="No progress bar.")):
    """Generate the dictionary dataset and the single/multi-answer chat sets (ms-swift messages)."""
    from .dataset.generate import Options
    from .dataset.pipeline import DatasetError, generate_dataset
    from .resources import rules_dir

    rule_paths = [str(p) for p in (rules or sorted(rules_dir().glob("*.yaml")))]
    for p in rule_paths:
        if not Path(p).exists():
            _fail(f"{p}: no such rule file")
    opts = Options(seed=seed, trials=trials, per_rule=per_rule, with_cuda=not no_cuda, rule_paths=rule_paths,
                   isolated=not in_process, timeout_s=timeout, nvcc=not no_nvcc)
    try:
        report = generate_dataset([str(i) for i in inputs], outdir, opts, workers=workers, progress=not quiet)
    except (DatasetError, FileNotFoundError, ValueError) as e:
        _fail(str(e))
    except OSError as e:
        _fail(f"{e.filename or outdir}: {e.strerror or e}")
    if parquet:
        from .dataset.writers import to_parquet

        try:
            to_parquet(outdir / "dictionary.jsonl", outdir / "dictionary.parquet")
        except OSError as e:
            _fail(f"{e.filename or outdir / 'dictionary.parquet'}: cannot write: {e.strerror or e}")
    typer.echo(json.dumps({k: report[k] for k in ("programs", "entries", "chat_single", "chat_multi",
                                                   "by_strategy", "by_level")}, indent=2))
    if report["programs_failed"]:
        typer.echo(f"{len(report['programs_failed'])} program(s) skipped; see {outdir}/report.json", err=True)


@app.command()
def corpus(outdir: Path = typer.Option(..., "-o", "--out", help="Directory for the generated .py programs."),
           count: int = typer.Option(100, "--count", min=1, help="Number of programs."),
           seed: int = typer.Option(0, "--seed"),
           budget: Optional[int] = typer.Option(None, "--budget", min=1,
                                                help="Work budget per program (estimated FLOPs + input elements)."),
           gpu: bool = typer.Option(False, "--gpu", help="Use the large GPU work budget (2^34)."),
           types: Optional[List[str]] = typer.Option(None, "--type", help="Restrict to these program types."),
           do_verify: bool = typer.Option(False, "--verify", help="Translate and verify every program; report the rate."),
           workers: int = typer.Option(1, "-j", "--workers", min=1),
           report: Optional[Path] = typer.Option(None, "--report", help="Write the verification report (JSON)."),
           quiet: bool = typer.Option(False, "-q", "--quiet", help="No progress bar.")):
    """Generate KernelBench-style PyTorch programs (paper §3.1) with seeded shapes and dtypes."""
    from tqdm import tqdm

    from .dataset.corpus import DEFAULT_BUDGET, GPU_BUDGET, CorpusError, format_report, generate_corpus, verify_corpus

    b = budget if budget is not None else (GPU_BUDGET if gpu else DEFAULT_BUDGET)
    try:
        paths = generate_corpus(outdir, count, seed=seed, budget=b, types=types)
    except CorpusError as e:
        _fail(str(e))
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
        from .dataset.writers import write_json_atomic

        write_json_atomic(report, rep)
    if rep["ok"] < rep["total"]:
        raise typer.Exit(1)


@rules_app.command("list")
def rules_list():
    """List the shipped rules with category and difficulty."""
    from .dataset.difficulty import difficulty_level, difficulty_score
    from .rules import load_rules

    for r in load_rules():
        d = r.difficulty
        s = difficulty_score(d["K"], d["P"], d["S"])
        typer.echo(f"{r.id:28} {r.category:9} score {s:4.1f} {difficulty_level(s)}")


@rules_app.command("test")
def rules_test(files: Optional[List[Path]] = typer.Argument(None, help="Rule files (default: all shipped)."),
               no_verify: bool = typer.Option(False, "--no-verify", help="Skip numeric verification.")):
    """Run each rule's own before/after tests (exact LEIR) and verify them numerically."""
    from .rules.selftest import run_selftests

    for f in files or []:
        _guard_rule(f, lambda f=f: __import__("steptp.rules", fromlist=["load_rule"]).load_rule(f))
    from .rules import RuleError

    try:
        ok = run_selftests([str(f) for f in files] if files else None, verify=not no_verify, echo=typer.echo)
    except RuleError as e:
        _fail(str(e))
    if not ok:
        raise typer.Exit(1)


def main() -> None:  # pragma: no cover
    app()


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
