"""One program -> its verified one-step dictionary entries (paper §3.2-§3.4).

For a source program: translate it (PyTorch) or parse it (``.leir``); verify the original
(against PyTorch eager for ``.py`` sources, three seeded trials); then for every rule that
matches, try candidates (site x parameters, in an order drawn from the run's seed) until
``per_rule`` transformed programs pass Diff/Build/Exec/Equal against the original (nvcc
batched over the programs of a worker task, see :func:`process_batch`). Each success
becomes one dictionary entry; each failed attempt is reported, never written as data.
Everything random derives from ``(seed, program key, rule id)``, so a run is reproducible
whatever the worker count, batch size or order.

Rounds (``Options.rounds``, ``stp dataset --rounds N``): round 1 is the above. Round k+1
takes, per source program, a seeded sample (``Options.derived_per_round``, seeded by
``(seed, program key, round)``) of the distinct verified transformed programs of round k as
*derived originals* and applies every rule to each of them again. Their entries are ordinary
single-step entries (``original`` is the derived program) that also record
``derived_from``: the entry id of the step that produced the derived original, the chain of
strategies from the source program to it, and the round. Strategies whose input never occurs
in translated programs (a nest with several equations after ``operator_fusion``, an online
softmax after ``online_softmax``) get data this way. All rounds of a program belong to its one
result (one resume record); with ``rounds == 1`` the output is exactly that of one round.

Follow-ups (``Options.follow_ups``, ``stp dataset --follow-ups``, on by default with
``--profile paper``): after the rounds, every rule whose YAML names ``follows`` (strategies
whose verified output offers it sites that translated programs lack: ``operator_fission``
and ``set_storage_scope`` after ``operator_fusion``, the prefix matmul after
``online_softmax``) and that has no verified step on the program yet is tried, alone, on
up to :data:`FOLLOW_UP_TRIES` distinct verified outputs of those strategies (seeded by
``(seed, program key, "follow-up", rule id)``). Their entries are derived entries whose
``derived_from`` also says ``"follow_up": true``. Without ``follows`` in any rule, or with
every such rule already verified, the output is exactly that without follow-ups.

One step, one label (:mod:`steptp.dataset.labels`, issue 50): a candidate of a derived
original that is alpha-equivalent to the program it was derived from is not verified
(attempt outcome ``reverts_parent``); and of the entries of one program (all rounds) with the
same alpha-normal (source, target) pair only the one of highest label precedence is kept,
naming the others in ``also_strategies`` (attempt outcome ``duplicate_label`` for each other).
"""

from __future__ import annotations

import hashlib
import json
import time
import traceback
from dataclasses import dataclass, field

from ..leir.fileformat import LeirModule
from ..leir.printer import format_program
from ..faults import INTERNAL_ERROR, is_internal_error  # noqa: F401  (re-exported for the dataset modules)
from ..programs import Source, load
from .labels import module_key, one_label_per_step, step_digest


@dataclass
class Options:
    """Generation knobs (all serialisable: they travel to worker processes)."""

    seed: int = 0
    trials: int = 3
    per_rule: int = 1           # verified steps kept per (program, rule): N sampled candidates (--per-rule N)
    max_tries: int = 4          # candidates tried per verified step wanted: at most max_tries*per_rule per rule
    with_cuda: bool = True      # store TIR for the GPU path and CUDA source
    nvcc: bool = True           # Build pass includes nvcc --ptx of the CUDA source (when nvcc exists)
    isolated: bool = True       # build+run every check in a worker process with a time limit
    timeout_s: float = 60.0     # per check (isolated mode)
    rule_paths: list[str] = field(default_factory=list)
    device: str = "cpu"         # where transformed programs run in verification: cpu or cuda (--device)
    rounds: int = 1             # rounds of steps (--rounds): round k+1 starts from verified programs of round k
    derived_per_round: int = 4  # derived originals sampled per program and round (rounds > 1)
    time: bool = False          # --time: each entry records original/transformed runtime and speedup
    negatives: bool = False     # --negatives: a failed candidate's attempt keeps its programs (negatives.jsonl)
    mutants: int = 2            # --negatives: hard negatives tried per verified step (dataset.mutants)
    follow_ups: bool = False    # --follow-ups: rules with ``follows`` tried on the output of those strategies


@dataclass
class ProgramResult:
    source: str
    key: str
    program: str | None
    entries: list[dict]
    attempts: list[dict]        # one per tried candidate: rule, outcome, reason
    error: str | None = None    # the program could not be used (bad input), or "internal error: ..." (a crash)
    seconds: float = 0.0


def _signature_dict(module: LeirModule) -> dict:
    return {"name": module.signature.name,
            "tensors": [{"name": t.name, "role": t.role, "dtype": t.dtype, "shape": list(t.shape)}
                        for t in module.signature.tensors]}


def entry_id(original_leir: str, transformed_leir: str, strategy: str) -> str:
    """Content hash of a step (sha256 of the canonical texts and strategy, 16 hex digits)."""
    h = hashlib.sha256("\x00".join([original_leir, transformed_leir, strategy]).encode()).hexdigest()
    return h[:16]


def _lowered(module: LeirModule, with_cuda: bool) -> dict:
    from ..backend import cuda_source, lower

    out = {"leir": format_program(module.program)}
    if with_cuda:
        out["tir"] = lower(module, target="cuda")
        try:
            out["cuda"] = cuda_source(module)
        except Exception as e:  # noqa: BLE001 - kept as data: the GPU path is reported, not fatal
            out["cuda"] = None
            out["cuda_error"] = f"{type(e).__name__}: {e}"
    else:
        out["tir"] = lower(module, target="cpu")
    return out


def _runner(opts: Options):
    """The generating process's verification worker, the pool's ``"verify"`` worker
    (:func:`steptp.runner.pool.shared`: started lazily, reused: a worker costs ~2 s to start;
    a crash or time-out restarts it and fails one check); None when not isolated."""
    if not opts.isolated:
        return None
    from ..runner.pool import shared

    return shared("verify", opts.timeout_s)


def load_source(src: Source, opts: Options) -> tuple[LeirModule, dict]:
    """Parse or translate one source; returns the module and the original's verification.

    Raises whatever the parser/translator raises; the caller records it as the program error."""
    module, tr = load(src.path, analyze=False)
    if tr is None:
        return module, {"against": "none"}
    res = tr.verify(trials=opts.trials, seed=opts.seed, runner=_runner(opts), timeout_s=opts.timeout_s)
    ver = res.to_dict()
    ver["against"] = "pytorch"
    if not res.equal:
        raise RuntimeError(f"translation of {src.path} does not match PyTorch: {res.reason}")
    return tr.module, ver


def _entry(src: Source, module: LeirModule, original: dict, original_check: dict, rule, step, res,
           opts: Options, nvcc_ran: bool, artifacts: dict | None = None, symbolic: str | None = None,
           derived: dict | None = None) -> dict:
    """One dictionary entry (design.md §6) for a verified step; ``artifacts`` (from
    :func:`steptp.verify.verify_pair`) hold the GPU TIR and CUDA source already produced.
    ``figures``: the figures the step's CoT states (:func:`steptp.engine.figures.step_figures`,
    each ``[before, after]``; design.md §8). ``program_type`` / ``program_id``: the source
    program's type (:func:`steptp.dataset.provenance.program_type`) and content key, the same for
    every round of the program (``stp split`` holds out whole types)."""
    after_text = format_program(step.after.program)
    art = artifacts or {}
    if opts.with_cuda and "tir_cuda" in art and "cuda" in art:
        transformed = {"leir": after_text, "tir": art["tir_cuda"], "cuda": art["cuda"]}
    else:
        transformed = _lowered(step.after, opts.with_cuda)
    d = rule.difficulty
    extra = {"derived_from": derived} if derived else {}
    figures = getattr(step, "figures", None)
    if not figures:  # a step made without them (steptp.engine.figures: design.md §8)
        from ..engine.figures import step_figures

        figures = step_figures(module, step.after)
    from .provenance import program_type  # the held-out split's unit (issue 51)

    return {
        "id": entry_id(original["leir"], after_text, rule.id),
        "program": module.signature.name,
        "source": str(src.path),
        # the source program: its corpus type (header) or name, and its content key (the
        # Source key, the SHA256 of its bytes); derived originals carry their source's
        "program_type": program_type(src.path, module.signature.name, src.key),
        "program_id": src.key,
        "signature": _signature_dict(module),
        "strategy": {"id": rule.id, "name": rule.name, "category": rule.category},
        "difficulty": {"K": d["K"], "P": d["P"], "S": d["S"], "score": rule.score, "level": rule.level},
        "params": _jsonable(step.params),
        "site": _jsonable(step.site_description),
        "original": original,
        "transformed": transformed,
        "cot": step.cot,
        "figures": figures,
        # the step's identity up to renaming (labels.step_digest), from the programs in hand
        "step_key": step_digest(module_key(module), module_key(step.after)),
        "verification": {**res.to_dict(), "nvcc": nvcc_ran, "symbolic": symbolic},
        "original_verification": original_check,
        "seed": opts.seed,
        **extra,
        **({"timing": entry_timing(module, step.after, opts.device)} if opts.time else {}),
    }


def entry_timing(original: LeirModule, transformed: LeirModule, device: str = "cpu") -> dict:
    """``{original_us, transformed_us, speedup, ci, verdict, device}`` of one verified step:
    :func:`steptp.runner.timing.compare`, the two programs timed interleaved on ``device``
    (CPU: the performance build) on the same seeded inputs; ``original_us`` /
    ``transformed_us`` are medians (µs per call), ``speedup`` the median of the paired ratios
    original/transformed with its bootstrap 95 % interval ``ci`` and ``verdict``
    (faster/slower only when the interval excludes 1). A program that cannot be timed gives
    ``{"device", "error"}`` instead: the entry is kept, its timing is not invented."""
    from ..backend.errors import BackendError
    from ..runner.timing import compare

    try:
        c = compare(original, transformed, device)
    except (BackendError, ValueError) as e:
        return {"device": device, "error": f"{type(e).__name__}: {e}"[:300]}
    return {"original_us": round(c.baseline_us, 4), "transformed_us": round(c.candidate_us, 4),
            "speedup": round(c.speedup, 4), "ci": [round(x, 4) for x in c.ci], "verdict": c.verdict, "device": device}


def _symbolic(rule, module: LeirModule, step) -> str | None:
    """Math rules: ``proved`` / ``unknown`` / ``disproved`` from the bounded symbolic check
    (:func:`steptp.engine.algebra.symbolic_check_programs`); None for other categories."""
    if rule.category != "math":
        return None
    from ..engine.algebra import symbolic_check_programs

    return symbolic_check_programs(module.program, step.after.program)


def _prefetch_sites(rules: list, module: LeirModule, opts: Options) -> None:
    """Every rule's match query on ``module`` in one batch
    (:func:`steptp.engine.match.prefetch_sites`), within one rule's time limit; if the batch
    fails or runs out of time, each rule lists its own sites (and reports its own error)."""
    from ..engine.match import prefetch_sites
    from ..rules.service import bounded

    try:
        bounded(prefetch_sites, rules, module, time_s=opts.timeout_s if opts.isolated else 0,
                what="site enumeration (every rule)")
    except Exception:  # noqa: BLE001 - the rules are listed one by one instead
        pass


def _infrastructure(rule_id: str, res) -> dict:
    """The attempt record of a candidate whose worker was killed at its time limit or crashed
    and that ran fine in a fresh worker (:func:`steptp.verify.confirm_failure`): the
    machine's failure, not the candidate's, so it carries no negative (``--negatives`` reports
    how many were left out) and no verdict on the program."""
    return {"rule": rule_id, "outcome": "infrastructure", "reason": res.reason}


class _RuleRun:
    """The candidate search of one rule on one program (see :func:`process`)."""

    def __init__(self, rule, module: LeirModule, src: Source, opts: Options, key: str | None = None,
                 parent_key: str | None = None):
        from ..engine import NoMatch, list_candidates
        from ..rules.service import bounded
        from ..seeds import seeded_rng

        self.rule, self.module, self.opts = rule, module, opts
        self.rng = seeded_rng(opts.seed, key or src.key, rule.id)
        self.attempts: list[dict] = []
        self.kept: list[tuple] = []       # (step, VerifyResult, artifacts), in candidate order
        self.pending: list[tuple] = []    # passed everything but the batched nvcc
        self.cands: list = []
        try:
            self.cands = bounded(list_candidates, rule, module, time_s=opts.timeout_s if opts.isolated else 0,
                                 what=f"rule {rule.id}: site enumeration")
        except NoMatch:
            pass
        except Exception as e:  # noqa: BLE001 - a rule that crashes on one program costs that rule only
            self.attempts.append({"rule": rule.id, "outcome": "match_error", "reason": f"{type(e).__name__}: {e}"})
        self.order = list(range(len(self.cands)))
        self.rng.shuffle(self.order)
        self.pos = 0
        self.budget = opts.max_tries * max(1, opts.per_rule)
        self.tries = self.repeats = 0
        self.seen_after: set[str] = set()
        self.symbolic: dict[str, str | None] = {}  # transformed LEIR -> symbolic verdict (math rules)
        # a derived original's parent (labels.program_key): a step back to it is no step
        self.parent_key = parent_key
        self.peeked = None  # the next step, drawn early by peek() (its CPU build batched)

    def _wants(self) -> bool:
        return (len(self.kept) + len(self.pending) < self.opts.per_rule and self.pos < len(self.order)
                and self.tries < self.budget and self.repeats < 4 * self.budget)

    def _next_step(self):
        """The next candidate step to verify (rule applied at the next sampled site; apply
        errors, repeated programs and steps back to the parent recorded and skipped), or
        None when no more are wanted or left. Counts the try."""
        from ..engine import apply_rule
        from ..rules.service import bounded

        opts, rule = self.opts, self.rule
        while self._wants():
            site, params = self.cands[self.order[self.pos]]
            self.pos += 1
            try:
                step = bounded(apply_rule, rule, self.module, seed=self.rng.randrange(2**31), site=site, params=params,
                               time_s=opts.timeout_s if opts.isolated else 0, what=f"rule {rule.id}: application")
            except Exception as e:  # noqa: BLE001
                self.tries += 1
                self.attempts.append({"rule": rule.id, "outcome": "apply_error", "reason": f"{type(e).__name__}: {e}"})
                continue
            after_text = format_program(step.after.program)
            if after_text in self.seen_after:
                self.repeats += 1
                continue
            self.seen_after.add(after_text)
            if self.parent_key is not None and _reverts(step.after, self.parent_key):
                self.repeats += 1
                self.attempts.append({"rule": rule.id, "outcome": "reverts_parent",
                                      "reason": "the step gives back the program this derived original was made from"})
                continue
            self.tries += 1
            return step
        return None

    def peek(self):
        """The step :meth:`advance` verifies next (drawn now, kept for it), or None."""
        if self.peeked is None:
            self.peeked = self._next_step()
        return self.peeked

    def advance(self, defer_nvcc: bool) -> bool:
        """Verify further candidates until enough are kept or pending; False if none was tried."""
        from ..verify import confirm_failure, verify_pair

        opts, rule = self.opts, self.rule
        progressed = False
        while True:
            step, self.peeked = self.peeked, None
            if step is None:
                step = self._next_step()
            if step is None:
                break
            progressed = True
            art: dict = {}
            def check(step=step, art=art):
                return verify_pair(self.module, step.after, trials=opts.trials, seed=opts.seed, runner=_runner(opts),
                                   timeout_s=opts.timeout_s, nvcc=opts.nvcc and not defer_nvcc,
                                   artifacts=art if opts.with_cuda else None, device=opts.device)

            res = confirm_failure(check(), check, _runner(opts))
            if res.infrastructure:
                self.attempts.append(_infrastructure(rule.id, res))
            elif not res.equal:
                self.attempts.append(self.failed(res.reason, step, res))
            elif self._disproved(step, res):
                continue
            elif defer_nvcc and "tir_cuda" in art:
                self.attempts.append(None)  # placeholder: decided by the batched nvcc run
                self.pending.append((step, res, art, len(self.attempts) - 1))
            else:
                self.attempts.append({"rule": rule.id, "outcome": "equal", "reason": res.reason})
                self.kept.append((step, res, art))
        return progressed

    def _disproved(self, step, res) -> bool:
        """Math steps the bounded symbolic check disproves are not verified steps, whatever
        the random trials say (e.g. ``x/y*y`` where ``y`` can be 0 or ``-inf``): they are
        recorded as failed attempts. The verdict is kept for the entry."""
        sym = _symbolic(self.rule, self.module, step)
        self.symbolic[format_program(step.after.program)] = sym
        if sym != "disproved":
            return False
        self.attempts.append(self.failed("symbolic: disproved (not equal to the original in exact arithmetic)",
                                         step, res, stage="symbolic"))
        return True

    def mutant_attempts(self, step) -> list[dict]:
        """With ``--negatives``: up to ``opts.mutants`` hard negatives of a verified step
        (:func:`steptp.dataset.mutants.mutants` of its transformed program), each verified
        against the original: ``mutant_failed`` attempts carry the negative; a mutant that
        passes is ``mutant_passed`` (an equivalent edit or a verifier defect: reported, never a
        negative)."""
        from ..verify import confirm_failure, verify_pair
        from .mutants import mutants

        out = []
        for op, mod in mutants(step.after, self.opts.mutants, self.opts.seed):
            def check(mod=mod):
                return verify_pair(self.module, mod, trials=self.opts.trials, seed=self.opts.seed,
                                   runner=_runner(self.opts), timeout_s=self.opts.timeout_s, gpu_check=False,
                                   device=self.opts.device)

            res = confirm_failure(check(), check, _runner(self.opts))
            if res.infrastructure:
                out.append(_infrastructure(self.rule.id, res))
                continue
            if res.equal:
                out.append({"rule": self.rule.id, "outcome": "mutant_passed", "reason": f"{op}: passed verification",
                            "mutant": {"operator": op, "transformed": format_program(mod.program)}})
                continue
            rec = self.failed(res.reason, _Mutant(mod, step.cot), res)
            rec["outcome"] = "mutant_failed"
            rec["negative"]["kind"] = "mutant"
            rec["negative"]["operator"] = op
            out.append(rec)
        return out

    def failed(self, reason: str, step, res, stage: str | None = None) -> dict:
        """The attempt record of a rejected candidate; with ``--negatives`` it keeps what a
        negative needs: both programs (canonical LEIR), the failing ``stage`` (diff / build /
        exec / equal / symbolic), the CoT and the largest error."""
        rec = {"rule": self.rule.id, "outcome": "failed", "reason": reason}
        if self.opts.negatives:
            first = next((s for s in ("diff", "build", "exec", "equal") if not getattr(res, s)), "equal")
            rec["negative"] = {"original": format_program(self.module.program),
                               "transformed": format_program(step.after.program),
                               "strategy": self.rule.name, "stage": stage or first,
                               "max_abs_err": res.to_dict().get("max_abs_err"), "cot": step.cot}
        return rec


class _Mutant:
    """A mutated step for :meth:`_RuleRun.failed`: its program and the CoT of the step it came from."""

    def __init__(self, after, cot):
        self.after, self.cot = after, cot


def _nvcc_round(runs: list[_RuleRun], opts: Options) -> None:
    """One batched nvcc run over every pending candidate of the batch; a failing batch is
    bisected by :func:`steptp.backend.nvcc_check`. The candidates' CUDA C (generated once,
    in verification) is joined into one file per preamble group
    (:func:`steptp.backend.build.cuda_groups`), so nothing is generated twice; without it
    (an older worker result), their GPU TIR goes through one IRModule in the verification
    worker, whose parse memo holds the GPU forms."""
    from ..backend import nvcc_check

    pending = [(r, item) for r in runs for item in r.pending]
    if not pending:
        return
    if all(item[2].get("cuda") for _, item in pending):
        # the candidates' CUDA C, generated once in verification: joined textually
        # (steptp.backend.build.joined_cuda), no second TVM code generation
        results = nvcc_check([item[2]["cuda"] for _, item in pending], batch=True)
        _settle_nvcc(pending, results)
        return
    texts = [item[2]["tir_cuda"] for _, item in pending]
    runner, results = _runner(opts), None
    if runner is not None:
        try:
            results = runner.call(nvcc_check, texts, batch=True, timeout_s=max(opts.timeout_s, 600.0))
        except Exception:  # noqa: BLE001 - redone below, without the worker's memo
            results = None
    if results is None:  # in process (its memo holds the GPU forms), or after a worker failure
        results = nvcc_check(texts, batch=True)
    _settle_nvcc(pending, results)


def _settle_nvcc(pending: list, results: list) -> None:
    """Keep the pending candidates that nvcc compiled; record the others as build failures."""
    for (run, (step, res, art, slot)), nv in zip(pending, results):
        if nv.ok is False:
            reason = f"build: {nv.status}: {nv.reason}"
            run.attempts[slot] = run.failed(reason, step, res, stage="build")
        else:
            run.attempts[slot] = {"rule": run.rule.id, "outcome": "equal", "reason": res.reason}
            run.kept.append((step, res, art))
    for run in dict.fromkeys(run for run, _ in pending):
        run.pending.clear()


class _Program:
    """One source inside :func:`process_batch`: its module and rule runs, or its error; or
    (``derived``) one derived original of a later round (see the module docstring)."""

    def __init__(self, src: Source, opts: Options, derived: dict | None = None, module: LeirModule | None = None,
                 original_check: dict | None = None, rule_ids: frozenset[str] | None = None,
                 parent: LeirModule | None = None):
        from ..rules import load_rule

        self.src, self.seconds = src, 0.0
        self.module = self.original_check = None
        self.runs: list[_RuleRun] = []
        self.error: str | None = None
        self.derived = derived
        t0 = time.perf_counter()
        if derived is not None:
            self.module, self.original_check = module, original_check
            key = f"{src.key}:{derived['id']}"
        else:
            key = None
            try:
                self.module, self.original_check = load_source(src, opts)
            except Exception as e:  # noqa: BLE001 - one bad program must not stop the run
                self.error = f"{type(e).__name__}: {e}"
            if self.error is None:
                from ..faults import inject

                inject(src.path)  # STP_FAULT_INJECT (tests): an unexpected crash -> "internal error: ..."
        if self.error is None:
            rules = [r for r in map(load_rule, opts.rule_paths) if rule_ids is None or r.id in rule_ids]
            _prefetch_sites(rules, self.module, opts)
            parent_key = module_key(parent) if parent is not None else None
            self.runs = [_RuleRun(r, self.module, src, opts, key, parent_key) for r in rules]
        self.seconds += time.perf_counter() - t0

    def kept_steps(self) -> list[tuple[str, object, object, str]]:
        """``(entry id, step, VerifyResult, strategy id)`` of every verified step."""
        text = format_program(self.module.program)
        return [(entry_id(text, format_program(step.after.program), run.rule.id), step, res, run.rule.id)
                for run in self.runs for step, res, _ in run.kept]

    @property
    def round(self) -> int:
        """1 for a source program, else the round of this derived original."""
        return self.derived["round"] if self.derived else 1

    def derive(self, opts: Options, chosen: list[tuple[str, object, object, str]], round_no: int,
               rule_ids: frozenset[str] | None = None) -> list["_Program"]:
        """Derived originals of ``chosen`` verified steps for round ``round_no``; with
        ``rule_ids`` a follow-up (only those rules run on it)."""
        chain = self.derived["chain"] if self.derived else []
        out = []
        for eid, step, res, strategy in chosen:
            d = {"id": eid, "chain": chain + [strategy], "round": round_no}
            if rule_ids is not None:
                d["follow_up"] = True
            check = {"against": "derived", "derived_from": eid, **res.to_dict()}
            out.append(_Program(self.src, opts, derived=d, module=step.after, original_check=check, rule_ids=rule_ids,
                                parent=self.module))
        return out

    def entries_and_attempts(self, opts: Options, nvcc_ran: bool) -> tuple[list[dict], list[dict]]:
        entries: list[dict] = []
        original = None  # lowered lazily: only programs with a verified step need it
        for run in self.runs:
            for step, res, art in run.kept:
                original = original or _lowered(self.module, opts.with_cuda)
                entries.append(_entry(self.src, self.module, original, self.original_check, run.rule, step, res, opts,
                                      nvcc_ran, art, run.symbolic.get(format_program(step.after.program)),
                                      self.derived))
        attempts = [a for run in self.runs for a in run.attempts]
        if opts.negatives and opts.mutants > 0:
            attempts += [a for run in self.runs for step, _, _ in run.kept for a in run.mutant_attempts(step)]
        if self.derived:
            attempts = [{**a, "derived_from": self.derived["id"], "round": self.derived["round"]} for a in attempts]
        return entries, attempts

    def result(self, opts: Options, nvcc_ran: bool, later: list["_Program"] = ()) -> ProgramResult:
        """The program's result; ``later``: its derived originals of later rounds, in order."""
        src = self.src
        if self.error is not None:
            return ProgramResult(str(src.path), src.key, None, [], [], error=self.error, seconds=self.seconds)
        t0 = time.perf_counter()
        entries, attempts = self.entries_and_attempts(opts, nvcc_ran)
        for d in later:
            e, a = d.entries_and_attempts(opts, nvcc_ran)
            entries += e
            attempts += a
            self.seconds += d.seconds
        entries, dropped = one_label_per_step(entries)
        attempts += [{"rule": e["strategy"]["id"], "outcome": "duplicate_label",
                      "reason": f"the same step as the kept entry of {e['duplicate_of']}",
                      **({"derived_from": e["derived_from"]["id"]} if e.get("derived_from") else {})}
                     for e in dropped]
        self.seconds += time.perf_counter() - t0
        return ProgramResult(str(src.path), src.key, self.module.signature.name, entries, attempts,
                             seconds=self.seconds)


def _reverts(after: LeirModule, parent_key: str) -> bool:
    """True when ``after`` is alpha-equivalent to the program whose key is ``parent_key``."""
    return module_key(after) == parent_key


def _verified_pool(units: list[_Program]) -> list[tuple[str, _Program, tuple]]:
    """``(entry id, unit, kept step)`` of every distinct verified transformed program of
    ``units``, sorted by entry id (the seeded choices below sample from it)."""
    pool, seen = [], set()
    for u in units:
        for item in u.kept_steps():
            text = format_program(item[1].after.program)
            if text not in seen:
                seen.add(text)
                pool.append((item[0], u, item))
    pool.sort(key=lambda x: x[0])
    return pool


def _choose_derived(units: list[_Program], opts: Options, key: str, round_no: int) -> list[tuple[_Program, tuple]]:
    """The seeded sample of round ``round_no - 1``'s verified steps of one source program
    (``units``: its originals of that round) that become round ``round_no``'s derived
    originals: distinct transformed programs, ``opts.derived_per_round`` of them at most."""
    pool = _verified_pool(units)
    from ..seeds import seeded_rng

    rng = seeded_rng(opts.seed, key, f"round{round_no}")
    n = max(0, opts.derived_per_round)
    chosen = pool if n >= len(pool) else sorted(rng.sample(pool, n), key=lambda x: x[0])
    return [(u, item) for _, u, item in chosen]


#: verified outputs of the strategies a rule ``follows`` that a follow-up tries it on, at most
FOLLOW_UP_TRIES = 2


def _follow_ups(units: list[_Program], opts: Options, key: str) -> list[_Program]:
    """The follow-up originals of one source program (``units``: it and its derived
    originals): for each rule with ``follows`` and no verified step in ``units``, a seeded
    choice of at most :data:`FOLLOW_UP_TRIES` distinct verified outputs of the strategies it
    follows; a derived original chosen for several rules runs all of them."""
    from ..seeds import seeded_rng

    verified = {run.rule.id for u in units for run in u.runs if run.kept}
    rules = {}
    for u in units:
        for run in u.runs:
            rules.setdefault(run.rule.id, run.rule)
    pool = _verified_pool(units)
    groups: dict[str, tuple[_Program, tuple, set]] = {}
    for rid in sorted(rules):
        follows = rules[rid].follows
        if not follows or rid in verified:
            continue
        candidates = [x for x in pool if x[2][3] in follows]
        if not candidates:
            continue
        rng = seeded_rng(opts.seed, key, "follow-up", rid)
        for eid, u, item in rng.sample(candidates, min(FOLLOW_UP_TRIES, len(candidates))):
            groups.setdefault(eid, (u, item, set()))[2].add(rid)
    out: list[_Program] = []
    for eid in sorted(groups):
        u, item, rids = groups[eid]
        out += u.derive(opts, [item], u.round + 1, frozenset(rids))
    return out


def _prebuild(progs: list[_Program], opts: Options) -> None:
    """Draw the next candidate of every rule run of ``progs`` (:meth:`_RuleRun.peek`) and
    build their CPU verification kernels in one batch where they will run (the verification
    worker, or this process): :func:`steptp.backend.build.prebuild_cpu`. Changes what runs
    when, never what is verified."""
    from ..backend.build import prebuild_cpu
    from ..verify import cpu_verification_text, resource_problem

    items = []
    for prog in progs:
        t0 = time.perf_counter()
        for r in prog.runs:
            step = r.peek()
            if step is not None and not resource_problem(step.after):  # one verification will refuse
                try:
                    items.append((cpu_verification_text(step.after), step.after.signature))
                except Exception:  # noqa: BLE001 - its verification reports it
                    pass
        prog.seconds += time.perf_counter() - t0
    if len(items) < 2:
        return
    runner = _runner(opts)
    try:
        if runner is None:
            prebuild_cpu(items)
        else:
            runner.call(prebuild_cpu, items, timeout_s=max(opts.timeout_s, 60.0 + len(items)))
    except Exception:  # noqa: BLE001 - a failed batch costs time only: each builds on its own
        pass


def _run_units(progs: list[_Program], opts: Options, defer: bool) -> None:
    """Verify candidates of every rule run of ``progs`` until each is done (nvcc batched)."""
    while True:
        any_progress = False
        _prebuild(progs, opts)
        for prog in progs:
            t0 = time.perf_counter()
            if any([r.advance(defer) for r in prog.runs]):
                any_progress = True
            prog.seconds += time.perf_counter() - t0
        if defer:
            waiting = [p for p in progs if any(r.pending for r in p.runs)]
            t0 = time.perf_counter()
            _nvcc_round([r for p in waiting for r in p.runs], opts)
            for p in waiting:
                p.seconds += (time.perf_counter() - t0) / len(waiting)
        if not any_progress:
            break


def one_reference_thread() -> None:
    """Run PyTorch references (and numpy/BLAS) on one thread in this process, so that the
    recorded errors against PyTorch do not depend on the machine: a GEMM accumulates in
    another order with two threads than with one (111 of 3,136 entries of the 200-program
    corpus recorded another ``original_verification.max_abs_err``), and a dataset must be
    the same files whatever ``-j``, ``--ray`` or the cores of the machine. It also stops
    OpenMP threads spinning on cores that the other dataset workers use (-j 2 on the 200
    programs' originals: 28.1 instead of 32.6 s of CPU). Sets ``OMP_NUM_THREADS=1`` for a
    later ``import torch`` and ``torch.set_num_threads(1)`` when it is already imported."""
    import os
    import sys

    os.environ["OMP_NUM_THREADS"] = "1"
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    os.environ.setdefault("MKL_NUM_THREADS", "1")
    torch = sys.modules.get("torch")
    if torch is not None and torch.get_num_threads() != 1:
        torch.set_num_threads(1)


def process_batch(srcs: list[Source], opts: Options) -> list[ProgramResult]:
    """Generate the verified steps of several programs (runs in a worker process); one
    :class:`ProgramResult` per source, in order.

    For every program and rule, candidates are sampled in the seeded order and verified (CPU
    build, run and compare; GPU preflight and CUDA code generation) until ``per_rule`` pass;
    with nvcc, the candidates that passed are then compiled in ONE batched nvcc run for all
    the programs of the batch (nvcc costs about 0.3 s per run whatever it compiles), and
    rules that lost a candidate there try their next ones in another round. The outcome is
    the same as verifying every candidate with nvcc one by one, so it does not depend on how
    the programs are grouped. ``seconds`` of a result is the program's own time plus its
    share of the batched nvcc runs. PyTorch references run on one thread
    (:func:`one_reference_thread`)."""
    from ..backend import nvcc_path

    one_reference_thread()
    nvcc_ran = bool(opts.nvcc and nvcc_path() is not None)
    defer = nvcc_ran and opts.with_cuda
    progs = [_Program(src, opts) for src in srcs]
    _run_units(progs, opts, defer)
    later: list[list[_Program]] = [[] for _ in progs]
    current: list[list[_Program]] = [[p] if p.error is None else [] for p in progs]
    for round_no in range(2, max(1, opts.rounds) + 1):
        nxt = []
        for i, (p, units) in enumerate(zip(progs, current)):
            derived = [d for u, item in _choose_derived(units, opts, p.src.key, round_no)
                       for d in u.derive(opts, [item], round_no)]
            later[i] += derived
            nxt.append(derived)
        current = nxt
        _run_units([d for units in current for d in units], opts, defer)
    if opts.follow_ups:
        follow = [_follow_ups([p] + later[i], opts, p.src.key) if p.error is None else [] for i, p in enumerate(progs)]
        for i, units in enumerate(follow):
            later[i] += units
        _run_units([d for units in follow for d in units], opts, defer)
    return [p.result(opts, nvcc_ran, later[i]) for i, p in enumerate(progs)]


def process(src: Source, opts: Options) -> ProgramResult:
    """:func:`process_batch` of one program."""
    return process_batch([src], opts)[0]


def process_safe(src: Source, opts: Options) -> ProgramResult:
    """:func:`process` that turns any unexpected crash into a ProgramResult error
    (``internal error: ...``, see :func:`is_internal_error`)."""
    try:
        return process(src, opts)
    except Exception as e:  # noqa: BLE001
        return ProgramResult(str(src.path), src.key, None, [], [],
                             error=f"{INTERNAL_ERROR}{type(e).__name__}: {e}\n{traceback.format_exc(limit=3)}")


def process_batch_safe(srcs: list[Source], opts: Options) -> list[ProgramResult]:
    """:func:`process_batch` that never raises: after an unexpected crash the programs are
    redone one by one (:func:`process_safe`), so the crash costs only the program behind it.
    The process's collector is tuned once (:func:`steptp.rules.service.settle_heap`)."""
    from ..rules.service import settle_heap

    settle_heap()
    try:
        return process_batch(list(srcs), opts)
    except Exception:  # noqa: BLE001
        return [process_safe(src, opts) for src in srcs]


def _jsonable(x):
    return json.loads(json.dumps(x, default=_leir_or_str))


def _leir_or_str(x) -> str:
    """JSON fallback: LEIR nodes (e.g. a parameter that is a subterm) as LEIR text."""
    from ..leir import ast as A
    from ..leir.printer import format_node

    if isinstance(x, (A.Int, A.Float, A.Index, A.Tensor, A.Neg, A.BinOp, A.Call, A.Compare, A.BoolOp, A.Not)):
        return format_node(x)
    return str(x)


__all__ = ["INTERNAL_ERROR", "Options", "ProgramResult", "entry_id", "entry_timing", "is_internal_error", "load_source",
           "process", "process_batch", "process_batch_safe", "process_safe"]
