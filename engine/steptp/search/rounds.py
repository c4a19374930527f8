"""Search in rounds through GPU packs: the builder here, the runner where the GPU is (issue 37).

TVM MetaSchedule splits a tuning run into a *builder* (compile candidates where the compiler
is) and a *runner* (measure them where the device is), in rounds. ``stp search PROGRAMS
--device cuda --runner pack -o OUT`` does the same with the project's GPU packs:

1. **Propose and verify here** (no GPU needed): from each program's frontier, every rule's
   candidates (a seeded sample per rule, :func:`steptp.engine.list_candidates` /
   :func:`~steptp.engine.apply_rule`) and *macro* proposals, "apply rule R at every site it
   matches" (``loop_binding`` on every nest is neutral one step at a time and pays only when
   every nest is bound), recorded as its individual steps, each verified. Every candidate is
   verified against the root program on the CPU (:func:`steptp.verify.verify_pair`, with the
   GPU preflight and CUDA code generation), deduplicated up to renaming
   (:func:`steptp.leir.alpha.alpha_normal`) and screened by the static GPU cost model
   (:func:`steptp.search.cost_gpu.estimate_gpu_ns`; single steps are verified in its order,
   only as many as can enter the pack): the ``measure`` best per program go to the round's
   pack. With ``levels`` > 1 the best programs of a level are expanded again on the CPU
   before anything is measured (a lookahead through the cost model).
2. **Write the round** to ``OUT/rounds/<k>/``: ``dictionary.jsonl`` (one entry per candidate:
   the root as the original, so every timing is a speedup over the root; the ``.py`` source
   when the program came from one, so the node times PyTorch eager beside it) and ``pack/``
   (:func:`steptp.gpu.pack.build_pack`, passed in as ``write_pack``: the search does not import
   the GPU front end). The state is saved (``OUT/rounds/state.json``) and the command returns
   ``waiting``: the CLI prints the node's command and exits 3.
3. **Read the results** (``OUT/rounds/<k>/results/results.jsonl`` from ``python -m
   steptp.gpu.run PACK -o RESULTS --time``) when the same command runs again: a candidate is a
   sample only when it is Equal on the GPU and timed (interleaved with the root, L2 flushed);
   the frontier keeps the ``beam`` fastest (greedy: 1) and the next round expands it.
4. After the last round (``rounds``, or a round that improves nothing), each program's best
   is reported from a second measurement: the node's own (``gpu.run --retime-best 1``:
   ``results/retime.jsonl``, taken in the call that measured the round) or, without one, a
   **re-time round** that measures it again in a fresh pack; the reported speedup is the re-time's,
   and only when its 95 % interval lies above 1 (else 1.0 with the reason). ``summary.json``
   gives per program ``speedup`` (over the root), ``speedup_vs_eager`` (PyTorch eager's time
   over the best's, a number when the node could import torch, else null with the reason) and
   the trajectory of verified steps; ``report.md`` both.

State survives between rounds and interruptions: a round is written before the command
returns, results are read only when complete (every entry of the round's manifest has a
line), and a rerun without new results repeats the waiting message without redoing work.
"""

from __future__ import annotations

import hashlib
import json
import math
import statistics
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

from ..leir.fileformat import LeirModule, parse_leir
from .proposals import _proposals, _verify

#: Algorithms that work in rounds (a level of the tree per round).
ROUND_ALGORITHMS = ("greedy", "beam")

#: Settings that may change between runs of one search (the rest must match the saved state):
#: ``rounds`` (more continue a finished search, fewer end it at a waiting round) and
#: ``measure`` (candidates per program of the rounds still to come).
PER_RUN = ("rounds", "measure")


class RoundsError(ValueError):
    """Bad input or state for a round search (one line, the CLI's exit 2)."""


@dataclass
class RoundConfig:
    """Settings of a round search: ``algorithm`` (greedy: frontier 1; beam: ``beam``),
    ``rounds`` (search rounds before the re-time round), ``measure`` (candidates per program
    and round sent to the GPU), ``per_rule`` (seeded sample of a rule's candidates per frontier
    program), ``seed``, ``arch`` (the node's ``sm_XY``), ``timeout_s`` (one CPU verification,
    seconds), ``macro_steps`` (at most this many steps per rule in one macro proposal: binding
    every spatial loop of a 9-nest convolution program takes 27; a macro cut short leaves
    nests serial), ``rank``
    (``cost``: the static GPU model screens; ``model``: a LightGBM model refitted after every
    round on all GPU samples so far, the static model its prior, screens once it has 4 samples)."""

    algorithm: str = "greedy"
    beam: int = 2
    rounds: int = 4
    measure: int = 8
    per_rule: int = 4
    seed: int = 0
    arch: str = "sm_90"
    timeout_s: float = 120.0
    macro_steps: int = 48
    rank: str = "cost"
    levels: int = 1
    expand: int = 3

    @property
    def width(self) -> int:
        return 1 if self.algorithm == "greedy" else max(1, self.beam)


@dataclass
class Node:
    """A program of the frontier: ``text`` (``.leir``), the verified ``steps`` from the root
    (``[{"rule", "site", "params"}]``), ``speedup`` over the root and its ``ci`` from the GPU
    (1.0 for the root), ``time_us`` on the GPU (None until measured)."""

    text: str
    steps: list = field(default_factory=list)
    speedup: float = 1.0
    ci: list = field(default_factory=lambda: [1.0, 1.0])
    time_us: float | None = None


def _key(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def _alpha_key(module: LeirModule) -> str:
    """A short key equal for programs equal up to renaming (:func:`steptp.leir.alpha.alpha_normal`)."""
    from ..leir.alpha import alpha_normal  # noqa: PLC0415

    return _key(repr(alpha_normal(module.program, module.signature.names)))


# --------------------------------------------------------------------------- state


def _state_path(out: Path) -> Path:
    return out / "rounds" / "state.json"


def _save(out: Path, state: dict) -> None:
    from ..io import write_json_atomic  # noqa: PLC0415

    _state_path(out).parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(_state_path(out), state)


def _load_state(out: Path, programs: list[dict], cfg: RoundConfig) -> dict:
    p = _state_path(out)
    recorded = {**asdict(cfg)}
    if p.exists():
        try:
            state = json.loads(p.read_text(encoding="utf-8"))
        except ValueError as e:
            raise RoundsError(f"{p}: not a round state ({e})") from None
        same = {k: v for k, v in (state.get("config") or {}).items() if k not in PER_RUN} == \
            {k: v for k, v in recorded.items() if k not in PER_RUN}
        if not same or sorted(state.get("programs", {})) != sorted(x["name"] for x in programs):
            raise RoundsError(f"{out} holds a round search with other programs or settings; use another -o")
        state["config"] = recorded  # PER_RUN settings may change between runs of the same search
        return state
    return {"format": "stp-search-rounds/1", "config": recorded, "round": 0, "phase": "search", "pending": None,
            "programs": {x["name"]: {"root": x["text"], "source": x.get("source"), "frontier": [asdict(Node(x["text"]))],
                                     "measured": {}, "tried": [], "samples": 0, "root_us": None, "eager": None,
                                     "history": []}
                         for x in programs}}


# --------------------------------------------------------------------------- proposals

def _samples(prog: dict) -> list[dict]:
    """A program's GPU samples: its measured candidates Equal on the GPU and timed."""
    return [m for m in prog["measured"].values() if m.get("equal") and m.get("speedup") and m.get("text")]


def _training_rows(state: dict, exclude: str | None = None) -> list[tuple[str, str, float]]:
    """``(root text, candidate text, ln speedup)`` of every GPU sample so far (all programs but
    ``exclude``)."""
    rows = []
    for name, prog in state["programs"].items():
        if name == exclude:
            continue
        rows += [(prog["root"], m["text"], math.log(float(m["speedup"]))) for m in _samples(prog)]
    return rows


#: GPU timings shipped with the package (``stp-gpu-samples/1``, gzipped JSON): the samples of
#: the 40-program corpus search measured on an NVIDIA H200 (issue 37), written by
#: :func:`export_samples`. ``--rank model`` starts from them (the default GPU model).
SHIPPED_SAMPLES = Path(__file__).with_name("data") / "gpu_samples_h200.json.gz"


def export_samples(state_path: str | Path, out: str | Path, device: str) -> dict:
    """Write the GPU samples of a round search (``OUT/rounds/state.json``: every candidate
    Equal on the GPU and timed) to ``out`` as ``stp-gpu-samples/1`` (gzipped JSON: ``roots``
    by key, ``rows`` ``[root key, candidate .leir, ln speedup]``, ``device``). Returns the
    counts. Raises ``OSError``/``ValueError`` for an unreadable state."""
    import gzip  # noqa: PLC0415

    state = json.loads(Path(state_path).read_text(encoding="utf-8"))
    roots, rows = {}, []
    for prog in state["programs"].values():
        key = _key(prog["root"])
        for m in _samples(prog):
            roots[key] = prog["root"]
            rows.append([key, m["text"], round(math.log(float(m["speedup"])), 6)])
    doc = {"format": "stp-gpu-samples/1", "device": device, "roots": roots, "rows": rows}
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(out, "wt", encoding="utf-8") as fh:
        json.dump(doc, fh, separators=(",", ":"))
    return {"programs": len(roots), "rows": len(rows)}


_SHIPPED: list | None = None  # [(root key, root text, candidate text, ln speedup)]


def shipped_rows(exclude_roots=()) -> list[tuple[str, str, float]]:
    """``(root text, candidate text, ln speedup)`` of :data:`SHIPPED_SAMPLES` (empty when the
    file is missing), without the rows of programs whose root text is in ``exclude_roots``
    (a search of those programs is not helped by their own timings)."""
    global _SHIPPED
    if _SHIPPED is None:
        import gzip  # noqa: PLC0415

        try:
            with gzip.open(SHIPPED_SAMPLES, "rt", encoding="utf-8") as fh:
                doc = json.load(fh)
            _SHIPPED = [(k, doc["roots"][k], text, float(ls)) for k, text, ls in doc["rows"]]
        except (OSError, ValueError, KeyError):
            _SHIPPED = []
    skip = {_key(t) for t in exclude_roots}
    return [(root, text, ls) for k, root, text, ls in _SHIPPED if k not in skip]


def learned_model(rows: list[tuple[str, str, float]]):
    """A :class:`steptp.search.costmodel.CostModel` for ``cuda`` fitted on ``rows``
    (:func:`_training_rows`), or None with fewer than 4 rows or without LightGBM."""
    from .costmodel import CostModel, CostModelUnavailable, features_of, require_lightgbm  # noqa: PLC0415

    if len(rows) < 4:
        return None
    try:
        require_lightgbm()
    except CostModelUnavailable:
        return None
    m = CostModel("cuda")
    for root, cand, ls in rows:
        m.add_row(features_of(parse_leir(root).program, "cuda"), features_of(parse_leir(cand).program, "cuda"), ls)
    return m.fit()


def _scores(root_text: str, texts: list[str], model) -> list[float]:
    """Predicted ln speedups over the root: the learned model's, else the static GPU model's
    (:func:`steptp.search.cost.static_scores` on ``cuda``)."""
    from .cost import static_scores  # noqa: PLC0415

    root = parse_leir(root_text).program
    progs = [parse_leir(t).program for t in texts]
    return model.predict(root, progs) if model is not None else static_scores(root, progs, "cuda")


def verified_candidates(name: str, prog: dict, cfg: RoundConfig, round_no: int, rules=None) -> tuple[list, list]:
    """The proposals of one program's frontier for round ``round_no`` that verify Equal against
    its root on the CPU, not tried before (up to renaming): ``([(text, steps)], new tried
    keys)``. ``cfg.levels`` levels are expanded (:class:`RoundConfig`). Within a level the
    single-step proposals are ordered by the static GPU model
    (:func:`steptp.search.cost.static_scores` on ``cuda``) and verified in that order until
    ``cfg.measure`` of them verify (the rest could not enter the pack); macro proposals are
    verified step by step as they are built. ``rules``: loaded rules (None: the shipped ones,
    loaded here: a worker process of :func:`search_rounds` with ``workers`` > 1).
    Deterministic for ``cfg.seed``, the program and the round."""
    from ..seeds import seeded_rng  # noqa: PLC0415
    from .cost import static_scores  # noqa: PLC0415

    if rules is None:
        from ..rules import load_rules  # noqa: PLC0415

        rules = load_rules()
    root = parse_leir(prog["root"])
    rng = seeded_rng(cfg.seed, name, "rounds", str(round_no))
    seen = set(prog["tried"])
    new_keys, out = [], []
    level = [Node(**n) for n in prog["frontier"]]
    for lvl in range(max(1, cfg.levels)):
        props = []  # (module, steps, verified)
        for node in level:
            for mod, steps, verified in _proposals(rules, node, root, cfg, rng):
                module = LeirModule(root.signature, mod.program)
                key = _alpha_key(module)
                if key in seen:
                    continue
                seen.add(key)
                new_keys.append(key)
                props.append((module, steps, verified))
        if not props:
            break
        pred = static_scores(root.program, [m.program for m, _, _ in props], "cuda")
        order = sorted(range(len(props)), key=lambda i: (-pred[i], i))
        found, singles = [], 0
        for i in order:
            module, steps, verified = props[i]
            if not verified:
                if singles >= cfg.measure:
                    continue
                if not _verify(root, module, cfg):
                    continue
                singles += 1
            found.append((module.text(), steps, pred[i]))
        out.extend((t, st) for t, st, _ in found)
        pick = _diverse(list(range(len(found))), [st for _, st, _ in found], max(1, cfg.expand),
                        family=True)
        level = [Node(found[i][0], found[i][1]) for i in pick]
    return out, new_keys


def _diverse(order: list[int], steps: list[list], n: int, family: bool = False) -> list[int]:
    """The first ``n`` of ``order`` (indices, best first), taking first the best of each
    distinct sequence of rules in ``steps`` (candidates that differ only in a parameter,
    e.g. the bound axis, are mostly the same program to a GPU), then the rest in order. With
    ``family`` the best of each distinct *set* of rules first (the level expansion: macro
    sequences that differ in their order or their canonical filters, e.g. the row sequences'
    variants, are one family, so a narrow expansion also keeps a program of another one)."""
    first, rest, kinds = [], [], set()
    for i in order:
        kind = frozenset(s["rule"] for s in steps[i]) if family else tuple(s["rule"] for s in steps[i])
        (rest if kind in kinds else first).append(i)
        kinds.add(kind)
    return (first + rest)[:n]


def _screen(prog: dict, verified: list, cfg: RoundConfig, model=None) -> list[dict]:
    """The ``measure`` best of ``verified`` (:func:`verified_candidates`) by the learned
    ``model`` when given, else by the static GPU model, the best of each distinct rule
    sequence first (:func:`_diverse`)."""
    pred = _scores(prog["root"], [t for t, _ in verified], model)
    order = sorted(range(len(verified)), key=lambda i: (-pred[i], i))
    pick = _diverse(order, [st for _, st in verified], cfg.measure)
    return [{"text": verified[i][0], "steps": verified[i][1], "score": pred[i]} for i in pick]


def _all_verified(state: dict, cfg: RoundConfig, k: int, rules, workers: int) -> dict[str, tuple[list, list]]:
    """:func:`verified_candidates` of every program, in this process or over ``workers`` spawn
    processes (one program per task; results in program order, so the round does not depend
    on the worker count)."""
    items = list(state["programs"].items())
    if workers <= 1 or len(items) <= 1:
        return {name: verified_candidates(name, prog, cfg, k, rules) for name, prog in items}
    import multiprocessing as mp  # noqa: PLC0415
    from concurrent.futures import ProcessPoolExecutor  # noqa: PLC0415

    with ProcessPoolExecutor(max_workers=min(workers, len(items)), mp_context=mp.get_context("spawn")) as pool:
        futs = [(name, pool.submit(verified_candidates, name, prog, cfg, k)) for name, prog in items]
        return {name: f.result() for name, f in futs}


# --------------------------------------------------------------------------- rounds


def _write_round(out: Path, k: int, entries: list[dict], write_pack: Callable[[Path, Path], dict]) -> Path:
    """Write round ``k``'s ``dictionary.jsonl`` and build its pack, unless the same entries'
    pack is already complete there (a command interrupted after the build); a pack of other
    entries (an interrupted attempt that chose differently) is built again."""
    import shutil  # noqa: PLC0415

    from ..io import write_jsonl_atomic  # noqa: PLC0415

    d = out / "rounds" / str(k)
    d.mkdir(parents=True, exist_ok=True)
    text = "".join(json.dumps(e, sort_keys=True) + "\n" for e in entries)
    f = d / "dictionary.jsonl"
    same = f.exists() and "".join(json.dumps(json.loads(x), sort_keys=True) + "\n"
                                  for x in f.read_text(encoding="utf-8").splitlines() if x.strip()) == text
    if same and (d / "pack" / "manifest.json").exists():
        return d
    write_jsonl_atomic(f, entries)
    if (d / "pack").exists():
        shutil.rmtree(d / "pack")
    if (d / "results").exists():
        shutil.rmtree(d / "results")  # results of another pack
    write_pack(d, d / "pack")
    return d


def _entry(name: str, prog: dict, text: str, steps: list, cfg: RoundConfig, tag: str) -> dict:
    """A dataset-format entry (what :func:`steptp.gpu.pack.collect` reads) of one candidate."""
    from ..llm.prompts import signature_dict  # noqa: PLC0415
    from ..leir.printer import format_program  # noqa: PLC0415

    root = parse_leir(prog["root"])
    cand = parse_leir(text)
    return {"id": f"{name}:{tag}:{_key(text)}", "program": name, "signature": signature_dict(root),
            "strategy": {"id": steps[-1]["rule"] if steps else ""}, "original": {"leir": format_program(root.program)},
            "transformed": {"leir": format_program(cand.program)}, "seed": cfg.seed, "source": prog.get("source"),
            "verification": {"equal": True}}


def _results(d: Path) -> dict[str, dict] | None:
    """The node's records of round directory ``d`` by entry id, or None while incomplete
    (no results file, or fewer lines than the pack's entries)."""
    res = d / "results" / "results.jsonl"
    man = d / "pack" / "manifest.json"
    if not res.exists() or not man.exists():
        return None
    want = {e["id"] for e in json.loads(man.read_text(encoding="utf-8")).get("entries", [])}
    got = _by_id(res)
    return got if want <= set(got) else None


def _by_id(path: Path) -> dict[str, dict]:
    """The records of one of the node's JSONL files by entry id (empty when it is missing);
    a line cut by an interruption is skipped: the node's rerun repairs it."""
    got = {}
    if path.exists():
        for line in path.read_text(encoding="utf-8").splitlines():
            try:
                r = json.loads(line)
            except ValueError:
                continue
            got[r["id"]] = r
    return got


def _retime_records(d: Path) -> dict[str, dict]:
    """The node's second measurements of round directory ``d`` (``results/retime.jsonl`` from
    ``python -m steptp.gpu.run ... --retime-best K``) by entry id; empty when there are none."""
    return _by_id(d / "results" / "retime.jsonl")


def _eager_us(rec: dict) -> tuple[float | None, float | None]:
    e = rec.get("eager") or {}
    return e.get("eager_us"), e.get("compile_us")


def _vs_eager(rec: dict, speedup: float) -> float | None:
    """PyTorch eager's time over the best program's: eager was timed interleaved with the
    root (``eager.original_us``), the best interleaved with the root (``speedup`` = root/best),
    so ``eager/best = eager/root * root/best`` compares interleaved ratios only."""
    e = rec.get("eager") or {}
    if e.get("eager_us") is None or not e.get("original_us"):
        return None
    return float(e["eager_us"]) / float(e["original_us"]) * float(speedup)


def _measured(rec: dict) -> dict:
    """What a node record says of one candidate: ``equal`` on the GPU, timing fields."""
    tr, orig = rec.get("transformed") or {}, rec.get("original") or {}
    t = rec.get("timing") or {}
    ok = bool(tr.get("exec") and tr.get("equal") and orig.get("equal") and "speedup" in t)
    return {"equal": ok, "reason": tr.get("reason") or orig.get("reason") or t.get("error", ""),
            "speedup": t.get("speedup"), "ci": t.get("ci"), "verdict": t.get("verdict"),
            "original_us": t.get("original_us"), "transformed_us": t.get("transformed_us"), "device": t.get("device")}


def _consume(state: dict, d: Path, records: dict[str, dict], cfg: RoundConfig) -> None:
    """Update every program's samples and frontier from a search round's records (and the
    node's re-time records, ``retime.jsonl``, kept beside the candidate they measured again)."""
    pending = state["pending"]
    again = _retime_records(d)
    for name, cands in pending["candidates"].items():
        prog = state["programs"][name]
        nodes = [Node(**n) for n in prog["frontier"]]
        improved = False
        for c in cands:
            rec = records.get(c["id"])
            if rec is None:
                continue
            m = _measured(rec)
            eager, comp = _eager_us(rec)
            if eager is not None:
                prog["eager"] = {"eager_us": eager, "compile_us": comp}
            if m["original_us"] is not None:
                prog["root_us"] = m["original_us"] if prog["root_us"] is None else min(prog["root_us"], m["original_us"])
            prog["measured"][c["id"]] = {**m, "steps": c["steps"], "score": c["score"], "text": c["text"]}
            if c["id"] in again:
                prog["measured"][c["id"]]["retime_record"] = again[c["id"]]
            if not m["equal"]:
                continue
            prog["samples"] += 1
            node = Node(c["text"], c["steps"], float(m["speedup"]), list(m["ci"] or [m["speedup"]] * 2),
                        m["transformed_us"])
            if node.speedup > max(n.speedup for n in nodes):
                improved = True
            nodes.append(node)
        nodes.sort(key=lambda n: -n.speedup)
        prog["frontier"] = [asdict(n) for n in nodes[: cfg.width]]
        prog["history"].append({"round": pending["round"], "measured": len(cands),
                                "best_speedup": prog["frontier"][0]["speedup"], "improved": improved})


def _node_retime(prog: dict) -> dict | None:
    """The node's second measurement of the program's best (its frontier's first), taken in
    the round that measured it (``--retime-best``), or None."""
    best = prog["frontier"][0]
    if not best.get("steps"):
        return None
    for m in prog["measured"].values():
        if m.get("text") == best["text"] and m.get("retime_record") is not None:
            return m["retime_record"]
    return None


def _finalize(state: dict, records: dict[str, dict] | None, out: Path, cfg: RoundConfig) -> list[dict]:
    """``summary.json`` per program (in ``OUT/<program>/``), the combined ``summary.json`` and
    ``report.md`` from the re-time round's records."""
    from ..io import write_json_atomic  # noqa: PLC0415

    summaries = []
    retime = (state.get("pending") or {}).get("retime", {})
    for name, prog in state["programs"].items():
        kept = _node_retime(prog)
        best = Node(**prog["frontier"][0])
        sm = {"program": name, "algorithm": cfg.algorithm, "runner": "pack", "device": "cuda",
              "rounds": len(prog["history"]), "samples": prog["samples"], "strategies": sorted(
                  {s["rule"] for s in best.steps}), "trajectory": best.steps, "speedup": 1.0, "speedup_ci": None,
              "speedup_vs_eager": None, "eager_reason": "", "root_us": prog["root_us"], "best_us": None,
              "eager_us": None, "compile_us": None, "retimed": False, "reason": ""}
        rid = retime.get(name)
        rec = (records or {}).get(rid) if rid else kept
        if rec is not None:
            m = _measured(rec)
            sm["retimed"] = True
            sm["root_us"] = m["original_us"]
            eager, comp = _eager_us(rec)
            sm["eager_us"], sm["compile_us"] = eager, comp
            if m["equal"] and m["ci"] and m["ci"][0] > 1.0:
                sm.update(speedup=float(m["speedup"]), speedup_ci=m["ci"], best_us=m["transformed_us"])
            else:
                sm["reason"] = ("the re-time did not reproduce a speedup (interval "
                                f"{m['ci']})" if m["equal"] else f"not Equal on the GPU at the re-time: {m['reason']}")
                sm["trajectory"], sm["strategies"] = [], []
                best = Node(prog["root"])
        elif best.steps:
            sm["reason"] = "no re-time result: the best is not reported"
            sm["trajectory"], sm["strategies"] = [], []
            best = Node(prog["root"])
        vs = _vs_eager(rec, sm["speedup"]) if rec is not None else None
        if vs is None and prog.get("eager") and prog["eager"].get("eager_us") and prog["root_us"]:
            sm["eager_us"] = prog["eager"]["eager_us"]  # no re-time (nothing beat the root): the root's round
            vs = float(sm["eager_us"]) / float(prog["root_us"])
        if vs is not None:
            sm["speedup_vs_eager"] = vs
        else:
            sm["eager_reason"] = ("the node did not time PyTorch eager (no torch there, or the program is not from a "
                                  ".py file)")
        sm["efficiency"] = sm["speedup"] / max(1, sm["samples"])
        d = out / name
        d.mkdir(parents=True, exist_ok=True)
        (d / "best.leir").write_text(best.text)
        write_json_atomic(d / "summary.json", sm)
        summaries.append(sm)
    write_json_atomic(out / "summary.json", {"programs": summaries, **_aggregate(summaries),
                                             "ranking": ranking_quality(state)})
    (out / "report.md").write_text(report_md(summaries))
    return summaries


def ranking_quality(state: dict, k: int = 3) -> dict:
    """How well the GPU cost models ranked what the node measured, per program (its Equal,
    timed candidates of every round; programs with at least two distinct speedups): mean
    Kendall τ and top-``k`` recall of the static GPU model (``ln(est_root / est_cand)``), of
    the learned model fitted on the *other* programs' samples only (held out by program; None
    with the reason without LightGBM or with too few samples) and of the shipped model
    (:data:`SHIPPED_SAMPLES` without the program's own rows)."""
    from .costmodel import kendall_tau, top_k_recall  # noqa: PLC0415

    out = {"static": {"tau": [], "recall": []}, "learned": {"tau": [], "recall": []},
           "shipped": {"tau": [], "recall": []}}
    learned_ok, why = True, ""
    for name, prog in state["programs"].items():
        items = _samples(prog)
        true = [math.log(float(m["speedup"])) for m in items]
        if len(items) < 2 or len(set(true)) < 2:
            continue
        texts = [m["text"] for m in items]
        for kind, model in (("static", None), ("learned", "held-out"), ("shipped", None)):
            if kind == "shipped":
                rows = shipped_rows([prog["root"]])
                if not rows:
                    continue
                model = learned_model(rows)  # refitted without this program's rows: held out
                if model is None:
                    continue
            if kind == "learned":
                if not learned_ok:
                    continue
                model = learned_model(_training_rows(state, exclude=name))
                if model is None:
                    learned_ok, why = False, "fewer than 4 samples of other programs, or no LightGBM"
                    continue
            pred = _scores(prog["root"], texts, model)
            tau = kendall_tau(pred, true)
            if tau is not None:
                out[kind]["tau"].append(tau)
            out[kind]["recall"].append(top_k_recall(pred, true, k))
    res = {}
    for kind, v in out.items():
        n = len(v["recall"])
        res[kind] = {"groups": n, "k": k, "tau": sum(v["tau"]) / len(v["tau"]) if v["tau"] else None,
                     f"recall_at_{k}": sum(v["recall"]) / n if n else None}
    if not learned_ok:
        res["learned"]["reason"] = why
    if not res["shipped"]["groups"]:
        res["shipped"]["reason"] = "no shipped GPU samples of other programs, or no LightGBM"
    return res


def _geo(xs) -> float | None:
    xs = [x for x in xs if x is not None and x > 0]
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else None


def _aggregate(summaries: list[dict]) -> dict:
    sp = sorted(s["speedup"] for s in summaries)
    eager = [s["speedup_vs_eager"] for s in summaries if s["speedup_vs_eager"] is not None]
    return {"median_speedup": statistics.median(sp) if sp else None, "geomean_speedup": _geo(sp),
            "geomean_vs_eager": _geo(eager), "faster_than_eager": sum(1 for x in eager if x > 1.0),
            "with_eager": len(eager)}


def report_md(summaries: list[dict]) -> str:
    """The round search's ``report.md``: per program the speedup over the root (re-timed, its
    interval), the best's and PyTorch eager's times and their ratio, samples and rounds."""
    agg = _aggregate(summaries)

    def f(x, fmt="{:.2f}"):
        return "n/a" if x is None else fmt.format(x)

    lines = ["# GPU search through packs", "",
             f"{len(summaries)} programs; median speedup over the original {f(agg['median_speedup'])}x, geometric "
             f"mean {f(agg['geomean_speedup'])}x; vs PyTorch eager: geometric mean {f(agg['geomean_vs_eager'])}x, "
             f"{agg['faster_than_eager']} of {agg['with_eager']} faster than eager.", "",
             "| program | speedup | 95% CI | original µs | best µs | eager µs | vs eager | samples | rounds | steps |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for s in summaries:
        ci = f"[{s['speedup_ci'][0]:.2f}, {s['speedup_ci'][1]:.2f}]" if s["speedup_ci"] else ""
        lines.append(f"| {s['program']} | {s['speedup']:.2f}x | {ci} | {f(s['root_us'], '{:.1f}')} | "
                     f"{f(s['best_us'], '{:.1f}')} | {f(s['eager_us'], '{:.1f}')} | {f(s['speedup_vs_eager'])} | "
                     f"{s['samples']} | {s['rounds']} | {len(s['trajectory'])} |")
    notes = [f"- {s['program']}: {s['reason']}" for s in summaries if s["reason"]]
    if notes:
        lines += ["", "Not reported:", *notes]
    return "\n".join(lines) + "\n"


def _stalled(state: dict) -> bool:
    """True when the last measured round improved no program's best."""
    last = [p["history"][-1] for p in state["programs"].values() if p["history"]]
    return bool(last) and not any(h["improved"] for h in last)


def search_rounds(programs: list[dict], out: str | Path, cfg: RoundConfig, rules,
                  write_pack: Callable[[Path, Path], dict], progress: Callable[[str], None] | None = None,
                  workers: int = 1) -> dict:
    """Advance the round search in ``out`` as far as it can go without the GPU node (module
    docstring). ``programs``: ``[{"name", "text" (.leir), "source" (.py path or None)}]``;
    ``rules``: loaded rules; ``write_pack(round_dir, pack_dir)`` builds the pack of a round
    directory's ``dictionary.jsonl``; ``workers``: processes proposing and verifying programs in
    parallel (each loads the shipped rules; the rounds are the same for any count). Returns ``{"status": "waiting", "round", "pack",
    "results"}`` when the node must run a pack, or ``{"status": "done", "summaries"}``. Raises
    :class:`RoundsError` for another search's state in ``out``."""
    say = progress or (lambda msg: None)
    if cfg.algorithm not in ROUND_ALGORITHMS:
        raise RoundsError(f"--runner pack works in rounds with --algorithm {' or '.join(ROUND_ALGORITHMS)}, not "
                          f"{cfg.algorithm}")
    out = Path(out)
    state = _load_state(out, programs, cfg)
    while True:
        pending = state.get("pending")
        if pending is not None:
            d = out / "rounds" / str(pending["round"])
            records = _results(d)
            if records is None and state["phase"] == "search" and pending["round"] >= cfg.rounds:
                state["pending"] = None  # -n lowered while a round waited: end with what was measured
                continue
            if records is None:
                _save(out, state)
                return {"status": "waiting", "round": pending["round"], "pack": str(d / "pack"),
                        "results": str(d / "results")}
            if state["phase"] == "retime":
                summaries = _finalize(state, records, out, cfg)
                state["phase"], state["pending"] = "done", None
                _save(out, state)
                return {"status": "done", "summaries": summaries}
            _consume(state, d, records, cfg)
            state["round"] += 1
            state["pending"] = None
            _save(out, state)
            continue
        if state["phase"] == "done" and state["round"] < cfg.rounds and not _stalled(state):
            # -n raised after the end: search on from the frontier, in a round directory of its own
            rounds_dir = out / "rounds"
            used = [int(x.name) for x in rounds_dir.iterdir() if x.is_dir() and x.name.isdigit()]
            state["round"] = max([state["round"], *[u + 1 for u in used]])
            state["phase"] = "search"
            if state["round"] >= cfg.rounds:
                state["phase"] = "done"
        if state["phase"] == "done":
            return {"status": "done", "summaries": [json.loads((out / n / "summary.json").read_text())
                                                    for n in state["programs"]]}
        stalled = _stalled(state)
        k = state["round"]
        if k >= cfg.rounds or stalled:
            # the re-time round: each program's best again, in a fresh pack (unless the node
            # measured it a second time in its own round: --retime-best)
            entries, retime = [], {}
            for name, prog in state["programs"].items():
                best = Node(**prog["frontier"][0])
                if best.steps and _node_retime(prog) is None:
                    e = _entry(name, prog, best.text, best.steps, cfg, "retime")
                    entries.append(e)
                    retime[name] = e["id"]
            state["phase"] = "retime"
            if not entries:
                summaries = _finalize(state, None, out, cfg)
                state["phase"] = "done"
                _save(out, state)
                return {"status": "done", "summaries": summaries}
            say(f"round {k}: re-timing {len(entries)} best program(s)")
            d = _write_round(out, k, entries, write_pack)
            state["pending"] = {"round": k, "retime": retime, "candidates": {}}
            _save(out, state)
            continue
        entries, cands = [], {}
        t0 = time.perf_counter()
        own_roots = [p["root"] for p in state["programs"].values()]
        model = learned_model(_training_rows(state) + shipped_rows(own_roots)) if cfg.rank == "model" else None
        verified = _all_verified(state, cfg, k, rules, workers)
        for name, prog in state["programs"].items():
            found, keys = verified[name]
            prog["tried"].extend(keys)
            picked = _screen(prog, found, cfg, model)
            cands[name] = []
            for c in picked:
                e = _entry(name, prog, c["text"], c["steps"], cfg, f"r{k}")
                entries.append(e)
                cands[name].append({"id": e["id"], **c})
        say(f"round {k}: {len(entries)} candidate(s) verified and screened in {time.perf_counter() - t0:.1f} s")
        if not entries:
            state["round"] = cfg.rounds  # nothing left to measure: re-time what there is
            _save(out, state)
            continue
        d = _write_round(out, k, entries, write_pack)
        state["pending"] = {"round": k, "candidates": cands}
        _save(out, state)


__all__ = ["ROUND_ALGORITHMS", "RoundConfig", "RoundsError", "Node", "search_rounds",
           "report_md", "SHIPPED_SAMPLES", "export_samples", "shipped_rows", "learned_model", "ranking_quality"]
