"""Paper-scale composition (--per-rule N), order-independent output files, and `stp dataset --ray`."""

import hashlib
import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from steptp.cli import app
from steptp.dataset.generate import Options
from steptp.dataset.pipeline import generate_dataset

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
RULES = ROOT / "rules"
runner = CliRunner()
FILES = ("dictionary.jsonl", "attempts.jsonl", "chat_single.jsonl", "chat_multi.jsonl", "report.json")


def rows(path):
    return [json.loads(l) for l in Path(path).read_text().splitlines() if l.strip()]


def digests(out: Path) -> dict:
    return {f: hashlib.sha256((out / f).read_bytes()).hexdigest() for f in FILES}


def _opts(**kw) -> Options:
    base = dict(seed=0, with_cuda=False, nvcc=False, isolated=False,
                rule_paths=[str(RULES / "loop_split.yaml"), str(RULES / "loop_reorder.yaml")])
    base.update(kw)
    return Options(**base)


def test_per_rule_samples_n_distinct_verified_steps_reproducibly(tmp_path):
    from steptp.engine import list_candidates
    from steptp.leir import load_leir
    from steptp.rules import load_rule

    src = EXAMPLES / "softmax.leir"
    n_cands = len(list_candidates(load_rule(RULES / "loop_split.yaml"), load_leir(src)))
    assert n_cands >= 3
    one = generate_dataset([str(src)], tmp_path / "n1", _opts(per_rule=1), progress=False)
    three = generate_dataset([str(src)], tmp_path / "n3", _opts(per_rule=3), progress=False)
    assert one["by_strategy"]["loop_split"] == 1 and three["by_strategy"]["loop_split"] == 3
    e1 = [e for e in rows(tmp_path / "n1" / "dictionary.jsonl") if e["strategy"]["id"] == "loop_split"]
    e3 = [e for e in rows(tmp_path / "n3" / "dictionary.jsonl") if e["strategy"]["id"] == "loop_split"]
    assert len({e["transformed"]["leir"] for e in e3}) == 3  # distinct steps (sites x parameters)
    assert len({json.dumps([e["site"], e["params"]], sort_keys=True) for e in e3}) == 3
    assert e1[0]["id"] == e3[0]["id"]  # N samples extend the N=1 sample: same seeded order
    assert all(e["verification"]["equal"] for e in e3)
    # loop_reorder has fewer candidates than N here: it yields what exists, no duplicates
    reorders = [e for e in rows(tmp_path / "n3" / "dictionary.jsonl") if e["strategy"]["id"] == "loop_reorder"]
    assert len(reorders) == len({e["transformed"]["leir"] for e in reorders}) <= 3
    again = generate_dataset([str(src)], tmp_path / "n3b", _opts(per_rule=3), progress=False)
    assert again == three and digests(tmp_path / "n3b") == digests(tmp_path / "n3")


def test_per_rule_cli_and_the_try_budget(tmp_path):
    out = tmp_path / "cli"
    res = runner.invoke(app, ["dataset", str(EXAMPLES / "scale_bias.leir"), "-o", str(out), "--in-process", "-q",
                              "--no-cuda", "--no-nvcc", "--rule", str(RULES / "loop_split.yaml"), "--per-rule", "2",
                              "--max-tries", "1"])
    assert res.exit_code == 0, res.output
    run = json.loads((out / "run.json").read_text())
    assert (run["per_rule"], run["max_tries"]) == (2, 1)
    attempts = rows(out / "attempts.jsonl")
    assert len(attempts) <= 2  # max_tries x per_rule candidates verified at most
    assert len(rows(out / "dictionary.jsonl")) == sum(a["outcome"] == "equal" for a in attempts)


@pytest.mark.slow
def test_ray_two_workers_byte_identical_and_resumes(tmp_path):
    ray = pytest.importorskip("ray")
    sources = [str(EXAMPLES / n) for n in ("gelu.leir", "scale_bias.leir", "softmax.leir")]  # discovery order
    opts = _opts(per_rule=2)
    single = tmp_path / "single"
    generate_dataset(sources, single, opts, progress=False)

    ray.init(num_cpus=2, include_dashboard=False, logging_level="ERROR", log_to_driver=False,
             object_store_memory=100 * 1024 * 1024)
    try:
        assert ray.cluster_resources()["CPU"] == 2
        dist = tmp_path / "ray"
        generate_dataset(sources, dist, opts, progress=False, use_ray=True, workers=2)
        assert digests(dist) == digests(single)
        # resume semantics: an interrupted run (first program recorded, the rest lost) continues
        part = tmp_path / "resumed"
        generate_dataset(sources[:1], part, opts, progress=False, use_ray=True, workers=2)
        with open(part / "dictionary.jsonl", "a") as f:
            f.write('{"id": "torn"')  # killed while writing the next program
        generate_dataset(sources, part, opts, progress=False, use_ray=True, workers=2)
        assert digests(part) == digests(single)
        assert [s["key"] for s in rows(part / "state.jsonl")] == [s["key"] for s in rows(single / "state.jsonl")]
    finally:
        ray.shutdown()


def test_parallel_workers_write_the_same_bytes_as_one(tmp_path):
    sources = [str(EXAMPLES / n) for n in ("scale_bias.leir", "gelu.leir")]
    opts = _opts(rule_paths=[str(RULES / "loop_reorder.yaml")])
    generate_dataset(sources, tmp_path / "j1", opts, progress=False)
    generate_dataset(sources, tmp_path / "j2", opts, progress=False, workers=2)
    assert digests(tmp_path / "j2") == digests(tmp_path / "j1")


def test_reused_cuda_artifacts_equal_a_fresh_lowering(tmp_path):
    """Entries store the GPU TIR and CUDA source produced once during verification (and
    compiled by the per-program batched nvcc run when nvcc exists): they must be exactly
    what lowering the stored LEIR gives."""
    from steptp.backend import cuda_source, lower
    from steptp.leir.fileformat import LeirModule, Signature, TensorDecl
    from steptp.leir.parser import parse_program

    out = tmp_path / "cuda"
    generate_dataset([str(EXAMPLES / "softmax.leir")], out,
                     _opts(with_cuda=True, nvcc=True, rule_paths=[str(RULES / "loop_reorder.yaml")], per_rule=2),
                     progress=False)
    entries = rows(out / "dictionary.jsonl")
    assert entries
    for e in entries:
        sig = Signature(e["signature"]["name"], tuple(TensorDecl(t["name"], t["role"], t["dtype"], tuple(t["shape"]))
                                                      for t in e["signature"]["tensors"]))
        m = LeirModule(sig, parse_program(e["transformed"]["leir"]))
        assert e["transformed"]["tir"] == lower(m, target="cuda")
        assert e["transformed"]["cuda"] == cuda_source(m)
        assert e["verification"]["equal"] and e["verification"]["nvcc"] == (shutil.which("nvcc") is not None)
    assert all(a["outcome"] == "equal" for a in rows(out / "attempts.jsonl"))


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not on PATH")
def test_programs_batched_into_one_nvcc_run_give_the_same_bytes(tmp_path, monkeypatch):
    """process_batch compiles the candidates of several programs in one nvcc run; the
    files are those of one program per batch, with fewer nvcc runs."""
    from steptp.backend import build as build_mod

    calls = []
    real = build_mod._run_nvcc
    monkeypatch.setattr(build_mod, "_run_nvcc", lambda *a, **k: calls.append(a[3]) or real(*a, **k))
    sources = [str(EXAMPLES / n) for n in ("gelu.leir", "scale_bias.leir", "softmax.leir")]
    opts = _opts(with_cuda=True, nvcc=True)
    generate_dataset(sources, tmp_path / "b1", opts, progress=False, batch=1)
    runs_one = len(calls)
    calls.clear()
    build_mod._NVCC_OK.clear()  # kernels compiled above would not be compiled again
    generate_dataset(sources, tmp_path / "b3", opts, progress=False, batch=3)
    assert digests(tmp_path / "b3") == digests(tmp_path / "b1")
    assert runs_one == 3 and len(calls) == 1
    # every kernel of a third run was compiled by nvcc in this process already: no nvcc run, same files
    calls.clear()
    generate_dataset(sources, tmp_path / "again", opts, progress=False, batch=3)
    assert digests(tmp_path / "again") == digests(tmp_path / "b1") and calls == []
    entries = rows(tmp_path / "b3" / "dictionary.jsonl")
    assert {e["source"].rsplit("/", 1)[1] for e in entries} == {"gelu.leir", "scale_bias.leir", "softmax.leir"}
    assert all(e["verification"]["nvcc"] and e["transformed"]["cuda"] for e in entries)


def test_program_batches_keep_order_and_feed_every_worker():
    from steptp.dataset.pipeline import program_batches

    todo = list(range(80))
    assert program_batches(todo, 1, 8) == [todo[i:i + 8] for i in range(0, 80, 8)]
    assert program_batches(todo, 2, 8) == [todo[i:i + 8] for i in range(0, 80, 8)]
    assert program_batches(todo[:27], 2, 8) == [todo[i:min(i + 4, 27)] for i in range(0, 27, 4)]  # 4+ per worker
    assert program_batches(todo[:3], 4, 8) == [[0], [1], [2]]
    assert program_batches(todo[:3], 1, 8) == [[0, 1, 2]]                 # one worker: no balancing
    assert program_batches([], 2, 8) == []


def test_unreachable_ray_address_fails_fast_and_writes_nothing(tmp_path):
    import socket
    import time

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = tmp_path / "ray-out"
    t0 = time.monotonic()
    res = runner.invoke(app, ["dataset", str(EXAMPLES / "gelu.leir"), "-o", str(out), "-q",
                              "--ray-address", f"ray://127.0.0.1:{port}"])
    assert res.exit_code == 1 and f"cannot reach the Ray cluster at ray://127.0.0.1:{port}" in res.output
    assert time.monotonic() - t0 < 30 and not out.exists()
    res = runner.invoke(app, ["dataset", str(EXAMPLES / "gelu.leir"), "-o", str(out), "-q", "--ray-address", "nohost"])
    assert res.exit_code == 1 and "bad Ray cluster address 'nohost'" in res.output and not out.exists()
