"""The RL reward on real chat prompts (issue 34 evidence): for N prompts of a dataset's RL prompt
set, the reward of five kinds of completion, and the mean per kind.

    python benchmarks/reward_table.py DATASET_DIR [-n 20] [--timeout 60]

Kinds, each written as an answer to the prompt (``<think>..</think><answer>{...}</answer>``):

* ``oracle``: a verified step of the dictionary (the entry's own label);
* ``unchanged``: the original program itself;
* ``renamed``: the original with one serial loop variable (or, lacking one, an intermediate
  tensor) renamed: alpha-equivalent, so it must score as unchanged;
* ``wrong``: the original with one term dropped from the equation writing an output (or the
  first binary operation changed): a plausible wrong program;
* ``garbage``: text that is not an answer.

Prints one row per prompt and the mean per kind; the order unparsable 0 <= wrong <= unchanged
= renamed < oracle must hold on every row.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

from steptp import rewards
from steptp.leir import ast as A
from steptp.leir import parse_leir
from steptp.leir.printer import format_program
from steptp.llm.prompts import single_label


def _renamed(prog: A.Program, known) -> A.Program:
    """One serial loop variable of the first nest that has one renamed (in that nest), else the
    first intermediate tensor renamed everywhere."""
    for k, nest in enumerate(prog.nests):
        for i, lp in enumerate(nest.loops):
            if lp.kind != "B":
                new = "zq"
                loops = nest.loops[:i] + (A.Loop(lp.kind, lp.extent, new),) + nest.loops[i + 1:]
                sub = {lp.var: A.Index(new)}

                def fix(item):
                    if isinstance(item, A.Assign):
                        return A.Assign(A.substitute_indices(item.target, sub), A.substitute_indices(item.value, sub))
                    return A.Nest(item.loops, tuple(fix(x) for x in item.body))

                nests = list(prog.nests)
                nests[k] = A.Nest(loops, tuple(fix(x) for x in nest.body))
                return A.Program(tuple(nests))
    names = [eq.target.name for _, eq in prog.equations() if eq.target.name not in known]
    if not names:
        return prog
    old = names[0]
    return A.map_program_exprs(prog, lambda e: A.transform(
        e, lambda x: A.Tensor("Zq", x.dtype, x.scope, x.indices) if isinstance(x, A.Tensor) and x.name == old else x))


def _wrong(prog: A.Program, outputs) -> A.Program:
    """The equation writing the last output loses one term (``x + y`` -> ``x``), or its first
    binary operation becomes another one (``max`` -> ``min``, a constant ``c`` -> ``c + 1``)."""
    done = []

    def drop(e):
        if done:
            return e
        if isinstance(e, A.Call) and e.func in ("max", "min"):
            done.append(1)
            return A.Call("min" if e.func == "max" else "max", e.args)
        if isinstance(e, A.Call) and len(e.args) == 1:
            done.append(1)
            return e.args[0]  # tanh(x) -> x
        if isinstance(e, A.Float):
            done.append(1)
            return A.Float(e.value + 1.0)
        if not isinstance(e, A.BinOp):
            return e
        done.append(1)
        if e.op in ("+", "-") and not (isinstance(e.lhs, A.Tensor) and e.lhs.name in outputs):
            return e.lhs
        return A.BinOp("+" if e.op != "+" else "*", e.lhs, e.rhs)

    nests = list(prog.nests)
    for k in reversed(range(len(nests))):
        if any(eq.target.name in outputs for _, eq in nests[k].equations()):
            nests[k] = A.Program((nests[k],))
            nests[k] = A.map_program_exprs(nests[k], lambda e: A.transform(e, drop) if not isinstance(e, A.Tensor)
                                           or e.name not in outputs else e).nests[0]
            break
    return A.Program(tuple(nests))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("dataset", type=Path)
    ap.add_argument("-n", type=int, default=20)
    ap.add_argument("--timeout", type=float, default=60.0)
    args = ap.parse_args(argv)
    rows = [json.loads(x) for x in (args.dataset / "rl_prompts.jsonl").read_text().splitlines() if x.strip()]
    entries = {}
    for line in (args.dataset / "dictionary.jsonl").read_text().splitlines():
        e = json.loads(line)
        entries[e["id"]] = e
    kinds = ("oracle", "unchanged", "renamed", "wrong", "garbage")
    table = {k: [] for k in kinds}
    print(f"{'program':<28} " + " ".join(f"{k:>9}" for k in kinds))
    bad = 0
    for row in rows[: args.n]:
        m = parse_leir(row["original"])
        known = set(m.signature.names)
        outputs = {t.name for t in m.signature.outputs}
        e = entries[row["entry_id"]]
        texts = {
            "oracle": single_label(e["cot"], e["transformed"]["leir"], e["strategy"]["name"]),
            "unchanged": single_label("No change.", format_program(m.program), "Loop Split"),
            "renamed": single_label("Rename.", format_program(_renamed(m.program, known)), "Loop Split"),
            "wrong": single_label("Drop a term.", format_program(_wrong(m.program, outputs)), "Operator Fusion"),
            "garbage": "I think the loop should be faster now.",
        }
        got = {k: rewards.score(row["original"], texts[k], timeout_s=args.timeout)[0] for k in kinds}
        for k in kinds:
            if got[k] is not None:
                table[k].append(got[k])
        ok = (got["garbage"] == 0.0 and got["wrong"] is not None and got["wrong"] <= got["unchanged"]
              and got["renamed"] == got["unchanged"] and got["unchanged"] < got["oracle"])
        bad += not ok
        print(f"{row['program'][:28]:<28} " + " ".join(f"{'None' if got[k] is None else f'{got[k]:.2f}':>9}"
                                                       for k in kinds) + ("" if ok else "  ORDER VIOLATED"))
    print(f"{'mean':<28} " + " ".join(f"{statistics.mean(table[k]) if table[k] else float('nan'):>9.3f}"
                                      for k in kinds))
    print(f"{len(rows[: args.n])} prompts, order violated on {bad}; infrastructure (None): "
          f"{rewards.STATS['infrastructure']}")
    rewards.close()
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
