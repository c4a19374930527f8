"""Running searches and writing their results (``stp search``).

One search per program (:func:`search_program`) writes into its directory:

* ``summary.json``: ``samples`` (Equal, timed candidates), ``speedup`` (the **re-timed**
  speedup of the final best over the root: both timed again interleaved,
  :func:`steptp.runner.timing.compare`, 10 rounds; the median of the paired ratios when its
  95 % interval lies above 1, else 1: no reproducible improvement), ``speedup_best_sample``
  (Runtime_root / Runtime_best from the search's own 3-measurement samples: the best of many
  noisy samples, which overstates), ``strategies`` (distinct strategies on the best
  trajectory), ``efficiency`` (speedup / samples; 0 with no sample), ``best``,
  ``trajectory`` (root first; each step: strategy, site, params, LEIR, time_us, speedup),
  ``curve`` (best speedup after each sample), ``seconds`` (propose / verify / time / total),
  ``confirmed`` (the re-time: root and best medians, speedup, ci, verdict, rounds),
  ``counts`` (nodes per status), ``noop`` (candidates that build to the same code as
  their parent on the device, e.g. a thread binding on the CPU: not timed, not a step) and, for a PyTorch program, ``eager_time_us`` and
  ``speedup_vs_eager`` (PyTorch eager time / best LEIR time, same device and input shapes).
* ``best.leir``: the fastest verified program with its ``%`` header (``stp verify`` loads it).
* ``tree.jsonl``: every node of the search (also rejected ones, with the reason).

:func:`search_many` runs several programs (resumable: a program whose ``summary.json``
exists is skipped) and writes ``report.md`` (a Table 3/4-style row per algorithm, paper
§4.4) with a plot of best speedup vs. samples, and ``run_summary.json``: the programs of the
run, how many were searched, and those that failed, as ``input_errors`` (bad program or
option) apart from ``internal_errors`` (an unexpected exception: a bug or a crash; the CLI
exits 1 when every program failed so). Rejected candidates of a search are neither: they are
nodes of its tree (``counts`` in its ``summary.json``). Metrics follow paper §4.4: search
efficiency in the report = average speedup / average samples.
"""

from __future__ import annotations

import json
import math
import os
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path

from ..io import write_text_atomic as _write_atomic
from ..leir import LeirModule, format_program, save_leir
from .algorithms import ALGORITHMS, DEFAULTS, run_algorithm
from .core import Node, Search, Timer

POLICIES = ("engine", "llm", "replay")

#: ``stopped`` reasons of a search cut short by a signal (not by its own time limit): its
#: summary is kept as a partial one, the run stops there, and a rerun searches it again.
SIGNALLED = ("interrupted", "SIGTERM")


class SearchInputError(ValueError):
    """A bad program, replay file or option (the CLI exits 2 with this message)."""


@dataclass
class SearchConfig:
    """Options of a search (CLI flags of ``stp search``); ``overrides`` holds algorithm
    parameters (see :data:`steptp.search.algorithms.DEFAULTS`), ``iterations`` overrides
    the iteration budget of every algorithm."""

    algorithm: str = "greedy"
    policy: str = "engine"
    rank: str = "random"  # random, cost, model or model:PATH (steptp.cost_model.learned)
    device: str = "cpu"  # cpu or cuda: where candidates are verified and timed (stp search --device)
    seed: int = 0
    iterations: int | None = None
    overrides: dict = field(default_factory=dict)
    per_rule: int = 8
    trials: int = 3
    timeout_s: float = 120.0
    max_samples: int | None = None
    temperature: float = 0.3
    max_tokens: int | None = None
    replay: str | None = None
    progress: bool = True
    confirm_repeat: int = 10
    time_limit_s: float | None = None  # per program: stop and write what the search has
    screen: int = 32  # --rank model with the paper's seven: candidates screened per node by the model
    runner: str = "local"  # local or pack (steptp.runner.kinds.create): where candidates are measured
    lookahead: int = 1  # engine policy, --rank cost: levels ranked by the static model before proposing
    expand: int = 3  # with lookahead > 1: programs of a level expanded at the next

    @property
    def rank_kind(self) -> str:
        """``random``, ``cost`` or ``model`` (without the model path), read by
        :func:`steptp.cost_model.learned.parse_rank` (``ValueError`` for anything else)."""
        from ..cost_model import parse_kind

        return parse_kind(self.rank)[0]

    @property
    def rank_model(self) -> str | None:
        """The model file of ``--rank model:PATH``, else None."""
        from ..cost_model import parse_kind

        return parse_kind(self.rank)[1]

    @property
    def target(self) -> str:
        """The former name of :attr:`device` (read-only)."""
        return self.device

    def algorithm_params(self) -> dict:
        p = dict(DEFAULTS[self.algorithm])
        if "seed" in p:
            p["seed"] = self.seed
        p.update({k: v for k, v in self.overrides.items() if v is not None})
        if self.iterations is not None:
            p["iterations"] = self.iterations
        return p


# ---------------------------------------------------------------------------
# programs
# ---------------------------------------------------------------------------


def collect_programs(inputs: list[str | Path]) -> list[Path]:
    """Program files of ``inputs`` by the one rule set of :func:`steptp.programs.discover`
    (directories recursively; a ``.py`` needs ``class Model``; ``X.py`` wins over
    ``X.leir``). Raises :class:`SearchInputError` for a missing path, a file of another type
    or a directory without programs."""
    from ..programs import discover

    out: list[Path] = []
    for raw in inputs:
        try:
            found = discover([raw])
        except (FileNotFoundError, ValueError) as e:
            msg = str(e).replace("input not found: ", "")
            raise SearchInputError(f"{msg}: no such file or directory" if isinstance(e, FileNotFoundError)
                                   else msg) from None
        if not found:
            raise SearchInputError(f"{raw}: no .py or .leir programs")
        out.extend(src.path for src in found)
    return out


def load_program(path: Path, meta: bool = False):
    """``(LeirModule, Translation or None)`` of a ``.leir`` file (parsed and analysed) or a
    PyTorch ``.py`` file (translated; ``meta``: traced on PyTorch's meta device, no data): :func:`steptp.programs.load`. Raises
    :class:`SearchInputError` with one line naming the file."""
    from ..leir import LeirSyntaxError
    from ..leir.analysis import LeirSemanticError
    from ..programs import load

    try:
        return load(path, meta=meta)
    except FileNotFoundError:
        raise SearchInputError(f"{path}: no such file") from None
    except LeirSyntaxError as e:
        raise SearchInputError(str(e).splitlines()[0]) from None
    except LeirSemanticError as e:
        raise SearchInputError(f"{path}: {e}") from None
    except OSError as e:
        raise SearchInputError(f"{path}: cannot read: {e.strerror or e}") from None
    except Exception as e:  # noqa: BLE001 - TranslationError and the program's own errors
        raise SearchInputError(f"{path}: cannot translate: {str(e).splitlines()[0] if str(e) else type(e).__name__}"
                               ) from None


def eager_time_us(tr, repeat: int = 3, warmup: int = 3, min_repeat_s: float = 0.02) -> float:
    """PyTorch eager run time (µs, median of ``repeat`` measurements of at least
    ``min_repeat_s`` each, after ``warmup`` calls; the one timing loop) of a translation's model on its example
    inputs, on the CPU with ONE intra-op thread (as the LEIR timings: TVM's pool runs one
    thread unless ``TVM_NUM_THREADS`` is set; several torch threads on a shared machine
    also spin against other processes and inflate small kernels' times by 1000x)."""
    import torch

    args = tr.example_inputs
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(max(1, int(os.environ.get("TVM_NUM_THREADS") or 1)))
    except ValueError:
        torch.set_num_threads(1)
    try:
        return _eager(tr.model, args, repeat, warmup, min_repeat_s)
    finally:
        torch.set_num_threads(threads)


def _eager(model, args, repeat: int, warmup: int, min_repeat_s: float) -> float:
    """Median microseconds per call of ``model(*args)`` on the CPU by the one timing loop
    (:func:`steptp.runner.cuda_timing.time_rounds` over :func:`steptp.runner.baseline.torch_timer`)."""
    import statistics

    from ..runner.cuda_timing import time_rounds
    from ..runner.baseline import torch_timer

    secs, _ = time_rounds([torch_timer(model, args, "cpu")], "cpu", rounds=repeat, warmup=warmup,
                          min_repeat_ms=min_repeat_s * 1e3, max_number=1 << 20)
    return statistics.median(secs[0]) * 1e6


# ---------------------------------------------------------------------------
# one search
# ---------------------------------------------------------------------------


def make_scorer(cfg: SearchConfig, roots=()):
    """The scorer of ``cfg.rank`` (:func:`steptp.cost_model.learned.make_scorer`) when the
    search screens with one (``--rank model``, or ``--algorithm evolutionary`` with any
    rank), else None. Raises :class:`SearchInputError` for a bad model file or a missing
    LightGBM."""
    if cfg.rank_kind != "model" and cfg.algorithm != "evolutionary":
        return None
    from ..cost_model import create
    from ..cost_model.learned import CostModelError, CostModelUnavailable

    try:
        return create(cfg.rank, cfg.device, cfg.seed, roots)
    except (CostModelError, CostModelUnavailable, ValueError) as e:
        raise SearchInputError(str(e)) from None


def make_policy(cfg: SearchConfig, root: LeirModule, client=None, rules=None, scorer=None, check=None):
    """The policy ``cfg.policy`` for ``root`` (``client``: the chat client of the LLM policy).
    With ``--rank model`` and one of the paper's seven algorithms the engine policy is wrapped
    in a :class:`~steptp.policy.ScreeningPolicy` (``cfg.screen`` candidates
    screened per node by ``scorer``); ``evolutionary`` screens by itself. On ``cuda`` the
    engine also proposes its multi-step proposals (:mod:`steptp.engine.macros`). ``check``:
    ``fn(module) -> bool``, the search's verification: the engine policy proposes (and its
    lookahead expands) only programs that pass it (:class:`~steptp.policy.EnginePolicy`)."""
    from ..policy import EnginePolicy, LLMPolicy, ReplayError, ReplayPolicy, ScreeningPolicy

    if cfg.policy == "engine":
        static = cfg.rank_kind == "cost" and cfg.algorithm != "evolutionary"
        pol = EnginePolicy(rules, rank="cost" if static else "random", seed=cfg.seed, per_rule=cfg.per_rule,
                           target=cfg.device, skip_binding_only=cfg.device == "cpu", macros=cfg.device == "cuda",
                           lookahead=cfg.lookahead if static else 1, expand=cfg.expand, check=check)
        if cfg.rank_kind == "model" and cfg.algorithm != "evolutionary" and scorer is not None:
            return ScreeningPolicy(pol, scorer, cfg.screen)
        return pol
    if cfg.policy == "replay":
        if not cfg.replay:
            raise SearchInputError("--policy replay needs --replay FILE.jsonl")
        try:
            return ReplayPolicy(cfg.replay, root.signature)
        except ReplayError as e:
            raise SearchInputError(str(e)) from None
    if cfg.policy == "llm":
        if client is None:
            raise SearchInputError("--policy llm needs --endpoint URL and --model NAME")
        return LLMPolicy(client, algorithm=cfg.algorithm, temperature=cfg.temperature, max_tokens=cfg.max_tokens,
                         target=cfg.device, rules=rules, seed=cfg.seed)
    raise SearchInputError(f"unknown policy {cfg.policy!r}; one of {', '.join(POLICIES)}")


def _strategy_names(strategy: str | None) -> list[str]:
    return [s for s in (strategy or "").split("+") if s]


def summarize(s: Search, cfg: SearchConfig, name: str, source: str, seconds: float) -> dict:
    """The ``summary.json`` dict of a finished search."""
    from ..engine.service import plain

    traj = s.trajectory()
    strategies = sorted({x for n in traj[1:] for x in _strategy_names(n.strategy)})
    samples = s.samples
    best = s.best
    speedup = best.speedup if samples and best.speedup else 1.0
    counts: dict[str, int] = {}
    for n in s.nodes[1:]:
        counts[n.status] = counts.get(n.status, 0) + 1
    return {
        "program": name, "source": source, "algorithm": cfg.algorithm, "policy": cfg.policy,
        "rank": cfg.rank_kind if cfg.policy == "engine" else None, "device": cfg.device,
        "target": cfg.device,  # the former name of "device", kept for readers of older summaries
        "seed": cfg.seed,
        "params": cfg.algorithm_params(),
        "samples": samples, "speedup": speedup, "strategies": len(strategies), "strategy_list": strategies,
        "efficiency": speedup / samples if samples else 0.0,
        "root_time_us": s.root.time_us,
        "best": {"node": best.id, "depth": best.depth, "time_us": best.time_us, "speedup": speedup,
                 "leir": best.text},
        "trajectory": [{"step": i, "node": n.id, "strategy": n.strategy, "site": n.site, "params": plain(n.params),
                        "leir": n.text, "time_us": n.time_us, "speedup": n.speedup, "cot": n.cot}
                       for i, n in enumerate(traj)],
        "curve": [[a, b] for a, b in s.curve],
        "nodes": len(s.nodes), "counts": counts, "noop": counts.get("noop", 0),
        "seconds": {**{k: round(v, 3) for k, v in s.timer.seconds.items()}, "total": round(seconds, 3)},
    }


def search_program(program, outdir: str | Path, cfg: SearchConfig, *, client=None, rules=None,
                   name: str | None = None, timer=None, runner=None) -> dict:
    """Search one program (a path to ``.leir``/``.py``, or a LeirModule) and write
    ``summary.json``, ``best.leir`` and ``tree.jsonl`` into ``outdir``; returns the summary.
    ``timer``: optional ``fn(module) -> µs`` replacing the default timing. ``runner``: a
    :class:`steptp.runner.base.Runner` (default: the ``local`` runner on ``cfg.device``).

    With a runner that answers later (``pack``) the search may stop at a batch whose
    measurements are pending: it then saves its caches (:class:`steptp.search.replay.SearchCache`)
    and returns ``{"program", "status": "pending"}`` without a summary; run again once the
    runner has the results, it replays from the start (:mod:`steptp.search.replay`) and goes on."""
    from tqdm import tqdm

    from ..runner.base import Pending
    from ..runner.kinds import create
    from .evaluate import Measure, RootFailed
    from .replay import CachedPolicy, SearchCache

    if cfg.algorithm not in ALGORITHMS:
        raise SearchInputError(f"unknown algorithm {cfg.algorithm!r}; one of {', '.join(ALGORITHMS)}")
    t_start = time.perf_counter()
    tr = None
    if isinstance(program, LeirModule):
        root, source = program, "<module>"
    else:
        path = Path(program)
        # measured elsewhere (a GPU node at KernelBench size): the translation needs shapes only
        root, tr = load_program(path, meta=runner is not None and runner.kind != "local")
        source = str(path)
    from ..faults import inject

    inject(source)  # STP_FAULT_INJECT (tests): an unexpected crash in this program's search
    name = name or root.signature.name
    out = Path(outdir)
    out.mkdir(parents=True, exist_ok=True)
    if runner is None:
        runner = create("local", device=cfg.device, timer=timer, retime_rounds=max(1, cfg.confirm_repeat))
    cache = SearchCache(out, {"root": root.text(), "algorithm": cfg.algorithm, "params": cfg.algorithm_params(),
                              "policy": cfg.policy, "rank": cfg.rank, "seed": cfg.seed, "per_rule": cfg.per_rule,
                              "lookahead": cfg.lookahead, "expand": cfg.expand,
                              "device": cfg.device, "runner": runner.kind})
    entry = _entry_fn(name, root, source if tr is not None else None, cfg.seed) if runner.kind != "local" else None
    try:
        measure = Measure(root, device=cfg.device, trials=cfg.trials, seed=cfg.seed, timeout_s=cfg.timeout_s,
                          timer=timer, runner=runner, name=name, verified=cache.verified, entry=entry)
    except RootFailed as e:
        raise SearchInputError(f"{source}: {e}") from None
    scorer = make_scorer(cfg, [root.text()])
    # on cuda the engine proposes the ranked programs that verify (its multi-step proposals reach
    # further than one step, and a step that does not build would cut them all to one prefix)
    check = (lambda m: measure.verify(m)["equal"]) if cfg.device == "cuda" else None
    policy = CachedPolicy(lambda: make_policy(cfg, root, client, rules, scorer, check=check),
                          cache.proposals, root.signature)
    bar = tqdm(desc=f"{name} {cfg.algorithm}", unit="sample", disable=not cfg.progress, leave=False)
    deadline = time.monotonic() + cfg.time_limit_s if cfg.time_limit_s else None
    s = Search(root, policy, measure, max_samples=cfg.max_samples, progress=bar, scorer=scorer, deadline=deadline)
    restore = _stop_on_sigterm(s)
    try:
        params = cfg.algorithm_params()
        run_algorithm(cfg.algorithm, s, **params)
    except Pending:
        cache.save()
        return {"program": name, "status": "pending"}
    except KeyboardInterrupt:
        s.request_stop("interrupted (SIGINT)")  # keep what the search has: the summary below
    finally:
        restore()
        bar.close()
        policy.close()
    s.root.time_us = s.root.time_us or measure.runner.root_time_us(name, root)
    summary = summarize(s, cfg, name, source, time.perf_counter() - t_start)
    summary["runner"] = runner.kind
    summary["speedup_best_sample"] = summary["speedup"]
    if s.stop_reason:
        summary["stopped"] = s.stop_reason
    signalled = s.stop_reason.startswith(SIGNALLED)
    retime = None
    if signalled and s.best.id != 0:
        # no time to re-time after a signal: the best sample is kept, never reported as a speedup
        summary["speedup"] = 1.0
        summary["best"]["speedup"] = 1.0
        summary["unconfirmed_best"] = summary["speedup_best_sample"]
    elif s.best.id != 0 and (timer is None or runner.kind != "local") and cfg.confirm_repeat:
        try:
            retime = measure.retime(s.best.module, s.best.steps)
        except Pending:
            cache.save()
            return {"program": name, "status": "pending"}
        summary["confirmed"] = c = confirmed_record(retime, cfg.confirm_repeat)
        # the headline is the re-time, and only an improvement that the interval supports
        summary["speedup"] = c["speedup"] if c.get("verdict") == "faster" else 1.0
        summary["best"]["speedup"] = summary["speedup"]
        summary["efficiency"] = summary["speedup"] / summary["samples"] if summary["samples"] else 0.0
        if c.get("verdict") != "faster":
            summary["reason"] = (f"the re-time did not reproduce a speedup (interval {c.get('ci')})"
                                 if retime.status == "equal" else f"the re-time failed: {retime.reason}")
    if runner.kind != "local":
        summary.update(_remote_fields(runner, s, retime, summary))
    elif tr is not None and cfg.device == "cpu":
        try:
            eager = eager_time_us(tr)
            summary["eager_time_us"] = eager
            best_us = (summary.get("confirmed") or {}).get("best_time_us") or s.best.time_us
            summary["speedup_vs_eager"] = eager / best_us if best_us else None
            summary["root_speedup_vs_eager"] = eager / s.root.time_us if s.root.time_us else None
        except Exception as e:  # noqa: BLE001 - the comparison is informative only
            summary["eager_error"] = f"{type(e).__name__}: {str(e)[:200]}"
    if scorer is not None:
        summary["scorer"] = {"kind": type(scorer).__name__, **({"model": cfg.rank_model}
                                                                if cfg.rank_kind == "model" else {}),
                             **{k: (round(v, 3) if isinstance(v, float) else v)
                                for k, v in (getattr(scorer, "stats", None) or {}).items()}}
    inner = policy.inner
    if hasattr(inner, "log"):
        summary["llm_requests"] = inner.log
    if getattr(inner, "skipped", None):
        summary["skipped_candidates"] = dict(inner.skipped)
    best = s.best
    save_leir(LeirModule(root.signature, best.module.program), out / "best.leir")
    save_leir(root, out / "root.leir")
    _write_atomic(out / "tree.jsonl", "".join(json.dumps(n.record()) + "\n" for n in s.nodes))
    _write_atomic(out / "summary.json", json.dumps(summary, indent=1) + "\n")
    return summary


def confirmed_record(r, repeat: int) -> dict:
    """The summary's ``confirmed`` record of a runner's re-time (:class:`steptp.runner.base.MeasureResult`):
    ``{repeat, root_time_us, best_time_us, speedup, ci, verdict}`` or ``{error}``."""
    if r.status != "equal" or r.speedup is None:
        return {"error": r.reason or r.status}
    return {"repeat": r.extra.get("rounds", repeat), "root_time_us": r.root_us, "best_time_us": r.time_us,
            "speedup": r.speedup, "ci": list(r.ci) if r.ci else None, "verdict": r.verdict}


#: Per-program summary fields of a GPU search (issue 44), each a number or null with
#: ``<field>_reason``: our best's kernels and call from Python, the original's kernels, PyTorch
#: eager from Python and in a CUDA graph, torch.compile (default, max-autotune-no-cudagraphs).
BASELINE_FIELDS = ("best_us", "best_py_us", "original_us", "eager_us", "eager_graph_us", "compile_us",
                   "compile_autotune_us", "compile_s")


def _remote_fields(runner, s: Search, retime, summary: dict) -> dict:
    """A remote runner's extra summary fields: ``rounds`` (complete rounds of the run), the
    node's device, the like-with-like baselines the node measured against the re-timed best
    (:data:`BASELINE_FIELDS`, their ratios with 95 % intervals: ``python -m steptp.gpu.run
    ... --baselines``), and the speed of light (:func:`steptp.roofline.sol_fields` for the GPU
    the node reports, an H200 for the simulated device). Without the node's baselines,
    ``speedup_vs_eager`` is PyTorch eager from Python over the original's kernels (timed
    interleaved on the node) times the re-timed speedup, and ``speedup_vs_eager_how`` says
    that it is not like with like."""
    from ..roofline import gpu_model_for, roofline, sol_fields

    extra = dict((retime.extra if retime is not None else {}) or {})
    lookup = getattr(runner, "result", None)
    for n in s.nodes if lookup is not None else []:  # the device and eager of any measured candidate
        if extra.get("eager") and extra.get("device_name"):
            break
        rec = lookup(f"{summary['program']}:{_hash(n.text)}") if n.status == "equal" else None
        if rec is not None:
            extra = {**{k: v for k, v in rec.extra.items() if k != "baselines"},
                     **{k: v for k, v in extra.items() if v is not None}}
    device = extra.get("device_name") or extra.get("device")
    out: dict = {"rounds": getattr(runner, "rounds_done", None), "gpu_device": device}
    base = dict(extra.get("baselines") or {})
    if base:
        base = {k: v for k, v in base.items() if k not in ("speedup", "speedup_ci", "speedup_reason")}
        out.update(base)  # (speedup_vs_original: the baseline session's own figure; speedup: the re-time's)
    else:
        why = ("no re-timed best (nothing beat the original)" if retime is None else
               "the node measured no baselines (python -m steptp.gpu.run ... --baselines)")
        for f in BASELINE_FIELDS:
            out[f] = None
            out[f"{f}_reason"] = why
        if retime is not None and retime.status == "equal":
            out["best_us"], out["original_us"] = retime.time_us, retime.root_us
            out.pop("best_us_reason"), out.pop("original_us_reason")
        elif s.root.time_us:
            out["original_us"] = s.root.time_us
            out.pop("original_us_reason")
    eager = extra.get("eager") or {}
    if out.get("speedup_vs_eager") is None and eager.get("eager_us") and eager.get("original_us"):
        out["speedup_vs_eager"] = float(eager["eager_us"]) / float(eager["original_us"]) * float(summary["speedup"])
        out["speedup_vs_eager_how"] = ("PyTorch eager from Python over the original's kernels (timed interleaved on "
                                       "the node) times the re-timed speedup: not like with like")
        out.pop("speedup_vs_eager_reason", None)
    elif out.get("speedup_vs_eager") is None:
        out["speedup_vs_eager"] = None
        out.setdefault("speedup_vs_eager_reason", "the node did not time PyTorch eager (no torch there, or the "
                                                  "program is not from a .py file)")
    out["eager_reason"] = out.get("speedup_vs_eager_reason", "") if out.get("speedup_vs_eager") is None else ""
    gpu = gpu_model_for(device or "")
    try:
        if gpu is None:
            raise ValueError(f"no datasheet figures for the node's device {device!r} (stp roofline --help)")
        roof = roofline(s.root.module, gpu)
    except Exception as e:  # noqa: BLE001 - the speed of light is informative; say why it is missing
        out["sol_us"], out["sol_reason"] = None, f"{type(e).__name__}: {str(e)[:200]}"
    else:
        best_us = out.get("best_us") or (s.best.time_us if s.best.id else s.root.time_us)
        out.update(sol_fields(roof, best_us=best_us, original_us=out.get("original_us") or s.root.time_us,
                              eager_graph_us=out.get("eager_graph_us"), compile_us=out.get("compile_us")))
        for f in ("fraction_of_sol", "fraction_of_sol_original", "fraction_of_sol_eager_graph",
                  "fraction_of_sol_compile"):
            if out.get(f) is None:
                out[f"{f}_reason"] = "its time is not known (see the baseline fields' reasons)"
    return out


def _hash(text: str) -> str:
    import hashlib  # noqa: PLC0415

    return hashlib.sha256(text.encode()).hexdigest()[:12]


def _entry_fn(name: str, root: LeirModule, source: str | None, seed: int):
    """``fn(module, steps) -> entry``: the dataset-format entry a pack is built from
    (:func:`steptp.gpu.pack.collect` reads it): the root as the original, so every timing on
    the node is a speedup over the root; the ``.py`` source when the program came from one, so
    the node times PyTorch eager beside it."""
    from ..llm.prompts import signature_dict

    sig = signature_dict(root)
    orig = format_program(root.program)
    src = str(Path(source).resolve()) if source else None

    def entry(module: LeirModule, steps: list) -> dict:
        text = format_program(module.program)
        return {"id": f"{name}:{_hash(text)}", "program": name, "signature": sig,
                "strategy": {"id": steps[-1]["rule"] if steps else ""}, "original": {"leir": orig},
                "transformed": {"leir": text}, "seed": seed, "source": src, "verification": {"equal": True}}

    return entry


def _stop_on_sigterm(s: Search):
    """While the search runs, SIGTERM (a job queue's time limit, ``timeout``) asks it to stop
    at its next check instead of killing the process, so its summary is written; returns the
    function that restores the previous handler. A no-op outside the main thread."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        return lambda: None
    previous = signal.getsignal(signal.SIGTERM)
    signal.signal(signal.SIGTERM, lambda signum, frame: s.request_stop("SIGTERM"))
    return lambda: signal.signal(signal.SIGTERM, previous)


def confirm(root: LeirModule, best: LeirModule, device: str = "cpu", repeat: int = 10) -> dict:
    """Time root and best again, **interleaved** (:func:`steptp.runner.timing.compare`,
    ``repeat`` rounds, same inputs): ``{repeat, root_time_us, best_time_us, speedup, ci,
    verdict}`` (medians in µs; speedup = median of the paired ratios root/best with its
    bootstrap 95 % interval). The best of many noisy samples is biased upwards (winner's
    curse); this figure is not, and ``stp time root.leir best.leir`` reproduces it."""
    from ..runner.timing import compare

    try:
        c = compare(root, best, device, rounds=repeat)
    except Exception as e:  # noqa: BLE001 - the headline then stays 1: nothing reproduced
        return {"error": f"{type(e).__name__}: {str(e)[:200]}"}
    return {"repeat": repeat, "root_time_us": c.baseline_us, "best_time_us": c.candidate_us, "speedup": c.speedup,
            "ci": list(c.ci), "verdict": c.verdict}


def _unique_names(paths: list[Path]) -> list[str]:
    names, seen = [], {}
    for p in paths:
        base = p.stem
        k = seen.get(base, 0)
        seen[base] = k + 1
        names.append(base if k == 0 else f"{base}_{k}")
    return names


def search_many(inputs: list, outdir: str | Path, cfg: SearchConfig, *, client=None, single_dir: bool | None = None,
                on_error=None, run_info: dict | None = None, write_pack=None, workers: int = 1) -> list[dict]:
    """Search every program of ``inputs`` (see :func:`collect_programs`); each one's files
    go to ``OUTDIR/<program stem>/`` (or ``OUTDIR`` itself when there is one program file
    and ``single_dir`` is not False). Programs whose ``summary.json`` exists are skipped
    (resume), except one cut short by a signal. A search stopped by its time limit
    (``cfg.time_limit_s``) or a signal (SIGINT, SIGTERM) still writes its summary
    (``stopped``: the reason; after a signal its best sample is kept unconfirmed and the run
    stops, ``run_summary.json`` saying so). Writes ``OUTDIR/report.md`` and ``OUTDIR/run_summary.json``
    (:func:`run_summary`). ``on_error(path, message)`` is called for a program that fails
    (default: raise); a single program that is bad input (:class:`SearchInputError`) and an
    unavailable device (:class:`TargetUnavailable`) raise anyway. ``run_info``: a dict to
    update with the run summary.

    ``cfg.runner``: ``local`` or ``pack`` (:func:`steptp.runner.kinds.create`; ``write_pack``:
    the pack builder ``fn(round_dir, pack_dir)``). With ``pack`` every program's search runs
    until its next batch is pending; the pending batches of all programs are written as one
    round (``OUTDIR/rounds/<k>/``) and ``run_info["waiting"]`` says where (the CLI exits 3);
    the same call again, with the node's results in place, replays and goes on. ``workers``:
    programs searched in parallel processes (``pack`` only: timing on this machine in parallel
    would measure the contention)."""
    from tqdm import tqdm

    from ..rules import load_rules
    from ..runner.kinds import create
    from .evaluate import TargetUnavailable

    paths = collect_programs(inputs)
    out = Path(outdir)
    if single_dir is None:
        single_dir = len(paths) == 1 and Path(inputs[0]).is_file() and cfg.runner == "local"
    runner = (create("pack", out=out, write_pack=write_pack) if cfg.runner == "pack" else
              create("local", device=cfg.device, retime_rounds=max(1, cfg.confirm_repeat)))
    rules = load_rules()
    summaries = []
    failed: list[dict] = []
    pending: list[str] = []
    pending_paths: set[str] = set()
    stopped = ""
    names = _unique_names(paths)
    todo = []
    for path, nm in zip(paths, names):
        d = out if single_dir else out / nm
        done = d / "summary.json"
        if done.exists():
            try:
                prev = json.loads(done.read_text(encoding="utf-8"))
                if not str(prev.get("stopped", "")).startswith(SIGNALLED):
                    summaries.append(prev)
                    continue
            except (OSError, json.JSONDecodeError):
                pass  # an unreadable summary, or one cut short by a signal: search again
        todo.append((path, nm, d))

    def outcome(path, res) -> bool:
        nonlocal stopped
        if isinstance(res, BaseException):
            if isinstance(res, TargetUnavailable):
                raise res  # the machine, not the program: every other program would fail the same way
            bad_input = isinstance(res, SearchInputError)
            if on_error is None or (bad_input and len(paths) == 1):
                raise res
            msg = str(res) if bad_input else f"{path}: {type(res).__name__}: {' '.join(str(res).split())[:300]}"
            failed.append({"program": str(path), "error": msg, "internal": not bad_input})
            on_error(path, msg)
            return True
        if res.get("status") == "pending":
            pending.append(res["program"])
            pending_paths.add(str(path))
            return True
        summaries.append(res)
        if str(res.get("stopped", "")).startswith(SIGNALLED):
            stopped = res["stopped"]
            return False  # a signal stops the run, not only this program: report what there is
        return True

    waiting = None
    for _attempt in range(64):  # a round whose every entry the pack builder left out needs no node
        _advance(todo, runner, cfg, client, rules, workers, len(paths), outcome)
        if stopped:
            break
        waiting = runner.submit() if pending else None
        if not waiting or waiting.get("entries"):
            break
        again = set(pending_paths)
        pending.clear()
        pending_paths.clear()
        todo = [t for t in todo if str(t[0]) in again]
        runner = create("pack", out=out, write_pack=write_pack)
    info = run_summary(len(paths), len(summaries), failed)
    if stopped:
        info["stopped"] = stopped
    if pending:
        info["pending"] = sorted(pending)
        info["waiting"] = waiting
    write_report(out, info)
    if cfg.runner != "local" and summaries and not pending:
        _write_atomic(out / "gpu_summary.json", json.dumps(gpu_aggregate(summaries, out), indent=1) + "\n")
    _write_atomic(out / "run_summary.json", json.dumps(info, indent=1) + "\n")
    if run_info is not None:
        run_info.update(info)
    return summaries


def _geo(xs) -> float | None:
    xs = [x for x in xs if isinstance(x, (int, float)) and x > 0]
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else None


def gpu_aggregate(summaries: list[dict], out: Path) -> dict:
    """``OUT/gpu_summary.json`` of a GPU search (issue 44's evidence): the programs' summaries, the
    median and geometric mean of the re-timed speedup over the original, the geometric mean of
    each like-with-like ratio over the programs that have it (``speedup_vs_eager``,
    ``speedup_vs_eager_graph``, ``speedup_vs_compile``, ``speedup_vs_compile_autotune``, with
    how many), the median ``fraction_of_sol`` (ours and the baselines'), and how well the cost
    models ranked what the node measured (:func:`steptp.cost_model.samples.ranking_quality`)."""
    from ..cost_model.samples import ranking_quality

    agg: dict = {"programs": summaries}
    sp = [s.get("speedup") for s in summaries if s.get("speedup")]
    agg["median_speedup"] = statistics.median(sp) if sp else None
    agg["geomean_speedup"] = _geo(sp)
    for r in ("speedup_vs_eager", "speedup_vs_eager_graph", "speedup_vs_compile", "speedup_vs_compile_autotune"):
        xs = [s.get(r) for s in summaries if s.get(r)]
        agg[f"geomean_{r}"], agg[f"with_{r}"] = _geo(xs), len(xs)
    for f in ("fraction_of_sol", "fraction_of_sol_original", "fraction_of_sol_eager_graph",
              "fraction_of_sol_compile"):
        xs = [s.get(f) for s in summaries if s.get(f) is not None]
        agg[f"median_{f}"] = statistics.median(xs) if xs else None
    try:
        agg["ranking"] = ranking_quality(out)
    except Exception as e:  # noqa: BLE001 - informative; a missing LightGBM or a damaged tree is said
        agg["ranking"] = {"error": f"{type(e).__name__}: {str(e)[:200]}"}
    return agg


def _advance(todo: list, runner, cfg: SearchConfig, client, rules, workers: int, n_paths: int, outcome) -> None:
    """Run (or resume) every program of ``todo`` (``(path, name, directory)``) once with
    ``runner``, in this process or over ``workers`` processes (``pack`` runner only), each
    result handed to ``outcome(path, summary | {"status": "pending"} | exception)`` (False:
    stop the run)."""
    from tqdm import tqdm

    if workers > 1 and cfg.runner == "pack" and len(todo) > 1:
        import multiprocessing as mp
        from concurrent.futures import ProcessPoolExecutor

        with ProcessPoolExecutor(max_workers=min(workers, len(todo)), mp_context=mp.get_context("spawn")) as pool:
            futs = [(path, pool.submit(_advance_remote, str(path), str(d), cfg, str(runner.out))) for path, _, d in todo]
            for path, f in tqdm(futs, desc="programs", unit="program", disable=not cfg.progress):
                try:
                    res, entries = f.result()
                except Exception as e:  # noqa: BLE001 - one program's failure must not stop the others
                    res, entries = e, {}
                runner.add_pending(entries)
                outcome(path, res)
    else:
        for path, nm, d in tqdm(todo, desc="programs", unit="program", disable=not cfg.progress or n_paths == 1):
            try:
                res = search_program(path, d, cfg, client=client, rules=rules, runner=runner)
            except Exception as e:  # noqa: BLE001 - one program's failure must not stop the others
                res = e
            if not outcome(path, res):
                break


def _advance_remote(path: str, outdir: str, cfg: SearchConfig, out: str) -> tuple:
    """One program's search in a worker process of :func:`search_many` (``pack`` runner):
    ``(summary or {"status": "pending"} or the exception, the pending entries)``."""
    from ..runner.kinds import create

    runner = create("pack", out=out, write_pack=None)
    try:
        res = search_program(path, outdir, cfg, runner=runner)
    except Exception as e:  # noqa: BLE001 - handed to the parent, which reports it
        res = e
    return res, runner.pending_entries()


def run_summary(programs: int, searched: int, failed: list[dict]) -> dict:
    """``run_summary.json`` of :func:`search_many`: ``programs`` of the run, how many have a
    search (``searched``, resumed ones included), the ``failed`` ones (``{program, error,
    internal}``) and their counts: ``internal_errors`` (an unexpected exception: a bug or a
    crash) apart from ``input_errors`` (a bad program or option). Rejected candidates are
    neither (they are nodes of a search: ``counts`` in its ``summary.json``)."""
    internal = sum(1 for f in failed if f["internal"])
    return {"programs": programs, "searched": searched, "internal_errors": internal,
            "input_errors": len(failed) - internal, "failed": failed}


# ---------------------------------------------------------------------------
# report
# ---------------------------------------------------------------------------


def load_summaries(outdir: str | Path) -> list[dict]:
    """Every ``summary.json`` at ``outdir`` and one level below."""
    out = Path(outdir)
    files = ([out / "summary.json"] if (out / "summary.json").exists() else []) + sorted(out.glob("*/summary.json"))
    res = []
    for f in files:
        try:
            res.append(json.loads(f.read_text(encoding="utf-8")))
        except (OSError, json.JSONDecodeError):
            continue
    return res


def table_rows(summaries: list[dict]) -> list[dict]:
    """One row per (algorithm, policy, rank, device): paper Table 3 and 4 columns."""
    groups: dict[tuple, list[dict]] = {}
    for sm in summaries:
        groups.setdefault((sm["algorithm"], sm["policy"], sm.get("rank"), _device(sm)), []).append(sm)
    rows = []
    for (alg, pol, rank, tgt), g in sorted(groups.items(), key=lambda kv: [str(x) for x in kv[0]]):
        sp = [x["speedup"] for x in g]
        smp = [x["samples"] for x in g]
        st = [x["strategies"] for x in g]
        eager = [x["speedup_vs_eager"] for x in g if x.get("speedup_vs_eager")]
        conf = [_confirmed(x) for x in g]
        avg_s, avg_n = statistics.mean(sp), statistics.mean(smp)
        rows.append({"algorithm": alg, "policy": pol + (f"/{rank}" if rank else ""), "device": tgt,
                     "target": tgt,  # the former name of "device"
                     "programs": len(g), "avg_samples": avg_n, "max_samples": max(smp), "avg_speedup": avg_s,
                     "median_speedup": statistics.median(sp), "max_speedup": max(sp),
                     "efficiency": avg_s / avg_n if avg_n else 0.0, "avg_strategies": statistics.mean(st),
                     "max_strategies": max(st),
                     "avg_speedup_vs_eager": statistics.mean(eager) if eager else None,
                     "avg_confirmed_speedup": statistics.mean(conf),
                     "wall_s": sum(x.get("seconds", {}).get("total", 0.0) for x in g)})
    return rows


def _us(x) -> str:
    return "n/a" if x is None else f"{x:.2f}"


def _device(sm: dict) -> str:
    """The device of a summary (``target`` in summaries written before ``device``)."""
    return sm.get("device") or sm.get("target") or "cpu"


def _confirmed(sm: dict) -> float:
    """The re-timed speedup of a summary (1 when the best is the root or it failed)."""
    c = sm.get("confirmed") or {}
    return c.get("speedup") or (sm["speedup"] if not c and sm["best"]["node"] != 0 else 1.0)


def _plot(summaries: list[dict], path: Path) -> bool:
    try:
        from matplotlib.figure import Figure
    except ImportError:
        return False
    groups: dict[str, list[dict]] = {}
    for sm in summaries:
        key = f"{sm['algorithm']} / {sm['policy']}" + (f"/{sm['rank']}" if sm.get("rank") else "")
        groups.setdefault(key, []).append(sm)
    fig = Figure(figsize=(6.4, 4.0))
    ax = fig.add_subplot(1, 1, 1)
    for key, g in sorted(groups.items()):
        top = max((x["samples"] for x in g), default=0)
        xs, ys = [0], [1.0]
        for n in range(1, top + 1):
            vals = []
            for sm in g:
                best = 1.0
                for a, b in sm.get("curve", []):
                    if a <= n:
                        best = max(best, b)
                vals.append(best)
            xs.append(n)
            ys.append(statistics.mean(vals))
        ax.plot(xs, ys, marker=".", label=f"{key} ({len(g)})")
    ax.set_xlabel("verified samples")
    ax.set_ylabel("best speedup (mean over programs)")
    ax.set_title("Best speedup vs. samples")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return True


def write_report(outdir: str | Path, run_info: dict | None = None) -> Path:
    """``OUTDIR/report.md`` (+ ``speedup_vs_samples.png``) over every summary under ``outdir``;
    ``run_info`` (:func:`run_summary`): also the programs of the run that failed."""
    out = Path(outdir)
    out.mkdir(parents=True, exist_ok=True)
    sms = load_summaries(out)
    lines = ["# stp search report", "",
             f"{len(sms)} search(es). Speedup = Runtime_root / Runtime_best; samples = candidates that verified "
             "Equal against the root (3 random + 2 ordered trials) and were timed; efficiency = average speedup / "
             "average samples (paper §4.4, Tables 3-4). Re-timed: root and best timed again with 10 measurements each "
             "(the best of many noisy 3-measurement samples overstates its speedup).", "",
             "| algorithm | policy | device | programs | avg # samples | max # samples | avg speedup | median speedup "
             "| max speedup | efficiency | avg # strategies | max # strategies | avg re-timed speedup | avg speedup vs eager "
             "| wall s |",
             "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    if run_info and run_info.get("stopped"):
        lines[4:4] = [f"The run was stopped ({run_info['stopped']}): the summaries are partial; rerun the same "
                      "command to resume.", ""]
    if run_info and run_info.get("failed"):
        lines[4:4] = [f"{len(run_info['failed'])} of {run_info['programs']} program(s) failed: "
                      f"{run_info['internal_errors']} with an internal error, {run_info['input_errors']} bad input "
                      "(see run_summary.json).", ""]
    for r in table_rows(sms):
        ve = "n/a" if r["avg_speedup_vs_eager"] is None else f"{r['avg_speedup_vs_eager']:.2f}"
        lines.append(f"| {r['algorithm']} | {r['policy']} | {r['device']} | {r['programs']} | {r['avg_samples']:.2f} | "
                     f"{r['max_samples']} | {r['avg_speedup']:.2f} | {r['median_speedup']:.2f} | {r['max_speedup']:.2f} | "
                     f"{r['efficiency']:.2f} | {r['avg_strategies']:.2f} | {r['max_strategies']} | "
                     f"{r['avg_confirmed_speedup']:.2f} | {ve} | "
                     f"{r['wall_s']:.0f} |")
    lines += ["", "## Programs", "",
              "| program | algorithm | samples | speedup | re-timed | strategies | root µs | best µs | vs eager "
              "| best trajectory |",
              "|---|---|---:|---:|---:|---:|---:|---:|---:|---|"]
    for sm in sorted(sms, key=lambda x: (x["program"], x["algorithm"])):
        traj = " → ".join(str(t["strategy"]) for t in sm["trajectory"][1:]) or "(root)"
        ve = sm.get("speedup_vs_eager")
        lines.append(f"| {sm['program']} | {sm['algorithm']} | {sm['samples']} | {sm['speedup']:.2f} | "
                     f"{_confirmed(sm):.2f} | "
                     f"{sm['strategies']} | {_us(sm['root_time_us'])} | {_us(sm['best']['time_us'])} | "
                     f"{'n/a' if ve is None else f'{ve:.2f}'} | {traj} |")
    if sms and _plot(sms, out / "speedup_vs_samples.png"):
        lines += ["", "![best speedup vs samples](speedup_vs_samples.png)"]
    path = out / "report.md"
    _write_atomic(path, "\n".join(lines) + "\n")
    return path


# ---------------------------------------------------------------------------
# chat export
# ---------------------------------------------------------------------------


def chat_record(summary: dict, signature, rules=None, device: str | None = None) -> dict | None:
    """A multi-step ms-swift record ``{"messages": [...]}`` of a summary's best trajectory:
    for each step, the search prompt at the current program (with its parent) as the user
    turn and the step (CoT + JSON answer) as the assistant turn. None for a trajectory
    without steps."""
    from ..leir import parse_program
    from ..resources import render
    from ..policy import render_prompt, strategy_table

    traj = summary.get("trajectory") or []
    if len(traj) < 2:
        return None
    table = strategy_table(rules)
    names = {s["id"]: s["name"] for s in table}
    nodes: list[Node] = []
    for i, t in enumerate(traj):
        mod = LeirModule(signature, parse_program(t["leir"]))
        nodes.append(Node(i, i - 1 if i else None, i, mod, t["leir"], t.get("strategy"), t.get("site"),
                          t.get("params") or {}, t.get("cot") or "", "root" if i == 0 else "equal",
                          time_us=t.get("time_us"), speedup=t.get("speedup")))
    msgs = []
    for i in range(len(nodes) - 1):
        cur, nxt = nodes[i], nodes[i + 1]
        parent = nodes[i - 1] if i else None
        msgs.append({"role": "user", "content": render_prompt(summary["algorithm"], cur, parent, table,
                                                               device or _device(summary))})
        answer = json.dumps([{"idx": 0, "transformed_IR": nxt.text,
                              "applied_strategies": [names.get(x, x) for x in _strategy_names(nxt.strategy)]}],
                            ensure_ascii=False)
        msgs.append({"role": "assistant", "content": render("search_answer.j2", cot=nxt.cot, answer_json=answer)})
    return {"messages": msgs, "meta": {"program": summary["program"], "algorithm": summary["algorithm"],
                                       "speedup": summary["speedup"], "steps": len(nodes) - 1}}


def export_chat(outdir: str | Path, path: str | Path) -> int:
    """Write one chat record per summary (with at least one step) under ``outdir`` to the
    JSONL file ``path``; returns the number of records."""
    from ..leir import load_leir
    from ..rules import load_rules

    out = Path(outdir)
    rules = load_rules()
    recs = []
    for d in ([out] if (out / "summary.json").exists() else []) + sorted(p.parent for p in out.glob("*/summary.json")):
        try:
            sm = json.loads((d / "summary.json").read_text(encoding="utf-8"))
            sig = load_leir(d / "root.leir").signature
        except Exception:  # noqa: BLE001 - a damaged run directory contributes nothing
            continue
        rec = chat_record(sm, sig, rules)
        if rec is not None:
            recs.append(rec)
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    _write_atomic(p, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in recs))
    return len(recs)


__all__ = ["SearchConfig", "SearchInputError", "search_program", "search_many", "run_summary", "write_report",
           "export_chat", "chat_record", "collect_programs", "load_program", "eager_time_us", "make_policy",
           "make_scorer", "table_rows", "load_summaries", "POLICIES", "Timer"]
