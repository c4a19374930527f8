"""Search trajectories as multi-step chat records (``stp search --export-chat``)."""

from __future__ import annotations

import json
from pathlib import Path

from ..io import write_text_atomic as _write_atomic
from ..leir import LeirModule
from .core import Node
from .report import _device
from .driver import _strategy_names


def chat_record(summary: dict, signature, rules=None, device: str | None = None) -> dict | None:
    """A multi-step ms-swift record ``{"messages": [...]}`` of a summary's best trajectory:
    for each step, the search prompt at the current program (with its parent) as the user
    turn and the step (CoT + JSON answer) as the assistant turn. None for a trajectory
    without steps."""
    from ..leir import parse_program
    from ..resources import render
    from ..policy import render_prompt, strategy_table

    traj = summary.get("trajectory") or []
    if len(traj) < 2:
        return None
    table = strategy_table(rules)
    names = {s["id"]: s["name"] for s in table}
    nodes: list[Node] = []
    for i, t in enumerate(traj):
        mod = LeirModule(signature, parse_program(t["leir"]))
        nodes.append(Node(i, i - 1 if i else None, i, mod, t["leir"], t.get("strategy"), t.get("site"),
                          t.get("params") or {}, t.get("cot") or "", "root" if i == 0 else "equal",
                          time_us=t.get("time_us"), speedup=t.get("speedup")))
    msgs = []
    for i in range(len(nodes) - 1):
        cur, nxt = nodes[i], nodes[i + 1]
        parent = nodes[i - 1] if i else None
        msgs.append({"role": "user", "content": render_prompt(summary["algorithm"], cur, parent, table,
                                                               device or _device(summary))})
        answer = json.dumps([{"idx": 0, "transformed_IR": nxt.text,
                              "applied_strategies": [names.get(x, x) for x in _strategy_names(nxt.strategy)]}],
                            ensure_ascii=False)
        msgs.append({"role": "assistant", "content": render("search_answer.j2", cot=nxt.cot, answer_json=answer)})
    return {"messages": msgs, "meta": {"program": summary["program"], "algorithm": summary["algorithm"],
                                       "speedup": summary["speedup"], "steps": len(nodes) - 1}}


def export_chat(outdir: str | Path, path: str | Path) -> int:
    """Write one chat record per summary (with at least one step) under ``outdir`` to the
    JSONL file ``path``; returns the number of records."""
    from ..leir import load_leir
    from ..rules import load_rules

    out = Path(outdir)
    rules = load_rules()
    recs = []
    for d in ([out] if (out / "summary.json").exists() else []) + sorted(p.parent for p in out.glob("*/summary.json")):
        try:
            sm = json.loads((d / "summary.json").read_text(encoding="utf-8"))
            sig = load_leir(d / "root.leir").signature
        except Exception:  # noqa: BLE001 - a damaged run directory contributes nothing
            continue
        rec = chat_record(sm, sig, rules)
        if rec is not None:
            recs.append(rec)
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    _write_atomic(p, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in recs))
    return len(recs)


__all__ = ["chat_record", "export_chat"]
