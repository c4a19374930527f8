"""`stp split` (issue 51: a held-out split that holds): program provenance in every entry and
chat record, whole program types held out, no leak (types, prompts, alpha-equivalent programs,
test cases), deterministic, loads with `datasets`, a data set card, exit 2 for bad input.

One real run: `stp corpus` (4 types, 2 programs each) plus two hand-written programs, the
second of which is the first after one verified `loop_split` step (so the two types share a
program up to renaming: holding out one must take the other along), `stp dataset --rounds 2`
with two cheap rules."""

from __future__ import annotations

import contextlib
import hashlib
import json
import shutil
from collections import Counter
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from steptp.cli import app
from steptp.dataset.corpus import parse_header
from steptp.dataset.labels import module_key, program_key
from steptp.dataset.split import choose_types, load_dataset_dir
from steptp.leir.fileformat import load_leir

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
RULES = ROOT / "rules"
runner = CliRunner()
TYPES = ("L1Loss", "Subtract", "CrossEntropyLoss", "Conv2dDilatedPadded")
P, Q = "scale_bias", "scale_bias_split"   # Q's program is P after one loop_split step


def stp(*args):
    return runner.invoke(app, [str(a) for a in args])


def rows(path):
    return [json.loads(l) for l in Path(path).read_text().splitlines() if l.strip()]


def _dataset(*inputs, out, rounds=1):
    args = ["dataset", *inputs, "-o", out, "--seed", "0", "--rule", RULES / "loop_split.yaml",
            "--no-nvcc", "--no-cuda", "--in-process", "-q"]
    if rounds > 1:
        args += ["--rule", RULES / "operator_fusion.yaml", "--rounds", rounds]
    res = stp(*args)
    assert res.exit_code == 0, res.output
    return out


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    """``BASE/{corpus,hand,ds}``; the dataset records its sources relative to BASE."""
    b = tmp_path_factory.mktemp("split")
    with contextlib.chdir(b):
        args = ["corpus", "-o", "corpus", "--count", "8", "--seed", "3"]
        for t in TYPES:
            args += ["--type", t]
        assert stp(*args).exit_code == 0
        (b / "hand").mkdir()
        shutil.copy(EXAMPLES / f"{P}.leir", b / "hand")
        one = _dataset(f"hand/{P}.leir", out=Path("one"))
        step = rows(one / "dictionary.jsonl")[0]
        header = (b / "hand" / f"{P}.leir").read_text().split("\nB^")[0].replace(P, Q)
        (b / "hand" / f"{Q}.leir").write_text(header + "\n" + step["transformed"]["leir"] + "\n")
        _dataset("corpus", "hand", out="ds", rounds=2)
    return b


@pytest.fixture(scope="module")
def split(base):
    """``stp split`` with a seed that draws neither P nor Q (both are checked elsewhere)."""
    ds = load_dataset_dir(base / "ds")
    counts = Counter(r.ptype for r in ds.records)
    seed = next(s for s in range(100) if not {P, Q} & set(choose_types(counts, s, 0.1)))
    out = base / "split"
    res = stp("split", base / "ds", "-o", out, "--seed", seed, "-q")
    assert res.exit_code == 0, res.output
    return out, seed


def _prompt(rec):
    return next(m["content"] for m in rec["messages"] if m["role"] == "user")


def _programs(recs, by_id):
    keys = set()
    for r in recs:
        for i in r["meta"]["entry_ids"]:
            e = by_id[i]
            known = [t["name"] for t in e["signature"]["tensors"]]
            keys |= {program_key(e["original"]["leir"], known), program_key(e["transformed"]["leir"], known)}
    return keys


# ---- provenance ---------------------------------------------------------------------------


def test_entries_and_chat_meta_carry_program_type_and_id(base):
    ds = base / "ds"
    entries = rows(ds / "dictionary.jsonl")
    by_id = {e["id"]: e for e in entries}
    assert {e["program_type"] for e in entries} == set(TYPES) | {P, Q}
    for e in entries:
        src = base / e["source"]
        assert e["program_id"] == hashlib.sha256(src.read_bytes()).hexdigest()[:16]
        if src.suffix == ".py":
            assert e["program_type"] == parse_header(src)["type"] != e["program"]
        else:
            assert e["program_type"] == e["program"]
    # two programs of one corpus type: one type, two ids
    corpus = [e for e in entries if e["source"].startswith("corpus")]
    assert all(len({e["program_id"] for e in corpus if e["program_type"] == t}) == 2 for t in TYPES)
    # derived originals (round 2) carry the id of the source program they come from
    derived = [e for e in entries if e.get("derived_from")]
    assert derived
    for e in derived:
        parent = by_id[e["derived_from"]["id"]]
        assert (e["program_type"], e["program_id"]) == (parent["program_type"], parent["program_id"])
    # every chat record's meta: its program's values (the one its prompt names), single and
    # multi alike
    recs = rows(ds / "chat_single.jsonl") + rows(ds / "chat_multi.jsonl")
    assert {r["meta"]["kind"] for r in recs} == {"single", "multi"}
    mixed = 0
    for r in recs:
        es = [by_id[i] for i in r["meta"]["entry_ids"]]
        assert (r["meta"]["program_type"], r["meta"]["program_id"]) == (es[0]["program_type"], es[0]["program_id"])
        assert f'"{es[0]["program"]}"' in _prompt(r)
        if len({e["program_id"] for e in es}) > 1:
            # the default profile groups multi-answer items by original LEIR alone: Q's
            # original is also P's derived original, so one record may hold both programs'
            # steps (the split's alpha-equivalence check keeps P and Q on one side)
            mixed += 1
            assert {e["program_type"] for e in es} == {P, Q}
            assert len({e["original"]["leir"] for e in es}) == 1
    assert mixed <= 1


# ---- the split ------------------------------------------------------------------------------


def test_split_holds_out_whole_types_with_no_leak(base, split):
    out, seed = split
    ds = base / "ds"
    by_id = {e["id"]: e for e in rows(ds / "dictionary.jsonl")}
    train, test = rows(out / "train.jsonl"), rows(out / "test.jsonl")
    every = rows(ds / "chat_single.jsonl") + rows(ds / "chat_multi.jsonl")
    # every record once, single and multi together, with the same meta keys
    key = lambda r: json.dumps(r, sort_keys=True)  # noqa: E731
    assert sorted(map(key, train + test)) == sorted(map(key, every))
    assert {tuple(r["meta"]) for r in train + test} == {tuple(every[0]["meta"])}
    assert {r["meta"]["kind"] for r in train} == {"single", "multi"}
    summary = json.loads((out / "split.json").read_text())
    held = set(summary["held_out_types"])
    assert held == {r["meta"]["program_type"] for r in test} and summary["moved_types"] == []
    # no leak, counted here independently of split.py
    assert not held & {r["meta"]["program_type"] for r in train}
    assert not {_prompt(r) for r in test} & {_prompt(r) for r in train}
    train_progs = _programs(train, by_id)
    assert not _programs(test, by_id) & train_progs
    lk = summary["leak_check"]
    assert lk["passed"] and (lk["types"], lk["prompts"], lk["alpha_equivalent_programs"], lk["testset_cases"]) == \
        (0, 0, 0, 0)
    assert summary["records"] == {"total": len(every), "train": len(train), "test": len(test),
                                  "test_share": round(len(test) / len(every), 4)}
    assert 0 < len(test) < len(every) / 4  # about 10 %: whole types
    # testset/: stp testset's format, every held-out source program, nothing of train
    m = json.loads((out / "testset" / "testset.json").read_text())
    test_sources = {by_id[i]["source"] for r in test for i in r["meta"]["entry_ids"]}
    assert set(m["inputs"]) == test_sources and m["cases"]
    assert {c["file"] for c in m["cases"]} == {p.name for p in (out / "testset").glob("*.leir")}
    for c in m["cases"]:
        assert c["source"] in test_sources and c["from"] == "source" and not c["in_training"]
        assert module_key(load_leir(out / "testset" / c["file"])) not in train_progs
    assert any(c["kind"] == "shape+dtype" for c in m["cases"])  # corpus programs: shapes varied too
    assert summary["testset"]["cases"] == len(m["cases"])


def test_a_type_alpha_equivalent_to_a_held_out_one_moves_to_test(base, tmp_path):
    """P and Q are different types sharing a program (Q's original is P's loop_split answer):
    whichever the seed draws, the other is moved to test, with its reason."""
    entries = rows(base / "ds" / "dictionary.jsonl")
    q = next(e for e in entries if e["program"] == Q and not e.get("derived_from"))
    known = [t["name"] for t in q["signature"]["tensors"]]
    assert any(program_key(e["transformed"]["leir"], known) == program_key(q["original"]["leir"], known)
               for e in entries if e["program"] == P)
    ds = load_dataset_dir(base / "ds")
    counts = Counter(r.ptype for r in ds.records)
    for drawn, other in ((P, Q), (Q, P)):
        seed = next(s for s in range(200) if drawn in (c := choose_types(counts, s, 0.1)) and other not in c)
        out = tmp_path / drawn
        res = stp("split", base / "ds", "-o", out, "--seed", seed, "-q")
        assert res.exit_code == 0, res.output
        s = json.loads((out / "split.json").read_text())
        assert drawn in s["chosen_types"] and {P, Q} <= set(s["held_out_types"])
        moved = {m["type"]: m for m in s["moved_types"]}
        assert moved[other]["rule"] == "alpha_equivalent" and "alpha-equivalent" in moved[other]["reason"]
        assert s["leak_check"]["alpha_equivalent_programs"] == 0
        assert {P, Q} <= {r["meta"]["program_type"] for r in rows(out / "test.jsonl")}
        assert not {P, Q} & {r["meta"]["program_type"] for r in rows(out / "train.jsonl")}
        card = (out / "README.md").read_text()
        assert f"`{other}`" in card and "Moved to test by the leak check (" in card


def test_the_split_is_deterministic_for_a_seed(base, split, tmp_path):
    out, seed = split
    again = tmp_path / "again"
    assert stp("split", base / "ds", "-o", again, "--seed", seed, "-q").exit_code == 0
    files = sorted(p.relative_to(out) for p in out.rglob("*") if p.is_file())
    assert files == sorted(p.relative_to(again) for p in again.rglob("*") if p.is_file())
    for f in files:
        assert (out / f).read_bytes() == (again / f).read_bytes(), f


def test_the_split_loads_with_datasets(split, tmp_path):
    import datasets

    out, _ = split
    dd = datasets.load_dataset("json", data_files={"train": str(out / "train.jsonl"),
                                                   "test": str(out / "test.jsonl")}, cache_dir=str(tmp_path))
    assert dd["train"].num_rows == len(rows(out / "train.jsonl"))
    assert dd["test"].num_rows == len(rows(out / "test.jsonl"))
    assert dd["train"].features == dd["test"].features
    assert dd["test"][0]["messages"][0]["role"] == "user" and dd["test"][0]["meta"]["program_type"]


def test_the_card_has_front_matter_and_sections(base, split):
    out, seed = split
    text = (out / "README.md").read_text()
    assert text.startswith("---\n")
    front = yaml.safe_load(text.split("---\n")[1])
    assert front["license"] == "apache-2.0"  # pyproject: Apache-2.0
    assert front["task_categories"] and front["configs"][0]["data_files"] == [
        {"split": "train", "path": "train.jsonl"}, {"split": "test", "path": "test.jsonl"}]
    for h in ("## Composition", "## Fields", "## How it was made", "## The split", "## Limitations"):
        assert f"\n{h}\n" in text, h
    s = json.loads((out / "split.json").read_text())
    assert "3 random + 2 ordered + 4 edge-case trials" in text
    assert "--rule loop_split.yaml --rule operator_fusion.yaml" in text and "--rounds 2" in text
    assert all(f"`{t}`" in text for t in s["held_out_types"])
    assert "| records | " in text and "| difficult |" in text and "| `loop_split` |" in text
    assert "`meta.program_type`" in text and "`meta.program_id`" in text
    assert f"--seed {seed}" in text and "| a test prompt (user message text) | 0 |" in text


def test_sources_gone_the_testset_comes_from_the_dictionary(base, split, tmp_path):
    """A dataset moved away from its sources: the cases are the dictionary's LEIR in other
    dtypes; the records split exactly as before."""
    out, seed = split
    moved = tmp_path / "elsewhere" / "ds"
    shutil.copytree(base / "ds", moved)
    with contextlib.chdir(tmp_path):
        res = stp("split", moved, "-o", "out", "--seed", seed, "-q")
    assert res.exit_code == 0, res.output
    for f in ("train.jsonl", "test.jsonl"):
        assert (tmp_path / "out" / f).read_bytes() == (out / f).read_bytes()
    m = json.loads((tmp_path / "out" / "testset" / "testset.json").read_text())
    assert m["cases"] and all(c["from"] == "dictionary" and c["kind"] in ("dtype", "as-given") for c in m["cases"])
    assert set(m["inputs"]) == set(json.loads((out / "testset" / "testset.json").read_text())["inputs"])


def test_a_dataset_written_before_provenance_splits_the_same(base, split, tmp_path):
    """Entries and records without program_type / program_id (older datasets) get them from
    the resume record and the source headers."""
    out, seed = split
    old = tmp_path / "old"
    shutil.copytree(base / "ds", old)
    for name in ("dictionary.jsonl", "chat_single.jsonl", "chat_multi.jsonl"):
        recs = rows(old / name)
        for r in recs:
            for holder in (r, r.get("meta", {})):
                holder.pop("program_type", None)
                holder.pop("program_id", None)
        (old / name).write_text("".join(json.dumps(r) + "\n" for r in recs))
    with contextlib.chdir(base):
        res = stp("split", old, "-o", tmp_path / "out", "--seed", seed, "-q")
    assert res.exit_code == 0, res.output
    assert (tmp_path / "out" / "test.jsonl").read_bytes() == (out / "test.jsonl").read_bytes()


# ---- bad input ------------------------------------------------------------------------------


def test_bad_inputs_exit_2_with_a_message(base, split, tmp_path):
    ds = base / "ds"
    empty = tmp_path / "empty"
    empty.mkdir()
    for f in ("run.json", "dictionary.jsonl", "chat_single.jsonl", "chat_multi.jsonl"):
        (empty / f).write_text("{}\n" if f == "run.json" else "")
    full = tmp_path / "full"
    full.mkdir()
    (full / "x").write_text("x")
    cases = [
        ((tmp_path / "nope", "--seed", 0), "no such directory"),
        ((EXAMPLES / "matmul.leir", "--seed", 0), "not a directory"),
        ((EXAMPLES, "--seed", 0), "not an stp dataset output directory"),
        ((empty, "--seed", 0), "empty dataset"),
        ((base / "one", "--seed", 0), "one program type"),
        ((ds, "--seed", 0, "--test-fraction", 0), "--test-fraction"),
        ((ds, "--seed", 0, "--test-fraction", 1), "--test-fraction"),
        ((ds, "--seed", 0, "--test-fraction", -0.5), "--test-fraction"),
        ((ds, "--seed", 0, "--test-fraction", 1.5), "--test-fraction"),
    ]
    for args, msg in cases:
        out = tmp_path / "out"
        res = stp("split", args[0], "-o", out, *args[1:])
        assert res.exit_code == 2, (args, res.output)
        assert "error:" in res.output and msg in res.output and "Traceback" not in res.output, res.output
        assert not out.exists()
    res = stp("split", ds, "-o", full, "--seed", 0)
    assert res.exit_code == 2 and "not an empty directory" in res.output and "Traceback" not in res.output
    assert sorted(p.name for p in full.iterdir()) == ["x"]
    # an existing empty directory is fine
    (tmp_path / "fresh").mkdir()
    assert stp("split", base / "one", "-o", tmp_path / "fresh", "--seed", 0).exit_code == 2  # one type
    assert stp("split", ds, "-o", tmp_path / "fresh", "--seed", 0, "-q").exit_code == 0
