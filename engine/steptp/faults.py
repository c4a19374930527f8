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


def inject(program: object) -> None:
    """Raise ``RuntimeError("injected internal fault")`` when ``STP_FAULT_INJECT`` asks for
    it for ``program`` (a source path); see the module docstring."""
    spec = os.environ.get(ENV, "")
    if not spec:
        return
    kind, _, only = spec.partition(":")
    if kind == "internal" and (not only or only in str(program)):
        raise RuntimeError(f"injected internal fault ({ENV}={spec})")


__all__ = ["ENV", "inject"]
