"""Translate and verify KernelBench programs at reduced shapes; print a success table.

Usage::

    python benchmarks/kernelbench_report.py KERNELBENCH/level1 [KERNELBENCH/level2 ...] \
        [--max-dim 16] [--json out.json] [--timeout 60]

KernelBench is not part of this repository (fetch it yourself). Its module-level shape
constants (``batch_size = 4096``, ``dim = 393216`` ...) are far too large for a CPU check,
so every top-level integer constant larger than ``--max-dim`` is replaced by ``--max-dim``
(kernel sizes, strides, groups and other small values stay) before ``get_inputs()`` and
``get_init_inputs()`` are called. Each program is translated with
:func:`steptp.frontend.translate_model` and verified against PyTorch eager (three seeded
trials), in a child process with a time limit. Failures are grouped by reason.
"""

from __future__ import annotations

import argparse
import ast
import importlib.util
import json
import multiprocessing as mp
import re
import sys
import time
from collections import Counter
from pathlib import Path


def _shrunk_module(path: Path, max_dim: int):
    """Import ``path`` with every top-level integer constant (or constant expression such as
    ``2048 * 2``) above ``max_dim`` replaced by ``max_dim`` *in the source*, so values derived
    from it later (``bias_shape = (out_channels, 1, 1)``) stay consistent."""
    src = path.read_text()
    tree = ast.parse(src)
    overrides = {}
    env: dict[str, int] = {}
    allowed = (ast.Expression, ast.Constant, ast.BinOp, ast.UnaryOp, ast.Name, ast.Load, ast.operator, ast.unaryop,
               ast.Tuple)
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            expr = ast.Expression(node.value)
            if not all(isinstance(n, allowed) for n in ast.walk(expr)):
                continue
            try:  # integer arithmetic over earlier constants only
                v = eval(compile(expr, str(path), "eval"), {"__builtins__": {}}, dict(env))
            except Exception:  # noqa: BLE001
                continue
            if isinstance(v, tuple) and all(isinstance(x, int) for x in v) and any(x > max_dim for x in v):
                node.value = ast.copy_location(ast.Tuple([ast.Constant(min(x, max_dim)) for x in v], ast.Load()),
                                               node.value)  # input_shape = (32768,)
                overrides[node.targets[0].id] = tuple(min(x, max_dim) for x in v)
            if isinstance(v, int) and not isinstance(v, bool):
                name = node.targets[0].id
                env[name] = v
                if v > max_dim:
                    overrides[name] = env[name] = max_dim
                    node.value = ast.copy_location(ast.Constant(max_dim), node.value)
    ast.fix_missing_locations(tree)
    spec = importlib.util.spec_from_file_location(f"kb_{abs(hash(str(path)))}", path)
    mod = importlib.util.module_from_spec(spec)
    exec(compile(tree, str(path), "exec"), mod.__dict__)
    return mod, overrides


def _check_one(path: str, max_dim: int, q) -> None:
    import torch

    from steptp.frontend import translate_model

    t0 = time.perf_counter()
    # a shrunk size can be invalid for the program (a dilated kernel larger than the input):
    # retry loading and capture with twice the size before reporting a failure
    for dim in (max_dim, 2 * max_dim):
        try:
            mod, overrides = _shrunk_module(Path(path), dim)
            torch.manual_seed(0)
            model = mod.Model(*mod.get_init_inputs())
            inputs = list(mod.get_inputs())
        except Exception as e:  # noqa: BLE001
            failure = {"file": path, "stage": "load", "ok": False, "reason": f"{type(e).__name__}: {e}"[:300]}
            continue
        try:
            tr = translate_model(model, inputs, Path(path).stem)
            break
        except Exception as e:  # noqa: BLE001
            failure = {"file": path, "stage": "translate", "ok": False, "reason": f"{type(e).__name__}: {e}"[:300]}
            if "could not capture" not in str(e):
                break
    else:
        q.put(failure)
        return
    if "tr" not in locals():
        q.put(failure)
        return
    try:
        res = tr.verify(trials=3, seed=0)
    except Exception as e:  # noqa: BLE001
        q.put({"file": path, "stage": "verify", "ok": False, "reason": f"{type(e).__name__}: {e}"[:300]})
        return
    q.put({"file": path, "stage": "verify", "ok": bool(res.equal), "reason": res.reason[:300],
           "max_abs_err": res.max_abs_err, "seconds": round(time.perf_counter() - t0, 2),
           "overrides": overrides})


def _reason_key(r: dict) -> str:
    reason = r["reason"]
    m = re.search(r"op '([^']+)'|unsupported op ([\w.:]+)|no lowering for ([\w.:]+)", reason)
    if m:
        return f"{r['stage']}: unsupported {next(g for g in m.groups() if g)}"
    return f"{r['stage']}: {reason.split(':')[0][:60]}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dirs", nargs="+", type=Path)
    ap.add_argument("--max-dim", type=int, default=16)
    ap.add_argument("--timeout", type=float, default=60.0)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    ctx = mp.get_context("spawn")
    results = []
    for d in args.dirs:
        files = sorted(d.glob("*.py"), key=lambda p: (int(re.match(r"\d+", p.name).group()) if re.match(r"\d+", p.name) else 0))
        for f in files:
            q = ctx.Queue()
            proc = ctx.Process(target=_check_one, args=(str(f), args.max_dim, q))
            proc.start()
            proc.join(args.timeout)
            if proc.is_alive():
                proc.kill()
                r = {"file": str(f), "stage": "timeout", "ok": False, "reason": f"over {args.timeout}s"}
            else:
                r = q.get() if not q.empty() else {"file": str(f), "stage": "crash", "ok": False,
                                                   "reason": f"exit code {proc.exitcode}"}
            r["level"] = d.name
            results.append(r)
            print(f"{'OK  ' if r['ok'] else 'FAIL'} {d.name}/{f.name}" + ("" if r["ok"] else f"  [{r['stage']}] {r['reason'][:120]}"),
                  flush=True)
    print()
    for level in sorted({r["level"] for r in results}):
        rs = [r for r in results if r["level"] == level]
        print(f"{level}: {sum(r['ok'] for r in rs)}/{len(rs)} translate and verify")
    print("\nfailure reasons:")
    for k, n in Counter(_reason_key(r) for r in results if not r["ok"]).most_common():
        print(f"  {n:3}  {k}")
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
