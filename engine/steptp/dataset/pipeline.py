"""``stp dataset``: batch generation with parallel workers, a progress bar and resume.

Output directory layout::

    OUTDIR/run.json            options of the run (a rerun must use the same ones)
    OUTDIR/dictionary.jsonl    archival dictionary entries, appended as programs finish
    OUTDIR/state.jsonl         one line per finished program (its key): the resume record
    OUTDIR/attempts.jsonl      every tried candidate with its outcome (failures included)
    OUTDIR/chat_single.jsonl   ms-swift single-answer set (filtered, derived; atomic rewrite)
    OUTDIR/chat_multi.jsonl    ms-swift multi-answer set (filtered, derived; atomic rewrite)
    OUTDIR/rl_prompts.jsonl    RL prompt set for TRL GRPOTrainer + steptp.rewards.step_reward: one
                               single-answer prompt per original program with an ``original``
                               (.leir) column (derived)
    OUTDIR/report.json         counts per strategy/category/level, pass rates, sizes, failed programs
                               (internal_errors: crashes, input_errors: bad programs)

With ``--rounds N`` (:class:`~steptp.dataset.generate.Options` ``rounds``) a program's
result holds the entries of all its rounds (derived originals included), so its state line
commits them together: a program is done only when all its rounds are on disk.

Crash safety: entries of a program are appended (flushed and fsynced) before its
attempts and its state line, which lists the program's entry ids and so commits it. Only
complete lines count on resume, and a program is done only when all its listed entries are
in the dictionary (:mod:`steptp.dataset.resume`), so an interrupted or truncated run loses
nothing: rerunning the same command appends exactly what is missing and never duplicates an
entry. Derived files are rebuilt from the dictionary at the end of every run. Foreign
lines in the output files, a read-only directory or a full disk raise :class:`DatasetError`
naming the file.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import random
from collections import Counter, defaultdict
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import asdict
from pathlib import Path
from typing import Callable, Iterable, Iterator

from tqdm import tqdm

from .chat import multi_messages, multi_tokens, rl_record, single_messages, token_counter
from .difficulty import (FilterPolicy, FilteredSets, composition_stats, filter_multi_items, keep_single, paper_sets,
                         prompt_key)
from .generate import Options, ProgramResult, is_internal_error, process_batch_safe
from .labels import one_label_per_step
from .resume import ResumeError, load_resume_state
from ..programs import discover
from ..io import JsonlAppender, read_jsonl, write_json_atomic, write_jsonl_atomic


class DatasetError(RuntimeError):
    """Unusable output directory or options (e.g. resuming with other options)."""


class DatasetInterrupted(DatasetError):
    """The run was stopped by a signal (Ctrl-C, SIGTERM): the programs recorded so far are
    kept, and the chat sets and ``report.json`` were rebuilt from them (a partial summary);
    a rerun of the same command resumes. ``report``: that partial report."""

    def __init__(self, message: str, report: dict):
        super().__init__(message)
        self.report = report


class WorkerCrashed(DatasetError):
    """A worker process died (killed, out of memory): an internal failure, not bad input
    (the CLI exits 1). What was recorded stays; a rerun resumes."""


def _run_options(opts: Options, policy: FilterPolicy) -> dict:
    d = asdict(opts)
    d["rule_paths"] = [Path(p).name for p in opts.rule_paths]
    d["rule_hashes"] = rule_hashes(opts.rule_paths)
    if d["device"] == "cpu":
        del d["device"]  # run.json of CPU runs as before --device existed (they resume)
    if not d["time"]:
        del d["time"]  # run.json as before --time existed
    if d["rounds"] == 1:
        del d["rounds"], d["derived_per_round"]  # one round: run.json as before --rounds existed
    if not d["negatives"]:
        del d["negatives"], d["mutants"]  # run.json as before --negatives existed
    if not d["follow_ups"]:
        del d["follow_ups"]  # run.json as before --follow-ups existed
    d["policy"] = policy.recorded()
    return d


#: Programs per worker task: their candidates share one batched nvcc run (see
#: :func:`steptp.dataset.generate.process_batch`); the output does not depend on it.
BATCH_PROGRAMS = 8


def program_batches(todo: list, workers: int, batch: int = BATCH_PROGRAMS) -> list[list]:
    """``todo`` cut into consecutive batches of at most ``batch`` programs; with several
    workers, smaller when there are too few programs for four batches per worker (so that
    no worker is left with a long last batch while the others idle)."""
    size = batch if workers <= 1 else min(batch, -(-len(todo) // (4 * workers)))
    size = max(1, size)
    return [todo[i:i + size] for i in range(0, len(todo), size)]


def _local_results(todo: list, opts: Options, workers: int, batch: int = BATCH_PROGRAMS) -> Iterator[ProgramResult]:
    """Results of ``todo`` in input order: in this process, or in ``workers`` long-lived
    spawn processes (each keeps its verification worker and caches for all its programs).
    Programs go in batches (:func:`program_batches`) that share their nvcc runs."""
    batches = program_batches(todo, workers, batch)
    if workers <= 1 or len(batches) <= 1:
        for b in batches:
            yield from process_batch_safe(b, opts)
        return
    ctx = mp.get_context("spawn")  # TVM's thread pool is not fork-safe (tvm notes §5)
    pool = ProcessPoolExecutor(max_workers=workers, mp_context=ctx)
    finished = False
    try:
        futs = [pool.submit(process_batch_safe, b, opts) for b in batches]
        for fut in futs:  # in input order: the files do not depend on timing
            yield from fut.result()
        finished = True
    finally:
        if finished:
            pool.shutdown(wait=True)
        else:  # interrupted (a signal, the consumer stopped): the batches in flight are given up
            procs = list((getattr(pool, "_processes", None) or {}).values())
            pool.shutdown(wait=False, cancel_futures=True)
            for p in procs:
                if p.is_alive():
                    p.terminate()


def generate_dataset(inputs: list[str], outdir: str | Path, opts: Options, policy: FilterPolicy | None = None,
                     workers: int = 1, progress: bool = True,
                     on_result: Callable[[ProgramResult], None] | None = None,
                     ray_address: str | None = None, use_ray: bool = False, batch: int = BATCH_PROGRAMS) -> dict:
    """Generate (or resume) a dataset into ``outdir``; returns the report dict.

    Programs are recorded in input order whatever the worker count or back end, so
    ``dictionary.jsonl``, ``attempts.jsonl`` and the derived files are byte-identical
    for the same inputs, options and seed (``state.jsonl`` holds timings). ``use_ray``
    distributes programs over a Ray cluster (:mod:`steptp.dataset.distributed`; a local one
    unless ``ray_address`` names one), ``workers`` then caps the batches in flight.
    ``batch``: programs per worker task (:func:`program_batches`); a killed run loses at
    most the batches in flight, which a rerun redoes.

    Raises :class:`DatasetError` when ``outdir`` holds a run made with other options,
    ``FileNotFoundError``/``ValueError`` for bad inputs and
    :class:`steptp.dataset.distributed.RayUnavailable` for an unreachable ``ray_address``
    (all before anything is written); :class:`WorkerCrashed` (a :class:`DatasetError`) when a
    worker process dies (killed, out of memory): what was recorded stays, and a rerun resumes.
    """
    policy = policy or FilterPolicy(seed=opts.seed)
    sources = discover(inputs)
    if use_ray and ray_address:
        from .distributed import check_reachable

        check_reachable(ray_address)  # before anything is written
    out = Path(outdir)
    try:
        return _generate(sources, out, opts, policy, workers, progress, on_result, use_ray, ray_address, batch)
    except ResumeError as e:
        raise DatasetError(f"{e}; the output directory was left unchanged (use another -o or fix the file)") from None
    except OSError as e:
        raise DatasetError(f"{e.filename or out}: cannot write: {e.strerror or e}") from None
    except BrokenProcessPool as e:
        raise WorkerCrashed(f"a worker process died ({e or 'killed'}); the programs recorded so far are kept in "
                           f"{out}, rerun the same command to resume") from None


def _generate(sources, out: Path, opts: Options, policy: FilterPolicy, workers: int, progress: bool,
              on_result, use_ray: bool = False, ray_address: str | None = None,
              batch: int = BATCH_PROGRAMS) -> dict:
    if out.exists() and not out.is_dir():
        raise DatasetError(f"{out}: exists and is not a directory")
    run_file = out / "run.json"
    run_opts = _run_options(opts, policy)
    if run_file.exists():
        try:
            previous = json.loads(run_file.read_text())
        except (ValueError, UnicodeDecodeError) as e:
            raise DatasetError(f"{run_file}: not a run description ({e})") from None
        if not isinstance(previous, dict):
            raise DatasetError(f"{run_file}: not a run description (expected a JSON object)")
        before, now = previous.get("rule_hashes") or {}, run_opts["rule_hashes"]
        changed = sorted(name for name, h in before.items() if now.get(name, h) != h)
        added, removed = sorted(set(now) - set(before)), sorted(set(before) - set(now))
        if before and (changed or added or removed):
            what = "; ".join(f"{k}: {', '.join(v)}" for k, v in (("changed", changed), ("added", added),
                                                                  ("removed", removed)) if v)
            raise DatasetError(f"{out} holds a run made with other rule files ({what}): its results would be "
                               "stale; use another output directory or delete it")
        if previous != run_opts:
            diff = sorted(k for k in set(previous) | set(run_opts) if previous.get(k) != run_opts.get(k))
            detail = "; ".join(f"{k}: {previous.get(k)!r} there, {run_opts.get(k)!r} now" for k in diff)
            raise DatasetError(f"{out} holds a run with different options ({detail}); "
                               "use another output directory or delete it")
    load_resume_state(out, validate_only=True)  # refuse foreign files before writing anything
    out.mkdir(parents=True, exist_ok=True)
    if not run_file.exists():
        write_json_atomic(run_file, run_opts)

    resume = load_resume_state(out)
    done, known_ids = resume.done, resume.known_ids
    todo = [s for s in sources if s.key not in done]

    dict_w = JsonlAppender(out / "dictionary.jsonl")
    state_w = JsonlAppender(out / "state.jsonl")
    att_w = JsonlAppender(out / "attempts.jsonl")
    bar = tqdm(total=len(sources), initial=len(sources) - len(todo), desc="programs", unit="prog",
               disable=not progress, dynamic_ncols=True)

    def record(res: ProgramResult) -> None:
        new = [e for e in res.entries if e["id"] not in known_ids]
        dict_w.write_many(new)
        known_ids.update(e["id"] for e in new)
        att_w.write_many({"source": res.source, "key": res.key, **a} for a in res.attempts)
        # the state line is the commit record: written last, it lists every entry of the program
        state_w.write_many([{"key": res.key, "source": res.source, "program": res.program,
                             "entries": len(new), "ids": [e["id"] for e in res.entries], "error": res.error,
                             "seconds": round(res.seconds, 3)}])
        bar.update(1)
        bar.set_postfix(entries=len(known_ids))
        if res.error:
            tqdm.write(f"skipped {res.source}: {res.error.splitlines()[0]}")
        if on_result:
            on_result(res)

    results = None
    try:
        if use_ray:
            from .distributed import ray_results

            results = ray_results(program_batches(todo, workers, batch), opts, address=ray_address,
                                  in_flight=max(2, 2 * workers))
        else:
            results = _local_results(todo, opts, workers, batch)
        for res in results:
            record(res)
    except KeyboardInterrupt:
        interrupted = True
    else:
        interrupted = False
    finally:
        bar.close()
        if results is not None and hasattr(results, "close"):
            results.close()  # stops the workers of an interrupted run
        dict_w.close()
        state_w.close()
        att_w.close()
    report = build_derived(out, policy)
    if interrupted:
        raise DatasetInterrupted(f"interrupted after {report['programs']} of {len(sources)} programs; the chat sets "
                                 f"and report.json in {out} cover those; rerun the same command to resume", report)
    return report


def filtered_sets(entries: list[dict], policy: FilterPolicy) -> FilteredSets:
    """The difficulty-aware filtering of paper §3.4 over dictionary entries (any order).

    Returns a :class:`~steptp.dataset.difficulty.FilteredSets`, the 2-tuple ``(single,
    multi)``: the entries kept as single-answer records (sorted by id) and the entry lists of
    the multi-answer records; its ``stats`` attribute is a JSON-ready dict of how they came
    out (:func:`~steptp.dataset.difficulty.composition_stats`: answers per prompt, answer
    slots against distinct steps, the level mix against the paper's).

    * ``default``: per original program with enough kept items, one multi-answer record (a
      seeded sample of 2..n items); every medium and difficult entry a single-answer record.
    * ``paper``: :func:`steptp.dataset.difficulty.paper_sets` over the entries grouped by
      prompt (program name, original LEIR, signature), multi-answer records measured with
      :func:`steptp.dataset.chat.multi_tokens` against ``policy.max_tokens``; ``stats``
      also has ``medium_join_rate`` and ``tokens {max_tokens, measure, over, split, parts,
      dropped, dropped_steps, max}`` (records over the bound, records split and the smaller
      records made of them, records dropped, answers lost, the longest record kept), for
      ``report.json``.

    Deterministic for ``policy.seed`` and the set of entries."""
    entries = sorted(entries, key=lambda e: e["id"])
    if policy.profile == "paper":
        by_prompt: dict[tuple, list[dict]] = defaultdict(list)
        for e in entries:
            by_prompt[prompt_key(e)].append(e)
        _, measure_name = token_counter()
        return paper_sets([sorted(by_prompt[k], key=lambda e: (e["strategy"]["id"], e["id"]))
                           for k in sorted(by_prompt)], policy, measure=multi_tokens, measure_name=measure_name)
    by_original: dict[str, list[dict]] = defaultdict(list)
    for e in entries:
        by_original[e["original"]["leir"]].append(e)
    singles = keep_single(entries, policy)
    rng = random.Random(f"multi:{policy.seed}")
    counts: dict[str, int] = {}
    multis = []
    for leir in sorted(by_original):
        group = sorted(by_original[leir], key=lambda e: (e["strategy"]["id"], e["id"]))
        items = filter_multi_items(group, counts, policy)
        if len(items) < policy.min_multi:
            continue
        k = rng.randint(policy.min_multi, len(items))
        multis.append(rng.sample(items, k))
    return FilteredSets(singles, multis, {"profile": "default", **composition_stats(singles, multis)})


def negative_records(attempts) -> list[dict]:
    """``negatives.jsonl`` records from the attempts of a ``--negatives`` run: every rejected
    candidate with ``original`` and ``transformed`` (canonical LEIR), ``strategy``, ``stage``
    (diff / build / exec / equal / symbolic), ``reason``, ``max_abs_err``, ``kind``
    (``rejected``: a candidate the engine proposed; ``mutant``: a hard negative made from a
    verified step, with its ``operator``), ``source`` and ``key`` of its program. Sorted,
    deduplicated by text."""
    out, seen = [], set()
    for a in attempts:
        n = a.get("negative")
        if not n or (n["original"], n["transformed"]) in seen:
            continue
        seen.add((n["original"], n["transformed"]))
        out.append({"original": n["original"], "transformed": n["transformed"], "strategy": n["strategy"],
                    "rule": a["rule"], "stage": n["stage"], "reason": a["reason"], "max_abs_err": n["max_abs_err"],
                    "kind": n.get("kind", "rejected"), "operator": n.get("operator"), "cot": n["cot"],
                    "source": a.get("source"), "key": a.get("key")})
    return sorted(out, key=lambda r: (r["original"], r["rule"], r["transformed"]))


def preference_pairs(chosen: list[dict], negatives: list[dict], seed: int = 0) -> tuple[list[dict], list[dict]]:
    """Preference pairs from the single-answer entries (``chosen``: verified steps) and the
    negatives of the same original program: each chosen step is paired with one negative of
    its program (a seeded choice, spread over them). Returns ``(trl, swift)``: TRL's
    conversational DPO format (``prompt`` / ``chosen`` / ``rejected`` message lists) and
    ms-swift's (``messages`` with the chosen answer, ``rejected_response``). The prompt is the
    chat set's single-answer prompt; the rejected answer is written like a chosen one (its CoT,
    its IR, its strategy), so only the program's correctness tells them apart."""
    from .chat import single_label

    by_original: dict[str, list[dict]] = defaultdict(list)
    for n in negatives:
        by_original[n["original"]].append(n)
    rng = random.Random(f"pairs:{seed}")
    trl, swift = [], []
    for e in chosen:
        cands = by_original.get(e["original"]["leir"])
        if not cands:
            continue
        neg = cands[rng.randrange(len(cands))]
        msgs = single_messages(e)["messages"]
        rejected = single_label(neg["cot"], neg["transformed"], neg["strategy"])
        meta = {"entry_id": e["id"], "chosen_strategy": e["strategy"]["id"], "rejected_rule": neg["rule"],
                "rejected_stage": neg["stage"]}
        trl.append({"prompt": [msgs[0]], "chosen": [msgs[1]], "rejected": [{"role": "assistant", "content": rejected}],
                    "meta": meta})
        swift.append({"messages": msgs, "rejected_response": rejected, "meta": meta})
    return trl, swift


#: Attempt outcomes that are not candidates the verifier judged (no pass rate counts them):
#: worker failures that did not reproduce, a derived original's step back to its parent, a
#: step kept under another strategy's label (:mod:`steptp.dataset.labels`).
NOT_CANDIDATE_OUTCOMES = ("infrastructure", "reverts_parent", "duplicate_label")
#: Attempt outcomes that are errors of the rule itself (its rewrite, its CoT template, its
#: patterns), not verdicts on a candidate.
RULE_ERROR_OUTCOMES = ("apply_error", "match_error")
#: Failures that say nothing against the rule: limits (a large program) and the GPU preflight
#: rejecting a candidate's result (a hardware limit of that program).
_NOT_RULE_ERRORS = ("WorkTimeout", "TimeoutError", "MemoryError", "PreflightRejected")


def broken_rules(attempts) -> dict[str, str]:
    """``{rule id: first error}`` for every rule all of whose attempts (at least one) failed
    with a rule error (:data:`RULE_ERROR_OUTCOMES`: an exception while matching or applying,
    e.g. a CoT template with an undefined variable), time and memory limits and GPU preflight
    rejections excepted (those say the program is large or the hardware limited, not that the
    rule is broken). Hard negatives and infrastructure
    failures do not count. Source: issue 34 (a broken template gave an empty dataset with
    exit 0)."""
    by_rule: dict[str, list[dict]] = defaultdict(list)
    for a in attempts:
        if a["outcome"].startswith("mutant") or a["outcome"] in NOT_CANDIDATE_OUTCOMES:
            continue
        by_rule[a["rule"]].append(a)
    out = {}
    for rule, atts in sorted(by_rule.items()):
        if all(a["outcome"] in RULE_ERROR_OUTCOMES and not str(a.get("reason", "")).startswith(_NOT_RULE_ERRORS)
               for a in atts):
            out[rule] = str(atts[0].get("reason", ""))[:300]
    return out


def rule_hashes(rule_paths) -> dict[str, str]:
    """``{file name: sha256 of its contents (16 hex digits)}`` of the rule files of a run: what
    ``run.json`` records so that a resume after a rule file changed refuses instead of serving
    the old results (issue 34)."""
    import hashlib

    return {Path(p).name: hashlib.sha256(Path(p).read_bytes()).hexdigest()[:16] for p in rule_paths}


def slim_entries(entries: Iterable[dict]) -> list[dict]:
    """Dictionary entries as the derived files need them: a transformed program's TIR and
    CUDA text dropped (only its LEIR is read) and the texts of an original shared by all its
    entries held once: at the paper's scale (6,335 programs, ~100k entries, ~2.4 GB of
    JSON, most of it those texts) the derived files are rebuilt from everything in memory.
    Measured on 200 programs (76 MB of JSON): the rebuild's peak resident size 560 -> 535 MB,
    the files unchanged."""
    shared: dict[str, str] = {}
    out = []
    for e in entries:
        t = e.get("transformed")
        if isinstance(t, dict):
            e["transformed"] = {"leir": t.get("leir")}
        o = e.get("original")
        if isinstance(o, dict):
            e["original"] = {k: shared.setdefault(v, v) if isinstance(v, str) else v for k, v in o.items()}
        out.append(e)
    return out


def build_derived(outdir: str | Path, policy: FilterPolicy) -> dict:
    """(Re)build the chat sets and the report from ``dictionary.jsonl`` (atomic writes)."""
    out = Path(outdir)
    entries = slim_entries(read_jsonl(out / "dictionary.jsonl"))
    # one label per step across programs too (two identical source programs): the chat sets
    # take the entry of highest precedence (labels.one_label_per_step)
    labelled, cross_dupes = one_label_per_step(entries)
    sets = filtered_sets(labelled, policy)
    single_entries, multi_groups = sets
    entries = sorted(entries, key=lambda e: e["id"])
    singles = [single_messages(e) for e in single_entries]
    multis = [multi_messages(g) for g in multi_groups]
    write_jsonl_atomic(out / "chat_single.jsonl", singles)
    write_jsonl_atomic(out / "chat_multi.jsonl", multis)
    # the RL prompt set: one single-answer prompt per original program (no label is trained on, so
    # no difficulty filter), with the columns steptp.rewards.step_reward reads
    by_original: dict[str, list[dict]] = defaultdict(list)
    for e in entries:
        by_original[e["original"]["leir"]].append(e)
    rl = [rl_record(group) for group in by_original.values()]
    write_jsonl_atomic(out / "rl_prompts.jsonl", rl)
    run_file = out / "run.json"
    negatives = None
    if run_file.exists() and json.loads(run_file.read_text(encoding="utf-8")).get("negatives"):
        negatives = negative_records(read_jsonl(out / "attempts.jsonl"))
        write_jsonl_atomic(out / "negatives.jsonl", negatives)
        trl, swift = preference_pairs(single_entries, negatives, policy.seed)
        write_jsonl_atomic(out / "chat_pairs.jsonl", trl)
        write_jsonl_atomic(out / "chat_pairs_swift.jsonl", swift)

    states = list(read_jsonl(out / "state.jsonl"))
    attempts = list(read_jsonl(out / "attempts.jsonl"))
    # hard negatives (--negatives) are not candidates of the rule: they stay out of its pass rate
    tried = Counter(a["rule"] for a in attempts
                    if not a["outcome"].startswith("mutant") and a["outcome"] not in NOT_CANDIDATE_OUTCOMES)
    passed = Counter(a["rule"] for a in attempts if a["outcome"] == "equal")
    failed = [s for s in states if s.get("error")]
    internal = sum(1 for s in failed if is_internal_error(s["error"]))
    rule_errors = broken_rules(attempts)
    report = {
        "programs": len(states),
        "programs_failed": sorted(({"source": s.get("source"), "error": s["error"]} for s in failed),
                                  key=lambda d: str(d["source"])),
        # programs lost to a crash (an unexpected exception, a failed Ray task) vs. programs that
        # are bad input (unparsable, untranslatable, not equal to PyTorch); rejected candidates
        # of usable programs are neither (attempts.jsonl, candidate_pass_rate)
        **({"negatives": len(negatives), "negatives_by_stage": dict(Counter(n["stage"] for n in negatives)),
            "negatives_by_strategy": dict(Counter(n["rule"] for n in negatives)),
            "negatives_by_kind": dict(Counter(n["kind"] for n in negatives)), "preference_pairs": len(trl),
            # worker time limits or crashes that did not reproduce in a fresh worker: the
            # machine's failures, never recorded as negatives
            "negatives_left_out_infrastructure": sum(1 for a in attempts if a["outcome"] == "infrastructure"),
            "mutants_tried": sum(1 for a in attempts if a["outcome"].startswith("mutant")),
            "mutants_passed": [{"rule": a["rule"], **a["mutant"], "source": a.get("source")}
                               for a in attempts if a["outcome"] == "mutant_passed"]}
           if negatives is not None else {}),
        "internal_errors": internal,
        "input_errors": len(failed) - internal,
        # rules every attempt of which failed for a rule error (template, rewrite, schema):
        # the CLI exits 1 naming them
        "rule_errors": rule_errors,
        "entries": len(entries),
        "chat_single": len(singles),
        "chat_multi": len(multis),
        "rl_prompts": len(rl),
        # one step, one label (steptp.dataset.labels): steps kept once under the label of highest
        # precedence, candidates of derived originals that gave back their parent, and pairs
        # still under two labels across programs (identical programs; left out of the chat sets)
        "labels": {"duplicate_labels_merged": sum(1 for a in attempts if a["outcome"] == "duplicate_label"),
                   "reverts_parent_skipped": sum(1 for a in attempts if a["outcome"] == "reverts_parent"),
                   "entries_with_also_strategies": sum(1 for e in entries if e.get("also_strategies")),
                   "steps_under_two_labels": len(cross_dupes)},
        # how the chat sets came out (difficulty.composition_stats): answers per single-answer
        # prompt, multi-answer slots against distinct steps, the level mix against the paper's
        "composition": sets.stats,
        "by_strategy": dict(sorted(Counter(e["strategy"]["id"] for e in entries).items())),
        "by_category": dict(sorted(Counter(e["strategy"]["category"] for e in entries).items())),
        "by_level": dict(sorted(Counter(e["difficulty"]["level"] for e in entries).items())),
        "candidate_pass_rate": {r: round(passed[r] / tried[r], 4) for r in sorted(tried)},
        "mean_chars": {
            "original_leir": _mean(len(e["original"]["leir"]) for e in entries),
            "original_tir": _mean(len(e["original"].get("tir") or "") for e in entries),
            "original_cuda": _mean(len(e["original"].get("cuda") or "") for e in entries),
        },
    }
    write_json_atomic(out / "report.json", report)
    return report


def _mean(xs) -> float:
    xs = list(xs)
    return round(sum(xs) / len(xs), 1) if xs else 0.0


__all__ = ["BATCH_PROGRAMS", "DatasetError", "DatasetInterrupted", "WorkerCrashed", "generate_dataset", "filtered_sets", "build_derived",
           "program_batches", "broken_rules", "rule_hashes", "RULE_ERROR_OUTCOMES"]
