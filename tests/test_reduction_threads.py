"""Cross-thread reductions: a reduction axis bound to threadIdx (rule reduction_thread_binding).

LEIR semantics: a ``B`` loop over a reduction axis of a sum / product / max / min accumulation
is still a loop; the CPU verification form runs it serially (exact), the CUDA form lets TVM's
``LowerCrossThreadReduction`` combine the threads' shares (warp shuffles, shared memory across
warps). The GPU preflight accepts exactly the reductions TVM lowers that way.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from steptp.backend import cuda_source, nvcc_check, nvcc_path, run_cpu
from steptp.backend.cuda_runtime import compile_ptx
from steptp.backend.errors import PreflightError
from steptp.backend.preflight import gpu_problems, preflight
from steptp.engine import apply_rule, checked_candidates
from steptp.leir import load_leir, parse_leir
from steptp.leir.printer import format_program
from steptp.rules import load_rules
from steptp.rules.tools import EXTRA_STRATEGIES, PAPER_STRATEGIES, CoverageRow, format_coverage
from steptp.verify import verify_pair

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
STP = Path(sys.executable).parent / "stp"
RULE = {r.id: r for r in load_rules()}["reduction_thread_binding"]
ALLREDUCE = ("__shfl_down_sync", "red_buf")   # warp shuffle / shared-memory reduction buffer


def _steps(path: Path):
    m = load_leir(path)
    rows = checked_candidates(RULE, m)
    return m, [step for _s, _p, step, why in rows if step is not None]


@pytest.mark.parametrize("name, n_steps", [
    ("softmax", 4),          # max and sum nests, each on ty or tz (tx is taken by the rows)
    ("log_softmax", 4),
    ("mean_reduction", 2),   # the inner reduction c on ty or tz (a is spatial: never bound)
    ("max_reduction", None),
    ("softmax_3d", None),
])
def test_rule_steps_verify_on_cpu_and_lower_to_an_allreduce(name, n_steps):
    m, steps = _steps(EXAMPLES / f"{name}.leir")
    assert steps, f"no step of reduction_thread_binding on {name}"
    if n_steps is not None:
        assert len(steps) == n_steps, [format_program(s.after.program) for s in steps]
    for step in steps:
        art: dict = {}
        res = verify_pair(m, step.after, trials=2, artifacts=art)
        assert res.equal, res.reason
        assert any(x in art["cuda"] for x in ALLREDUCE), art["cuda"]
        # the reference lowering has no all-reduce: each row is one thread's serial loop
    assert not any(x in cuda_source(m) for x in ALLREDUCE)


def test_cpu_form_is_exact_for_a_non_multiple_of_32_max_with_infinities():
    before = parse_leir("% program: rowmax\n% input A: f32[6,100]\n% output D: f32[6]\n"
                        "B^{6}_{bx=0}L^{100}_{a=0}[D^{f32,g}_{bx}=max(D^{f32,g}_{bx},A^{f32,g}_{bx,a});];\n")
    step = apply_rule(RULE, before, params={"ax": "tx"})
    assert format_program(step.after.program) == \
        "B^{6}_{bx=0}B^{100}_{txa=0}[D^{f32,g}_{bx}=max(D^{f32,g}_{bx},A^{f32,g}_{bx,txa});];"
    a = np.random.default_rng(0).standard_normal((6, 100)).astype(np.float32)
    a[2] = -np.inf                     # the identity -inf survives (TVM's own max reducer uses -3.4e38)
    a[3, 99] = np.inf
    want = run_cpu(before, {"A": a})["D"]
    got = run_cpu(step.after, {"A": a})["D"]
    assert np.array_equal(got, a.max(1)) and np.array_equal(got, want)
    assert got[2] == -np.inf and got[3] == np.inf
    cu = cuda_source(step.after)
    assert "red_buf" in cu and "__launch_bounds__(100)" in cu   # 100 threads: a masked shared-memory tree


@pytest.mark.needs("cuda_compiler")
def test_the_cuda_compiler_compiles_the_allreduce_kernels(tmp_path):
    """nvcc (the Build pass's batched round) when on the PATH, else NVRTC: the compiler the
    package itself uses without nvcc (compile_ptx)."""
    mods = []
    for name in ("softmax", "log_softmax", "mean_reduction"):
        mods += [s.after for s in _steps(EXAMPLES / f"{name}.leir")[1]]
    mods.append(parse_leir("% program: l1\n% input A: f16[8,48]\n% output D: f16[8]\n"
                           "B^{8}_{bx=0}B^{48}_{tx=0}[D^{f16,g}_{bx}=D^{f16,g}_{bx}+abs(A^{f16,g}_{bx,tx});];\n"))
    if nvcc_path() is not None:
        res = nvcc_check(mods)
        assert len(res) == len(mods) and all(r.ok for r in res), [r.to_dict() for r in res if not r.ok]
        return
    for m in mods:
        ptx = compile_ptx(cuda_source(m), tmp_path).read_text()
        assert ".entry" in ptx and ("shfl.sync" in ptx or "bar.sync" in ptx), ptx[:400]


def test_preflight_accepts_thread_reductions_and_rejects_races():
    hdr = "% program: p\n% input A: f32[4,8,16]\n% output D: f32[4]\n"
    ok = {
        "sum": "B^{4}_{bx=0}B^{16}_{tx=0}[D^{f32,g}_{bx}=D^{f32,g}_{bx}+A^{f32,g}_{bx,0,tx};];",
        "prod": "B^{4}_{bx=0}B^{16}_{tx=0}[D^{f32,g}_{bx}=D^{f32,g}_{bx}*A^{f32,g}_{bx,0,tx};];",
        "min": "B^{4}_{bx=0}B^{16}_{tx=0}[D^{f32,g}_{bx}=min(D^{f32,g}_{bx},A^{f32,g}_{bx,0,tx});];",
        "inner serial reduction": "B^{4}_{bx=0}B^{8}_{tx=0}L^{16}_{c=0}[D^{f32,g}_{bx}=D^{f32,g}_{bx}+A^{f32,g}_{bx,tx,c};];",
        "two thread axes": "B^{4}_{bx=0}B^{8}_{ty=0}B^{16}_{tx=0}[D^{f32,g}_{bx}=D^{f32,g}_{bx}+A^{f32,g}_{bx,ty,tx};];",
    }
    for what, body in ok.items():
        m = parse_leir(hdr + body + "\n")
        assert gpu_problems(m) == [], what
        cu = cuda_source(m)
        assert any(x in cu for x in ALLREDUCE), what
        a = np.random.default_rng(1).standard_normal((4, 8, 16)).astype(np.float32)
        assert np.isfinite(run_cpu(m, {"A": a})["D"]).all()
    bad = {
        "blockIdx": ("B^{4}_{tx=0}B^{16}_{bx=0}[D^{f32,g}_{tx}=D^{f32,g}_{tx}+A^{f32,g}_{tx,0,bx};];",
                     "thread blocks cannot accumulate"),
        "plain store": ("B^{4}_{bx=0}B^{16}_{tx=0}[D^{f32,g}_{bx}=A^{f32,g}_{bx,0,tx};];", "race"),
        "subtraction": ("B^{4}_{bx=0}B^{16}_{tx=0}[D^{f32,g}_{bx}=D^{f32,g}_{bx}-A^{f32,g}_{bx,0,tx};];",
                        "needs an accumulation"),
        "accumulator second": ("B^{4}_{bx=0}B^{16}_{tx=0}[D^{f32,g}_{bx}=A^{f32,g}_{bx,0,tx}+D^{f32,g}_{bx};];",
                               "accumulator first"),
        "written before": ("B^{4}_{bx=0}[D^{f32,g}_{bx}=A^{f32,g}_{bx,0,0};];"
                           "B^{4}_{bx=0}B^{16}_{tx=0}[D^{f32,g}_{bx}=D^{f32,g}_{bx}+A^{f32,g}_{bx,0,tx};];",
                           "initialise its accumulator"),
        "spatial loop inside": ("B^{4}_{bx=0}B^{16}_{tx=0}L^{8}_{a=0}[E^{f32,g}_{bx,a}=E^{f32,g}_{bx,a}+A^{f32,g}_{bx,a,tx};];"
                                "B^{4}_{bx=0}L^{8}_{a=0}[D^{f32,g}_{bx}=D^{f32,g}_{bx}+E^{f32,g}_{bx,a};];",
                                "not reduction axes"),
    }
    for what, (body, needle) in bad.items():
        m = parse_leir(hdr + body + "\n")
        probs = gpu_problems(m)
        assert any(needle in p for p in probs), (what, probs)
        with pytest.raises(PreflightError):
            preflight(m)


def test_too_many_threads_needs_a_split_first():
    m = parse_leir("% program: big\n% input A: f32[4,2048]\n% output D: f32[4]\n"
                   "B^{4}_{bx=0}L^{2048}_{a=0}[D^{f32,g}_{bx}=D^{f32,g}_{bx}+A^{f32,g}_{bx,a};];\n")
    assert checked_candidates(RULE, m) == [] or all(step is None for *_x, step, _w in checked_candidates(RULE, m))
    split = {r.id: r for r in load_rules()}["loop_split"]
    s1 = apply_rule(split, m, site={"loop": 1}, params={"f": 512})   # a -> d*512+e, e serial inner
    step = apply_rule(RULE, s1.after, site={"loop": 2}, params={"ax": "tx"})
    assert "B^{512}_{tx" in format_program(step.after.program)
    assert verify_pair(m, step.after, trials=1).equal
    assert "red_buf" in cuda_source(step.after) or "__shfl_down_sync" in cuda_source(step.after)


def test_coverage_counts_the_extra_strategy_on_top_of_the_papers():
    assert "reduction_thread_binding" in EXTRA_STRATEGIES and "reduction_thread_binding" not in PAPER_STRATEGIES
    assert len(PAPER_STRATEGIES) == 43
    rows = [CoverageRow("loop_split", equal=1, tried=1), CoverageRow("reduction_thread_binding", equal=2, tried=2)]
    assert format_coverage(rows).splitlines()[-1] == "strategies with a verified transformation: 2/44"
    assert format_coverage(rows[:1]).splitlines()[-1] == "strategies with a verified transformation: 1/43"


@pytest.mark.needs("cuda_compiler")
def test_simulated_device_runs_the_bound_reduction(tmp_path):
    """STP_CUDA_SIM=1: real GPU-form lowering, TVM CUDA codegen and PTX (nvcc, else NVRTC); the simulator
    then runs the program's CPU build (it does not execute PTX, so the warp shuffles
    themselves are not exercised here)."""
    orig = EXAMPLES / "log_softmax.leir"
    cand = tmp_path / "cand.leir"
    r = subprocess.run([str(STP), "apply", str(ROOT / "rules" / "reduction_thread_binding.yaml"), str(orig),
                        "--site", "0", "-o", str(cand)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    env = {**os.environ, "STP_CUDA_SIM": "1", "STP_PTX_CACHE": str(tmp_path / "ptx")}
    env.pop("STP_CUDA_SIM_FAULT", None)
    r = subprocess.run([str(STP), "verify", str(orig), str(cand), "--device", "cuda"], capture_output=True,
                       text=True, env=env, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "Equal  pass" in r.stdout and "device cuda" in r.stdout
    ptx = list((tmp_path / "ptx").glob("*.ptx"))
    assert ptx and any("shfl.sync" in p.read_text() or "bar.sync" in p.read_text() for p in ptx)
    r = subprocess.run([str(STP), "lower", "--cuda", str(cand)], capture_output=True, text=True)
    assert r.returncode == 0 and any(x in r.stdout for x in ALLREDUCE), r.stderr
