"""`stp search --runner pack`: every algorithm through the one driver, in rounds, on a machine
without a GPU (issue 45).

Each batch a search cannot measure here is written as a GPU pack and the command exits 3; the pack
runs on the simulated device (`STP_CUDA_SIM=1`, the runtime-only runner `python -m
steptp.gpu.run`); the same command then replays the search from its caches, goes on, and ends
with the summaries a local search writes (plus the node's PyTorch eager timing)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from steptp.cli import app
from steptp.leir import LeirModule, parse_leir, parse_program

ROOT = Path(__file__).resolve().parents[1]
STP = Path(sys.executable).parent / "stp"
SIM = {**os.environ, "STP_CUDA_SIM": "1"}

#: the smallest budget that exercises each algorithm's batches (mcts: an expansion and a rollout)
SMALL = {"greedy": ["--breadth", "2"], "beam": ["--per-node", "2", "--beam-k", "2"], "bfs": ["--per-node", "2"],
         "dfs": ["--per-node", "2"], "mcts": [], "chain": [], "chain-no-parent": [],
         "evolutionary": ["--screen", "8", "--measure", "2", "--population", "2"]}


def _search(out: Path, *extra: str, program: str = "softmax.py") -> subprocess.CompletedProcess:
    """``stp search ... --runner pack`` in this process (the command's own code; a round costs the
    search, not a second start of PyTorch, TVM and the workers)."""
    args = ["search", str(ROOT / "examples" / program), "-o", str(out), "--device", "cuda", "--runner", "pack", "-q",
            *extra]
    res = CliRunner().invoke(app, args)
    if res.exception is not None and not isinstance(res.exception, SystemExit):
        raise res.exception
    return subprocess.CompletedProcess(args, res.exit_code, res.stdout, res.stderr)


def _node(out: Path, k: int) -> None:
    d = out / "rounds" / str(k)
    r = subprocess.run([sys.executable, "-m", "steptp.gpu.run", str(d / "pack"), "-o", str(d / "results"), "--time",
                        "--retime-best", "1", "-q"], capture_output=True, text=True, timeout=900, env=SIM)
    assert r.returncode == 0, r.stdout + r.stderr


def _loop(out: Path, *extra: str, limit: int = 6) -> tuple[subprocess.CompletedProcess, int]:
    r = _search(out, *extra)
    rounds = 0
    while r.returncode == 3:
        assert "python -m steptp.gpu.run" in r.stdout and "waiting for" in r.stdout, r.stdout
        k = max(int(p.name) for p in (out / "rounds").iterdir() if p.name.isdigit())
        _node(out, k)
        r = _search(out, *extra)
        rounds += 1
        assert rounds <= limit, r.stdout + r.stderr
    return r, rounds


@pytest.mark.parametrize("algorithm", list(SMALL))
def test_every_algorithm_runs_in_rounds_on_the_simulated_device(tmp_path, algorithm):
    out = tmp_path / "s"
    args = ("-a", algorithm, "-n", "1", "--candidates-per-rule", "2", *SMALL[algorithm])
    r, rounds = _loop(out, *args)
    assert r.returncode == 0, r.stdout + r.stderr
    assert rounds >= 1
    sm = json.loads((out / "softmax" / "summary.json").read_text())  # one directory per program
    # the keys a local search writes, and the runner's
    for key in ("algorithm", "samples", "speedup", "strategies", "efficiency", "root_time_us", "best", "trajectory",
                "curve", "counts", "runner", "rounds", "speedup_vs_eager"):
        assert key in sm, key
    assert sm["algorithm"] == algorithm and sm["runner"] == "pack" and sm["device"] == "cuda"
    assert sm["samples"] >= 1 and sm["speedup"] >= 1.0 and sm["root_time_us"] > 0
    if sm["speedup"] > 1.0:  # reported only from a re-time whose interval lies above 1
        assert sm["confirmed"]["verdict"] == "faster" and sm["confirmed"]["ci"][0] > 1.0
    assert isinstance(sm["speedup_vs_eager"], float) and sm["speedup_vs_eager"] > 0, sm
    tree = [json.loads(x) for x in (out / "softmax" / "tree.jsonl").read_text().splitlines()]
    assert tree[0]["status"] == "root" and {"id", "parent", "depth", "iteration", "status", "strategy",
                                            "leir"} <= set(tree[1])
    assert sum(t["status"] == "equal" for t in tree) == sm["samples"]
    # done: the same command prints the same summary, measures nothing more
    again = _search(out, *args)
    assert again.returncode == 0 and json.loads((out / "softmax" / "summary.json").read_text()) == sm
    assert "vs PyTorch eager" in (out / "report.md").read_text() or "vs eager" in (out / "report.md").read_text()


def test_a_waiting_round_is_not_built_again_and_a_lowered_budget_ends_the_search(tmp_path):
    out = tmp_path / "s"
    r = _search(out, "-n", "2", "--candidates-per-rule", "2")
    assert r.returncode == 3, r.stdout + r.stderr
    man = out / "rounds" / "0" / "pack" / "manifest.json"
    stamp = man.stat().st_mtime_ns
    assert _search(out, "-n", "2", "--candidates-per-rule", "2").returncode == 3
    assert man.stat().st_mtime_ns == stamp  # the same round, not built again
    _node(out, 0)
    r = _search(out, "-n", "2", "--candidates-per-rule", "2")
    assert r.returncode in (0, 3), r.stdout + r.stderr
    if r.returncode == 3:  # round 1 waits; a run with -n 1 ends with what round 0 measured
        r = _search(out, "-n", "1", "--candidates-per-rule", "2")
        assert r.returncode in (0, 3), r.stdout + r.stderr  # 3: the best's re-time is pending
        if r.returncode == 3:
            k = max(int(p.name) for p in (out / "rounds").iterdir() if p.name.isdigit())
            _node(out, k)
            r = _search(out, "-n", "1", "--candidates-per-rule", "2")
    assert r.returncode == 0, r.stdout + r.stderr


def test_the_first_batch_does_not_depend_on_the_runner(tmp_path):
    """Same seed, algorithm and --rank cost: the records of iteration 0 propose the same programs
    with the local runner (the simulated device) and with packs."""
    base = ["-a", "beam", "-n", "1", "--per-node", "3", "--rank", "cost", "--candidates-per-rule", "2"]
    local = tmp_path / "local"
    r = subprocess.run([str(STP), "search", str(ROOT / "examples" / "softmax.leir"), "-o", str(local), "--device",
                        "cuda", "-q", *base], capture_output=True, text=True, timeout=900, env=SIM)
    assert r.returncode == 0, r.stdout + r.stderr
    pack = tmp_path / "pack"
    r = _search(pack, *base, program="softmax.leir")
    assert r.returncode == 3, r.stdout + r.stderr

    def first(path: Path) -> list[str]:
        return sorted(json.loads(x)["leir"] for x in path.read_text().splitlines()
                      if json.loads(x)["iteration"] == 0 and json.loads(x)["parent"] is not None)

    got_local = first(local / "tree.jsonl")
    cache = json.loads((pack / "softmax" / ".search" / "cache.json").read_text())
    got_pack = sorted(p["leir"] for p in cache["proposals"][0])
    assert got_local and got_local == got_pack
    entries = {json.loads(x)["transformed"]["leir"] for x in (pack / "rounds" / "0" / "dictionary.jsonl").read_text()
               .splitlines()}
    equal = {json.loads(x)["leir"] for x in (local / "tree.jsonl").read_text().splitlines()
             if json.loads(x)["status"] == "equal"}
    assert entries == equal  # what the local runner timed is what the pack ships


def test_the_runner_flags_keep_one_meaning(tmp_path):
    prog = str(ROOT / "examples" / "softmax.leir")
    r = subprocess.run([str(STP), "search", prog, "-o", str(tmp_path / "y"), "--runner", "pack"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and "--device cuda" in r.stderr and "Traceback" not in r.stderr
    r = subprocess.run([str(STP), "search", prog, "-o", str(tmp_path / "z"), "-j", "2"], capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 2 and "only with --runner pack" in r.stderr
    r = subprocess.run([str(STP), "search", prog, "-o", str(tmp_path / "w"), "--device", "cuda", "--runner", "pack",
                        "-a", "greedy", "--measure", "3"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and "--measure" in r.stderr and "greedy" in r.stderr


def _verified_steps(root: LeirModule, steps: list[dict]) -> bool:
    from steptp.verify import verify_pair

    return all(verify_pair(root, LeirModule(root.signature, parse_program(st["leir"])), seed=0).ok for st in steps)


def _proposals(text: str, per_rule: int = 2) -> list[list[dict]]:
    from steptp.engine.macros import macro_proposals
    from steptp.rules import load_rules

    return macro_proposals(load_rules(), parse_leir(text), seed=0, per_rule=per_rule)


def test_a_rebinding_that_enables_a_cross_thread_reduction_is_proposed_as_two_steps():
    """64 rows of 256 summed serially in one block of 64 threads: the row sum cannot go to
    threads (64 x 256 > 1024) until the rows move to blocks (thread_block_rebinding, slower
    alone); the engine proposes the pair as one two-step proposal, each step verifying."""
    from steptp.cost_model.static import static_scores

    root = ("% program: rowsum\n% input A: f32[64,256]\n% output E: f32[64]\n"
            "B^{64}_{tx=0}L^{256}_{a=0}[E^{f32,g}_{tx}=E^{f32,g}_{tx}+A^{f32,g}_{tx,a};];\n")
    pairs = [st for st in _proposals(root) if [s["rule"] for s in st] == ["thread_block_rebinding",
                                                                           "reduction_thread_binding"]]
    assert pairs, [[s["rule"] for s in st] for st in _proposals(root)]
    body = pairs[0][-1]["leir"]
    assert body.startswith("B^{64}_{b") and "B^{256}_{t" in body, body
    assert _verified_steps(parse_leir(root), pairs[0])
    assert static_scores(parse_leir(root).program, [parse_program(body)], "cuda")[0] > 0.5


def test_macro_sequences_bind_fuse_and_join_the_bias_of_a_linear_layer_in_one_kernel():
    """The translator's Linear (a GEMM nest, then a bias-add nest over the same spatial loops)
    is two kernels; the canonical sequence "bind every nest, fuse, epilogue fusion" makes it one
    bound kernel, every step recorded and verified (issue 37: launches dominate at microseconds)."""
    from steptp.engine.recipes import recipes_in_effect

    root = ("% program: linear\n% input A: f32[8,16]\n% param C: f32[96,16]\n% param D: f32[96]\n"
            "% output E: f32[8,96]\n"
            "B^{8}_{tx=0}L^{96}_{a=0}L^{16}_{c=0}[E^{f32,g}_{tx,a}=E^{f32,g}_{tx,a}+A^{f32,g}_{tx,c}*C^{f32,g}_{a,c};];\n"
            "B^{8}_{tx=0}L^{96}_{a=0}[E^{f32,g}_{tx,a}=E^{f32,g}_{tx,a}+D^{f32,g}_{a};];\n")
    assert ["loop_binding", "operator_fusion", "epilogue_fusion"] in [
        [st["rule"] for st in r.spec["steps"]] for r in recipes_in_effect("sequence")]
    seq = [st for st in _proposals(root, 1) if [s["rule"] for s in st] == ["loop_binding", "loop_binding",
                                                                            "epilogue_fusion"]]
    assert seq, [[s["rule"] for s in st] for st in _proposals(root, 1)]
    steps = seq[0]
    body = steps[-1]["leir"]
    assert len(parse_program(body).nests) == 1  # one kernel
    ax = steps[0]["params"]["ax"]  # both nests bound alike, so the bias nest could join the GEMM
    assert steps[1]["params"] == {"ax": ax}
    assert body.startswith(f"B^{{8}}_{{tx=0}}B^{{96}}_{{{ax}a=0}}[L^{{16}}_{{c=0}}["), body
    assert _verified_steps(parse_leir(root), steps)


def test_a_long_serial_reduction_is_split_over_threads_by_an_rfactor_chain():
    """A dot product per row, 2048 long, serial in each of 16 threads of one block: rfactor
    alone adds a pass; binding its partial results' new loop (the follow-up, in the nests the
    rfactor changed) spreads the reduction (split-K). Proposed as two verified steps."""
    from steptp.cost_model.static import static_scores
    from steptp.engine.recipes import recipes_in_effect

    assert {"first": "reduction_factorization", "then": ["loop_binding"]}.items() <= next(
        r.spec for r in recipes_in_effect("chain") if r.spec["first"] == "reduction_factorization").items()
    root = ("% program: gemv\n% input A: f32[16,2048]\n% param C: f32[2048]\n% output E: f32[16]\n"
            "B^{16}_{tx=0}L^{2048}_{a=0}[E^{f32,g}_{tx}=E^{f32,g}_{tx}+A^{f32,g}_{tx,a}*C^{f32,g}_{a};];\n")
    pairs = [st for st in _proposals(root) if [s["rule"] for s in st] == ["reduction_factorization", "loop_binding"]]
    assert pairs
    for st in pairs:
        nests = parse_program(st[-1]["leir"]).nests
        assert len(nests) == 2 and sum(lp.kind == "B" for lp in nests[0].loops) == 2  # partials bound
        assert _verified_steps(parse_leir(root), st)
    assert max(static_scores(parse_leir(root).program, [parse_program(st[-1]["leir"]) for st in pairs], "cuda")) > 0.5


def test_shipped_gpu_samples_their_export_and_the_ranking_quality(tmp_path, monkeypatch):
    """The package ships the H200 search's GPU samples (the default GPU model's rows): every
    row's texts parse, a searched program's own rows are left out, export_samples writes the
    same rows back from a search directory, and the shipped model ranks held out by program."""
    pytest.importorskip("lightgbm", reason="the learned cost model needs lightgbm")
    from steptp.cost_model import samples as S

    rows = S.shipped_rows()
    assert len(rows) >= 700 and S.SHIPPED_SAMPLES.stat().st_size < 200_000
    roots = sorted({r[0] for r in rows})
    assert len(roots) == 40
    for root, cand, ls in rows[:25]:
        parse_leir(root), parse_leir(cand)
        assert math.isfinite(ls)
    mine = [r for r in rows if r[0] == roots[0]]
    assert mine and len(S.shipped_rows([roots[0]])) == len(rows) - len(mine)
    # a search directory holding two programs' samples: export, read back through shipped_rows
    out = tmp_path / "search"
    for n, root in enumerate(roots[:2]):
        d = out / f"p{n}"
        d.mkdir(parents=True)
        (d / "root.leir").write_text(root)
        recs = [{"id": 0, "status": "root", "speedup": 1.0, "leir": root}]
        recs += [{"id": i + 1, "status": "equal", "speedup": math.exp(ls), "leir": cand}
                 for i, (_, cand, ls) in enumerate(r for r in rows if r[0] == root)]
        (d / "tree.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    path = tmp_path / "s.json.gz"
    counts = S.export_samples(out, path, "test GPU")
    assert counts["programs"] == 2 and counts["rows"] == sum(1 for r in rows if r[0] in roots[:2])
    monkeypatch.setattr(S, "SHIPPED_SAMPLES", path)
    monkeypatch.setattr(S, "_SHIPPED", None)
    back = S.shipped_rows()
    assert sorted((a, b) for a, b, _ in back) == sorted((a, b) for a, b, _ in rows if a in roots[:2])
    rank = S.ranking_quality(out)  # held out by program: each ranked by a model of the other's rows
    assert rank["shipped"]["groups"] == 2 and rank["shipped"]["tau"] is not None
    monkeypatch.setattr(S, "_SHIPPED", None)


def test_engine_proposals_replayed_from_the_cache_are_not_proposed_again():
    """A search replayed after a pending batch answers its earlier policy calls from the cache;
    the engine policy is told, so its next call proposes what a search that never stopped would."""
    from steptp.policy import EnginePolicy
    from steptp.search.replay import CachedPolicy

    mod = parse_leir((ROOT / "examples" / "softmax.leir").read_text())
    straight = EnginePolicy(rank="cost", seed=0, per_rule=2, target="cuda", isolated=False)
    want = [[p.module.text() for p in straight.propose(mod, [], 2)] for _ in range(3)]
    calls: list = []
    first = CachedPolicy(lambda: EnginePolicy(rank="cost", seed=0, per_rule=2, target="cuda", isolated=False), calls,
                         mod.signature)
    first.propose(mod, [], 2)
    replay = CachedPolicy(lambda: EnginePolicy(rank="cost", seed=0, per_rule=2, target="cuda", isolated=False), calls,
                          mod.signature)
    got = [[p.module.text() for p in replay.propose(mod, [], 2)] for _ in range(3)]
    assert replay.inner is not None and got == want  # the 2nd and 3rd call went to the engine


def test_a_program_that_fails_the_check_is_neither_proposed_nor_a_prefix_of_the_lookahead():
    """With the search's check (on cuda: its verification) the engine proposes the ranked programs
    that pass and expands only a level's programs that pass: a first step the check refuses (as
    TVM refuses some cross-thread reduction placements) is no prefix of any proposal. A replay
    from the cache proposes what the straight run proposed."""
    from steptp.policy import EnginePolicy, program_key
    from steptp.search.replay import CachedPolicy

    mod = parse_leir((ROOT / "examples" / "softmax.leir").read_text())
    opts = dict(rank="cost", seed=0, per_rule=2, target="cuda", isolated=False, lookahead=2, expand=2)

    def props(pol, n=12):
        return pol.propose(mod, [], n)

    plain = props(EnginePolicy(**opts))
    first = [p.steps[0].leir for p in plain if len(p.steps) > 1]  # typed steps (issue 53)
    assert first  # the lookahead reached a second step
    refused = {program_key(LeirModule(mod.signature, parse_program(first[0])))}
    seen: list[str] = []

    def check(m):
        seen.append(program_key(m))
        return program_key(m) not in refused

    got = props(EnginePolicy(**opts, check=check))
    assert got and refused & set(seen)
    for p in got:
        assert program_key(p.module) not in refused
        for st in p.steps:  # no proposal goes through the refused program
            assert program_key(st.program) not in refused
    assert any(program_key(st.program) in refused
               for p in plain for st in p.steps[:1])  # without the check, some did
    straight = EnginePolicy(**opts, check=check)
    want = [[p.module.text() for p in straight.propose(mod, [], 2)] for _ in range(3)]
    calls: list = []
    CachedPolicy(lambda: EnginePolicy(**opts, check=check), calls, mod.signature).propose(mod, [], 2)
    replay = CachedPolicy(lambda: EnginePolicy(**opts, check=check), calls, mod.signature)
    assert [[p.module.text() for p in replay.propose(mod, [], 2)] for _ in range(3)] == want


def test_at_size_the_node_computes_the_references_and_verifies_every_candidate(tmp_path, monkeypatch):
    """A program above the CPU check budget (here lowered to 100 equation instances per trial
    with $STP_CPU_CHECK_WORK, the same path a KernelBench-size program takes): its candidates
    get only the checks that execute nothing on this CPU, the pack carries no reference digests
    ("references": "node"), the node computes the original's references from its CPU build and
    verifies every candidate at full size; only those verdicts make samples."""
    out = tmp_path / "s"
    monkeypatch.setenv("STP_CPU_CHECK_WORK", "100")
    cmd = ("-n", "1", "--breadth", "3", "--candidates-per-rule", "2")
    r = _search(out, *cmd, program="softmax.leir")
    assert r.returncode == 3, r.stdout + r.stderr
    cache = json.loads((out / "softmax" / ".search" / "cache.json").read_text())
    assert cache["verified"] and all(v["where"] == "node" for v in cache["verified"].values())
    man = json.loads((out / "rounds" / "0" / "pack" / "manifest.json").read_text())
    prog = next(iter(man["programs"].values()))
    assert prog["references"] == "node" and prog["outputs_sha1"] is None and man["entries"]
    _node(out, 0)
    recs = [json.loads(x) for x in (out / "rounds" / "0" / "results" / "results.jsonl").read_text().splitlines()]
    assert recs and all(x["original"]["equal"] and x["transformed"]["trials"] == 5 for x in recs
                        if x["status"] == "equal")
    r = _search(out, *cmd, program="softmax.leir")
    while r.returncode == 3:  # the best's re-time
        k = max(int(p.name) for p in (out / "rounds").iterdir() if p.name.isdigit())
        _node(out, k)
        r = _search(out, *cmd, program="softmax.leir")
    assert r.returncode == 0, r.stdout + r.stderr
    sm = json.loads((out / "softmax" / "summary.json").read_text())
    assert sm["samples"] == sum(x["status"] == "equal" for x in recs)
    assert sm["sol_us"] > 0 and sm["flops"] > 0 and sm["gpu_device"].startswith("simulated")
    agg = json.loads((out / "gpu_summary.json").read_text())  # the run's aggregate over programs
    assert agg["programs"][0]["program"] == "softmax" and agg["median_speedup"] >= 1.0
    assert {"geomean_speedup_vs_eager_graph", "median_fraction_of_sol", "ranking"} <= set(agg)


def test_the_engine_proposes_a_tiled_gemm_in_one_proposal_and_the_gpu_model_prefers_it():
    """A GEMM as the translator writes it: one of the engine's multi-step proposals is the tiled
    form (blocks and threads bound, a register micro-tile, shared tiles of both inputs fetched
    cooperatively, vectorized copies, unrolled micro-tile loops), every step verifying; at a
    size where tiles matter (512^3) the static GPU model ranks it above every other proposal of
    the engine, which proposes it first (issue 44)."""
    from steptp.cost_model.static import static_scores
    from steptp.policy import EnginePolicy

    def gemm(n: int) -> str:
        return (f"% program: gemm\n% input A: f32[{n},{n}]\n% input C: f32[{n},{n}]\n% output D: f32[{n},{n}]\n"
                f"B^{{{n}}}_{{tx=0}}L^{{{n}}}_{{a=0}}L^{{{n}}}_{{c=0}}"
                "[D^{f32,g}_{tx,a}=D^{f32,g}_{tx,a}+A^{f32,g}_{tx,c}*C^{f32,g}_{c,a};];\n")

    small = parse_leir(gemm(64))
    tiled = [st for st in _proposals(gemm(64)) if "shared_memory_tiling" in {s["rule"] for s in st}]
    assert len(tiled) == 1
    rules = [s["rule"] for s in tiled[0]]
    assert {"register_tiling", "loop_vectorization", "loop_unrolling", "loop_binding"} <= set(rules)
    assert rules.count("shared_memory_tiling") == 2  # both inputs
    assert _verified_steps(small, tiled[0])
    big = parse_leir(gemm(512))
    pol = EnginePolicy(rank="cost", seed=0, per_rule=2, target="cuda", macros=True, isolated=False)
    first = pol.propose(big, [], 1)[0]
    assert "shared_memory_tiling" in first.strategy and "register_tiling" in first.strategy
    assert static_scores(big.program, [first.module.program], "cuda")[0] > math.log(4)


def test_the_engine_proposes_a_tiled_batched_convolution_in_one_proposal(tmp_path):
    """A translated Conv2d with a batch (7 loops): one multi-step proposal binds batch and
    output channels to blocks, output rows/columns to threads, keeps each thread's outputs in a
    register tile and stages the input window in shared memory; every step verifies."""
    from steptp.programs import load

    src = tmp_path / "conv.py"
    src.write_text("import torch\n\n\nclass Model(torch.nn.Module):\n    def __init__(self):\n        super().__init__()\n"
                   "        self.conv = torch.nn.Conv2d(8, 16, 3, bias=False)\n\n    def forward(self, x):\n"
                   "        return self.conv(x)\n\n\ndef get_inputs():\n    return [torch.randn(2, 8, 10, 18)]\n\n\n"
                   "def get_init_inputs():\n    return []\n")
    mod, _ = load(src)
    from steptp.engine.macros import macro_proposals
    from steptp.rules import load_rules

    tiled = [st for st in macro_proposals(load_rules(), mod, 0, 2)
             if "shared_memory_tiling" in {s["rule"] for s in st}]
    assert len(tiled) == 1
    rules = [s["rule"] for s in tiled[0]]
    assert rules[:2] == ["thread_block_rebinding", "loop_binding"] and "register_tiling" in rules
    last = parse_program(tiled[0][-1]["leir"])
    assert "f32,s" in tiled[0][-1]["leir"] and "f32,l" in tiled[0][-1]["leir"] and len(last.nests) == 1
    assert _verified_steps(mod, tiled[0])
