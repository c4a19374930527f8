"""Rule tooling behind ``stp rules list / lint / coverage`` and the matching benchmark.

* :func:`rule_rows` - id, category, K, P, S, score and level of every rule.
* :func:`replicate` - a program repeated ``k`` times with renamed tensors (a valid, larger
  program with the same structure: the matching-cost yardstick of lint and the benchmark).
* :func:`match_cost` / :func:`lint_rules` - time each rule's matching (egglog query +
  ``{check:}`` clauses) on a program and on a 4x replica, and warn when a rule is slow or
  its cost grows much faster than the program (issue 7: a 23-clause precondition went from
  38 ms on 31 nests to 31.6 s on 121 nests).
* :func:`coverage` - apply every rule to every program it matches (a few candidates each),
  verify numerically and report per strategy.

The 43 strategies of the paper (App. A.3) are listed in :data:`PAPER_STRATEGIES` (ids as
the rule files name them); the shipped strategies outside the paper's list in
:data:`EXTRA_STRATEGIES`.
"""

from __future__ import annotations

import copy
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path

from ..leir import ast as A
from ..leir.fileformat import LeirModule, Signature, TensorDecl, parse_leir

#: The paper's 43 strategies (App. A.3), as rule ids.
PAPER_STRATEGIES: tuple[str, ...] = (
    # graph
    "operator_fusion", "operator_fission", "compute_inline", "expression_splitting", "expression_reorder",
    "tensor_concat_to_fuse_operators", "tensor_split_to_decouple_operators", "common_subexpression_elimination",
    # operator
    "loop_reorder", "loop_tiling", "loop_split", "loop_fusion", "loop_unrolling", "loop_parallelization",
    "loop_vectorization", "loop_binding", "reduction_factorization",
    # memory
    "cache_read_write", "layout_transformation", "set_storage_scope", "set_storage_layout", "precompute_indices",
    # math
    "factorization", "expand_factorization", "cancellation", "expand_cancellation", "apart", "together",
    "powsimp", "expand_powsimp", "logsimp", "expand_log", "collect", "expand_collect",
    "exponential_split", "multiplicative_split", "additive_split",
    "partially_equivalent_then_correct", "normal_loop_max_to_prefix_max",
    "normal_loop_summation_on_exp_to_prefix_summation_on_exp", "online_softmax", "flashattention_wo_tiling",
    "normal_matmul_to_prefix_matmul_based_on_online_softmax",
)
assert len(PAPER_STRATEGIES) == 43


def _extra_strategies() -> tuple[str, ...]:
    from ..resources import rules_dir  # noqa: PLC0415

    return tuple(sorted(p.stem for p in rules_dir().glob("*.yaml") if p.stem not in PAPER_STRATEGIES))


#: The shipped strategies beyond the paper's list (GPU ones: cross-thread reductions, rows to
#: blocks, epilogue and block fusion, shared-memory and register tiles, tensor cores, ...): every
#: shipped rule file whose id is not in :data:`PAPER_STRATEGIES`, read from ``rules/`` (each
#: file's ``source:`` says where it comes from).
EXTRA_STRATEGIES: tuple[str, ...] = _extra_strategies()


def rule_rows(rules) -> list[dict]:
    """One dict per rule: id, category, K, P, S, score, level (paper eq. 1 and §3.4)."""
    out = []
    for r in rules:
        d = r.difficulty
        out.append({"id": r.id, "category": r.category, "K": d["K"], "P": d["P"], "S": d["S"],
                    "score": r.score, "level": r.level})
    return out


# ---------------------------------------------------------------------------
# Program replication (scaling yardstick)
# ---------------------------------------------------------------------------


def _renamer(taken: set[str], suffix: str):
    memo: dict[str, str] = {}

    def rename(name: str) -> str:
        if name not in memo:
            new = name + suffix
            k = 0
            while new in taken:
                k += 1
                new = f"{name}{suffix}{k}"
            taken.add(new)
            memo[name] = new
        return memo[name]

    return rename, memo


def replicate(module: LeirModule, copies: int) -> LeirModule:
    """``module`` repeated ``copies`` times: copy ``j > 0`` renames every tensor ``X`` to
    ``Xz<j>`` (signature entries too), so the result is a valid program with ``copies``
    times the nests and the same structure. Raises ``ValueError`` for ``copies < 1``."""
    if copies < 1:
        raise ValueError("copies must be >= 1")
    from ..engine.primitives import program_names

    taken = set(program_names(module))
    nests = list(module.program.nests)
    decls = list(module.signature.tensors)
    for j in range(1, copies):
        rename, memo = _renamer(taken, f"z{j}")

        def fix(e, rename=rename):
            return A.Tensor(rename(e.name), e.dtype, e.scope, e.indices) if isinstance(e, A.Tensor) else e

        prog = A.map_program_exprs(module.program, lambda e, fix=fix: A.transform(e, fix))
        nests += list(prog.nests)
        for t in module.signature.tensors:
            decls.append(TensorDecl(rename(t.name), t.role, t.dtype, t.shape))
    return LeirModule(Signature(module.signature.name, tuple(decls)), A.Program(tuple(nests)))


def merge_programs(modules: list[LeirModule], name: str = "merged") -> LeirModule:
    """One program running ``modules`` one after another; the tensors of module ``j > 0``
    are renamed ``X -> Xm<j>`` (signature entries too) so they stay independent."""
    from ..engine.primitives import program_names

    taken: set[str] = set()
    for m in modules:
        taken |= set(program_names(m))
    nests: list = []
    decls: list = []
    for j, m in enumerate(modules):
        if j == 0:
            nests += list(m.program.nests)
            decls += list(m.signature.tensors)
            continue
        rename, _ = _renamer(taken, f"m{j}")

        def fix(e, rename=rename):
            return A.Tensor(rename(e.name), e.dtype, e.scope, e.indices) if isinstance(e, A.Tensor) else e

        nests += list(A.map_program_exprs(m.program, lambda e, fix=fix: A.transform(e, fix)).nests)
        decls += [TensorDecl(rename(t.name), t.role, t.dtype, t.shape) for t in m.signature.tensors]
    return LeirModule(Signature(name, tuple(decls)), A.Program(tuple(nests)))


def scaled_to(module: LeirModule, nests: int) -> LeirModule:
    """The smallest replica of ``module`` with at least ``nests`` top-level nests."""
    n = max(1, len(module.program.nests))
    return replicate(module, -(-nests // n))


# ---------------------------------------------------------------------------
# Matching cost and lint
# ---------------------------------------------------------------------------


def match_cost(rules, module: LeirModule, repeat: int = 3, candidates: bool = False) -> dict:
    """Median wall time (ms) over ``repeat`` runs to list the sites of every rule on
    ``module``, each run from a fresh program load: ``{"load_ms", "batch_ms", "rules":
    {id: ms}, "total_ms", "counts": {id: n}}``. ``load_ms`` (inserting the facts and
    saturating the analysis strata) is shared by all rules; ``rules`` is each rule's own
    schedule plus its ``{check:}`` clauses and the decoding of its rows. Each run lists the candidates of a
    fresh deep copy of ``module``, so memos kept by program identity do not carry over.

    ``candidates=True`` times what the dataset and the search pay instead: every rule's
    query in one batch (:func:`~steptp.engine.match.prefetch_sites`, ``batch_ms``), then
    ``list_candidates`` (sites x parameters, through the process-wide matcher and its site
    cache, emptied before each run) per rule; ``counts`` are candidates rather than sites.
    Without it ``batch_ms`` is 0."""
    from ..engine import match as M

    if candidates:
        from ..engine import NoMatch, list_candidates

        m = M.shared_matcher()
        m.add(rules)

        def count(rule) -> int:
            try:
                return len(list_candidates(rule, module))
            except NoMatch:
                return 0
    else:
        m = M.Matcher(rules)

        def count(rule) -> int:
            return len(m.sites_of(rule, module))

    loads, batches, totals = [], [], []
    per: dict[str, list[float]] = {r.id: [] for r in rules}
    counts: dict[str, int] = {}
    original = module
    for _ in range(repeat):
        # a fresh copy each run: the per-program memos (kept by program identity) start
        # empty, as for each new candidate program of a search or dataset run
        module = copy.deepcopy(original)
        if candidates:
            M._SITES.clear()
        m._unload()
        t0 = time.perf_counter()
        m._load(module)
        t1 = time.perf_counter()
        loads.append(1e3 * (t1 - t0))
        if candidates:  # as the search and the dataset list: every rule's query in one batch
            M.prefetch_sites(rules, module, m)
        batches.append(1e3 * (time.perf_counter() - t1))
        for r in rules:
            t1 = time.perf_counter()
            counts[r.id] = count(r)
            per[r.id].append(1e3 * (time.perf_counter() - t1))
        totals.append(1e3 * (time.perf_counter() - t0))
    return {"load_ms": statistics.median(loads), "batch_ms": statistics.median(batches), "rules": {k: statistics.median(v) for k, v in per.items()},
            "total_ms": statistics.median(totals), "counts": counts}


@dataclass
class LintFinding:
    rule: str
    level: str          # "warning" | "error"
    message: str

    def __str__(self) -> str:
        return f"{self.level}: {self.rule}: {self.message}"


def _where_that_rejects(rule, module: LeirModule) -> tuple[int, int] | None:
    """``(k, sites)``: the first ``where:`` clause ``k`` (0-based) after which ``rule`` has no
    site on ``module`` although the clauses before it left ``sites`` > 0; None when the
    pattern alone matches nothing (or the rule has no ``where:``)."""
    import dataclasses

    from ..engine import find_sites

    before = None
    for k in range(len(rule.where) + 1):
        part = dataclasses.replace(rule, where=rule.where[:k], key=f"{rule.key}:where[:{k}]")
        try:
            n = len(find_sites(part, module))
        except Exception:  # noqa: BLE001 - a clause that cannot be evaluated alone: stop here
            return None
        if n == 0:
            return None if before is None else (k - 1, before)
        before = n
    return None


def _where(rule, field: str, name: str | None = None) -> str:
    """``FILE:LINE:COL`` of ``field`` in the rule's file (:func:`~steptp.rules.positions.locate_field`),
    ``FILE`` alone when it cannot be read."""
    from .positions import locate_field

    src = rule.display_source
    try:
        pos = locate_field(Path(rule.path).read_text(encoding="utf-8"), field, name) if rule.path else None
    except (OSError, UnicodeDecodeError):
        pos = None
    return f"{src}:{pos[0]}:{pos[1]}" if pos else src


def symbolically_checked(rule) -> bool:
    """Whether lint runs the symbolic check (:func:`steptp.engine.algebra.symbolic_check_programs`)
    on the rule's tests: math rules (as ``stp rules test``) and every rule of the ``expr``
    scope (a rewrite of one subexpression: before - after must be zero). Loop and nest
    rewrites are left out: the check compares the equations one by one, so a loop split or a
    fusion reads as a difference it cannot account for."""
    return rule.category == "math" or rule.scope == "expr"


def lint_tests(rules) -> list[LintFinding]:
    """Errors a rule's own tests reveal without verifying anything numerically (issues 34, 54):

    * the CoT template cannot render on a test the rule applies to (an undefined variable, a
      filter error): ``FILE:LINE:COL`` of its ``cot:`` key and the template's message; such a
      rule would give an empty dataset;
    * a test that expects a rewrite finds no site: the ``where:`` clause that rejected every
      site the pattern and the clauses before it matched, with its position;
    * the symbolic check disproves the rewrite a test produces (before - after is not zero;
      :func:`symbolically_checked` rules): ``FILE:LINE:COL`` of ``rewrite``.

    Returns the findings (level ``error``)."""
    import jinja2

    from ..engine import NoMatch, apply_rule
    from ..engine.algebra import symbolic_check_programs

    out: list[LintFinding] = []
    for rule in rules:
        for t in rule.tests:
            if t.no_match:
                continue
            try:
                before = parse_leir(t.before, f"{rule.id} tests[{t.index}].before")
                step = apply_rule(rule, before, seed=t.seed, site=t.site, params=t.params)
            except jinja2.TemplateError as e:
                out.append(LintFinding(rule.id, "error", f"{_where(rule, 'cot')}: cot: the template cannot render on "
                                                         f"tests[{t.index}] ({t.name}): {type(e).__name__}: {e}"))
                break
            except NoMatch:
                hit = _where_that_rejects(rule, before)
                if hit is None:
                    where = "the match: pattern finds no site"
                else:
                    k, n = hit
                    where = (f"{_where(rule, f'where[{k}]')}: where[{k}] {rule.where[k]!r} rejects all {n} site(s) "
                             f"the pattern and the clauses before it match")
                out.append(LintFinding(rule.id, "error", f"tests[{t.index}] ({t.name}) expects a rewrite but the rule "
                                                         f"does not match: {where}"))
                continue
            except Exception:  # noqa: BLE001 - other failures are stp rules test's to report
                continue
            if symbolically_checked(rule):
                try:
                    verdict = symbolic_check_programs(before.program, step.after.program, before.signature)
                except Exception:  # noqa: BLE001 - a form the check cannot read decides nothing
                    verdict = "unknown"
                if verdict == "disproved":
                    out.append(LintFinding(rule.id, "error", f"{_where(rule, 'rewrite')}: rewrite: the symbolic check "
                                                             f"disproves the rewrite on tests[{t.index}] ({t.name}): "
                                                             f"before - after is not zero"))
    return out


def largest_program(paths) -> LeirModule | None:
    """The ``.leir`` program with the most top-level nests among files/directories."""
    from ..leir import load_leir
    from ..programs import discover

    best = None
    for src in discover(paths, kinds=("leir",)):
        m = load_leir(src.path)
        if best is None or len(m.program.nests) > len(best.program.nests):
            best = m
    return best


def lint_rules(rules, program: LeirModule | None, slow_ms: float = 1000.0, growth: float = 8.0,
               scale_nests: int = 120) -> tuple[list[LintFinding], dict]:
    """Warn about rules whose matching is slow or explodes with program size.

    Each rule's matching time is measured on ``program`` (the largest bundled one) and on a
    replica with at least ``scale_nests`` nests (:func:`scaled_to`). A warning is raised when
    a rule takes more than ``slow_ms`` on the replica, or (above 20 ms) when its time grows
    more than ``growth`` times faster than the program: ``(t_big / t_small) / (nests_big /
    nests_small) > growth`` (linear growth gives 1, a join over pairs of nests about the
    size ratio). Returns (findings, figures)."""
    findings: list[LintFinding] = []
    fig: dict = {}
    if program is None or not rules:
        return findings, fig
    big = scaled_to(program, scale_nests)
    small_cost = match_cost(rules, program, repeat=1)
    big_cost = match_cost(rules, big, repeat=1)
    ratio_n = len(big.program.nests) / max(1, len(program.program.nests))
    fig = {"program": program.signature.name, "nests": len(program.program.nests),
           "scaled_nests": len(big.program.nests), "small": small_cost, "big": big_cost}
    for r in rules:
        t_s = max(small_cost["rules"][r.id], 0.5)     # below 0.5 ms the ratio is noise
        t_b = big_cost["rules"][r.id]
        if t_b > slow_ms:
            findings.append(LintFinding(r.id, "warning", f"matching takes {t_b:.0f} ms on a {len(big.program.nests)}-nest "
                                                         f"program (limit {slow_ms:.0f} ms): reorder or split the where: "
                                                         f"clauses, or move a check to {{check: ...}}"))
        elif t_b > 20 and (t_b / t_s) / ratio_n > growth:
            findings.append(LintFinding(r.id, "warning", f"matching cost explodes: {t_s:.1f} ms on "
                                                         f"{len(program.program.nests)} nests, {t_b:.1f} ms on "
                                                         f"{len(big.program.nests)} (x{t_b / t_s:.0f} for x{ratio_n:.0f} "
                                                         f"nests)"))
    return findings, fig


def site_text(module: LeirModule, site, width: int = 100) -> str:
    """The program text at ``site`` (a :class:`~steptp.engine.match.Site` of ``module``):
    the matched subexpression (expr scope), the equation, the loop with its nest (``L^{8}_{a=0}
    in B^{4}_{tx=0}L^{8}_{a=0}[...]``), the nest, the nests or the tensor's first access;
    shortened to ``width`` characters (``...``); ``""`` when the site does not resolve."""
    from ..engine.primitives import expr_at, get_item, iter_tensors
    from ..leir.printer import format_assign, format_expr, format_loops, format_nest

    prog = module.program
    try:
        if site.equation is not None and site.expr is not None:
            text = format_expr(expr_at(get_item(prog, site.equation).value, site.expr))
        elif site.equation is not None:
            text = format_assign(get_item(prog, site.equation))
        elif site.nest is not None and site.loop is not None:
            nest = get_item(prog, site.nest)
            text = f"{format_loops((nest.loops[site.loop],))} in {format_nest(nest)}"
        elif site.nest is not None:
            text = format_nest(get_item(prog, site.nest))
        elif site.nests:
            text = " ".join(format_nest(get_item(prog, p)) for p in site.nests)
        elif site.tensor is not None:
            text = next((format_expr(t) for t in iter_tensors(prog) if t.name == site.tensor), site.tensor)
        else:
            return ""
    except (ValueError, IndexError, TypeError, AttributeError):
        return ""
    return text if len(text) <= width else text[: max(0, width - 3)] + "..."


# ---------------------------------------------------------------------------
# Coverage
# ---------------------------------------------------------------------------


@dataclass
class CoverageRow:
    """One strategy: candidates found, tried, verified Equal, and the first failure."""

    rule: str
    candidates: int = 0
    tried: int = 0
    equal: int = 0
    programs: int = 0
    first_failure: str = ""
    failures: list = field(default_factory=list)


def coverage(rules, programs: list[LeirModule], per_program: int = 3, seed: int = 0, trials: int = 3,
             nvcc: bool = False, progress=None) -> list[CoverageRow]:
    """Apply every rule to every program it matches (``per_program`` candidates each,
    spread over the candidate list in a seeded order), verify each result against its
    program (:func:`steptp.verify.verify_pair`, ``trials`` seeded trials) and count.

    The candidates are those ``stp apply --all`` lists (``list_candidates(check=True)``):
    a site whose rewrite the GPU preflight rejects (e.g. a threadIdx.x loop that would
    write elements other iterations write) is not a step of the rule, so it is neither
    tried nor a failure. Candidates are listed and applied through the engine service
    (:class:`steptp.rules.service.EngineService`, in this process, no time limit); the
    order is drawn with ``seeded_rng(seed, rule id, program name)`` (:mod:`steptp.seeds`; rule before
    program, the one exception to its order, kept so that coverage tables stay unchanged)."""
    from .service import EngineService
    from ..seeds import seeded_rng
    from ..verify import verify_pair

    svc = EngineService(rules, isolated=False, check=True, apply_timeout_s=0, list_timeout_s=0)
    rows = []
    for r in rules:
        row = CoverageRow(r.id)
        for m in programs:
            try:
                cands = svc.candidates(m, r.id)
            except Exception as e:  # noqa: BLE001 - a crashing rule is a finding, not a crash
                row.failures.append(f"{m.signature.name}: match error {type(e).__name__}: {e}")
                continue
            if not cands:
                continue
            row.programs += 1
            row.candidates += len(cands)
            order = list(range(len(cands)))
            seeded_rng(seed, r.id, m.signature.name).shuffle(order)  # the exception: see the docstring
            for k in order[:per_program]:
                s, p = cands[k]
                row.tried += 1
                a = svc.apply(m, r.id, k, seed=seed)
                if not a.ok:
                    row.failures.append(f"{m.signature.name} {s}: {a.reason}")
                    continue
                res = verify_pair(m, a.module, trials=trials, seed=seed, nvcc=nvcc)
                if res.equal:
                    row.equal += 1
                else:
                    row.failures.append(f"{m.signature.name} {s} {p}: {res.reason}")
            if progress:
                progress(r.id, m.signature.name)
        row.first_failure = row.failures[0] if row.failures else ""
        rows.append(row)
    return rows


def format_coverage(rows: list[CoverageRow], total: int | None = None) -> str:
    """The coverage table, ending with ``strategies with a verified transformation: N/T``.

    ``T`` (unless ``total`` is given) is the paper's 43 plus the shipped strategies beyond it
    (:data:`EXTRA_STRATEGIES`) that have a row, so all shipped rules give ``N/53``; ``N``
    counts the paper's and those strategies with at least one Equal result."""
    extra = [r for r in rows if r.rule in EXTRA_STRATEGIES]
    if total is None:
        total = len(PAPER_STRATEGIES) + len(extra)
    w = max([len("strategy")] + [len(r.rule) for r in rows])
    lines = [f"{'strategy':{w}}  {'programs':>8}  {'candidates':>10}  {'tried':>5}  {'Equal':>5}  first failure"]
    for r in rows:
        fail = r.first_failure.replace("\n", " ")
        if len(fail) > 120:
            fail = fail[:117] + "..."
        lines.append(f"{r.rule:{w}}  {r.programs:8d}  {r.candidates:10d}  {r.tried:5d}  {r.equal:5d}  {fail or '-'}")
    tried = sum(r.tried for r in rows)
    eq = sum(r.equal for r in rows)
    verified = sum(1 for r in rows if r.equal > 0 and (r.rule in PAPER_STRATEGIES or r.rule in EXTRA_STRATEGIES))
    lines.append(f"candidates tried: {tried}, Equal: {eq} ({100.0 * eq / tried if tried else 0:.1f}%)")
    lines.append(f"strategies with a verified transformation: {verified}/{total}")
    return "\n".join(lines)


__all__ = ["PAPER_STRATEGIES", "EXTRA_STRATEGIES", "rule_rows", "replicate", "merge_programs", "scaled_to", "match_cost", "LintFinding", "largest_program",
           "lint_tests", "symbolically_checked", "lint_rules", "site_text", "CoverageRow", "coverage", "format_coverage"]
