"""``stp eval``: single-step evaluation of a policy (a model behind an OpenAI-compatible
endpoint, an answers file or a baseline) on held-out programs (paper §4.3, Table 2, Fig. 5).

Each input program (as for ``stp dataset``: ``.py`` files translated to LEIR, ``.leir``
files, directories) is one case, prompted with the single-answer prompt of the chat set
(:func:`steptp.llm.single_prompt`). Every sample is read tolerantly
(:func:`steptp.llm.parse_single`) and scored with :func:`steptp.verify.verify_pair`
(Diff / Build / Exec / Equal, ``trials`` seeded trials, isolated worker with a time limit);
the claimed strategy is compared with the rules that produce the answer in one step
(:class:`steptp.eval.recognize.Recognizer`).

Output directory::

    OUTDIR/run.json        the run's options (a resumed run must use the same ones)
    OUTDIR/results.jsonl   one line per sample (append-only; only complete lines count)
    OUTDIR/summary.json    pass rates (first sample), pass@k, strategy counts
    OUTDIR/report.md       Table 2 row, pass@k, Fig. 5-style tables and PNG plots

Resume: a sample with a record is never asked again, except when its request failed
(time-out, server error): those are asked again and the newest record counts.

Failures of a sample are told apart in its record's ``error``: ``request`` (the endpoint),
``answer`` (no usable answer), ``internal`` (an unexpected exception while asking the policy
or scoring: a bug or a crash, never the model's fault), None (scored; the stages say how far
it got). ``summary.json`` counts ``internal_errors`` (cases whose every sample failed
internally) apart from failed answers; ``stp eval`` exits 1 when every case did.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path

from ..leir.printer import format_program
from .metrics import STAGES, mean_pass_at_k
from ..faults import INTERNAL_ERROR
from .policies import Answer, AnswerSource, Case


class EvalError(RuntimeError):
    """Bad input or output directory (exit 2 in the CLI)."""


@dataclass
class EvalOptions:
    """``samples`` per case; ``workers`` concurrent requests (threaded policies); ``seed`` of
    the verification inputs; ``trials`` seeded trials; ``verify_timeout_s`` per check;
    ``device`` where answers run (``cpu``, or ``cuda``: their GPU form on the GPU);
    ``recognise``: run the strategy recogniser (bounded by ``recognise_time_s`` per program)."""

    samples: int = 1
    workers: int = 1
    seed: int = 0
    trials: int = 3
    verify_timeout_s: float = 60.0
    device: str = "cpu"  # where answers run: cpu, or cuda (GPU form on the GPU; stp eval --device)
    recognise: bool = True
    recognise_time_s: float = 30.0
    progress: bool = True


def load_cases(inputs: list[str]) -> tuple[list[Case], list[dict]]:
    """Discover the inputs and load each program (:func:`steptp.programs.discover`,
    :func:`steptp.programs.load`): ``.leir`` parsed and analysed, ``.py`` translated (not
    re-verified against PyTorch). Returns ``(cases,
    skipped)`` with ``skipped`` = ``[{"source", "error"}]``. Raises :class:`EvalError` for a
    missing path or a file of another type."""
    from ..llm import single_prompt
    from ..programs import discover, load

    try:
        sources = discover(inputs)
    except (FileNotFoundError, ValueError) as e:
        raise EvalError(str(e)) from None
    cases, skipped = [], []
    for src in sources:
        try:
            module, _ = load(src.path)
            cases.append(Case(src.key, str(src.path), module.signature.name, module, single_prompt(module)))
        except Exception as e:  # noqa: BLE001 - one bad program is skipped and reported
            skipped.append({"source": str(src.path), "error": f"{type(e).__name__}: {e}"[:500]})
    return cases, skipped


def _read_results(path: Path) -> list[dict]:
    from ..io import read_jsonl_lines

    out = []
    try:
        for lineno, rec in read_jsonl_lines(path):
            if not isinstance(rec, dict) or "case" not in rec or "sample" not in rec:
                raise EvalError(f"{path}:{lineno}: not a result line of stp eval")
            out.append(rec)
    except ValueError as e:
        raise EvalError(str(e)) from None
    return out


def _check_run(outdir: Path, run: dict) -> None:
    p = outdir / "run.json"
    if p.exists():
        try:
            old = json.loads(p.read_text())
        except (OSError, ValueError) as e:
            raise EvalError(f"{p}: unreadable ({e})") from None
        if old != run:
            diff = sorted(k for k in set(old) | set(run) if old.get(k) != run.get(k))
            raise EvalError(f"{outdir} holds a run with other options ({', '.join(diff)}); use another -o")
    else:
        from ..io import write_json_atomic

        try:
            outdir.mkdir(parents=True, exist_ok=True)
            write_json_atomic(p, run)
        except OSError as e:
            raise EvalError(f"{e.filename or outdir}: cannot write: {e.strerror or e}") from None


class _Scorer:
    """Parse, verify and recognise one sample (main thread: time limits apply)."""

    def __init__(self, opts: EvalOptions):
        from ..runner.pool import shared

        self.opts = opts
        self.runner = shared("verify", opts.verify_timeout_s)
        self.recognizer = None
        if opts.recognise:
            from .recognize import Recognizer

            self.recognizer = Recognizer(time_s=opts.recognise_time_s, seed=opts.seed)

    def close(self) -> None:
        self.runner.close()
        if self.recognizer is not None:
            self.recognizer.close()

    @staticmethod
    def record(case: Case, sample: int, ans: Answer) -> dict:
        """The result record of a sample before scoring (every stage failed)."""
        rec = {"case": case.id, "source": case.source, "program": case.program, "sample": sample,
               "prompt": case.prompt, "answer": ans.text, "parsed_leir": None, "named_strategy": "",
               "named_rule": None, "recognised": [], "recognition_complete": None, "stage": "none",
               **{s: False for s in STAGES}, "reason": "", "error": None,
               "prompt_tokens": ans.prompt_tokens, "completion_tokens": ans.completion_tokens,
               "finish_reason": ans.finish_reason}
        if ans.extra:
            rec["policy_info"] = ans.extra
        return rec

    def score_safe(self, case: Case, sample: int, ans: Answer) -> dict:
        """:meth:`score` that never raises: an unexpected exception becomes a record with
        ``error: "internal"`` (the run goes on with the next sample)."""
        t0 = time.perf_counter()
        try:
            return self.score(case, sample, ans)
        except Exception as e:  # noqa: BLE001 - a crash costs its sample, and is counted as internal
            rec = self.record(case, sample, ans)
            rec["error"] = "internal"
            rec["reason"] = f"{INTERNAL_ERROR}scoring: {type(e).__name__}: {e}"[:500]
            rec["seconds"] = round(time.perf_counter() - t0, 3)
            return rec

    def score(self, case: Case, sample: int, ans: Answer) -> dict:
        from ..faults import inject
        from ..llm import parse_single
        from ..verify import verify_pair

        t0 = time.perf_counter()
        rec = self.record(case, sample, ans)
        if ans.error is not None:
            rec["reason"] = ans.error
            rec["error"] = ("request" if ans.error.startswith("request:")
                            else "internal" if ans.error.startswith(INTERNAL_ERROR) else "answer")
            rec["seconds"] = round(time.perf_counter() - t0, 3)
            return rec
        inject(case.source)  # STP_FAULT_INJECT (tests): an unexpected crash while scoring
        cand = parse_single(ans.text, case.module.signature)
        rec["named_strategy"] = cand.strategy
        if self.recognizer is not None and cand.strategy:
            r = self.recognizer.rule_for_name(cand.strategy)
            rec["named_rule"] = r.id if r is not None else None
        if not cand.ok:
            rec["reason"] = f"parse: {cand.reason}"
            rec["seconds"] = round(time.perf_counter() - t0, 3)
            return rec
        rec["parsed_leir"] = cand.leir
        rec["stage"] = "parse"
        try:
            res = verify_pair(case.module, cand.module, trials=self.opts.trials, seed=self.opts.seed,
                              timeout_s=self.opts.verify_timeout_s, isolated=True, runner=self.runner,
                              device=self.opts.device)
            flags = {s: bool(getattr(res, s)) for s in STAGES}
            reason = res.reason
        except Exception as e:  # noqa: BLE001 - a hostile answer costs its sample, never the run
            flags = {s: False for s in STAGES}
            flags["diff"] = cand.leir != format_program(case.module.program)
            reason = f"verification error: {type(e).__name__}: {e}"[:500]
            rec["error"] = "internal"  # verify_pair reports bad programs as failed stages; it never should raise
        # progressive: a stage counts only when every earlier one passed
        ok = True
        for s in STAGES:
            ok = ok and flags[s]
            rec[s] = ok
            if ok:
                rec["stage"] = s
        rec["reason"] = reason
        if self.recognizer is not None and rec["diff"]:
            try:
                ids, complete = self.recognizer.recognise(case.module, cand.leir)
            except Exception:  # noqa: BLE001
                ids, complete = [], False
            rec["recognised"], rec["recognition_complete"] = ids, complete
        rec["seconds"] = round(time.perf_counter() - t0, 3)
        return rec


def evaluate(inputs: list[str], outdir: str | Path, policy: AnswerSource, opts: EvalOptions | None = None) -> dict:
    """Evaluate ``policy`` on the programs of ``inputs``; writes ``outdir`` (see the module
    docstring) and returns the summary dict (:func:`summarise`).

    Raises :class:`EvalError` for bad inputs or an output directory holding another run,
    :class:`steptp.llm.EndpointError` when the endpoint is unusable (checked once, before
    anything is asked). Hostile answers, request failures and crashing kernels become failed
    samples with their reason."""
    from ..io import JsonlAppender

    opts = opts or EvalOptions()
    out = Path(outdir)
    cases, skipped = load_cases(inputs)
    if not cases:
        raise EvalError("no usable program in the inputs" + (f" ({skipped[0]['source']}: {skipped[0]['error']})"
                                                             if skipped else ""))
    run = {**policy.describe(), "samples": opts.samples, "seed": opts.seed, "trials": opts.trials}
    policy.check()
    _check_run(out, run)
    results_path = out / "results.jsonl"
    done: dict[str, set[int]] = {}
    for rec in _read_results(results_path):
        if rec.get("error") != "request":
            done.setdefault(rec["case"], set()).add(rec["sample"])
    todo = []
    for c in cases:
        missing = [k for k in range(opts.samples) if k not in done.get(c.id, set())]
        if missing:
            todo.append((c, missing))
    scorer = _Scorer(opts)
    try:
        appender = JsonlAppender(results_path)
    except OSError as e:
        raise EvalError(f"{e.filename or results_path}: cannot write: {e.strerror or e}") from None
    try:
        _run(todo, policy, scorer, appender, opts)
    finally:
        appender.close()
        scorer.close()
        close = getattr(policy, "close", None)
        if close is not None:
            close()
    summary = summarise(_read_results(results_path), cases, opts.samples, skipped, run)
    from ..io import write_json_atomic
    from .report import write_report

    write_json_atomic(out / "summary.json", summary)
    write_report(out, summary)
    return summary


def _ask(policy: AnswerSource, case: Case, missing: list[int]) -> list[tuple[int, Answer]]:
    """Answers for the missing samples (consecutive runs asked together)."""
    answers: list[tuple[int, Answer]] = []
    n = len(missing)
    got = policy.answers(case, n, first_sample=missing[0]) if missing == list(range(missing[0], missing[0] + n)) \
        else [a for k in missing for a in policy.answers(case, 1, first_sample=k)]
    for k, a in zip(missing, got):
        answers.append((k, a))
    return answers


def _run(todo, policy: AnswerSource, scorer: _Scorer, appender, opts: EvalOptions) -> None:
    from tqdm import tqdm

    bar = tqdm(total=len(todo), desc="eval", unit="case", disable=not opts.progress, dynamic_ncols=True)
    try:
        if policy.threaded and opts.workers > 1:
            with ThreadPoolExecutor(max_workers=opts.workers) as pool:
                futs = {pool.submit(_ask, policy, c, missing): (c, missing) for c, missing in todo}
                for fut in as_completed(futs):
                    case, missing = futs[fut]
                    try:
                        answers = fut.result()
                    except Exception as e:  # noqa: BLE001 - a policy crash costs this case
                        answers = [(k, Answer("", error=f"request: {type(e).__name__}: {e}"[:500])) for k in missing]
                    appender.write_many([scorer.score_safe(case, k, a) for k, a in answers])
                    bar.update(1)
        else:
            for case, missing in todo:
                try:
                    answers = _ask(policy, case, missing)
                except Exception as e:  # noqa: BLE001 - a policy crash costs this case (internal, not the answer)
                    answers = [(k, Answer("", error=f"{INTERNAL_ERROR}policy: {type(e).__name__}: {e}"[:500]))
                               for k in missing]
                appender.write_many([scorer.score_safe(case, k, a) for k, a in answers])
                bar.update(1)
    finally:
        bar.close()


def summarise(records: list[dict], cases: list[Case], samples: int, skipped: list[dict] | None = None,
              run: dict | None = None) -> dict:
    """The summary of the records of ``cases`` (newest record per case and sample):

    * ``diff``/``build``/``exec``/``equal``: fractions (0..1) of cases whose FIRST sample passes
      the stage (paper Table 2, single attempt);
    * ``pass_at_k``: ``{stage: {k: mean unbiased pass@k}}`` for k <= samples (Chen et al. 2021);
    * ``by_strategy`` / ``by_category`` / ``by_level``: ``{"recognised", "claimed"}`` counts over
      the samples that pass Equal (paper Fig. 5); a recognised sample counts under its
      claimed rule when that is among the recognised ones, else under the first;
    * ``claimed_vs_recognised``: rows ``{claimed, recognised, count}`` over samples that pass
      Diff, and ``agreement`` (fraction whose claimed rule is among the recognised);
    * ``reasons``: the most frequent first-failure reasons of first samples;
    * ``request_errors``: samples whose request failed; ``internal_error_samples``: samples lost to
      an unexpected exception (record ``error: "internal"``); ``internal_errors``: cases whose
      every sample was (these failed for an internal reason, not for their answers).
    """
    from ..rules import load_rules

    info = {r.id: r for r in load_rules()}
    latest: dict[tuple[str, int], dict] = {}
    ids = {c.id for c in cases}
    for rec in records:
        if rec["case"] in ids and isinstance(rec["sample"], int) and 0 <= rec["sample"] < samples:
            latest[(rec["case"], rec["sample"])] = rec
    per_case: dict[str, list[dict]] = {}
    for (cid, _k), rec in sorted(latest.items(), key=lambda kv: kv[0][1]):
        per_case.setdefault(cid, []).append(rec)
    n_cases = len(cases)
    first = [per_case[c.id][0] for c in cases if c.id in per_case and per_case[c.id][0]["sample"] == 0]
    summary: dict = {"cases": n_cases, "cases_answered": len(per_case), "samples": samples,
                     "records": len(latest)}
    for s in STAGES:
        summary[s] = (sum(1 for r in first if r.get(s)) / n_cases) if n_cases else 0.0
    summary["parse"] = (sum(1 for r in first if r.get("parsed_leir") is not None) / n_cases) if n_cases else 0.0
    summary["pass_at_k"] = {}
    for s in STAGES:
        counts = [(len(v), sum(1 for r in v if r.get(s))) for v in per_case.values()]
        summary["pass_at_k"][s] = {str(k): mean_pass_at_k(counts, k) for k in range(1, samples + 1)}
    equal = [r for v in per_case.values() for r in v if r.get("equal")]
    strat = {"recognised": Counter(), "claimed": Counter()}
    cat = {"recognised": Counter(), "claimed": Counter()}
    lvl = {"recognised": Counter(), "claimed": Counter()}
    for r in equal:
        rid = _recognised_one(r)
        if rid is not None and rid in info:
            strat["recognised"][rid] += 1
            cat["recognised"][info[rid].category] += 1
            lvl["recognised"][info[rid].level] += 1
        else:
            strat["recognised"]["(unrecognised)"] += 1
        cid = r.get("named_rule")
        if cid in info:
            strat["claimed"][cid] += 1
            cat["claimed"][info[cid].category] += 1
            lvl["claimed"][info[cid].level] += 1
        else:
            strat["claimed"]["(unknown name)"] += 1
    summary["by_strategy"] = {k: dict(v.most_common()) for k, v in strat.items()}
    summary["by_category"] = {k: dict(v.most_common()) for k, v in cat.items()}
    summary["by_level"] = {k: dict(v.most_common()) for k, v in lvl.items()}
    summary["distinct_strategies"] = {k: len([x for x in v if x in info]) for k, v in strat.items()}
    diffed = [r for v in per_case.values() for r in v if r.get("diff")]
    pairs = Counter((r.get("named_rule") or f"? {r.get('named_strategy', '')[:40]}", _recognised_one(r) or "-")
                    for r in diffed)
    summary["claimed_vs_recognised"] = [{"claimed": a, "recognised": b, "count": n} for (a, b), n in
                                        pairs.most_common()]
    agree = sum(1 for r in diffed if r.get("named_rule") and r.get("named_rule") in (r.get("recognised") or []))
    summary["agreement"] = agree / len(diffed) if diffed else None
    summary["unrecognised"] = sum(1 for r in diffed if not r.get("recognised"))
    reasons = Counter(_reason_key(r["reason"]) for r in first if not r.get("equal"))
    summary["reasons"] = [{"reason": k, "count": n} for k, n in reasons.most_common(15)]
    tokens = [r.get("completion_tokens") for v in per_case.values() for r in v if r.get("completion_tokens")]
    summary["completion_tokens_mean"] = sum(tokens) / len(tokens) if tokens else None
    summary["request_errors"] = sum(1 for r in latest.values() if r.get("error") == "request")
    # crashes (not the answers' fault), apart from failed answers: samples, and cases whose every sample crashed
    summary["internal_error_samples"] = sum(1 for r in latest.values() if r.get("error") == "internal")
    summary["internal_errors"] = sum(1 for v in per_case.values() if v and all(r.get("error") == "internal" for r in v))
    summary["skipped"] = skipped or []
    if run is not None:
        summary["run"] = run
    return summary


def _recognised_one(r: dict) -> str | None:
    rec = r.get("recognised") or []
    if not rec:
        return None
    named = r.get("named_rule")
    return named if named in rec else rec[0]


def _reason_key(reason: str) -> str:
    reason = " ".join(str(reason).split())
    return reason[:100] + ("..." if len(reason) > 100 else "")


__all__ = ["EvalError", "EvalOptions", "load_cases", "evaluate", "summarise"]
