"""The typed steps of a multi-step proposal (:attr:`steptp.policy.base.Proposal.steps`).

A :class:`Step` is one rule applied at one site with its parameters, and the program it
reaches. The engine's worker hands its steps over as records ``{"rule", "site", "params",
"leir"}`` (``leir``: canonical program text, no header); they become steps once, at that
boundary (:func:`steps_of_records`), and go back to the same records where they are written
(``tree.jsonl``, the search caches in ``.search/cache.json``: :func:`steps_to_records`), so
files written before the steps were typed load unchanged. A step's program is parsed at most
once, when it is first needed (:attr:`Step.program`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..leir.fileformat import LeirModule, Signature


@dataclass(eq=False)
class Step:
    """One step: ``rule`` (a rule id), ``site`` (text or None), ``params`` (JSON-ready),
    ``leir`` (the canonical text of the program it reaches) and ``signature`` (that program's);
    ``extra``: further fields of the record it was read from (written back unchanged)."""

    rule: str
    site: str | None = None
    params: dict = field(default_factory=dict)
    leir: str = ""
    signature: Signature | None = None
    extra: dict = field(default_factory=dict)
    _program: LeirModule | None = field(default=None, repr=False)

    @classmethod
    def of(cls, rule: str, module: LeirModule, site: str | None = None, params: dict | None = None) -> "Step":
        """The step to ``module`` (a program already parsed: nothing is parsed again)."""
        from ..leir.printer import format_program  # noqa: PLC0415

        return cls(rule, site, dict(params or {}), format_program(module.program), module.signature,
                   _program=module)

    @property
    def program(self) -> LeirModule:
        """The program this step reaches (parsed from :attr:`leir` on first use, then kept)."""
        if self._program is None:
            from ..leir import parse_program  # noqa: PLC0415

            self._program = LeirModule(self.signature, parse_program(self.leir))
        return self._program

    def record(self) -> dict:
        """The step as a JSON-ready record ``{"rule", "site", "params", "leir"}`` (and its
        :attr:`extra` fields)."""
        return {"rule": self.rule, "site": self.site, "params": self.params, "leir": self.leir, **self.extra}


def steps_of_records(records, signature: Signature | None) -> tuple[Step, ...]:
    """Steps from records ``{"rule", "site", "params", "leir"}`` (steps pass through), their
    programs with ``signature``."""
    out = []
    for r in records or ():
        if isinstance(r, Step):
            out.append(r)
            continue
        extra = {k: v for k, v in r.items() if k not in ("rule", "site", "params", "leir")}
        out.append(Step(r["rule"], r.get("site"), r.get("params") if r.get("params") is not None else {},
                        r.get("leir") or "", signature, extra))
    return tuple(out)


def steps_to_records(steps) -> list[dict]:
    """The records of ``steps`` (:meth:`Step.record`)."""
    return [s.record() if isinstance(s, Step) else dict(s) for s in steps or ()]


def rule_ids(steps) -> list[str]:
    """The rule of each step, in order."""
    return [s.rule for s in steps]


__all__ = ["Step", "steps_of_records", "steps_to_records", "rule_ids"]
