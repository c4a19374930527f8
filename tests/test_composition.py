"""Issue 51: the paper profile's composition without repetition.

Real entries: `stp dataset --profile paper` over four example programs (a few rules of each
level, two steps per rule), then the chat sets as `stp dataset` wrote them and as
`filtered_sets` composes them. Rules checked: one single-answer record per prompt (at most
1.5 answers per prompt), no two multi-answer records of a program with the same steps or the
same prompt, a step in at most two multi-answer records of its program, answer slots at most
twice the distinct steps, the paper's level mix without repetition, seeded determinism, and
the --max-tokens bound (long records split or dropped, and counted)."""

import json
import random
import shutil
from collections import Counter, defaultdict
from pathlib import Path

import pytest
from typer.testing import CliRunner

from steptp.cli import app
from steptp.dataset.chat import multi_tokens, record_tokens
from steptp.dataset.difficulty import DEFAULT_MAX_TOKENS, FilterPolicy, FilteredSets, prompt_key
from steptp.dataset.labels import one_label_per_step
from steptp.dataset.pipeline import build_derived, filtered_sets

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
PROGRAMS = ["matmul.leir", "softmax.leir", "layernorm_tanh.leir", "exp_log_power.leir"]
#: difficult, medium and easy rules (rules/*.yaml `difficulty`)
RULES = ["loop_split", "loop_tiling", "cache_read_write", "layout_transformation",
         "loop_reorder", "loop_unrolling", "loop_binding", "factorization", "expand_factorization"]
runner = CliRunner()


def stp(*args):
    return runner.invoke(app, [str(a) for a in args])


def rows(path):
    return [json.loads(l) for l in Path(path).read_text().splitlines() if l.strip()]


def dataset_args(out, *extra):
    args = ["dataset", *(EXAMPLES / p for p in PROGRAMS), "-o", out, "--seed", "0", "--in-process", "-q",
            "--per-rule", "2", "--profile", "paper", *extra]
    for r in RULES:
        args += ["--rule", ROOT / "rules" / f"{r}.yaml"]
    return args


@pytest.fixture(scope="module")
def paper_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("composition") / "out"
    res = stp(*dataset_args(out))
    assert res.exit_code == 0, res.output
    return out


def _entries(run):
    """The entries the chat sets are made of (as build_derived takes them)."""
    return one_label_per_step(rows(run / "dictionary.jsonl"))[0]


def check_rules(singles, multis):
    """The composition rules of issue 51 over entry lists (filtered_sets' result)."""
    prompts = Counter(prompt_key(e) for e in singles)
    assert singles and len(singles) / len(prompts) <= 1.5
    assert max(prompts.values()) == 1  # one answer per single-answer prompt
    by_prog = defaultdict(list)
    for g in multis:
        assert len({prompt_key(e) for e in g}) == 1 and len(g) >= 2
        assert len({e["id"] for e in g}) == len(g)  # no step twice in a record
        assert all(e["difficulty"]["level"] != "easy" for e in g)
        by_prog[prompt_key(g[0])].append(g)
    slots = Counter(e["id"] for g in multis for e in g)
    assert sum(slots.values()) <= 2 * len(slots)
    for groups in by_prog.values():
        sets = [frozenset(e["id"] for e in g) for g in groups]
        assert len(set(sets)) == len(sets)  # no duplicate answer set
        assert len({len(g) for g in groups}) == len(groups)  # no two records with one prompt
        per_step = Counter(i for s in sets for i in s)
        assert max(per_step.values()) <= 2
    single_ids = {e["id"] for e in singles}
    assert not single_ids & set(slots)  # a single-answer step is not repeated in a multi-answer record


def test_chat_files_follow_the_composition_rules(paper_run):
    entries = {e["id"]: e for e in rows(paper_run / "dictionary.jsonl")}
    singles = [entries[r["meta"]["entry_ids"][0]] for r in rows(paper_run / "chat_single.jsonl")]
    multis = [[entries[i] for i in r["meta"]["entry_ids"]] for r in rows(paper_run / "chat_multi.jsonl")]
    check_rules(singles, multis)
    # the prompt a model sees: one single-answer record per distinct prompt text
    texts = Counter(r["messages"][0]["content"] for r in rows(paper_run / "chat_single.jsonl"))
    assert max(texts.values()) == 1
    multi_texts = Counter(r["messages"][0]["content"] for r in rows(paper_run / "chat_multi.jsonl"))
    assert max(multi_texts.values()) == 1
    assert len(multis) >= len(singles)  # several multi-answer records per program, not one


def test_stats_count_the_mix_the_papers_way(paper_run):
    fs = filtered_sets(_entries(paper_run), FilterPolicy(seed=0, profile="paper"))
    assert isinstance(fs, FilteredSets)
    singles, multis = fs
    st = fs.stats
    items = list(singles) + [e for g in multis for e in g]
    level = Counter(e["difficulty"]["level"] for e in items)
    assert st["items"] == len(items) and st["level_items"] == {lv: level.get(lv, 0)
                                                               for lv in ("difficult", "medium", "easy")}
    assert st["single_answers_per_prompt"] == 1.0 and st["multi_step_max_records"] <= 2
    assert st["multi_duplicate_sets"] == 0 and st["multi_same_prompt"] == 0
    assert st["multi_slots"] <= 2 * st["multi_distinct_steps"]
    assert st["paper_level_pct"] == {"difficult": 87.32, "medium": 12.17, "easy": 0.51}
    # about half the entries are medium; the filter gets close to the paper's 12.17 % without
    # repeating a step more than twice
    assert abs(st["level_pct_gap"]["medium"]) <= 5.0 and st["level_pct"]["difficult"] >= 80.0, st
    assert st["tokens"]["max_tokens"] == DEFAULT_MAX_TOKENS and st["tokens"]["measure"]
    assert st["tokens"]["max"] == max(multi_tokens(multis))
    json.dumps(st)  # JSON-ready for report.json


def test_composition_is_seeded_and_order_free(paper_run, tmp_path):
    entries = _entries(paper_run)
    policy = FilterPolicy(seed=0, profile="paper")
    first = filtered_sets(entries, policy)
    shuffled = entries[:]
    random.Random(5).shuffle(shuffled)
    again = filtered_sets(shuffled, policy)
    assert first == again and first.stats == again.stats
    other = filtered_sets(entries, FilterPolicy(seed=1, profile="paper"))
    check_rules(*other)
    assert other != first  # the seed chooses
    # the files: rebuilding the derived sets gives the same bytes
    copy = tmp_path / "copy"
    shutil.copytree(paper_run, copy)
    build_derived(copy, policy)
    for name in ("chat_single.jsonl", "chat_multi.jsonl"):
        assert (copy / name).read_bytes() == (paper_run / name).read_bytes()


def test_max_tokens_splits_or_drops_long_records_and_counts_them(paper_run):
    entries = _entries(paper_run)
    full = filtered_sets(entries, FilterPolicy(seed=0, profile="paper"))
    tokens = sorted(multi_tokens(full[1]))
    limit = tokens[len(tokens) // 2]  # half the records are longer
    bounded = filtered_sets(entries, FilterPolicy(seed=0, profile="paper", max_tokens=limit))
    t = bounded.stats["tokens"]
    over = sum(n > limit for n in tokens)
    assert t["max_tokens"] == limit and t["over"] == over > 0
    assert t["split"] + t["dropped"] >= 1
    kept = multi_tokens(bounded[1])
    assert all(n <= limit for n in kept) and t["max"] == max(kept, default=0)
    # the records within the bound are kept as they were; the others are parts of them or gone
    short = [g for g in full[1] if multi_tokens([g])[0] <= limit]
    assert all(g in bounded[1] for g in short)
    assert len(bounded[1]) == len(full[1]) - t["over"] + t["parts"]
    assert t["split"] >= 1 and t["parts"] >= 1  # cut into smaller sets, not only dropped
    assert bounded[0] == full[0]
    check_rules(*bounded)
    # every step of a kept record was in the unbounded sets' records
    assert {e["id"] for g in bounded[1] for e in g} <= {e["id"] for g in full[1] for e in g}
    # too small to split anything: every long record dropped, its steps counted
    tiny = filtered_sets(entries, FilterPolicy(seed=0, profile="paper", max_tokens=1))
    assert tiny[1] == [] and tiny.stats["tokens"]["dropped"] >= tiny.stats["tokens"]["over"] == len(full[1])
    assert tiny.stats["tokens"]["dropped_steps"] >= sum(len(g) for g in full[1])


def test_max_tokens_option_bounds_the_written_records(paper_run, tmp_path):
    """`stp dataset --max-tokens N` (a rerun over a finished run rebuilds the chat sets) and
    its refusal without --profile paper."""
    tokens = sorted(record_tokens(rows(paper_run / "chat_multi.jsonl")))
    limit = tokens[len(tokens) // 2]
    out = tmp_path / "bounded"
    shutil.copytree(paper_run, out)
    run = json.loads((out / "run.json").read_text())
    assert "max_tokens" not in run["policy"]  # the default is not recorded (older runs resume)
    run["policy"]["max_tokens"] = limit
    (out / "run.json").write_text(json.dumps(run))
    res = stp(*dataset_args(out, "--max-tokens", limit))
    assert res.exit_code == 0, res.output
    written = rows(out / "chat_multi.jsonl")
    assert any(n > limit for n in tokens)
    assert written and all(n <= limit for n in record_tokens(written))
    # the original directory refuses another bound (it is part of the run's options)
    res = stp(*dataset_args(paper_run, "--max-tokens", limit))
    assert res.exit_code == 2 and "max_tokens" in res.output
    res = stp("dataset", EXAMPLES / "matmul.leir", "-o", tmp_path / "default", "--max-tokens", "100")
    assert res.exit_code == 2 and "--profile paper" in res.output
    assert not (tmp_path / "default").exists()


def test_default_profile_is_unchanged_and_reports_its_composition(paper_run):
    """The default profile keeps the §3.4 filter alone (every medium and difficult entry a
    single-answer record, one multi-answer record per program): its stats show the answers
    per prompt that the paper profile avoids."""
    entries = _entries(paper_run)
    fs = filtered_sets(entries, FilterPolicy(seed=0))
    assert fs.stats["profile"] == "default"
    programs = {e["original"]["leir"] for e in entries}
    assert len(fs[1]) <= len(programs)
    assert {e["id"] for e in entries if e["difficulty"]["level"] != "easy"} <= {e["id"] for e in fs[0]}
    assert fs.stats["single_answers_per_prompt"] > 1.5
