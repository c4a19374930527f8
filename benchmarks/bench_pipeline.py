"""Print timings of each pipeline stage on the bundled examples (no assertions: figures only).

    python benchmarks/bench_pipeline.py [--repeat 5]

Stages: parse + print (LEIR), translate (PyTorch -> LEIR), site enumeration (all shipped
rules, egglog), apply (one step), lower (TVMScript text), CPU build, CUDA codegen, one
verify_pair (3 trials, in process). Medians in milliseconds.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _time(fn, repeat):
    xs = []
    out = None
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn()
        xs.append((time.perf_counter() - t0) * 1000)
    return statistics.median(xs), out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()

    from steptp.backend import build_cpu, cuda_source, lower
    from steptp.engine import NoMatch, apply_rule, list_candidates
    from steptp.frontend import translate_file
    from steptp.leir import format_program, load_leir, parse_program
    from steptp.rules import load_rules
    from steptp.verify import verify_pair

    rules = load_rules()

    def candidates(rule, module):
        try:
            return list_candidates(rule, module)
        except NoMatch:
            return []
    rows = []
    for leir_path in sorted((ROOT / "examples").glob("*.leir")):
        m = load_leir(leir_path)
        text = format_program(m.program)
        t_parse, _ = _time(lambda: format_program(parse_program(text)), args.repeat)
        py = leir_path.with_suffix(".py")
        t_tr = _time(lambda: translate_file(py), 1)[0] if py.exists() else float("nan")
        t_sites, cands = _time(lambda: [(r, candidates(r, m)) for r in rules], args.repeat)
        n_sites = sum(len(c) for _, c in cands)
        first = next(((r, c[0]) for r, c in cands if c), None)
        t_apply, step = _time(lambda: apply_rule(first[0], m, seed=0, site=first[1][0], params=first[1][1]),
                              args.repeat) if first else (float("nan"), None)
        t_lower, _ = _time(lambda: lower(m, target="cpu"), args.repeat)
        t_build, _ = _time(lambda: build_cpu(lower(m, target="cpu"), m.signature), 1)
        t_cuda, _ = _time(lambda: cuda_source(m), 1)
        t_verify = _time(lambda: verify_pair(m, step.after, trials=3, seed=0), 1)[0] if step else float("nan")
        rows.append((leir_path.stem, len(m.program.nests), n_sites, t_parse, t_tr, t_sites, t_apply, t_lower,
                     t_build, t_cuda, t_verify))
    head = ("program", "nests", "sites", "parse", "translate", "enumerate", "apply", "lower", "build", "cuda", "verify")
    print(" ".join(f"{h:>10}" for h in head))
    for r in rows:
        print(f"{r[0][:10]:>10} {r[1]:>10} {r[2]:>10} " + " ".join(f"{x:10.2f}" for x in r[3:]))
    print("\n(milliseconds; enumerate = all shipped rules; verify = 3 trials, in process)")


if __name__ == "__main__":
    main()
