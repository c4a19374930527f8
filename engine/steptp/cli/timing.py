"""``stp time`` (run time of LEIR programs and their speedups) and ``stp doctor`` (what this
machine can build, run and time)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import List, Optional

import typer

from .app import app
from .common import fail, load, semantic


from ..runner.device import device_problem  # noqa: E402,F401  (re-exported for the other commands)


def _same_signature(a, b) -> bool:
    def key(s):
        return sorted((t.name, t.is_output, t.dtype, tuple(t.shape)) for t in s.tensors)

    return key(a) == key(b)


@app.command("time")
def time_cmd(programs: List[Path] = typer.Argument(..., help=".leir files; speedups are against the first."),
             device: str = typer.Option("cpu", "--device", help="cpu or cuda: where the programs run and are timed."),
             as_json: bool = typer.Option(False, "--json", help="One JSON object per program."),
             number: Optional[int] = typer.Option(None, "--number", min=1,
                                                  help="Calls per measurement (default: enough for --min-repeat-ms)."),
             repeat: int = typer.Option(10, "--repeat", min=1,
                                        help="Timing rounds: measurements per program, a count (the paper used 3)."),
             warmup: int = typer.Option(3, "--warmup", min=0, help="Calls before measuring."),
             min_repeat_ms: float = typer.Option(10.0, "--min-repeat-ms", min=0.0,
                                                 help="Minimum length of one measurement in milliseconds."),
             seed: int = typer.Option(0, "--seed", help="Seed of the inputs (same for every program).")):
    """Time programs: median, min, IQR and CV (microseconds per call), and the speedup of each
    against the first (only between programs with the same signature), measured interleaved
    with the first: --repeat rounds of one measurement of each, A B, B A, ...; the speedup is
    the median of the paired ratios with a bootstrap 95 % interval, "faster"/"slower" only when
    the interval excludes 1 (the method of stp dataset --time and stp search).

    Method: performance build (CPU: LLVM opt-level 3, P loops parallel, V loops vectorized,
    bound loops serial; CUDA: the GPU form), seeded inputs, --warmup calls, then TVM's
    time_evaluator with --repeat measurements of --number calls (on CUDA each measurement
    starts from a flushed L2 cache: twice the device's L2 written first). CPU timings use
    TVM_NUM_THREADS threads (1 unless set). Warns on stderr when CV > 5 %."""
    from ..backend.errors import BackendError, LoweringError
    from ..runner.timing import NOISY_CV, compare, measure

    problem = device_problem(device)
    if problem:
        fail(problem)
    mods = []
    for p in programs:
        m = load(p)
        semantic(p, m)
        mods.append(m)
    base = None
    rows = []
    for p, m in zip(programs, mods):
        try:
            t = measure(m, device, number=number, repeat=repeat, warmup=warmup, min_repeat_ms=min_repeat_ms,
                        seed=seed)
        except LoweringError as e:
            fail(f"{p}: {e.reason}")
        except BackendError as e:
            _timing_failed(p, e)
        if base is None:
            base = (m, t)
        s = c = None
        if base[0] is m:
            s = 1.0
        elif _same_signature(base[0].signature, m.signature):
            try:
                c = compare(base[0], m, device, rounds=repeat, warmup=warmup, min_repeat_ms=min_repeat_ms, seed=seed)
            except BackendError as e:
                _timing_failed(p, e)
            s = c.speedup
        if t.cv > NOISY_CV:
            typer.echo(f"warning: {p}: CV {t.cv:.1%} > {NOISY_CV:.0%}: noisy timing (raise --repeat or "
                       f"--min-repeat-ms, or use a quieter machine)", err=True)
        rows.append((p, m, t, s, c))
        if as_json:
            extra = {"speedup_ci": list(c.ci), "speedup_verdict": c.verdict} if c is not None else {}
            typer.echo(json.dumps({"program": str(p), "name": m.signature.name, **t.as_dict(), "speedup": s, **extra}))
    if as_json:
        return
    w = max(len("program"), *(len(str(p)) for p, *_ in rows))
    typer.echo(f"{'program':<{w}}  {'median_us':>11}  {'min_us':>11}  {'iqr_us':>10}  {'cv':>6}  {'speedup':>8}  "
               f"{'95% CI':>15}  verdict")
    for p, _, t, s, c in rows:
        sp = "n/a" if s is None else f"{s:.2f}x"
        ci = f"[{c.ci[0]:.2f}, {c.ci[1]:.2f}]" if c is not None else ""
        typer.echo(f"{str(p):<{w}}  {t.median_us:>11.3f}  {t.min_us:>11.3f}  {t.iqr_us:>10.3f}  {t.cv:>6.1%}  {sp:>8}  "
                   f"{ci:>15}  {c.verdict if c is not None else ''}")
    t0 = rows[0][2]
    flush = ", L2 flushed before each" if t0.device == "cuda" else ""
    typer.echo(f"({t0.device}, {t0.threads} TVM thread(s), {t0.repeats} measurements of {t0.number} call(s) each "
               f"for the first program{flush})", err=True)


def _timing_failed(path, e) -> None:
    """Exit 1 for a program that cannot be timed; a performance form that disagrees with the
    verification form (:class:`~steptp.backend.errors.FormMismatch`) is a defect reported with
    both TVMScript forms, written to a new temporary directory."""
    from ..backend.errors import FormMismatch

    if isinstance(e, FormMismatch):
        import tempfile

        d = Path(tempfile.mkdtemp(prefix="stp-form-mismatch-"))
        (d / "verification.py").write_text(e.verification)
        (d / "performance.py").write_text(e.performance)
        fail(f"{path}: {e.reason}; both forms written to {d}", 1)
    fail(f"{path}: {e.stage}: {e.reason}", 1)


@app.command()
def doctor():
    """Print what this machine has for building, running and timing: TVM, tvm-ffi and torch versions,
    nvcc, the CUDA runtime and driver, a CUDA device, TVM's thread count. Always exit 0."""
    import os
    from importlib import metadata

    from ..backend import cuda_runtime as cr

    def version(dist: str) -> str:
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            return "not installed"

    rows = [("tvm", version("apache-tvm")), ("tvm-ffi", version("apache-tvm-ffi")), ("torch", version("torch"))]
    nvcc = cr.nvcc_path()
    if nvcc:
        import subprocess

        try:
            out = subprocess.run([nvcc, "--version"], capture_output=True, text=True, timeout=60).stdout
            rel = next((ln.strip() for ln in out.splitlines() if "release" in ln), "version unknown")
        except (OSError, subprocess.SubprocessError) as e:
            rel = f"does not run: {e}"
        rows.append(("nvcc", f"{nvcc} ({rel})"))
    else:
        rows.append(("nvcc", "not found on PATH"))
    d = cr.tvm_lib_dir()
    rows.append(("tvm runtime", str(d) if d else f"not found ({cr.TVM_RUNTIME_LIB})"))
    rows.append(("cuda runtime", cr.find_cudart() or f"not found ({cr.CUDART_SONAME})"))
    rows.append(("cuda driver", cr.find_libcuda() or f"not found ({cr.LIBCUDA_SONAME})"))
    n, why = cr.cuda_devices()
    rows.append(("cuda device", f"{n} ({cr.device_name(0)})" if n else f"none ({why})"))
    threads = os.environ.get("TVM_NUM_THREADS")
    rows.append(("tvm threads", f"TVM_NUM_THREADS={threads}" if threads else "TVM_NUM_THREADS unset (stp time uses 1)"))
    rows.append(("cuda compiler", f"{cr.cuda_compiler()} ({cr.compiler_tag()})" if cr.cuda_compiler() else "none"))
    arch = cr.device_arch()
    rows.append(("cuda arch", f"{arch} (kernels are built for it)" if arch else "no device (builds check sm_90)"))
    rows.append(("simulated device", "on (STP_CUDA_SIM=1: CUDA modules run as their CPU builds)" if cr.simulated()
                 else "off"))
    problem = cr.cuda_available()
    rows.append(("--device cuda", "available" if problem is None else f"unavailable: {problem}"))
    w = max(len(k) for k, _ in rows)
    for k, v in rows:
        typer.echo(f"{k:<{w}}  {v}")
