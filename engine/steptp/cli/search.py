"""``stp search``: multi-step optimisation of programs (paper §4.4, App. B.2); a thin layer
over :mod:`steptp.search`."""

from __future__ import annotations

import math
from pathlib import Path
from typing import List, Optional

import typer

from .app import app
from .common import fail, internal_errors_exit, rules_option, use_rule_dirs

#: Exit code of a search that waits for a remote runner's measurements (--runner pack).
EXIT_WAITING = 3

ALGORITHM_HELP = ("greedy, beam, bfs, dfs, mcts, chain or chain-no-parent (paper App. B.2), or evolutionary (TVM "
                  "MetaSchedule: population, rule mutations, model-scored selection, the top 2 per round measured).")


@app.command()
def search(programs: List[Path] = typer.Argument(..., help=".leir files, PyTorch .py files (translated) or "
                                                           "directories of them."),
           out: Path = typer.Option(..., "-o", "--out", help="Output directory (one sub-directory per program "
                                                              "when there are several; resumable)."),
           algorithm: str = typer.Option("greedy", "--algorithm", "-a", help=ALGORITHM_HELP),
           policy: str = typer.Option("engine", "--policy", help="engine (rule engine), llm (chat endpoint) or "
                                                                 "replay (JSONL file)."),
           rank: str = typer.Option("random", "--rank", help="Engine policy: random (seeded), cost (static cost "
                                                             "model) or model[:PATH] (learned cost model, stp "
                                                             "costmodel train; refitted online on the search's "
                                                             "samples; without PATH online only) choice of the K "
                                                             "candidates (model: 32 screened per node). With "
                                                             "--algorithm evolutionary: the selection score."),
           endpoint: Optional[str] = typer.Option(None, "--endpoint", help="OpenAI-compatible URL, e.g. "
                                                                           "http://127.0.0.1:8000/v1 (--policy llm)."),
           model: Optional[str] = typer.Option(None, "--model", help="Model name at the endpoint (--policy llm)."),
           api_key: Optional[str] = typer.Option(None, "--api-key", help="Default: $OPENAI_API_KEY."),
           replay: Optional[Path] = typer.Option(None, "--replay", help="JSONL proposals (--policy replay)."),
           device: str = typer.Option("cpu", "--device", "--target",
                                      help="cpu or cuda: where candidates are verified and timed, as in stp verify "
                                           "and stp dataset (--target: deprecated alias)."),
           iterations: Optional[int] = typer.Option(None, "--iterations", "-n", min=1,
                                                    help="Iterations (expansions for bfs/dfs); default 20."),
           breadth: Optional[int] = typer.Option(None, "--breadth", min=1, help="Greedy: candidates per step (2)."),
           per_node: Optional[int] = typer.Option(None, "--per-node", min=1,
                                                  help="Beam 3, bfs/dfs 2, mcts 1: candidates per expansion."),
           beam_k: Optional[int] = typer.Option(None, "--beam-k", min=1, help="Beam: frontier size k (2)."),
           max_depth: Optional[int] = typer.Option(None, "--max-depth", min=1, help="bfs/dfs: max depth (20)."),
           exploration: Optional[float] = typer.Option(None, "--exploration", min=0.0,
                                                       help="MCTS: UCT exploration constant c (sqrt 2)."),
           rollout_depth: Optional[int] = typer.Option(None, "--rollout-depth", min=0,
                                                       help="MCTS: policy steps per rollout (1)."),
           population: Optional[int] = typer.Option(None, "--population", min=1,
                                                    help="evolutionary: fastest measured programs mutated per "
                                                         "round (4)."),
           screen: Optional[int] = typer.Option(None, "--screen", min=1,
                                                help="evolutionary: proposals per parent scored by the cost "
                                                     "model (32)."),
           measure: Optional[int] = typer.Option(None, "--measure", min=1,
                                                 help="evolutionary: best-scored candidates verified and timed "
                                                      "per round (2)."),
           max_samples: Optional[int] = typer.Option(None, "--max-samples", min=1,
                                                     help="Stop a search after this many verified samples."),
           per_rule: int = typer.Option(8, "--candidates-per-rule", min=1,
                                        help="Engine policy: at most N candidates (a seeded sample) per rule and "
                                             "program, a count."),
           seed: int = typer.Option(0, "--seed"),
           temperature: float = typer.Option(0.3, "--temperature", min=0.0, help="LLM sampling temperature (paper: "
                                                                                 "0.3)."),
           max_tokens: Optional[int] = typer.Option(None, "--max-tokens", min=1),
           request_timeout: float = typer.Option(600.0, "--request-timeout", min=1.0,
                                                 help="Seconds: time limit of one endpoint request."),
           timeout: float = typer.Option(120.0, "--timeout", min=1.0,
                                         help="Seconds: time limit of one verification check (a candidate built "
                                              "and run against the root in the worker)."),
           export_chat: Optional[Path] = typer.Option(None, "--export-chat",
                                                      help="Also write each best trajectory as a multi-step chat "
                                                           "record (ms-swift {\"messages\": [...]}) to this JSONL."),
           quiet: bool = typer.Option(False, "-q", "--quiet", help="No progress bars."),
           time_limit: Optional[float] = typer.Option(None, "--time-limit", min=1.0,
                                                      help="Seconds per program: the search stops at its next "
                                                           "check and writes what it has (summary.json 'stopped')."),
           lookahead: int = typer.Option(1, "--lookahead", min=1,
                                         help="Engine policy with --rank cost: tree levels ranked by the static cost "
                                              "model before proposing (L > 1: the --expand best programs of a level "
                                              "are expanded again; every program met is a multi-step proposal, each "
                                              "step verified). Makes a round of a GPU search reach further."),
           expand: int = typer.Option(3, "--expand", min=1,
                                      help="With --lookahead > 1: programs of a level expanded at the next."),
           runner: str = typer.Option("local", "--runner",
                                      help="local: measure on this machine's --device; pack (with --device cuda): "
                                           "each batch of candidates is written as a GPU pack to "
                                           "OUT/rounds/<k>/pack for python -m steptp.gpu.run on a GPU node (exit 3 "
                                           "while waiting; rerun the same command with the results in place). Any "
                                           "--algorithm."),
           arch: str = typer.Option("sm_90", "--arch", help="--runner pack: the GPU node's architecture (sm_XY)."),
           workers: int = typer.Option(1, "-j", "--workers", min=1,
                                       help="--runner pack: worker processes searching programs in parallel (the "
                                            "rounds do not depend on it)."),
           no_sim: bool = typer.Option(False, "--no-sim",
                                       help="--runner pack: packs without the simulated device's CPU builds (a "
                                            "real GPU node does not need them)."),
           rule_dirs: Optional[List[Path]] = rules_option()):
    """Search for a faster equivalent program: every candidate is verified against the root
    (3 seeded random + 2 ordered trials) and only Equal ones are timed (samples).

    Writes OUT/summary.json (samples, speedup = Runtime_root/Runtime_best, strategies,
    efficiency = speedup/samples, best, trajectory), OUT/best.leir and OUT/tree.jsonl per
    program, OUT/report.md (Table 3/4-style rows, speedup-vs-samples plot) and
    OUT/run_summary.json (failed programs: internal_errors apart from input_errors). Exit 0
    when the searches ran (a search without any speedup included), 1 when the endpoint is
    unreachable or every program failed with an internal error, 2 for bad input or an
    unavailable --device.

    With --runner pack (--device cuda; no GPU needed here) the same search runs in rounds:
    candidates are verified on this CPU (with the GPU preflight and CUDA code generation), each
    batch to measure is written as a pack, the command exits 3 with the node's command, and the
    same command run again with the node's results replays the search from its caches and goes
    on; every flag keeps its meaning, and the summaries have the same keys (plus the node's
    PyTorch eager timing)."""
    use_rule_dirs(rule_dirs)
    from ..runner import kinds

    if runner not in kinds.names():
        fail(f"--runner {runner}: expected {' or '.join(kinds.names())}")
    if lookahead > 1 and (policy != "engine" or rank != "cost" or algorithm == "evolutionary"):
        fail("--lookahead: only with --policy engine and --rank cost (the static model ranks the levels; "
             "evolutionary screens by itself)")
    if runner == "pack":
        if device != "cuda":
            fail("--runner pack measures on a GPU node: use it with --device cuda")
    else:
        for flag, given in (("-j/--workers", workers != 1), ("--arch", arch != "sm_90"), ("--no-sim", no_sim)):
            if given:
                fail(f"{flag}: only with --runner pack (the local runner times on this machine, one program at a "
                     "time)")
    from ..search import ALGORITHMS, POLICIES, SearchConfig, SearchInputError, TargetUnavailable
    from ..search.run import export_chat as do_export
    from ..search.run import search_many

    if algorithm not in ALGORITHMS:
        fail(f"--algorithm {algorithm}: expected one of {', '.join(ALGORITHMS)}")
    if policy not in POLICIES:
        fail(f"--policy {policy}: expected one of {', '.join(POLICIES)}")
    if device not in ("cpu", "cuda"):
        fail(f"--device {device}: expected cpu or cuda")
    from ..cost_model import create, parse_kind
    from ..cost_model.learned import CostModelError, CostModelUnavailable

    try:
        if parse_kind(rank)[0] == "model":
            create(rank, device, seed)  # LightGBM and the model file, before anything is written
    except (ValueError, CostModelError, CostModelUnavailable) as e:
        fail(str(e))
    if device == "cuda" and runner == "local":
        from ..search.evaluate import cuda_problem

        why = cuda_problem()
        if why:
            fail(f"--device cuda: {why}")
    if policy == "replay" and replay is None:
        fail("--policy replay needs --replay FILE.jsonl")
    if policy == "llm" and (not endpoint or not model):
        fail("--policy llm needs --endpoint URL and --model NAME")
    if out.exists() and not out.is_dir():
        fail(f"{out}: exists and is not a directory")
    client = None
    if policy == "llm":
        from ..llm.client import ChatClient, EndpointError

        try:
            client = ChatClient(endpoint, model, api_key=api_key, timeout_s=request_timeout)
            client.check()
        except EndpointError as e:
            fail(str(e), 1)
    overrides = {"breadth": breadth, "per_node": per_node, "k": beam_k, "max_depth": max_depth, "c": exploration,
                 "rollout_depth": rollout_depth, "population": population, "screen": screen, "measure": measure}
    from ..search.algorithms import DEFAULTS

    bad = [k for k, v in overrides.items() if v is not None and k not in DEFAULTS[algorithm]]
    if bad:
        names = {"breadth": "--breadth", "per_node": "--per-node", "k": "--beam-k", "max_depth": "--max-depth",
                 "c": "--exploration", "rollout_depth": "--rollout-depth", "population": "--population",
                 "screen": "--screen", "measure": "--measure"}
        fail(f"{', '.join(names[b] for b in bad)}: not a parameter of --algorithm {algorithm}")
    cfg = SearchConfig(algorithm=algorithm, policy=policy, rank=rank, device=device, seed=seed, iterations=iterations,
                       overrides={k: v for k, v in overrides.items() if v is not None}, per_rule=per_rule,
                       timeout_s=timeout, max_samples=max_samples, temperature=temperature, max_tokens=max_tokens,
                       replay=str(replay) if replay else None, progress=not quiet, time_limit_s=time_limit,
                       runner=runner, lookahead=lookahead, expand=expand)
    errors: list[str] = []
    info: dict = {}
    import signal

    def _interrupt(signum, frame):  # outside a running search (which stops itself): as Ctrl-C
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, _interrupt)
    try:
        sms = search_many([str(p) for p in programs], out, cfg, client=client,
                          on_error=lambda p, m: errors.append(m), run_info=info, workers=workers,
                          builder=_pack_builder(arch, not no_sim) if runner == "pack" else None)
    except SearchInputError as e:
        fail(str(e))
    except TargetUnavailable as e:
        fail(str(e))
    except OSError as e:
        fail(f"{getattr(e, 'filename', None) or out}: {e.strerror or e}")
    except KeyboardInterrupt:
        fail("interrupted; rerun the same command to resume", 1)
    except Exception as e:  # noqa: BLE001 - one line, never a traceback
        fail(f"search failed: {type(e).__name__}: {' '.join(str(e).split())[:300]}", 1)
    for m in errors:
        typer.echo(f"skipped: {m}", err=True)
    waiting = info.get("waiting")
    if waiting:
        import shlex
        import sys

        cmd = " ".join(shlex.quote(a) for a in sys.argv)
        typer.echo(f"round {waiting['round']}: {len(info.get('pending', []))} program(s) waiting for "
                   f"{waiting['entries']} measurement(s). On the GPU node run:\n"
                   f"  python -m steptp.gpu.run {shlex.quote(waiting['pack'])} -o {shlex.quote(waiting['results'])} "
                   f"--time --retime-best 1 --baselines --compile --autotune --sanitizer\n"
                   f"(or benchmarks/gpu_at_size.sh with time caps)\n"
                   f"then, with the results copied back to {waiting['results']}, run this command again:\n  {cmd}")
        if not info.get("internal_errors"):
            raise typer.Exit(EXIT_WAITING)
    if info.get("stopped"):
        typer.echo(f"stopped ({info['stopped']}): partial summaries written; rerun the same command to resume",
                   err=True)
    for sm in sms:
        eager = sm.get("speedup_vs_eager")
        extra = "" if eager is None or not math.isfinite(eager) else f"  vs eager {eager:.2f}x"
        if sm.get("runner") == "pack":
            extra += f"  rounds {sm.get('rounds')}"
        typer.echo(f"{sm['program']}: {sm['algorithm']}/{sm['policy']} samples {sm['samples']}  speedup "
                   f"{sm['speedup']:.2f}x  strategies {sm['strategies']}  efficiency {sm['efficiency']:.2f}{extra}")
    typer.echo(f"wrote {Path(out) / 'report.md'}", err=True)
    if export_chat is not None:
        n = do_export(out, export_chat)
        typer.echo(f"wrote {n} chat record(s) to {export_chat}", err=True)
    internal_errors_exit(info.get("internal_errors", 0), info.get("programs", 0), Path(out) / "run_summary.json")
    if info.get("stopped"):
        raise typer.Exit(1)


def _pack_builder(arch: str, sim: bool):
    """The ``pack`` runner's Builder (:class:`steptp.gpu.pack.PackBuilder`) for ``arch``,
    composed here so that neither the runner nor the search imports the GPU front end."""
    from ..gpu.pack import PackBuilder

    return PackBuilder(arch, sim)
