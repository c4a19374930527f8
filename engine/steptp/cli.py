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


def _param_text(v) -> str:
    """JSON fallback for parameter values: LEIR subterms (math domains) as LEIR text."""
    from .leir import ast as A
    from .leir.printer import format_node

    if isinstance(v, (A.Int, A.Float, A.Index, A.Tensor, A.Neg, A.BinOp, A.Call, A.Compare, A.BoolOp, A.Not)):
        return format_node(v)
    return str(v)


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
    from .engine import NoMatch, RewriteError, apply_rule, list_candidates
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
    if all_ or site is not None:
        # list (and index) only candidates whose result is valid and passes the GPU preflight
        from .engine import checked_candidates

        rows = checked_candidates(r, m, cands)
        cands = [(s, p) for s, p, st, _ in rows if st is not None]
        rejected = [(s, p, why) for s, p, st, why in rows if st is None]
        if rejected:
            typer.echo(f"{len(rejected)} candidate(s) omitted (invalid result or GPU preflight), e.g. "
                       f"site={rejected[0][0]} params={json.dumps(rejected[0][1], default=str)}: {rejected[0][2]}",
                       err=True)
        if not cands:
            _fail(f"rule {r.id}: every candidate in {program} is rejected", 1)
    if all_:
        for i, (s, params) in enumerate(cands):
            typer.echo(f"[{i}] site={s} params={json.dumps(params, default=_param_text)}")
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
    except RewriteError as e:
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
            batch: int = typer.Option(8, "--batch", min=1,
                                      help="Programs per worker task; their candidates share one nvcc run "
                                           "(the output does not depend on it)."),
            per_rule: int = typer.Option(1, "--per-rule", min=1,
                                         help="Verified steps per program and rule: N candidates (sites x parameters) "
                                              "sampled with the seed."),
            max_tries: int = typer.Option(4, "--max-tries", min=1,
                                          help="Candidates tried per verified step wanted (per rule: N x this)."),
            trials: int = typer.Option(3, "--trials", min=1, help="Seeded verification trials per check."),
            no_cuda: bool = typer.Option(False, "--no-cuda", help="Skip the CUDA source / GPU TIR in entries."),
            no_nvcc: bool = typer.Option(False, "--no-nvcc", help="Build pass without nvcc --ptx (faster)."),
            in_process: bool = typer.Option(False, "--in-process",
                                            help="Run checks in the generating process (faster, no time limit)."),
            timeout: float = typer.Option(60.0, "--timeout", help="Time limit per check in seconds (isolated mode)."),
            parquet: bool = typer.Option(False, "--parquet", help="Also write dictionary.parquet (needs pyarrow)."),
            quiet: bool = typer.Option(False, "-q", "--quiet", help="No progress bar."),
            use_ray: bool = typer.Option(False, "--ray", help="Distribute programs over a Ray cluster (a local one "
                                                             "with -j CPUs unless --ray-address is given)."),
            ray_address: Optional[str] = typer.Option(None, "--ray-address",
                                                      help="Ray cluster address (ray://host:10001, host:6379, auto); "
                                                           "implies --ray.")):
    """Generate the dictionary dataset and the single/multi-answer chat sets (ms-swift messages).

    The output files do not depend on -j or --ray: programs are recorded in input order."""
    from .dataset.generate import Options
    from .dataset.pipeline import DatasetError, generate_dataset
    from .resources import rules_dir

    rule_paths = [str(p) for p in (rules or sorted(rules_dir().glob("*.yaml")))]
    for p in rule_paths:
        if not Path(p).exists():
            _fail(f"{p}: no such rule file")
    opts = Options(seed=seed, trials=trials, per_rule=per_rule, max_tries=max_tries, with_cuda=not no_cuda, rule_paths=rule_paths,
                   isolated=not in_process, timeout_s=timeout, nvcc=not no_nvcc)
    from .dataset.distributed import RayUnavailable

    try:
        report = generate_dataset([str(i) for i in inputs], outdir, opts, workers=workers, progress=not quiet,
                                  use_ray=use_ray or ray_address is not None, ray_address=ray_address,
                                  batch=batch)
    except (DatasetError, FileNotFoundError, ValueError) as e:
        _fail(str(e))
    except RayUnavailable as e:
        _fail(str(e), 1)
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


@app.command()
def report(outdir: Path = typer.Argument(..., help="Output directory of `stp dataset` (finished or interrupted)."),
           no_plots: bool = typer.Option(False, "--no-plots", help="Only report.md, no PNG plots."),
           no_tokens: bool = typer.Option(False, "--no-tokens", help="Skip the token-efficiency table."),
           tokenizer: Optional[Path] = typer.Option(None, "--tokenizer",
                                                    help="A tokenizer.json to count tokens with (default: Qwen).")):
    """Summarise a dataset run: counts before/after filtering, per strategy/category/level, strategy
    diversity, pass rates per stage, first failure reasons and token efficiency (LEIR vs TIR vs CUDA).

    Prints and writes OUTDIR/report.md, OUTDIR/report_stats.json and PNG plots."""
    from .dataset.report import ReportError, build_report

    if tokenizer is not None and not tokenizer.exists():
        _fail(f"{tokenizer}: no such file")
    try:
        text, _ = build_report(outdir, plots=not no_plots, tokenizer=tokenizer, tokens=not no_tokens)
    except (ReportError, ValueError) as e:
        _fail(str(e))
    typer.echo(text, nl=False)


@rules_app.command("list")
def rules_list(directory: Optional[Path] = typer.Option(None, "--dir", help="Rule directory (default: shipped).")):
    """List the rules: id, category, K, P, S, score (paper eq. 1) and level."""
    from .rules import RuleError, load_rules
    from .rules.tools import rule_rows

    try:
        rows = rule_rows(load_rules(directory))
    except RuleError as e:
        _fail(str(e))
    w = max([len("id")] + [len(r["id"]) for r in rows])
    typer.echo(f"{'id':{w}}  {'category':8}  {'K':>2} {'P':>2} {'S':>2}  {'score':>5}  level")
    for r in rows:
        typer.echo(f"{r['id']:{w}}  {r['category']:8}  {r['K']:2d} {r['P']:2d} {r['S']:2d}  {r['score']:5.1f}  "
                   f"{r['level']}")
    typer.echo(f"{len(rows)} rule(s)")


def _rule_files(files) -> list:
    from .rules import RuleError, load_rule, load_rules

    try:
        return [load_rule(f) for f in files] if files else load_rules()
    except (RuleError, FileNotFoundError) as e:
        _fail(str(e))


def _programs(inputs) -> list:
    from .leir import LeirSyntaxError, load_leir

    out = []
    for i in inputs:
        p = Path(i)
        files = sorted(p.rglob("*.leir")) if p.is_dir() else [p]
        if not p.exists():
            _fail(f"{p}: no such file or directory")
        for f in files:
            try:
                out.append(load_leir(f))
            except LeirSyntaxError as e:
                _fail(str(e))
    return out


@rules_app.command("lint")
def rules_lint(files: Optional[List[Path]] = typer.Argument(None, help="Rule files (default: all shipped)."),
               program: Optional[List[Path]] = typer.Option(None, "--program",
                                                            help=".leir files/directories; the largest is the "
                                                                 "yardstick (default: examples/ if present)."),
               slow_ms: float = typer.Option(1000.0, "--slow-ms", help="Warn above this matching time on the "
                                                                       "scaled program."),
               nests: int = typer.Option(120, "--nests", help="Scale the yardstick program to this many nests."),
               strict: bool = typer.Option(False, "--strict", help="Exit 1 on warnings.")):
    """Validate rule files and warn about preconditions whose matching cost explodes.

    Each rule is loaded (schema, patterns, relations, templates, tests' LEIR) and matched on
    the largest bundled program and on a copy scaled to --nests nests."""
    from .rules.tools import largest_program, lint_rules

    rules = _rule_files(files)
    typer.echo(f"{len(rules)} rule file(s) load and validate")
    paths = program or ([Path("examples")] if Path("examples").is_dir() else [])
    mod = largest_program(paths) if paths else None
    if mod is None:
        typer.echo("no .leir program given (--program): matching cost not checked")
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
    elif strict:
        raise typer.Exit(1)


@rules_app.command("coverage")
def rules_coverage(inputs: List[Path] = typer.Argument(..., help=".leir files or directories."),
                   rules: Optional[List[Path]] = typer.Option(None, "--rule", help="Rule file(s); default: shipped."),
                   per_program: int = typer.Option(3, "--per-program", min=1,
                                                   help="Candidates tried per rule and program."),
                   seed: int = typer.Option(0, "--seed"),
                   trials: int = typer.Option(3, "--trials", min=1),
                   nvcc: bool = typer.Option(False, "--nvcc", help="Also run nvcc --ptx in the Build pass.")):
    """Apply every rule to every program it matches, verify, and tabulate per strategy."""
    from .rules.tools import coverage, format_coverage

    rs = _rule_files(rules)
    progs = _programs(inputs)
    if not progs:
        _fail("no .leir programs found")
    rows = coverage(rs, progs, per_program=per_program, seed=seed, trials=trials, nvcc=nvcc)
    typer.echo(format_coverage(rows))
    if any(r.tried > r.equal for r in rows):
        raise typer.Exit(1)


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
