"""``stp gpu pack`` / ``run`` / ``merge``: build here, run on a GPU node, merge back."""

from __future__ import annotations

import json
from pathlib import Path
from typing import List, Optional

import typer

from .app import gpu_app
from .common import fail


@gpu_app.command("pack")
def pack(inputs: List[Path] = typer.Argument(..., help="Dataset directories (dictionary.jsonl) or .leir programs "
                                                       "(the first is the original, the others its candidates)."),
         outdir: Path = typer.Option(..., "-o", "--out", help="New pack directory."),
         arch: str = typer.Option("sm_90", "--arch", help="GPU architecture of the node that will run it (sm_XY)."),
         batch: int = typer.Option(32, "--batch", min=1, help="Programs per built library."),
         limit: Optional[int] = typer.Option(None, "--limit", min=1, help="Pack only the first N entries."),
         trials: int = typer.Option(3, "--trials", min=1, help="Random trials (plus 2 ordered ones)."),
         no_sim: bool = typer.Option(False, "--no-sim", help="Leave out the CPU builds of the simulated device "
                                                             "(a real GPU node does not need them); the originals' "
                                                             "reference builds always stay."),
         store_references: bool = typer.Option(False, "--store-references",
                                               help="Also store the CPU reference outputs (large), for a node whose "
                                                    "CPU cannot run x86-64 code."),
         quiet: bool = typer.Option(False, "-q", "--quiet")):
    """Build every entry's original and transformed GPU form (and CPU form, for the simulator) in
    batched libraries with their PTX, the originals' verification-form CPU builds (the node computes
    the references), input seeds and digests, the PyTorch files of .py programs, TVM's runtime
    libraries and the runtime-only runner: a directory `python -m steptp.gpu.run` runs on a GPU node
    with only numpy and apache-tvm-ffi. Prints the pack's size."""
    from tqdm import tqdm

    from ..backend.cuda_runtime import arch_level
    from ..backend.errors import BuildError
    from ..gpu.pack import PackError, build_pack

    if arch_level(arch) is None:
        fail(f"--arch {arch}: expected sm_XY (e.g. sm_90)")
    for p in inputs:
        if not p.exists():
            fail(f"{p}: no such file or directory")
    bars: dict = {}

    def progress(stage, done, total):
        if quiet:
            return
        bar = bars.get(stage) or bars.setdefault(stage, tqdm(total=total, desc=stage, dynamic_ncols=True))
        bar.n = done
        bar.refresh()

    try:
        s = build_pack([str(p) for p in inputs], outdir, arch=arch, trials=trials, batch=batch, limit=limit,
                       sim=not no_sim, store_references=store_references, progress=progress)
    except PackError as e:
        fail(str(e))
    except BuildError as e:
        fail(f"cannot build the pack: {e.reason}")
    except OSError as e:
        fail(f"{e.filename or outdir}: {e.strerror or e}")
    finally:
        for b in bars.values():
            b.close()
    typer.echo(json.dumps(s, indent=1))
    typer.echo(f"pack: {s['entries']} entries, {s['bytes'] / 2**20:.1f} MB in {outdir} "
               f"(references {s['references']})", err=True)
    if s["entries"] == 0:
        fail(f"no entry could be packed ({s['skipped']} skipped: see {outdir}/manifest.json)", 1)


@gpu_app.command("run")
def run(pack_dir: Path = typer.Argument(..., help="Pack directory (stp gpu pack)."),
        outdir: Path = typer.Option(..., "-o", "--out", help="Results directory (resumable)."),
        time_it: bool = typer.Option(False, "--time", help="Time original vs transformed, interleaved."),
        deadline_s: Optional[float] = typer.Option(None, "--deadline-s", help="Stop cleanly after this many seconds."),
        timeout: float = typer.Option(120.0, "--timeout", help="Seconds: time limit of one verification check on "
                                                                     "the node (one entry's runs and timing in its "
                                                                     "worker)."),
        jobs: Optional[int] = typer.Option(None, "-j", "--jobs", min=1,
                                           help="GPU worker processes (default: one per GPU), spread over the GPUs."),
        ref_jobs: Optional[int] = typer.Option(None, "--ref-jobs", min=1,
                                               help="CPU workers computing the references (default: half the CPUs, "
                                                    "1 to 8)."),
        no_eager: bool = typer.Option(False, "--no-eager", help="Do not time PyTorch eager beside .py programs."),
        compile_: bool = typer.Option(False, "--compile", help="Also time torch.compile (warm-up outside timing)."),
        quiet: bool = typer.Option(False, "-q", "--quiet")):
    """Run a pack here: the same as `python -m steptp.gpu.run PACK -o OUT` on a GPU node."""
    from ..gpu.run import main

    args = [str(pack_dir), "-o", str(outdir), "--timeout", str(timeout)]
    args += ["-j", str(jobs)] if jobs is not None else []
    args += ["--ref-jobs", str(ref_jobs)] if ref_jobs is not None else []
    args += ["--time"] if time_it else []
    args += ["--no-eager"] if no_eager else []
    args += ["--compile"] if compile_ else []
    args += ["--deadline-s", str(deadline_s)] if deadline_s is not None else []
    args += ["-q"] if quiet else []
    code = main(args)
    if code:
        raise typer.Exit(code)


@gpu_app.command("merge")
def merge_cmd(results: Path = typer.Argument(..., help="Results directory of a pack run."),
              dataset: Path = typer.Argument(..., help="The dataset directory the pack was made from.")):
    """Write GPU verdicts and timings into the dataset's entries (verification_gpu, timing_gpu)."""
    from ..gpu.merge import MergeError, merge

    try:
        s = merge(results, dataset)
    except MergeError as e:
        fail(str(e))
    typer.echo(json.dumps(s, indent=1))
