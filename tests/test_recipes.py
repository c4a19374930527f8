"""Multi-step recipes as data (issue 53): ``rules/recipes/*.yaml`` loaded and checked
(:mod:`steptp.engine.recipes`), each recipe's own tests (the proposal it alone makes on its
test programs, numerically verified), errors that name file, line and column, a user recipe
from a ``--rules`` folder, no strategy names or SM counts in the driver, and round 0's
multi-step proposals on ``stp corpus --count 8 --seed 5`` the same as at the parent commit.

``python tests/test_recipes.py --update`` rewrites ``tests/data/recipes_round0.json`` with what
the engine proposes now (only after a deliberate change of the recipes)."""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from steptp.engine.macros import macro_proposals
from steptp.engine.recipes import (KINDS, RecipeError, load_recipe_text, load_recipes, recipe_dirs,
                                   recipes_in_effect, sequences)
from steptp.leir import parse_leir
from steptp.rules import load_rules
from steptp.rules.recipe_tests import run_recipe_test

ROOT = Path(__file__).resolve().parents[1]
STP = Path(sys.executable).parent / "stp"
GOLDEN = ROOT / "tests" / "data" / "recipes_round0.json"
RULES = {r.id: r for r in load_rules()}
RECIPES = recipes_in_effect()
CASES = [(r, i) for r in RECIPES for i in range(len(r.spec.get("tests", [])))]


def test_every_shipped_recipe_loads_names_loaded_rules_and_has_tests():
    ids = {r.id for r in RECIPES}
    assert len(RECIPES) == len(list((ROOT / "rules" / "recipes").glob("*.yaml"))) == 20
    assert {r.kind for r in RECIPES} == set(KINDS)
    for r in RECIPES:
        assert set(r.rules) <= set(RULES), (r.id, set(r.rules) - set(RULES))
        assert r.spec.get("tests"), f"{r.id} has no tests"
        assert r.description and r.spec.get("source"), r.id
    assert {"gemm_tiling", "conv_window_tiling", "conv_tiling", "tensor_core_tiling"} <= ids


@pytest.mark.parametrize("recipe,index", CASES, ids=[f"{r.id}[{i}]" for r, i in CASES])
def test_recipe_own_tests(recipe, index):
    """Each test of each recipe: its rules, its result (exact LEIR or snippets) or its
    refusal, and the result numerically equal to the test's program."""
    out = run_recipe_test(recipe, index, RULES, verify=True)
    assert out.ok, f"{out.where}: {out.message}"
    t = recipe.spec["tests"][index]
    if "refused" not in t and t.get("verify", True):
        assert out.verified is True


def test_a_recipe_test_that_expects_other_rules_fails_and_says_why():
    r = next(x for x in RECIPES if x.id == "gemm_tail")
    text = Path(r.source_path).read_text().replace('rules: ["thread_block_rebinding", "loop_binding"]',
                                                   'rules: ["loop_binding", "thread_block_rebinding"]')
    broken = load_recipe_text(text, r.source_path)
    out = run_recipe_test(broken, 0, RULES, verify=False)
    assert not out.ok and "rules differ" in out.message


def _gemm(m, n, k, dt="f32"):
    return parse_leir(f"% program: mm\n% input A: {dt}[{m},{k}]\n% input C: {dt}[{k},{n}]\n% output D: f32[{m},{n}]\n"
                      f"B^{{{m}}}_{{tx=0}}L^{{{n}}}_{{a=0}}L^{{{k}}}_{{c=0}}[D^{{f32,g}}_{{tx,a}}=D^{{f32,g}}_{{tx,a}}"
                      f"+A^{{{dt},g}}_{{tx,c}}*C^{{{dt},g}}_{{c,a}};];\n")


def test_gemm_tries_come_best_first_and_use_the_device_table():
    """The GEMM recipe's tries: enough blocks for every multiprocessor of the device table
    first (stp roofline's sm_count), then the largest tile; a tile that leaves a tail adds a
    loop_partition step."""
    from steptp.engine.domains import EvalContext, eval_value
    from steptp.roofline import GPUS

    assert eval_value("sm_count()", EvalContext(None, {})) == GPUS["h100"].sms == 132
    gemm = next(r for r in RECIPES if r.id == "gemm_tiling")
    seqs, why, claimed = sequences(gemm, _gemm(1024, 1024, 1024), 0)
    assert claimed and why is None and len(seqs) == 6
    splits = [[p["f"] for rule, _s, p in seq if rule == "loop_split"] for seq in seqs]
    bm, bn = splits[0][:2]
    assert (1024 // bm) * (1024 // bn) >= 132 and bm * bn == 4096   # the largest tile with a block per SM
    assert [128, 128] not in [s[:2] for s in splits]                 # 64 blocks: 68 of 132 SMs idle
    seqs, _, _ = sequences(gemm, _gemm(72, 64, 64), 0)
    assert seqs[0][0] == ("loop_partition", {"nest": [0], "loop": 0}, {"f": 32})


def test_bad_recipe_files_name_file_line_and_column(tmp_path):
    d = tmp_path / "r" / "recipes"
    d.mkdir(parents=True)
    cases = {
        "typo_field.yaml": ("id: typo_field\nkind: sequence\nstesp: [loop_binding]\n", r":3:1: stesp: unknown field"),
        "bad_kind.yaml": ("id: bad_kind\nkind: macros\nrule: loop_binding\n", r":2:7: kind: kind must be one of"),
        "bad_form.yaml": ("id: bad_form\nkind: tiling\nform: gemmm\nsteps: [{rule: loop_split}]\n",
                          r":3:7: form: unknown form 'gemmm'; did you mean 'gemm'\?"),
        "bad_value.yaml": ("id: bad_value\nkind: tiling\nform: gemm\nsteps:\n  - {rule: loop_split, loop: m, "
                           "params: {f: \"tiled_extnt(?M, 4)\"}}\n", r":5:\d+: steps\[0\]\.params\.f: unknown value "
                           r"function 'tiled_extnt'; did you mean 'tiled_extent'\?"),
        "bad_filter.yaml": ("id: bad_filter\nkind: sequence\nsteps:\n  - {rule: loop_binding, accept: blocks_first}\n",
                            r":4:\d+: steps\[0\]\.accept: unknown site filter"),
    }
    for name, (text, want) in cases.items():
        with pytest.raises(RecipeError) as e:
            load_recipe_text(text, str(d / name))
        assert re.search(want, str(e.value)), str(e.value)
        assert str(e.value).startswith(str(d / name))
    # a rule id that no rule file has: named with a did-you-mean, exit 2
    (tmp_path / "one.yaml").write_text("id: one\nkind: macro\nrule: loop_bindng\n")
    r = subprocess.run([str(STP), "rules", "recipes", str(tmp_path / "one.yaml")], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 2 and "no rule 'loop_bindng' is loaded; did you mean 'loop_binding'?" in r.stderr, r.stderr
    # through the CLI: exit 2, the message, no traceback
    (d / "typo_field.yaml").write_text(cases["typo_field.yaml"][0])
    r = subprocess.run([str(STP), "rules", "recipes", "--rules", str(d.parent)], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 2 and "typo_field.yaml:3:1: stesp: unknown field" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr + r.stdout


def test_a_user_recipe_from_a_rules_folder_is_listed_tested_and_proposed(tmp_path, monkeypatch):
    """A new multi-step proposal is a new YAML file: a user sequence recipe in ``--rules
    DIR/recipes/`` is listed, its own test runs, and the search's proposals include it."""
    d = tmp_path / "mine" / "recipes"
    d.mkdir(parents=True)
    prog = ("% program: scale_shift\n% input A: f32[4,32]\n% output C: f32[4,32]\n"
            "B^{4}_{tx=0}L^{32}_{a=0}[T^{f32,g}_{tx,a}=A^{f32,g}_{tx,a}*2.0;];\n"
            "B^{4}_{tx=0}L^{32}_{a=0}[C^{f32,g}_{tx,a}=T^{f32,g}_{tx,a}+1.0;];\n")
    (d / "fuse_then_unroll.yaml").write_text(
        "id: fuse_then_unroll\nkind: sequence\norder: 9\nsteps: [operator_fusion, loop_unrolling]\n"
        "description: Fuse every pair of nests, then unroll.\nsource: a test\n"
        "tests:\n  - name: two nests\n    before: |\n"
        + "".join(f"      {line}\n" for line in prog.splitlines())
        + "    rules: [operator_fusion, loop_unrolling]\n")
    r = subprocess.run([str(STP), "rules", "recipes", "--rules", str(d.parent)], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0 and "fuse_then_unroll" in r.stdout and "21 recipe(s)" in r.stdout, r.stdout + r.stderr
    r = subprocess.run([str(STP), "rules", "recipes", "--test", str(d / "fuse_then_unroll.yaml")],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and "1 of 1 recipe test(s) passed" in r.stdout, r.stdout + r.stderr
    monkeypatch.setenv("STP_RULES_PATH", str(d.parent))
    assert [p.name for p in recipe_dirs()][-1] == "recipes" and len(recipe_dirs()) == 2
    props = macro_proposals(list(RULES.values()), parse_leir(prog), 0)
    assert ["operator_fusion", "loop_unrolling"] in [[s["rule"] for s in p] for p in props]
    monkeypatch.delenv("STP_RULES_PATH")
    assert ["operator_fusion", "loop_unrolling"] not in [[s["rule"] for s in p]
                                                         for p in macro_proposals(list(RULES.values()),
                                                                                  parse_leir(prog), 0)]


def test_a_tiling_recipe_with_a_wrong_loop_name_costs_only_its_nest_a_reason():
    """A user recipe that names a loop its form does not give (``mm`` for ``m``) does not stop
    the proposals: the nest's report names the recipe, its file and the loop."""
    from steptp.engine.macros import tiling_report

    bad = load_recipe_text("id: typo_tiling\nkind: tiling\nform: gemm\nsteps:\n"
                           "  - {rule: loop_split, loop: mm, params: {f: 16}}\n", "/u/recipes/typo_tiling.yaml")
    rep = tiling_report(RULES, _gemm(64, 64, 64), [bad])
    assert len(rep) == 1 and "recipe typo_tiling (/u/recipes/typo_tiling.yaml)" in rep[0]["reason"]
    assert "no loop named 'mm'" in rep[0]["reason"], rep


def test_the_driver_names_no_strategy_and_no_device_figure():
    """engine/macros.py, recipes.py and forms.py know no rule or recipe by name, and no SM
    count: those are the recipes' and the device table's."""
    names = set(RULES) | {r.id for r in RECIPES}
    for mod in ("macros.py", "recipes.py", "forms.py"):
        text = (ROOT / "engine" / "steptp" / "engine" / mod).read_text()
        code = re.sub(r'"""[\s\S]*?"""|#[^\n]*', "", text)  # docstrings and comments may explain
        found = sorted(n for n in names if re.search(rf"['\"]{n}['\"/]", code))
        assert not found, (mod, found)
        assert not re.search(r"\b(132|108|114)\b", code), mod


def _round0() -> dict:
    """macro_proposals(seed 0) of each program of `stp corpus --count 8 --seed 5`, as the golden
    file records them."""
    import tempfile

    from steptp.frontend.translate import translate_file  # noqa: PLC0415

    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([str(STP), "corpus", "-o", tmp, "--count", "8", "--seed", "5", "-q"], check=True,
                       capture_output=True, timeout=300)
        out = {}
        rules = list(RULES.values())
        for py in sorted(Path(tmp).glob("*.py")):
            mod = parse_leir(translate_file(py).module.text(), py.name)
            out[py.stem] = [[[s["rule"], s["site"], json.dumps(s["params"], sort_keys=True),
                              hashlib.sha256(s["leir"].encode()).hexdigest()[:16]] for s in p]
                            for p in macro_proposals(rules, mod, 0)]
    return out


def test_round0_multi_step_proposals_match_the_parent_commit():
    """Round 0's multi-step proposals (every recipe: macros, chains, sequences, tilings and
    their tails) on the 8 programs of `stp corpus --count 8 --seed 5`: step for step (rule,
    site, parameters, resulting LEIR) what the Python tables proposed before the move."""
    want = json.loads(GOLDEN.read_text())["programs"]
    got = _round0()
    assert sorted(got) == sorted(want)
    for name in want:
        assert got[name] == want[name], name


if __name__ == "__main__" and "--update" in sys.argv:
    doc = json.loads(GOLDEN.read_text())
    doc["programs"] = _round0()
    GOLDEN.write_text(json.dumps(doc, indent=1))
    print(f"{GOLDEN}: {sum(len(v) for v in doc['programs'].values())} proposals")
