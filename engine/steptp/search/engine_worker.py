"""Rule matching and application for :class:`~steptp.search.policies.EnginePolicy` in a
worker process (:class:`steptp.runner.worker.IsolatedRunner`), under a time limit and an
address-space limit, so that one rule that explodes on one program (seen: a
``cache_read_write`` candidate growing past 9 GB in a minute) costs one candidate, not the
machine. The worker keeps the loaded rules and the candidate lists per (program, rule).

The functions are module-level (they are pickled by reference) and take/return plain
data: LEIR texts with their ``%`` header, rule ids, candidate indices.
"""

from __future__ import annotations

_STATE: dict = {"rules": None, "limited": False, "cands": {}}


def _limit(mem_bytes: int | None) -> None:
    if _STATE["limited"] or not mem_bytes:
        return
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    cap = mem_bytes if hard == resource.RLIM_INFINITY else min(mem_bytes, hard)
    resource.setrlimit(resource.RLIMIT_AS, (cap, hard))
    _STATE["limited"] = True


def _rules(rules_dir: str | None) -> dict:
    if _STATE["rules"] is None:
        from ..rules import load_rules

        _STATE["rules"] = {r.id: r for r in load_rules(rules_dir)}
    return _STATE["rules"]


def _module(text: str):
    from ..leir import parse_leir

    return parse_leir(text, "<search>")


def _candidates(text: str, rule_id: str, rules_dir: str | None) -> list:
    key = (text, rule_id)
    hit = _STATE["cands"].get(key)
    if hit is None:
        from ..engine import NoMatch, list_candidates

        try:
            hit = list_candidates(_rules(rules_dir)[rule_id], _module(text))
        except NoMatch:
            hit = []
        if len(_STATE["cands"]) > 4096:
            _STATE["cands"].clear()
        _STATE["cands"][key] = hit
    return hit


def count_candidates(text: str, rule_ids: list[str], rules_dir: str | None = None,
                     mem_bytes: int | None = None) -> dict:
    """``{rule id: number of (site, params) candidates}`` for the program ``text``; a
    rule that fails counts 0 (``"memory"`` marks an exhausted address space)."""
    _limit(mem_bytes)
    out: dict = {}
    for rid in rule_ids:
        try:
            out[rid] = len(_candidates(text, rid, rules_dir))
        except MemoryError:
            _STATE["cands"].clear()
            out[rid] = 0
            out["memory"] = True
        except Exception:  # noqa: BLE001 - a rule that fails on this program offers nothing
            out[rid] = 0
    return out


def apply_candidate(text: str, rule_id: str, index: int, seed: int = 0, rules_dir: str | None = None,
                    mem_bytes: int | None = None):
    """Apply candidate ``index`` of ``rule_id`` to ``text``: ``("ok", after_text, cot,
    site, params)`` or ``("fail", reason)`` / ``("memory", reason)``."""
    _limit(mem_bytes)
    from ..engine import NoMatch, RewriteError, apply_rule
    from .core import _jsonable

    try:
        cands = _candidates(text, rule_id, rules_dir)
        site, params = cands[index]
        st = apply_rule(_rules(rules_dir)[rule_id], _module(text), seed=seed, site=site, params=params)
        return ("ok", st.after.text(), st.cot, str(site), _jsonable(dict(params)))
    except MemoryError:
        _STATE["cands"].clear()
        return ("memory", "address-space limit reached")
    except (RewriteError, NoMatch, ValueError, IndexError, RecursionError) as e:
        return ("fail", f"{type(e).__name__}: {str(e)[:200]}")
    except Exception as e:  # noqa: BLE001 - one broken candidate is skipped
        return ("fail", f"{type(e).__name__}: {str(e)[:200]}")
