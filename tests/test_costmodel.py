"""The learned cost model (``stp costmodel``, ``stp search --rank model``) and the
``evolutionary`` search algorithm, on real measurements: a small ``stp dataset --time`` run
of two bundled programs trains the model; searches run end to end on a bundled program."""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from steptp.cli import app
from steptp.leir import LeirModule, load_leir, parse_program
from steptp.search import SearchConfig, search_program
from steptp.cost_model import learned as C
from steptp.policy import Proposal
from steptp.search.core import Evaluation, Search
from steptp.cost_model.static import estimate_ns
from steptp.cost_model.features import FEATURE_NAMES, program_features

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
runner = CliRunner()


def _one_line_error(r, code: int = 2) -> str:
    assert r.exit_code == code, r.output
    assert "Traceback" not in r.output
    lines = [x for x in r.output.splitlines() if x.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), r.output
    return lines[0]


@pytest.fixture(scope="module")
def timed(tmp_path_factory) -> Path:
    """A real ``stp dataset --time`` run: matmul and softmax x three loop rules, 2 steps each."""
    d = tmp_path_factory.mktemp("cm")
    src = d / "programs"
    src.mkdir()
    for name in ("matmul", "softmax"):
        (src / f"{name}.leir").write_text((EXAMPLES / f"{name}.leir").read_text())
    out = d / "data"
    args = ["dataset", str(src), "-o", str(out), "--time", "--per-rule", "2", "--no-cuda", "--no-nvcc",
            "--in-process", "-q"]
    for rule in ("loop_reorder", "loop_unrolling", "loop_split"):
        args += ["--rule", str(ROOT / "rules" / f"{rule}.yaml")]
    r = runner.invoke(app, args)
    assert r.exit_code == 0, r.output
    return out


@pytest.fixture(scope="module")
def model_file(timed, tmp_path_factory) -> Path:
    pytest.importorskip("lightgbm", reason="needs lightgbm, which is not installed (pip install '.[costmodel]')")
    path = tmp_path_factory.mktemp("model") / "model.json"
    r = runner.invoke(app, ["costmodel", "train", str(timed), "-o", str(path)])
    assert r.exit_code == 0, r.output
    assert "trained on" in r.output and path.exists()
    return path


def test_features_see_loops_strides_and_vectors():
    serial = parse_program("L^{64}_{a=0}L^{64}_{b=0}[C^{f32,g}_{a,b}=A^{f32,g}_{a,b}*2.0;];")
    vector = parse_program("L^{64}_{a=0}V^{64}_{b=0}[C^{f32,g}_{a,b}=A^{f32,g}_{a,b}*2.0;];")
    strided = parse_program("L^{64}_{b=0}L^{64}_{a=0}[C^{f32,g}_{a,b}=A^{f32,g}_{a,b}*2.0;];")
    f = {k: dict(zip(FEATURE_NAMES, program_features(p))) for k, p in
         (("serial", serial), ("vector", vector), ("strided", strided))}
    assert all(len(program_features(p)) == len(FEATURE_NAMES) for p in (serial, vector, strided))
    assert f["vector"]["w_inner_vector"] == 1.0 and f["serial"]["w_inner_vector"] == 0.0
    assert f["vector"]["w_vector_lanes"] == 8.0  # 32-byte vectors of f32
    assert f["serial"]["w_contiguous"] == 1.0 and f["strided"]["w_strided"] == 1.0
    assert f["serial"]["log2_iters"] == pytest.approx(12.0, abs=0.01)
    m = load_leir(EXAMPLES / "softmax.leir")
    assert dict(zip(FEATURE_NAMES, program_features(m.program)))["log2_transcendental"] > 0
    # a thread binding is a serial loop on the CPU: the same features there, not on CUDA
    bound = parse_program("B^{64}_{tx=0}L^{64}_{b=0}[C^{f32,g}_{tx,b}=A^{f32,g}_{tx,b}*2.0;];")
    assert program_features(bound) == program_features(serial)
    assert program_features(bound, "cuda") != program_features(serial, "cuda")


def test_rank_metrics_agree_with_scipy():
    from scipy.stats import kendalltau

    rng = random.Random(0)
    for _ in range(20):
        a = [rng.randint(0, 5) for _ in range(9)]
        b = [rng.randint(0, 5) for _ in range(9)]
        ref = kendalltau(a, b).statistic
        mine = C.kendall_tau(a, b)
        assert (mine is None and ref != ref) or mine == pytest.approx(ref)
    assert C.top_k_recall([3, 2, 1, 0], [3, 2, 1, 0], 2) == 1.0
    assert C.top_k_recall([0, 1, 2, 3], [3, 2, 1, 0], 2) == 0.0
    assert C.kendall_tau([1, 2, 3], [3, 2, 1]) == pytest.approx(-1.0)


def test_train_and_rank_measured_steps(timed, model_file):
    groups = C.measured_groups([timed])
    assert len(groups) == 2 and sum(len(v) for v in groups.values()) >= 6
    m = C.LearnedModel.load(model_file)
    assert m.trained and m.meta["groups"] == 2
    res = C.evaluate(groups, m.predict, k=2)
    assert res["groups"] == 2 and res["tau"] is not None
    # in-sample, where the measurements differ by more than noise (matmul: a loop order or an
    # unrolling ~5x slower than the rest), the model orders them and its top pick is no slow one
    spread = [(o, items) for o, items in groups.items() if max(x for _, x in items) - min(x for _, x in items) > 1.0]
    assert spread
    for orig, items in spread:
        pred = m.predict(orig, [t for t, _ in items])
        assert C.kendall_tau(pred, [x for _, x in items]) > 0.3
        best = max(range(len(items)), key=lambda i: pred[i])
        assert items[best][1] > min(x for _, x in items) + 1.0
    r = runner.invoke(app, ["costmodel", "eval", str(model_file), str(timed), "--json"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.output)
    assert doc["model"]["tau"] == pytest.approx(res["tau"]) and doc["static"]["groups"] == 2
    # a saved and reloaded model predicts the same
    again = C.LearnedModel.load(model_file)
    orig = next(iter(groups))
    assert again.predict(orig, [t for t, _ in groups[orig]]) == m.predict(orig, [t for t, _ in groups[orig]])


def test_bad_inputs_exit_2(tmp_path, timed, model_file):
    soft = str(EXAMPLES / "softmax.leir")
    assert "no such model file" in _one_line_error(runner.invoke(app, ["costmodel", "eval", str(tmp_path / "no.json"),
                                                                       str(timed)]))
    bad = tmp_path / "bad.json"
    bad.write_text('{"format": "steptp-costmodel", "features": ' + json.dumps(list(FEATURE_NAMES)) +
                   ', "booster": "garbage", "train": {"X": [], "y": [], "w": []}}')
    assert "corrupt" in _one_line_error(runner.invoke(app, ["costmodel", "eval", str(bad), str(timed)]))
    (tmp_path / "text.json").write_text("not json")
    assert "not a cost model" in _one_line_error(runner.invoke(app, ["costmodel", "eval", str(tmp_path / "text.json"),
                                                                     str(timed)]))
    empty = tmp_path / "empty"
    empty.mkdir()
    _one_line_error(runner.invoke(app, ["costmodel", "train", str(empty), "-o", str(tmp_path / "m.json")]))
    untimed = tmp_path / "untimed"
    untimed.mkdir()
    line = (timed / "dictionary.jsonl").read_text().splitlines()[0]
    e = json.loads(line)
    e.pop("timing")
    (untimed / "dictionary.jsonl").write_text(json.dumps(e) + "\n")
    assert "no timed entries" in _one_line_error(runner.invoke(app, ["costmodel", "train", str(untimed), "-o",
                                                                     str(tmp_path / "m.json")]))
    assert not (tmp_path / "m.json").exists()
    for rank in ("bogus", "cost:x", "model:", f"model:{tmp_path / 'no.json'}", f"model:{bad}"):
        _one_line_error(runner.invoke(app, ["search", soft, "-o", str(tmp_path / "s"), "--rank", rank, "-q"]))
    _one_line_error(runner.invoke(app, ["search", soft, "-o", str(tmp_path / "s"), "-a", "evolution", "-q"]))
    assert not (tmp_path / "s").exists()


def test_missing_lightgbm_is_one_line_exit_2(tmp_path, monkeypatch, model_file, timed):
    monkeypatch.setitem(sys.modules, "lightgbm", None)  # import lightgbm -> ImportError
    with pytest.raises(C.CostModelUnavailable, match="pip install"):
        C.require_lightgbm()
    msg = _one_line_error(runner.invoke(app, ["costmodel", "train", str(timed), "-o", str(tmp_path / "m.json")]))
    assert "lightgbm" in msg
    msg = _one_line_error(runner.invoke(app, ["search", str(EXAMPLES / "softmax.leir"), "-o", str(tmp_path / "s"),
                                              "--rank", f"model:{model_file}", "-q"]))
    assert "lightgbm" in msg


def test_search_rank_model_end_to_end(tmp_path, model_file):
    out = tmp_path / "s"
    r = runner.invoke(app, ["search", str(EXAMPLES / "softmax.leir"), "-o", str(out), "--rank",
                            f"model:{model_file}", "-n", "1", "--candidates-per-rule", "1", "-q"])
    assert r.exit_code == 0, r.output
    sm = json.loads((out / "summary.json").read_text())
    assert sm["rank"] == "model" and sm["samples"] >= 1 and sm["algorithm"] == "greedy"
    assert sm["scorer"]["kind"] == "ModelScorer" and sm["scorer"]["offline_rows"] > 0
    assert sm["scorer"]["online_rows"] >= 2  # the search's own samples were learned from
    assert sm["speedup"] >= 1.0


def _cost_timer(m: LeirModule) -> float:
    return estimate_ns(m.program) / 1000.0 + 0.001


@pytest.mark.parametrize("rank,rounds", [("model", 2), ("random", 1)])
def test_evolutionary_end_to_end(tmp_path, model_file, rank, rounds):
    r = f"model:{model_file}" if rank == "model" else rank
    out = tmp_path / rank
    cfg = SearchConfig(algorithm="evolutionary", iterations=rounds, rank=r, seed=1, progress=False, per_rule=2,
                       overrides={"screen": 8})
    sm = search_program(EXAMPLES / "softmax.leir", out, cfg, timer=_cost_timer)
    assert sm["algorithm"] == "evolutionary" and sm["params"]["measure"] == 2 and sm["params"]["seed"] == 1
    assert sm["params"]["screen"] == 8
    assert 1 <= sm["samples"] <= 2 * rounds
    tree = [json.loads(x) for x in (out / "tree.jsonl").read_text().splitlines()]
    ok = {n["id"] for n in tree if n["status"] in ("root", "equal")}
    assert all(n["parent"] in ok for n in tree[1:])  # every candidate mutates a measured program
    assert len(tree) - 1 <= 2 * rounds  # only the selected top-2 per round were verified (or rejected)
    if rank == "model":
        assert sm["scorer"]["online_rows"] > 0


class _Policy:
    """Proposes ten programs per node, each once (no rules, no TVM)."""

    def __init__(self, sig):
        self.sig = sig
        self.n = 0

    def propose(self, node, history, k):
        out = []
        for _ in range(min(k, 10)):
            self.n += 1
            prog = parse_program(f"L^{{8}}_{{a=0}}[C^{{f32,g}}_{{a}}=A^{{f32,g}}_{{a}}*{self.n}.0;];")
            out.append(Proposal(LeirModule(self.sig, prog), f"s{self.n}"))
        return out


class _Scorer:
    """Prefers larger constants: score = the constant."""

    def __init__(self):
        self.seen = []

    def score(self, node, proposals):
        return [float(p.strategy[1:]) for p in proposals]

    def observe(self, root, parent, child):
        self.seen.append(child.strategy)


class _Measure:
    root_time_us = 100.0

    def __init__(self):
        self.calls = []

    def evaluate(self, module):
        self.calls.append(module)
        return Evaluation("equal", time_us=50.0 + len(self.calls))


def test_evolutionary_screens_many_and_measures_the_top_k():
    from steptp.search.algorithms import run_algorithm

    root = load_leir(EXAMPLES / "softmax.leir")
    scorer, measure = _Scorer(), _Measure()
    s = Search(root, _Policy(root.signature), measure, scorer=scorer)
    run_algorithm("evolutionary", s, iterations=3, population=2, screen=10, measure=2, eps_greedy=0.0)
    assert s.samples == 6 and len(measure.calls) == 6  # 3 rounds x top 2, nothing else verified
    # round 1 screens the root's 10 and measures the two best-scored (10, 9); round 2 adds the
    # proposals of the two new members (11..30) and measures the best of the pool (30, 29) ...
    assert scorer.seen[:4] == ["s10", "s9", "s30", "s29"]
    assert s.timer.seconds["model"] >= 0.0


def test_screening_policy_proposes_the_best_scored_first():
    root = load_leir(EXAMPLES / "softmax.leir")
    from steptp.policy import ScreeningPolicy

    pol = ScreeningPolicy(_Policy(root.signature), _Scorer(), screen=10)
    node = Search(root, pol, _Measure()).root
    assert [p.strategy for p in pol.propose(node, [], 3)] == ["s10", "s9", "s8"]
    assert [p.strategy for p in pol.propose(node, [], 2)] == ["s7", "s6"]


def test_evolutionary_sizes_from_the_command_line(tmp_path):
    """--population/--screen/--measure set the evolutionary search's sizes (recorded in the
    summary's params): one measured candidate per round gives one sample per round; the
    flags are refused for another algorithm."""
    softmax = Path(__file__).resolve().parents[1] / "examples" / "softmax.leir"
    out = tmp_path / "evo"
    res = CliRunner().invoke(app, ["search", str(softmax), "-o", str(out), "--algorithm", "evolutionary",
                                   "--population", "2", "--screen", "8", "--measure", "1", "-n", "2", "-q"])
    assert res.exit_code == 0, res.output
    summary = json.loads((out / "summary.json").read_text())
    assert summary["params"]["population"] == 2 and summary["params"]["screen"] == 8
    assert summary["params"]["measure"] == 1 and summary["samples"] <= 2
    res = CliRunner().invoke(app, ["search", str(softmax), "-o", str(tmp_path / "g"), "--algorithm", "greedy",
                                   "--screen", "8"])
    assert res.exit_code == 2 and "--screen: not a parameter of --algorithm greedy" in res.output
    assert not (tmp_path / "g").exists()


def test_cost_models_come_from_one_registry():
    """One ranking home (issue 53): every kind by :func:`steptp.cost_model.create`, the ``--rank``
    values read from the registry, and a kind registered later is created the same way."""
    import steptp.cost_model as cm
    from steptp.cost_model.learned import CostScorer, RandomScorer

    assert cm.kinds()[:3] == ("random", "cost", "model")
    assert isinstance(cm.create("random", seed=3), RandomScorer) and isinstance(cm.create("cost"), CostScorer)
    with pytest.raises(ValueError, match="expected random, cost, model or model:PATH"):
        cm.parse_kind("cost:x")

    class Constant:
        def predict(self, base, programs):
            return [0.0] * len(programs)

        def update(self, rows):
            pass

    cm.register("constant", lambda **_: Constant())
    try:
        assert cm.parse_kind("constant") == ("constant", None) and isinstance(cm.create("constant"), Constant)
    finally:
        cm._KINDS.pop("constant")
