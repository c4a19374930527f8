"""Translate and verify KernelBench programs at reduced shapes; print a success table.

Usage::

    python benchmarks/kernelbench_report.py KERNELBENCH/level1 [KERNELBENCH/level2 ...] \
        [--max-dim 16] [--json out.json] [--timeout 60] [--eval]

KernelBench is not part of this repository (fetch it yourself). Its module-level shape
constants (``batch_size = 4096``, ``dim = 393216`` ...) are far too large for a CPU check,
so every size literal above ``--max-dim`` (top-level constants, also in multi-name
assignments, and integer literals inside ``get_inputs``/``get_init_inputs``) is shrunk
through one consistent map that keeps equal sizes equal and divisibility by the small
constants (groups, heads), see :func:`shrink_plan`; kernel sizes, strides, groups and
other small values stay. Each program is translated with
:func:`steptp.frontend.translate_model` and verified against PyTorch eager (three seeded
trials), in a child process with a time limit. Failures are grouped by reason.
"""

from __future__ import annotations

import argparse
import ast
import importlib.util
import json
import math
import multiprocessing as mp
import re
import sys
import time
from collections import Counter
from pathlib import Path


def shrink_plan(values, max_dim: int) -> dict[int, int]:
    """New value for every integer of ``values`` above ``max_dim``, from one map (equal
    sizes stay equal: ``height = width``).

    All large values are divided by one power of two ``s`` (the smallest that brings the
    largest to ``<= max_dim``), so relations between sizes survive
    (``out_channels = 2 * width`` after a stride-2 transposed convolution). Then the
    relations with the program's small constants (``1 < c <= max_dim / 2``: groups, heads,
    kernel sizes) are restored: when ``c`` divides ``v`` the new value is a multiple of ``c``
    (divisors whose least common multiple would exceed ``2 * max_dim`` are dropped, smallest
    kept first), and when ``v >= 2c`` (``c <= max_dim / 2``) it stays ``>= 2c`` (more than
    one channel per group). A value never grows."""
    large = sorted({v for v in values if isinstance(v, int) and not isinstance(v, bool) and v > max_dim})
    if not large:
        return {}
    smalls = sorted({c for c in values if isinstance(c, int) and 1 < c <= max_dim // 2})
    scale = 1
    while large[-1] / scale > max_dim:
        scale *= 2
    plan = {}
    for v in large:
        new = max(1, round(v / scale))
        step = 1
        for c in smalls:
            if v % c == 0 and math.lcm(step, c) <= 2 * max_dim:
                step = math.lcm(step, c)
        for c in smalls:
            if v % c == 0 and v >= 2 * c and 2 * c <= max_dim:
                new = max(new, 2 * c)
        new = -(-new // step) * step
        plan[v] = min(v, new)
    return plan


#: names of batch sizes: independent of every other size, shrunk on their own
BATCH_NAMES = ("batch_size", "batch", "bs")


def _const_int(node, env=None):
    """Value of a name-free integer expression (``2048``, ``2048 * 2``, ``-1``) or ``None``."""
    allowed = (ast.Expression, ast.Constant, ast.BinOp, ast.UnaryOp, ast.operator, ast.unaryop)
    expr = ast.Expression(node)
    if not all(isinstance(n, allowed) for n in ast.walk(expr)):
        return None
    try:
        v = eval(compile(expr, "<const>", "eval"), {"__builtins__": {}}, {})
    except Exception:  # noqa: BLE001
        return None
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def _size_nodes(tree):
    """``(node, value, name)`` for every live size literal: name-free integer values of the
    last top-level assignment of each name (``a = 4096``, ``a = b = 4096``,
    ``a, b = 32, 32``, tuples) and integer literals inside ``get_inputs`` /
    ``get_init_inputs`` (``name`` None)."""
    last: dict[str, list] = {}
    out = []
    for node in tree.body:
        if isinstance(node, ast.Assign):
            for target in node.targets:
                names = [t.id for t in target.elts] if isinstance(target, (ast.Tuple, ast.List)) else \
                    [target.id] if isinstance(target, ast.Name) else []
                vals = node.value.elts if isinstance(node.value, (ast.Tuple, ast.List)) and len(names) > 1 \
                    else [node.value] * len(names)
                for name, x in zip(names, vals):
                    items = x.elts if isinstance(x, (ast.Tuple, ast.List)) else [x]
                    last[name] = [(y, _const_int(y), name) for y in items if _const_int(y) is not None]
        elif isinstance(node, ast.FunctionDef) and node.name in ("get_inputs", "get_init_inputs"):
            for x in ast.walk(node):
                if isinstance(x, ast.Constant) and isinstance(x.value, int) and not isinstance(x.value, bool):
                    out.append((x, x.value, None))
    for items in last.values():
        out.extend(items)
    return out


class _Replace(ast.NodeTransformer):
    def __init__(self, repl: dict[int, ast.AST]):
        self.repl = repl

    def generic_visit(self, node):
        for field, old in ast.iter_fields(node):
            if isinstance(old, list):
                old[:] = [self.repl.get(id(x), x) if isinstance(x, ast.AST) else x for x in old]
                for x in old:
                    if isinstance(x, ast.AST) and id(x) not in self.repl:
                        self.visit(x)
            elif isinstance(old, ast.AST):
                if id(old) in self.repl:
                    setattr(node, field, self.repl[id(old)])
                else:
                    self.visit(old)
        return node


def _shrunk_module(path: Path, max_dim: int):
    """Import ``path`` with its sizes shrunk consistently *in the source*: every live size
    literal (:func:`_size_nodes`) above ``max_dim`` is replaced through one
    :func:`shrink_plan` (batch sizes, :data:`BATCH_NAMES`, on their own to ``max_dim // 4``),
    so equal sizes stay equal, ratios and divisibility by the small constants (groups,
    heads) are kept, and values derived by name (``bias_shape = (out_channels, 1, 1)``,
    ``normalized_shape = (features, dim)``) follow. Returns the module and the map used."""
    src = path.read_text()
    tree = ast.parse(src)
    nodes = _size_nodes(tree)
    batch = [(n, v) for n, v, name in nodes if name in BATCH_NAMES]
    sizes = [(n, v) for n, v, name in nodes if name not in BATCH_NAMES]
    plan = shrink_plan([v for _, v in sizes], max_dim)
    repl = {id(n): ast.copy_location(ast.Constant(plan[v]), n) for n, v in sizes if v in plan}
    small_batch = max(2, max_dim // 4)
    for n, v in batch:
        if v > small_batch:
            repl[id(n)] = ast.copy_location(ast.Constant(small_batch), n)
    _Replace(repl).visit(tree)
    ast.fix_missing_locations(tree)
    spec = importlib.util.spec_from_file_location(f"kb_{abs(hash(str(path)))}", path)
    mod = importlib.util.module_from_spec(spec)
    exec(compile(tree, str(path), "exec"), mod.__dict__)
    return mod, {str(k): v for k, v in plan.items()}


def _check_one(path: str, max_dim: int, q, eval_mode: bool = False) -> None:
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
            if eval_mode:
                model.eval()
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


def _generic(text: str, n: int = 70) -> str:
    """A message with its numbers and quoted values blanked, so equal causes group."""
    text = re.sub(r"'[^']*'|\"[^\"]*\"", "'…'", text)
    text = re.sub(r"\d+(\.\d+)?", "N", text)
    return text[:n]


def reason_key(r: dict) -> str:
    """Failure class of one result, from the translator's and verifier's message formats:
    ``TranslationError`` heads ``op aten.x.y[, argument 'a'][, graph node %n]: message``;
    verifier reasons start with their stage (``equal:``, ``build:``, ``exec:``)."""
    reason = (r.get("reason") or "").splitlines()[0] if r.get("reason") else ""
    reason = re.sub(r"^(TranslationError|RuntimeError|ValueError): ", "", reason)
    stage = r.get("stage", "?")
    if stage == "translate":
        m = re.match(r"op (\S+?)(?:, argument '([^']+)')?(?:, graph node %\S+)?: (.*)", reason)
        if m:
            op, arg, msg = m.groups()
            if msg.startswith("no lowering"):
                return f"translate: no lowering for {op}"
            return f"translate: {op}{f' ({arg})' if arg else ''}: {_generic(msg, 50)}"
        if "could not capture" in reason:
            return "translate: torch.export could not capture the model"
        return f"translate: {_generic(reason)}"
    if stage == "verify":
        head = reason.split(":", 1)[0] if ":" in reason else reason
        if head == "equal":
            return "verify: outputs differ from PyTorch"
        return f"verify: {head}: {_generic(reason.split(':', 1)[1].strip() if ':' in reason else '', 50)}"
    return f"{stage}: {_generic(reason)}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dirs", nargs="+", type=Path)
    ap.add_argument("--max-dim", type=int, default=16)
    ap.add_argument("--timeout", type=float, default=60.0)
    ap.add_argument("--json", type=Path)
    ap.add_argument("--eval", action="store_true", help="put each model in eval() mode (dropout off)")
    args = ap.parse_args()
    ctx = mp.get_context("spawn")
    results = []
    for d in args.dirs:
        files = sorted(d.glob("*.py"), key=lambda p: (int(re.match(r"\d+", p.name).group()) if re.match(r"\d+", p.name) else 0))
        for f in files:
            q = ctx.Queue()
            proc = ctx.Process(target=_check_one, args=(str(f), args.max_dim, q, args.eval))
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
    for k, n in Counter(reason_key(r) for r in results if not r["ok"]).most_common():
        print(f"  {n:3}  {k}")
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
