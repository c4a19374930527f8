"""The runner kinds (:mod:`steptp.runner.base`), chosen by name: a registry.

:func:`register` adds a kind (``register("rpc", make_rpc_runner)``), :func:`create` builds one
by name, :func:`names` lists them, :func:`for_search` builds the runner a search configuration
names. A factory is called with keyword options and ignores those it does not need; the
options a search passes (:func:`for_search`): ``out`` (the search directory), ``device``
(``cpu``/``cuda``), ``retime_rounds``, ``timer`` (``fn(module) -> µs`` replacing the timing of
samples, tests) and ``builder`` (a :class:`steptp.runner.base.Builder`, from above). The two
shipped kinds, ``local`` and ``pack``, are registered here.
"""

from __future__ import annotations

from typing import Callable

from .base import Runner

_FACTORIES: dict[str, Callable[..., Runner]] = {}


def register(name: str, factory: Callable[..., Runner]) -> None:
    """Make ``factory(**options) -> Runner`` the runner kind ``name`` (``stp search --runner
    NAME``); registering a name again replaces its factory."""
    if not name or not isinstance(name, str):
        raise ValueError(f"a runner kind needs a name, not {name!r}")
    _FACTORIES[name] = factory


def names() -> tuple[str, ...]:
    """The registered kinds, in registration order."""
    return tuple(_FACTORIES)


def create(kind: str, **options) -> Runner:
    """The runner of ``kind`` with its ``options`` (module docstring): ``local``: ``device``
    (``cpu``/``cuda``), ``repeat``, ``warmup``, ``retime_rounds``, ``timer``; ``pack``: ``out``
    (the search directory), ``builder`` (a :class:`steptp.runner.base.Builder`, or
    ``write_pack``: ``fn(round_dir, pack_dir) -> dict``; None in a search worker, which builds
    nothing). Raises ``ValueError`` for an unknown kind."""
    factory = _FACTORIES.get(kind)
    if factory is None:
        raise ValueError(f"unknown runner {kind!r}; one of {', '.join(_FACTORIES)}")
    return factory(**options)


def for_search(cfg, out=None, *, builder=None, timer=None) -> Runner:
    """The runner that a search configuration (:class:`steptp.search.config.SearchConfig`:
    ``runner``, ``device``, ``confirm_repeat``) names, for the search directory ``out``."""
    return create(cfg.runner, out=out, device=cfg.device, retime_rounds=max(1, cfg.confirm_repeat), timer=timer,
                  builder=builder)


def _local(*, device: str = "cpu", repeat: int = 3, warmup: int = 3, retime_rounds: int = 10, timer=None, **_):
    from .local import LocalRunner  # noqa: PLC0415

    return LocalRunner(device=device, repeat=repeat, warmup=warmup, retime_rounds=retime_rounds, timer=timer)


def _pack(*, out, builder=None, write_pack=None, **_):
    from .pack import PackRunner  # noqa: PLC0415

    return PackRunner(out, builder if builder is not None else write_pack)


register("local", _local)
register("pack", _pack)

__all__ = ["register", "names", "create", "for_search"]
