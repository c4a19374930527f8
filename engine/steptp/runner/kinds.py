"""The runner kinds (:mod:`steptp.runner.base`), chosen by name: :func:`create`."""

from __future__ import annotations

from .base import KINDS, Runner


def create(kind: str, **options) -> Runner:
    """The runner of ``kind`` (:data:`KINDS`) with its ``options``: ``local``: ``device``
    (``cpu``/``cuda``), ``repeat``, ``warmup``, ``retime_rounds``, ``timer``; ``pack``: ``out``
    (the search directory), ``write_pack`` (``fn(round_dir, pack_dir) -> dict``: the pack
    builder, passed in from above), ``node_retime`` (the node re-times each program's best in
    the same call). Raises ``ValueError`` for an unknown kind."""
    if kind == "local":
        from .local import LocalRunner

        return LocalRunner(**options)
    if kind == "pack":
        from .pack import PackRunner

        return PackRunner(**options)
    raise ValueError(f"unknown runner {kind!r}; one of {', '.join(KINDS)}")


__all__ = ["KINDS", "create"]
