"""`stp search --runner pack`: the whole round loop on a machine without a GPU (issue 37).

The search writes each round as a GPU pack and exits 3; the pack runs on the simulated device
(`STP_CUDA_SIM=1`, the runtime-only runner `python -m steptp.gpu.run`); the same command then
reads the results and goes on, to a re-time round and a summary with the speedup over the
original and, where the program came from a .py file and torch imports, vs PyTorch eager."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
STP = Path(sys.executable).parent / "stp"


def _search(out: Path, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(STP), "search", str(ROOT / "examples" / "softmax.py"), "-o", str(out), "--device",
                           "cuda", "--runner", "pack", "-n", "1", "--measure", "3", "-q", *extra],
                          capture_output=True, text=True, timeout=900)


def _node(pack: str, results: str) -> None:
    env = {**os.environ, "STP_CUDA_SIM": "1"}
    r = subprocess.run([sys.executable, "-m", "steptp.gpu.run", pack, "-o", results, "--time"], capture_output=True,
                       text=True, timeout=900, env=env)
    assert r.returncode == 0, r.stdout + r.stderr


def test_round_loop_through_packs_on_the_simulated_device(tmp_path):
    out = tmp_path / "s"
    r = _search(out)
    assert r.returncode == 3, r.stdout + r.stderr
    assert "python -m steptp.gpu.run" in r.stdout and "waiting for measurements" in r.stdout
    pack = out / "rounds" / "0" / "pack"
    manifest = json.loads((pack / "manifest.json").read_text())
    assert 1 <= len(manifest["entries"]) <= 3
    # rerun without results: still waiting, the round is not built again
    stamp = (pack / "manifest.json").stat().st_mtime_ns
    r = _search(out)
    assert r.returncode == 3 and (pack / "manifest.json").stat().st_mtime_ns == stamp
    rounds = 0
    while r.returncode == 3:
        k = json.loads((out / "rounds" / "state.json").read_text())["pending"]["round"]
        _node(str(out / "rounds" / str(k) / "pack"), str(out / "rounds" / str(k) / "results"))
        r = _search(out)
        rounds += 1
        assert rounds <= 3, r.stdout + r.stderr
    assert r.returncode == 0, r.stdout + r.stderr
    summary = json.loads((out / "summary.json").read_text())
    sm = summary["programs"][0]
    assert sm["runner"] == "pack" and sm["samples"] >= 1 and sm["rounds"] == 1
    assert sm["speedup"] >= 1.0
    if sm["speedup"] > 1.0:  # reported only from the re-time round, with its interval above 1
        assert sm["retimed"] and sm["speedup_ci"][0] > 1.0 and sm["trajectory"]
    # PyTorch eager beside the program (torch imports in this venv): a number
    assert isinstance(sm["speedup_vs_eager"], float) and sm["speedup_vs_eager"] > 0, sm
    assert (out / "softmax" / "best.leir").exists() and "vs PyTorch eager" in (out / "report.md").read_text()
    # how the GPU cost models ranked what was measured (one program: no held-out learned model)
    rank = summary["ranking"]
    assert rank["static"]["groups"] <= 1 and "reason" in rank["learned"]
    # done: the same command prints the same summary
    again = _search(out)
    assert again.returncode == 0 and json.loads((out / "summary.json").read_text()) == summary


def test_runner_pack_refuses_what_it_cannot_do(tmp_path):
    r = subprocess.run([str(STP), "search", str(ROOT / "examples" / "softmax.leir"), "-o", str(tmp_path / "x"),
                        "--device", "cuda", "--runner", "pack", "--algorithm", "mcts"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and "greedy or beam" in r.stderr and "Traceback" not in r.stderr
    r = subprocess.run([str(STP), "search", str(ROOT / "examples" / "softmax.leir"), "-o", str(tmp_path / "y"),
                        "--runner", "pack"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and "--device cuda" in r.stderr


def test_a_round_does_not_depend_on_the_worker_count(tmp_path):
    """-j 2 proposes and verifies the programs in two processes: the round's entries are the
    same as in one."""
    progs = [str(ROOT / "examples" / "softmax.leir"), str(ROOT / "examples" / "gelu.leir")]
    rounds = {}
    for j in ("1", "2"):
        out = tmp_path / f"j{j}"
        r = subprocess.run([str(STP), "search", *progs, "-o", str(out), "--device", "cuda", "--runner", "pack",
                            "-n", "1", "--measure", "2", "-q", "-j", j], capture_output=True, text=True, timeout=900)
        assert r.returncode == 3, r.stdout + r.stderr
        rounds[j] = (out / "rounds" / "0" / "dictionary.jsonl").read_text()
    assert rounds["1"] == rounds["2"] and rounds["1"].count("\n") == 4


def test_levels_and_a_retime_taken_by_the_node_in_the_same_call(tmp_path):
    """--levels 2 proposes from the static model's best programs of level 1 too (two-step
    trajectories in the first round); the node's --retime-best 1 measures each program's
    fastest entry a second time in the same call, so the search ends without a re-time pack;
    -n lowered while a round waits ends the search with what was measured."""
    out = tmp_path / "s"
    r = _search(out, "--levels", "2", "--no-sim")
    assert r.returncode == 3, r.stdout + r.stderr
    assert "--retime-best 1" in r.stdout
    entries = [json.loads(x) for x in (out / "rounds" / "0" / "dictionary.jsonl").read_text().splitlines()]
    state = json.loads((out / "rounds" / "state.json").read_text())
    depths = [len(c["steps"]) for c in state["pending"]["candidates"]["softmax"]]
    assert len(entries) == len(depths) and max(depths) >= 2, depths
    manifest = json.loads((out / "rounds" / "0" / "pack" / "manifest.json").read_text())
    assert not any("sim" in k for e in manifest["entries"] for k in e), "--no-sim packs carry no CPU builds"
    results = out / "rounds" / "0" / "results"
    r = subprocess.run([sys.executable, "-m", "steptp.gpu.run", str(out / "rounds" / "0" / "pack"), "-o",
                        str(results), "--retime-best", "1", "-q"], capture_output=True, text=True, timeout=900)
    assert r.returncode == 2 and "only with --time" in r.stderr
    # a --no-sim pack cannot run on the simulated device; rebuild the round's pack with sim builds
    import shutil

    shutil.rmtree(out)
    r = _search(out, "--levels", "2", "-n", "2")
    assert r.returncode == 3, r.stdout + r.stderr
    env = {**os.environ, "STP_CUDA_SIM": "1"}
    r = subprocess.run([sys.executable, "-m", "steptp.gpu.run", str(out / "rounds" / "0" / "pack"), "-o",
                        str(results), "--time", "--retime-best", "1", "-q"], capture_output=True, text=True,
                       timeout=900, env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    again = [json.loads(x) for x in (results / "retime.jsonl").read_text().splitlines()]
    firsts = {json.loads(x)["id"]: json.loads(x) for x in (results / "results.jsonl").read_text().splitlines()}
    assert len(again) == 1 and again[0]["id"] in firsts and "speedup" in again[0]["timing"]
    best = max((f for f in firsts.values() if f["transformed"]["equal"] and "speedup" in f.get("timing", {})),
               key=lambda f: f["timing"]["speedup"])
    assert again[0]["id"] == best["id"]
    assert json.loads((results / "summary.json").read_text())["retime"]["done"] == 1
    r = _search(out, "--levels", "2", "-n", "2")
    waiting = r.returncode == 3
    assert r.returncode in (0, 3), r.stdout + r.stderr  # 0: round 0 improved nothing (stalled)
    # -n lowered while round 1 waits: the search ends with round 0's measurements, and the
    # node's second measurement stands in for a re-time pack round
    r = _search(out, "--levels", "2", "-n", "1")
    assert r.returncode == 0, r.stdout + r.stderr
    dirs = sorted(p.name for p in (out / "rounds").iterdir() if p.is_dir())
    assert dirs == (["0", "1"] if waiting else ["0"]), dirs
    assert not (out / "rounds" / "1" / "results").exists()
    sm = json.loads((out / "summary.json").read_text())["programs"][0]
    assert sm["rounds"] == 1
    if sm["trajectory"]:
        assert sm["retimed"] and sm["speedup_ci"][0] > 1.0
    else:  # nothing beat the original on the simulated device, or the re-time did not reproduce it
        assert sm["speedup"] == 1.0 and (sm["reason"] or not sm["retimed"])


def test_shipped_gpu_samples_and_their_export(tmp_path, monkeypatch):
    """The package ships the H200 search's GPU samples (the default GPU model's rows): every
    row's texts parse, a searched program's own rows are left out, export_samples writes
    the same rows back from a round state, and the shipped model ranks held out by program."""
    import math

    from steptp.leir import parse_leir
    from steptp.search import rounds as R

    rows = R.shipped_rows()
    assert len(rows) >= 700 and R.SHIPPED_SAMPLES.stat().st_size < 200_000
    roots = sorted({r[0] for r in rows})
    assert len(roots) == 40
    for root, cand, ls in rows[:25]:
        parse_leir(root), parse_leir(cand)
        assert math.isfinite(ls)
    mine = [r for r in rows if r[0] == roots[0]]
    assert mine and len(R.shipped_rows([roots[0]])) == len(rows) - len(mine)
    # a round state holding two programs' rows: export, read back through shipped_rows
    state = {"programs": {}}
    for n, root in enumerate(roots[:2]):
        state["programs"][f"p{n}"] = {"root": root, "measured": {
            f"c{i}": {"equal": True, "speedup": math.exp(ls), "text": cand}
            for i, (_, cand, ls) in enumerate(r for r in rows if r[0] == root)}}
    (tmp_path / "state.json").write_text(json.dumps(state))
    out = tmp_path / "s.json.gz"
    counts = R.export_samples(tmp_path / "state.json", out, "test GPU")
    assert counts["programs"] == 2 and counts["rows"] == sum(len(p["measured"]) for p in state["programs"].values())
    monkeypatch.setattr(R, "SHIPPED_SAMPLES", out)
    monkeypatch.setattr(R, "_SHIPPED", None)
    back = R.shipped_rows()
    assert sorted((a, b) for a, b, _ in back) == sorted((a, b) for a, b, _ in rows if a in roots[:2])
    assert all(abs(x - y) < 1e-5 for x, y in zip(sorted(c for *_, c in back),
                                                    sorted(c for a, _, c in rows if a in roots[:2])))
    # held out by program: each program is ranked by a model of the other's rows only
    rank = R.ranking_quality(state)
    assert rank["shipped"]["groups"] == 2 and rank["shipped"]["tau"] is not None
    monkeypatch.setattr(R, "_SHIPPED", None)


def test_a_rebinding_that_enables_a_cross_thread_reduction_is_proposed_as_two_steps():
    """64 rows of 256 summed serially in one block of 64 threads: the row sum cannot go to
    threads (64 x 256 > 1024) until the rows move to blocks (thread_block_rebinding, slower
    alone); the round search proposes the pair as two verified steps."""
    from steptp.leir import parse_leir
    from steptp.search.cost import static_scores
    from steptp.search.rounds import RoundConfig, verified_candidates

    root = ("% program: rowsum\n% input A: f32[64,256]\n% output E: f32[64]\n"
            "B^{64}_{tx=0}L^{256}_{a=0}[E^{f32,g}_{tx}=E^{f32,g}_{tx}+A^{f32,g}_{tx,a};];\n")
    prog = {"root": root, "frontier": [{"text": root, "steps": [], "speedup": 1.0, "ci": [1.0, 1.0],
                                        "time_us": None}], "tried": []}
    found, _ = verified_candidates("rowsum", prog, RoundConfig(measure=2, per_rule=2), 0)
    pairs = [(t, st) for t, st in found if [s["rule"] for s in st] == ["thread_block_rebinding",
                                                                        "reduction_thread_binding"]]
    assert pairs, [[s["rule"] for s in st] for _, st in found]
    text = pairs[0][0]
    body = [x for x in text.splitlines() if not x.startswith("%")][0]
    assert body.startswith("B^{64}_{b") and "B^{256}_{t" in body, body
    assert static_scores(parse_leir(root).program, [parse_leir(text).program], "cuda")[0] > 0.5


def test_macro_sequences_bind_fuse_and_join_the_bias_of_a_linear_layer_in_one_kernel():
    """The translator's Linear (a GEMM nest, then a bias-add nest over the same spatial loops)
    is two kernels; the canonical sequence "bind every nest, fuse, epilogue fusion" makes it one
    bound kernel, every step recorded and verified (issue 37: launches dominate at microseconds)."""
    from steptp.leir import parse_leir
    from steptp.search.proposals import MACRO_SEQUENCES
    from steptp.search.rounds import RoundConfig, verified_candidates
    from steptp.verify import verify_pair

    root = ("% program: linear\n% input A: f32[8,16]\n% param C: f32[96,16]\n% param D: f32[96]\n"
            "% output E: f32[8,96]\n"
            "B^{8}_{tx=0}L^{96}_{a=0}L^{16}_{c=0}[E^{f32,g}_{tx,a}=E^{f32,g}_{tx,a}+A^{f32,g}_{tx,c}*C^{f32,g}_{a,c};];\n"
            "B^{8}_{tx=0}L^{96}_{a=0}[E^{f32,g}_{tx,a}=E^{f32,g}_{tx,a}+D^{f32,g}_{a};];\n")
    assert ("loop_binding", "operator_fusion", "epilogue_fusion") in MACRO_SEQUENCES
    prog = {"root": root, "frontier": [{"text": root, "steps": [], "speedup": 1.0, "ci": [1.0, 1.0],
                                        "time_us": None}], "tried": []}
    found, _ = verified_candidates("linear", prog, RoundConfig(measure=2, per_rule=1), 0)
    seq = [(t, st) for t, st in found if [s["rule"] for s in st] == ["loop_binding", "loop_binding",
                                                                     "epilogue_fusion"]]
    assert seq, [[s["rule"] for s in st] for _, st in found]
    text, steps = seq[0]
    prog_after = parse_leir(text).program
    assert len(prog_after.nests) == 1  # one kernel
    body = [x for x in text.splitlines() if not x.startswith("%")][0]
    # both nests were bound alike (same axis, same index), so the bias nest could join the GEMM
    ax = steps[0]["params"]["ax"]
    assert steps[1]["params"] == {"ax": ax}
    assert body.startswith(f"B^{{8}}_{{tx=0}}B^{{96}}_{{{ax}a=0}}[L^{{16}}_{{c=0}}["), body
    assert verify_pair(parse_leir(root), parse_leir(text), seed=0).ok


def test_the_summary_median_of_an_even_count_is_the_mean_of_the_two_middle_speedups():
    """40 programs have two middle values: the median is their mean (the H200 summary first
    printed the upper one, 11.45x instead of 10.72x)."""
    from steptp.search.rounds import _aggregate

    rows = [{"speedup": s, "speedup_vs_eager": None} for s in (1.0, 2.0, 4.0, 30.0)]
    agg = _aggregate(rows)
    assert agg["median_speedup"] == 3.0 and abs(agg["geomean_speedup"] - (240.0 ** 0.25)) < 1e-9
    assert _aggregate(rows[:3])["median_speedup"] == 2.0


def test_a_long_serial_reduction_is_split_over_threads_by_an_rfactor_chain():
    """A dot product per row, 2048 long, serial in each of 16 threads of one block: rfactor
    alone adds a pass; binding its partial results' new loop (the follow-up, in the nests the
    rfactor changed) spreads the reduction (split-K). Proposed as two verified steps."""
    from steptp.leir import parse_leir
    from steptp.search.cost import static_scores
    from steptp.search.proposals import CHAINS
    from steptp.search.rounds import RoundConfig, verified_candidates
    from steptp.verify import verify_pair

    assert CHAINS["reduction_factorization"] == ("loop_binding",)
    root = ("% program: gemv\n% input A: f32[16,2048]\n% param C: f32[2048]\n% output E: f32[16]\n"
            "B^{16}_{tx=0}L^{2048}_{a=0}[E^{f32,g}_{tx}=E^{f32,g}_{tx}+A^{f32,g}_{tx,a}*C^{f32,g}_{a};];\n")
    prog = {"root": root, "frontier": [{"text": root, "steps": [], "speedup": 1.0, "ci": [1.0, 1.0],
                                        "time_us": None}], "tried": []}
    found, _ = verified_candidates("gemv", prog, RoundConfig(measure=2, per_rule=2), 0)
    pairs = [(t, st) for t, st in found if [s["rule"] for s in st] == ["reduction_factorization", "loop_binding"]]
    assert pairs, [[s["rule"] for s in st] for _, st in found]
    for text, _ in pairs:
        nests = parse_leir(text).program.nests
        assert len(nests) == 2 and sum(lp.kind == "B" for lp in nests[0].loops) == 2, text  # partials bound
        assert verify_pair(parse_leir(root), parse_leir(text), seed=0).ok
    assert max(static_scores(parse_leir(root).program, [parse_leir(t).program for t, _ in pairs], "cuda")) > 0.5


def test_the_level_expansion_keeps_one_program_per_family_of_rules():
    """Within a level the expansion takes the best of each distinct *set* of rules first: two
    variants of one macro sequence (the same rules in another order) count once, so with
    ``expand`` 2 a program of another family still gets expanded (on Conv2d_ReLU_MaxPool_
    Flatten_Gemm the split-K chain grows from such a program); the pack screening keeps
    distinct sequences apart."""
    from steptp.search.rounds import _diverse

    def st(*rules):
        return [{"rule": r} for r in rules]

    steps = [st("loop_reorder", "loop_binding", "block_fusion"), st("loop_binding", "loop_reorder", "block_fusion"),
             st("operator_fusion", "loop_binding"), st("loop_binding", "operator_fusion")]
    assert _diverse([0, 1, 2, 3], steps, 2, family=True) == [0, 2]
    assert _diverse([0, 1, 2, 3], steps, 2) == [0, 1]
    assert _diverse([0, 1, 2, 3], steps, 4, family=True) == [0, 2, 1, 3]
