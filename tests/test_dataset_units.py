"""Dataset building blocks: difficulty, filtering, chat records, answer parsing, crash-safe files."""

import json

import pytest

from steptp.dataset.chat import AnswerError, multi_messages, parse_answer, single_messages
from steptp.dataset.difficulty import (
    FilterPolicy, difficulty_level, difficulty_score, filter_multi_items, keep_single,
)
from steptp.dataset.sources import discover
from steptp.io import JsonlAppender, read_jsonl, write_jsonl_atomic


def _entry(i, sid="loop_split", level="difficult", leir="B^{2}_{tx=0}[C^{f32,g}_{tx}=A^{f32,g}_{tx};];"):
    return {
        "id": f"id{i}", "program": "Copy",
        "signature": {"name": "Copy", "tensors": [
            {"name": "A", "role": "input", "dtype": "f32", "shape": [2]},
            {"name": "C", "role": "output", "dtype": "f16", "shape": [2]}]},
        "strategy": {"id": sid, "name": sid.replace("_", " "), "category": "operator"},
        "difficulty": {"K": 1, "P": 1, "S": 0, "score": 0.1, "level": level},
        "original": {"leir": leir}, "transformed": {"leir": f"T{i}"}, "cot": f"cot {i}",
    }


@pytest.mark.parametrize("K,P,S,score,level", [
    (1, 1, 0, 0.1, "easy"), (2, 3, 0, 1.2, "medium"), (1, 3, 1, 2.1, "medium"), (2, 2, 2, 2.7, "difficult"),
    (0, 1, 1, 1.0, "medium"), (5, 4, 1, 3.0, "difficult"),
])
def test_difficulty_score_and_level(K, P, S, score, level):
    assert difficulty_score(K, P, S) == pytest.approx(score)
    assert difficulty_level(difficulty_score(K, P, S)) == level


def test_difficulty_rejects_bad_components():
    with pytest.raises(ValueError, match="P >= 1"):
        difficulty_score(1, 0, 0)


def test_single_filter_rates_follow_policy():
    simplify = [_entry(i, "logsimp", "easy") for i in range(2000)]
    expand = [_entry(i, "expand_log", "easy") for i in range(2000)]
    hard = [_entry(i, "loop_split", "difficult") for i in range(50)]
    kept = keep_single(simplify + expand + hard, FilterPolicy(seed=3))
    n_simplify = sum(e["strategy"]["id"] == "logsimp" for e in kept)
    n_expand = sum(e["strategy"]["id"] == "expand_log" for e in kept)
    assert 0.16 * 2000 < n_simplify < 0.24 * 2000
    assert 0.02 * 2000 < n_expand < 0.06 * 2000
    assert sum(e["strategy"]["id"] == "loop_split" for e in kept) == 50
    assert kept == keep_single(simplify + expand + hard, FilterPolicy(seed=3))  # seeded


def test_paper_profile_gives_the_papers_composition():
    """--profile paper: final items ~87/12/0.5 % difficult/medium/easy and multi-answer
    records outnumbering single-answer ones about 2.3 : 1, from a dictionary that is half
    medium (as translated corpus programs give), seeded."""
    from steptp.dataset.pipeline import filtered_sets

    entries, i = [], 0
    for prog in range(120):
        leir = f"B^{{2}}_{{tx=0}}[C^{{f32,g}}_{{tx}}=A^{{f32,g}}_{{tx}}*{prog}.0;];"
        for sid, level, n in (("loop_split", "difficult", 5), ("loop_reorder", "medium", 6), ("logsimp", "easy", 2)):
            for _ in range(n):
                entries.append(_entry(i, sid, level, leir))
                i += 1
    policy = FilterPolicy(seed=1, profile="paper")
    singles, multis = filtered_sets(entries, policy)
    items = singles + [e for g in multis for e in g]
    share = {lv: sum(e["difficulty"]["level"] == lv for e in items) / len(items)
             for lv in ("difficult", "medium", "easy")}
    assert share["difficult"] >= 0.82 and 0.08 <= share["medium"] <= 0.16 and share["easy"] <= 0.03, share
    assert 1.8 <= len(multis) / len(singles) <= 2.8
    assert all(len({e["original"]["leir"] for e in g}) == 1 and len(g) >= 2 for g in multis)
    assert all(e["difficulty"]["level"] != "easy" for g in multis for e in g)
    assert len({tuple(sorted(e["id"] for e in g)) for g in multis}) == len(multis)  # distinct subsets
    assert (singles, multis) == filtered_sets(list(reversed(entries)), policy)  # seeded, order-free
    default = filtered_sets(entries, FilterPolicy(seed=1))
    assert len(default[1]) == 120 and len(default[0]) > len(default[1])  # one multi record per program
    with pytest.raises(ValueError, match="unknown dataset profile"):
        FilterPolicy(profile="other")


def test_multi_filter_drops_easy_and_caps_medium():
    counts = {}
    policy = FilterPolicy(medium_cap_multi=1)
    items = [_entry(0, "logsimp", "easy"), _entry(1, "loop_reorder", "medium"), _entry(2, "loop_split")]
    assert [e["id"] for e in filter_multi_items(items, counts, policy)] == ["id1", "id2"]
    # the medium cap (1) is reached: the next entry keeps only the difficult item -> too few
    assert filter_multi_items(items, counts, policy) == []


def test_single_and_multi_messages_are_ms_swift_records():
    e0, e1 = _entry(0), _entry(1, "set_storage_scope")
    rec = single_messages(e0)
    assert [m["role"] for m in rec["messages"]] == ["user", "assistant"]
    user, label = rec["messages"][0]["content"], rec["messages"][1]["content"]
    assert e0["original"]["leir"] in user and "torch.float16" in user and "shape [2]" in user
    assert '"applied_strategy"' in user
    assert label == '<think>cot 0</think><answer>{"transformed_IR": "T0", "applied_strategy": "loop split"}</answer>'
    assert parse_answer(label, check_ir=False) == [{"transformed_IR": "T0", "applied_strategy": "loop split"}]

    multi = multi_messages([e0, e1])
    label = multi["messages"][1]["content"]
    assert "2 transformed IRs" in label and "0. cot 0" in label and "1. cot 1" in label
    assert "Give 2 different" in multi["messages"][0]["content"]
    assert [a["transformed_IR"] for a in parse_answer(label, check_ir=False)] == ["T0", "T1"]
    with pytest.raises(ValueError, match="share the original"):
        multi_messages([e0, _entry(2, leir="other")])


@pytest.mark.parametrize("text,reason", [
    ("I think the answer is 42", "no <answer> block"),
    ("<answer>{\"transformed_IR\": 1", "not closed"),
    ("<answer>{transformed_IR: x}</answer>", "not valid JSON"),
    ("<answer>[]</answer>", "empty"),
    ("<answer>[\"x\"]</answer>", "item 0 is a str"),
    ("<answer>{\"transformed_IR\": \"B\"}</answer>", "no string 'applied_strategy'"),
])
def test_parse_answer_rejects_garbage_with_a_reason(text, reason):
    with pytest.raises(AnswerError, match=reason):
        parse_answer(text)


def test_parse_answer_accepts_fences_and_backslash_close():
    ir = "B^{4}_{tx=0}[C^{f32,g}_{tx}=A^{f32,g}_{tx};];"
    text = '<think>x</think><answer>```json\n{"transformed_IR": "%s", "applied_strategy": "s"}\n```<\\answer>' % ir
    assert parse_answer(text) == [{"transformed_IR": ir, "applied_strategy": "s"}]


def test_appender_repairs_a_torn_line_and_keeps_earlier_records(tmp_path):
    p = tmp_path / "d.jsonl"
    with JsonlAppender(p) as w:
        w.write_many([{"a": 1}, {"a": 2}])
    with open(p, "a") as f:
        f.write('{"a": 3, "torn')  # a crash mid-write
    assert [r["a"] for r in read_jsonl(p)] == [1, 2]
    with JsonlAppender(p) as w:
        assert w.repaired_bytes == len('{"a": 3, "torn')
        w.write_many([{"a": 4}])
    assert [r["a"] for r in read_jsonl(p)] == [1, 2, 4]


def test_read_jsonl_names_file_and_line_of_a_corrupt_record(tmp_path):
    p = tmp_path / "d.jsonl"
    p.write_text('{"a": 1}\nnot json\n{"a": 2}\n')
    with pytest.raises(ValueError, match=r"d.jsonl:2: invalid JSON"):
        list(read_jsonl(p))


def test_atomic_write_replaces_whole_file(tmp_path):
    p = tmp_path / "c.jsonl"
    write_jsonl_atomic(p, [{"x": 1}])
    write_jsonl_atomic(p, [{"x": 2}, {"x": 3}])
    assert [json.loads(l)["x"] for l in p.read_text().splitlines()] == [2, 3]
    assert not (tmp_path / "c.jsonl.tmp").exists()
    from steptp.io import write_json_atomic, write_text_atomic

    t = tmp_path / "s.txt"
    write_text_atomic(t, "old\n")
    write_text_atomic(t, "n\u00e9w\r\n")  # UTF-8, no newline translation
    assert t.read_bytes() == "n\u00e9w\r\n".encode("utf-8") and not (tmp_path / "s.txt.tmp").exists()
    write_json_atomic(t, {"a": "\u00e9"})
    assert t.read_text(encoding="utf-8") == '{\n  "a": "\u00e9"\n}\n'


def test_discover_prefers_python_over_its_leir_and_skips_non_models(tmp_path):
    (tmp_path / "mm.py").write_text("class Model: pass\n")
    (tmp_path / "mm.leir").write_text("% program: mm\n")
    (tmp_path / "only.leir").write_text("% program: only\n")
    (tmp_path / "helper.py").write_text("x = 1\n")
    found = discover([tmp_path])
    assert [(s.path.name, s.kind) for s in found] == [("mm.py", "torch"), ("only.leir", "leir")]
    assert len({s.key for s in found}) == 2
    with pytest.raises(FileNotFoundError):
        discover([tmp_path / "missing"])
    with pytest.raises(ValueError, match="expected a .py model file"):
        (tmp_path / "x.txt").write_text("")
        discover([tmp_path / "x.txt"])


def test_expansion_strategies_are_the_rules_marked_so(tmp_path, monkeypatch):
    """§3.4's lower keep rate applies to the rules whose file says ``expansion: true``: the
    shipped ``expand_`` rules and ``apart``, and a user rule that says so; not to the
    simplifications they undo."""
    from pathlib import Path

    from steptp.dataset.difficulty import is_expansion
    from steptp.rules import load_rules

    ids = {r.id for r in load_rules()}
    marked = {i for i in ids if is_expansion(i)}
    assert marked == {i for i in ids if i.startswith("expand_")} | {"apart"}
    assert not is_expansion("together") and not is_expansion("logsimp") and not is_expansion("no_such_rule")
    src = Path(__file__).resolve().parents[1] / "rules" / "together.yaml"
    text = src.read_text().replace("id: together", "id: together_again").replace("inverse: apart\n", "expansion: true\n")
    assert "expansion: true" in text
    (tmp_path / "together_again.yaml").write_text(text)
    monkeypatch.setenv("STP_RULES_PATH", str(tmp_path))
    assert is_expansion("together_again") and not is_expansion("together")
