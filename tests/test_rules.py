"""Rule files: the shipped rules, their own tests (exact LEIR + numeric verification), and
schema / semantic errors that name the file and the field."""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

import pytest
import yaml

from steptp.leir import parse_leir
from steptp.rules import RuleError, load_rule, load_rule_text, load_rules
from steptp.rules.loader import default_rules_dir, difficulty_level, difficulty_score, display_path
from steptp.rules.schema import PRECONDITIONS
from steptp.rules.selftest import run_rule_test, run_selftests

RULES = load_rules()
BY_ID = {r.id: r for r in RULES}
CASES = [pytest.param(r, t, id=f"{r.id}-{t.index}") for r in RULES for t in r.tests]
POSITIVE = [pytest.param(r, t, id=f"{r.id}-{t.index}") for r in RULES for t in r.tests if not t.no_match]

#: The paper's App. A.3 category and level of each shipped strategy.
PAPER = {
    "logsimp": ("math", "easy"),
    "expand_log": ("math", "easy"),
    "loop_split": ("operator", "difficult"),
    "loop_reorder": ("operator", "medium"),
    "operator_fusion": ("graph", "medium"),
    "set_storage_scope": ("memory", "difficult"),
    "loop_tiling": ("operator", "difficult"),
    "loop_fusion": ("operator", "difficult"),
    "loop_unrolling": ("operator", "medium"),
    "loop_parallelization": ("operator", "medium"),
    "loop_vectorization": ("operator", "medium"),
    "loop_binding": ("operator", "medium"),
    "reduction_factorization": ("operator", "difficult"),
    "normal_loop_max_to_prefix_max": ("math", "difficult"),
    "normal_loop_summation_on_exp_to_prefix_summation_on_exp": ("math", "difficult"),
    "online_softmax": ("math", "difficult"),
    "flashattention_wo_tiling": ("math", "difficult"),
    "normal_matmul_to_prefix_matmul_based_on_online_softmax": ("math", "difficult"),
    "partially_equivalent_then_correct": ("math", "difficult"),
    "factorization": ("math", "easy"),
    "expand_factorization": ("math", "easy"),
    "cancellation": ("math", "easy"),
    "expand_cancellation": ("math", "easy"),
    "apart": ("math", "easy"),
    "together": ("math", "easy"),
    "powsimp": ("math", "easy"),
    "expand_powsimp": ("math", "easy"),
    "collect": ("math", "easy"),
    "expand_collect": ("math", "easy"),
    "exponential_split": ("math", "medium"),
    "multiplicative_split": ("math", "medium"),
    "additive_split": ("math", "medium"),
}

#: The 13 strategies of the math issue (sympy normal forms and the three splits).
MATH13 = ["factorization", "expand_factorization", "cancellation", "expand_cancellation", "apart", "together",
          "powsimp", "expand_powsimp", "collect", "expand_collect", "exponential_split", "multiplicative_split",
          "additive_split"]


def test_shipped_rules_match_the_paper_levels():
    assert set(PAPER) <= set(BY_ID)
    for rid, (cat, level) in PAPER.items():
        r = BY_ID[rid]
        assert (r.category, r.level) == (cat, level), rid
        assert r.difficulty["K"] == len(r.preconditions)
        assert set(r.preconditions) <= set(PRECONDITIONS)
        assert r.tests and any(t.no_match for t in r.tests) and any(not t.no_match for t in r.tests)


def test_inverse_pairs_and_names_mean_what_they_say():
    assert BY_ID["logsimp"].inverse == "expand_log" and BY_ID["expand_log"].inverse == "logsimp"
    assert BY_ID["logsimp"].raw["rewrite"] == "log(?a*?b)"          # simplification combines
    assert BY_ID["expand_log"].raw["rewrite"] == "log(?a)+log(?b)"  # expansion splits


def test_difficulty_formula():
    assert difficulty_score(1, 1, 0) == pytest.approx(0.1)
    assert difficulty_score(1, 3, 2) == pytest.approx(3.1)
    assert difficulty_level(0.999) == "easy" and difficulty_level(1.0) == "medium"
    assert difficulty_level(2.4999) == "medium" and difficulty_level(2.5) == "difficult"


@pytest.mark.parametrize("rule,test", CASES)
def test_rule_own_tests_exact_leir(rule, test):
    out = run_rule_test(rule, test, verify=False)
    assert out.ok, out.message


@pytest.mark.parametrize("rule,test", POSITIVE)
def test_rule_own_tests_verify_numerically(rule, test):
    from steptp.engine import apply_rule
    from steptp.verify import verify_pair

    before = parse_leir(test.before)
    step = apply_rule(rule, before, seed=test.seed, site=test.site, params=test.params)
    assert step.after.signature == before.signature
    res = verify_pair(before, step.after, trials=3, seed=0)
    assert res.diff and res.build and res.exec and res.equal, res.reason


def test_selftest_runner_reports_all(capsys):
    lines = []
    assert run_selftests([str(default_rules_dir() / "logsimp.yaml")], verify=False, echo=lines.append)
    assert lines[-1].endswith("all passed") and len(lines) == len(BY_ID["logsimp"].tests) + 1


def test_load_rules_default_directory_is_the_package_data():
    d = default_rules_dir()
    assert (d / "loop_split.yaml").exists()
    assert display_path(d / "loop_split.yaml") == "rules/loop_split.yaml"
    assert sorted(r.id for r in RULES) == sorted(p.stem for p in d.glob("*.yaml"))


# ---------------------------------------------------------------- errors name file and field

def _base() -> dict:
    return yaml.safe_load((default_rules_dir() / "loop_split.yaml").read_text())


def _write(tmp_path: Path, data: dict, name: str = "loop_split.yaml") -> Path:
    p = tmp_path / name
    p.write_text(yaml.safe_dump(data, sort_keys=False))
    return p


def _error(tmp_path, mutate, name="loop_split.yaml") -> RuleError:
    data = _base()
    mutate(data)
    p = _write(tmp_path, data, name)
    with pytest.raises(RuleError) as ei:
        load_rule(p)
    return ei.value


@pytest.mark.parametrize("mutate,field,fragment", [
    (lambda d: d["params"]["f"].__setitem__("divisors_of", 3.5), "params.f.divisors_of", "is not of type"),
    (lambda d: d.__setitem__("category", "bogus"), "category", "is not one of"),
    (lambda d: d.pop("difficulty"), "(top level)", "'difficulty' is a required property"),
    (lambda d: d["difficulty"].__setitem__("K", 4), "difficulty.K", "K counts the preconditions"),
    (lambda d: d["difficulty"].__setitem__("level", "easy"), "difficulty.level", "gives 'difficult'"),
    (lambda d: d["preconditions"].append("vibes"), "preconditions[1]", "is not one of"),
    (lambda d: d.__setitem__("where", ["frobnicated(?n)"]), "where[0]", "unknown relation 'frobnicated'"),
    (lambda d: d.__setitem__("where", ["not factorizable(?zz)"]), "where", "negated clause"),
    (lambda d: d.__setitem__("where", ["same_loops(?n, ?n)"]), "where[0]", "?n is a Int but this argument needs a Nest"),
    (lambda d: d.__setitem__("where", ["factorizable(?n)", "scope_of(?i, 3)"]), "where", "egglog rejects"),
    (lambda d: d["match"].__setitem__("loop", "?k^{?n}_{?i=1}"), "match.loop", "lower bound must be 0"),
    (lambda d: d["rewrite"][1]["substitute_index"].__setitem__("?i", "?io*?f+?zz"),
     "rewrite[1].substitute_index.mapping", "unbound metavariable(s) ['?zz']"),
    (lambda d: d["rewrite"].append({"frobnicate": "?x"}), "rewrite[2].frobnicate", "unknown primitive"),
    (lambda d: d.__setitem__("cot", "no_such_template.j2"), "cot", "no_such_template.j2"),
    (lambda d: d["tests"][0].__setitem__("before", "% program: x\nB^{4}_{tx=0}[C^{f32,g}_{tx}=;];"),
     "tests[0].before", "unexpected"),
    (lambda d: d["tests"][0].__setitem__("params", {"g": 2}), "tests[0].params.g", "no parameter 'g'"),
    (lambda d: d["tests"][0].pop("after"), "tests[0]", "after"),
    (lambda d: d["params"].__setitem__("g", {"choice": [1], "divisors_of": 4}), "params.g", "exactly one domain"),
    (lambda d: d.__setitem__("extra_key", 1), "(top level)", "unknown key(s)"),
    (lambda d: d["fresh"].__setitem__("f", "index"), "fresh.f", "already bound"),
])
def test_errors_name_file_and_field(tmp_path, mutate, field, fragment):
    e = _error(tmp_path, mutate)
    src = str(tmp_path / "loop_split.yaml")
    msg = str(e)
    assert re.match(rf"{re.escape(src)}:\d+:\d+: {re.escape(field)}: ", msg), msg  # FILE:LINE:COL: field
    assert fragment in msg, msg
    assert e.source == src


def test_id_must_match_file_name(tmp_path):
    e = _error(tmp_path, lambda d: None, name="other_name.yaml")
    assert str(e).startswith(f"{tmp_path / 'other_name.yaml'}:1:5: id: ")  # at the id's value


def test_invalid_yaml_names_the_position(tmp_path):
    p = tmp_path / "broken.yaml"
    p.write_text("id: broken\nname: [unclosed\n")
    with pytest.raises(RuleError) as ei:
        load_rule(p)
    assert str(ei.value).startswith(f"{p}:3:1: (top level): invalid YAML"), str(ei.value)


def test_rules_that_passed_their_checks_are_remembered_and_a_broken_edit_is_still_refused(tmp_path, monkeypatch):
    from steptp.rules import loader

    cache = tmp_path / "cache"
    monkeypatch.setenv("STP_RULE_CHECK_CACHE", str(cache))
    monkeypatch.setattr(loader, "_CACHE", {})  # the in-process cache by (path, mtime, size)
    rules_dir = tmp_path / "rules"
    rules_dir.mkdir()
    data = _base()
    p = _write(rules_dir, data)
    first = load_rule(p)
    markers = sorted(cache.iterdir())
    assert len(markers) == 1 and markers[0].stat().st_size == 0
    loader._CACHE.clear()
    again = load_rule(p)
    assert again.key == first.key and sorted(cache.iterdir()) == markers  # remembered, nothing new
    # the same file edited into a broken rule: checked again and refused, every time, never remembered
    data["rewrite"][1]["substitute_index"]["?i"] = "?io*?f+?zz"
    _write(rules_dir, data)
    for _ in range(2):
        loader._CACHE.clear()
        with pytest.raises(RuleError, match=r"unbound metavariable\(s\) \['\?zz'\]"):
            load_rule(p)
    assert sorted(cache.iterdir()) == markers
    monkeypatch.setenv("STP_RULE_CHECK_CACHE", "off")
    off = tmp_path / "rules2"
    off.mkdir()
    load_rule(_write(off, _base()))
    assert sorted(cache.iterdir()) == markers and loader.rule_check_cache() is None


def test_all_schema_problems_are_listed(tmp_path):
    def mutate(d):
        d["category"] = "bogus"
        d["params"]["f"]["divisors_of"] = 3.5
    e = _error(tmp_path, mutate)
    fields = [f for f, _ in e.problems]
    assert fields == sorted(fields) and "category" in fields and "params.f.divisors_of" in fields


def test_inline_rule_text_with_inline_cot():
    text = textwrap.dedent('''
        id: double_neg
        name: double negation
        category: math
        description: A double negation cancels.
        preconditions: [pattern_match]
        difficulty: {K: 1, P: 1, S: 0}
        match: {expr: "-(-?a)"}
        rewrite: "?a"
        cot: "{{ description }} '{{ site_before }}' becomes '{{ site_after }}'."
        tests:
          - before: |
              % program: neg
              % input A: f32[4]
              % output C: f32[4]
              B^{4}_{tx=0}[C^{f32,g}_{tx}=-(-A^{f32,g}_{tx})+1.0;];
            after: "B^{4}_{tx=0}[C^{f32,g}_{tx}=A^{f32,g}_{tx}+1.0;];"
            cot_contains: ["'--A^{f32,g}_{tx}' becomes 'A^{f32,g}_{tx}'"]
    ''')
    rule = load_rule_text(text, "<inline>")
    assert rule.level == "easy"
    assert run_rule_test(rule, rule.tests[0]).ok


@pytest.mark.parametrize("rid", MATH13)
def test_math_rules_keep_subscripts_apart_and_have_enough_tests(rid):
    """At least two positive tests and a no_match test, and one positive test where the same
    tensor is read at two different subscripts (and both accesses survive the rewrite)."""
    import re

    r = BY_ID[rid]
    pos = [t for t in r.tests if not t.no_match]
    assert len(pos) >= 2 and any(t.no_match for t in r.tests)

    def accesses(text):
        return set(re.findall(r"([A-Z][a-z]?)\^\{[^}]*\}_\{([^}]*)\}", text))

    def two_subscripts(text):
        acc = accesses(text)
        return {n for n, _ in acc if len({s for m, s in acc if m == n}) >= 2}

    hits = [t for t in pos if two_subscripts(t.before.split("\n", 4)[-1]) & two_subscripts(t.after)]
    assert hits, f"{rid}: no test reads one tensor at two subscripts"


@pytest.mark.parametrize("rid", MATH13)
def test_math_rule_tests_are_proved_symbolically(rid):
    from steptp.engine import apply_rule
    from steptp.engine.algebra import symbolic_check_programs

    for t in BY_ID[rid].tests:
        if t.no_match:
            continue
        before = parse_leir(t.before)
        step = apply_rule(BY_ID[rid], before, seed=t.seed, site=t.site, params=t.params)
        assert symbolic_check_programs(before.program, step.after.program) == "proved", (rid, t.name)


def test_a_disproved_math_rewrite_fails_its_self_test():
    bad = textwrap.dedent("""\
        id: bad_math
        name: bad math
        category: math
        description: A wrong identity, exp(a)*exp(b) = exp(a*b), for testing.
        preconditions: [pattern_match]
        difficulty: {K: 1, P: 1, S: 0}
        match:
          expr: "exp(?a)*exp(?b)"
        rewrite: "exp(?a*?b)"
        cot: "{{ description }}"
        tests:
          - before: |
              % program: p
              % input A: f32[4]
              % input W: f32[4]
              % output C: f32[4]
              B^{4}_{tx=0}[C^{f32,g}_{tx}=exp(A^{f32,g}_{tx})*exp(W^{f32,g}_{tx});];
            after: "B^{4}_{tx=0}[C^{f32,g}_{tx}=exp(A^{f32,g}_{tx}*W^{f32,g}_{tx});];"
        """)
    r = load_rule_text(bad, "<bad_math>")
    out = run_rule_test(r, r.tests[0], verify=False)
    assert not out.ok and out.symbolic == "disproved" and "disproves" in out.message


# ---------------------------------------------------------------------------
# stp rules test --update: rewrite the after: texts in place
# ---------------------------------------------------------------------------

_SPLIT_AFTER = ("      B^{8}_{tx=0}L^{4}_{d=0}L^{4}_{f=0}L^{12}_{c=0}[C^{f32,g}_{tx,d*4+f}=C^{f32,g}_{tx,d*4+f}+"
                "A^{f32,g}_{tx,c}*W^{f32,g}_{c,d*4+f};];\n")


@pytest.mark.parametrize("corrupt", [
    # another loop variable: still parses, but is not what the engine produces
    lambda line: line.replace("_{f=0}", "_{e=0}").replace("d*4+f", "d*4+e"),
    # the same program in a non-canonical form (redundant parentheses)
    lambda line: line.replace("+A^{f32,g}_{tx,c}*", "+(A^{f32,g}_{tx,c})*"),
], ids=["renamed-variable", "non-canonical"])
def test_selftest_update_restores_a_corrupted_after_text(tmp_path, corrupt):
    orig = (default_rules_dir() / "loop_split.yaml").read_bytes()
    text = orig.decode("utf-8")
    assert text.count(_SPLIT_AFTER) == 1
    p = tmp_path / "loop_split.yaml"
    p.write_bytes(text.replace(_SPLIT_AFTER, corrupt(_SPLIT_AFTER)).encode("utf-8"))
    assert p.read_bytes() != orig
    lines = []
    assert run_selftests([str(p)], echo=lines.append, update=True)
    assert p.read_bytes() == orig
    assert "after: rewritten" in lines[0] and sum("after: rewritten" in x for x in lines) == 1
    assert lines[-1] == "1 after: text(s) rewritten in 1 file(s)"
    assert not (tmp_path / "loop_split.yaml.tmp").exists()


def test_selftest_update_leaves_an_up_to_date_file_alone(tmp_path):
    orig = (default_rules_dir() / "expression_reorder.yaml").read_bytes()
    p = tmp_path / "expression_reorder.yaml"
    p.write_bytes(orig)
    mtime = p.stat().st_mtime_ns
    lines = []
    assert run_selftests([str(p)], echo=lines.append, update=True)
    assert p.read_bytes() == orig and p.stat().st_mtime_ns == mtime
    assert lines[-1] == "no after: text to rewrite"


def test_selftest_update_refuses_a_wrong_rewrite(tmp_path):
    # the rule now rewrites log(a)+log(b) to log(a+b): its output must never become the expected text
    orig = (default_rules_dir() / "logsimp.yaml").read_text(encoding="utf-8")
    assert orig.count('rewrite: "log(?a*?b)"') == 1
    p = tmp_path / "logsimp.yaml"
    p.write_text(orig.replace('rewrite: "log(?a*?b)"', 'rewrite: "log(?a+?b)"'), encoding="utf-8")
    before = p.read_bytes()
    with pytest.raises(RuleError, match=r"logsimp\.yaml.*tests\[0\]\.after.*no file was rewritten"):
        run_selftests([str(p)], echo=lambda s: None, update=True)
    assert p.read_bytes() == before


def test_selftest_update_refuses_when_the_numeric_check_fails(tmp_path, monkeypatch):
    import types

    import steptp.verify

    # the after: texts are stale (a variable renamed), and the engine's output "fails" verification
    text = (default_rules_dir() / "expression_reorder.yaml").read_text(encoding="utf-8")
    p = tmp_path / "expression_reorder.yaml"
    stale = "    after: >-\n      B^{4}_{tx=0}L^{8}_{a=0}"
    p.write_text(text.replace(stale, stale.replace("{a=0}", "{b=0}"))
                 .replace("exp(-A^{f32,g}_{tx,a});];B^{4}", "exp(-A^{f32,g}_{tx,b});];B^{4}"), encoding="utf-8")
    before = p.read_bytes()
    assert before.decode() != text and load_rule(p).tests[0].after != BY_ID["expression_reorder"].tests[0].after
    monkeypatch.setattr(steptp.verify, "verify_pair",
                        lambda *a, **k: types.SimpleNamespace(equal=False, reason="2 elements differ"))
    with pytest.raises(RuleError, match=r"expression_reorder\.yaml: tests\[0\]\.after: .*2 elements differ"):
        run_selftests([str(p)], echo=lambda s: None, update=True)
    assert p.read_bytes() == before
    with pytest.raises(ValueError, match="verification"):
        run_selftests([str(p)], verify=False, update=True)


def test_rewrite_after_texts_keeps_every_other_byte():
    from steptp.rules.selftest import rewrite_after_texts

    text = ("id: x  # a comment\ntests:\n  - name: 'one'\n    after: >-   # keep me\n      OLD;\n\n"
            "    cot_contains: [\"a\"]\n  - {name: two, after: 'OLD2'}\n  - name: three\n    after: \"OLD3\"\n"
            "    seed: 3\n")
    out = rewrite_after_texts(text, {0: "NEW;", 1: "it's", 2: "N3"})
    assert out == text.replace("OLD;", "NEW;").replace("'OLD2'", "'it''s'").replace('"OLD3"', '"N3"')
    assert yaml.safe_load(out)["tests"][1]["after"] == "it's"
    # a multi-line value cannot stay a folded scalar: it is written double-quoted
    out = rewrite_after_texts(text, {0: "A;\nB;"})
    assert yaml.safe_load(out)["tests"][0]["after"] == "A;\nB;" and '    after: "A;\\nB;"\n\n    cot' in out
    with pytest.raises(RuleError, match=r"tests\[5\]\.after"):
        rewrite_after_texts(text, {5: "X"})
