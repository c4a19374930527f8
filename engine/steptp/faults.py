"""Fault injection for tests of the "no silent success" guarantee.

``stp dataset``, ``stp eval`` and ``stp search`` tell a program that failed for an
*internal* reason (an unexpected exception, a crashed worker) apart from bad input and from
a program that merely produced no verified result, and exit 1 when every program of a run
failed internally. No valid input reliably crashes the engine, so the tests drive that path
through the environment variable ``STP_FAULT_INJECT``, read only by :func:`inject`:

* unset or empty: nothing happens (the normal case);
* ``internal``: every program raises ``RuntimeError("injected internal fault")`` in its
  per-program processing (after it was loaded, so bad input is still reported as such);
* ``internal:TEXT``: only programs whose source path contains ``TEXT``.
"""

from __future__ import annotations

import os

ENV = "STP_FAULT_INJECT"

#: Prefix of the error of a program or sample lost to an unexpected crash (not bad input, not
#: a failed answer): ``stp dataset``, ``eval`` and ``search`` count these as internal errors and
#: exit 1 when every program failed so.
INTERNAL_ERROR = "internal error: "


def is_internal_error(error: str | None) -> bool:
    """Whether a recorded error (``ProgramResult.error``, a state line's or a sample's) is an
    internal one (an unexpected crash, a failed Ray task) rather than bad input."""
    return isinstance(error, str) and error.startswith(INTERNAL_ERROR)


def inject(program: object) -> None:
    """Raise ``RuntimeError("injected internal fault")`` when ``STP_FAULT_INJECT`` asks for
    it for ``program`` (a source path); see the module docstring."""
    spec = os.environ.get(ENV, "")
    if not spec:
        return
    kind, _, only = spec.partition(":")
    if kind == "internal" and (not only or only in str(program)):
        raise RuntimeError(f"injected internal fault ({ENV}={spec})")


__all__ = ["ENV", "INTERNAL_ERROR", "inject", "is_internal_error"]
