"""``stp dataset --ray``: programs distributed over a Ray cluster.

Each batch of programs is one Ray task running
:func:`steptp.dataset.generate.process_batch_safe` (the same function as the single-machine
path, so the batch shares its nvcc runs); Ray reuses its worker processes across tasks, so
each worker keeps its verification subprocess and caches for all the programs it gets.
Results come back to the driver, which records them **in input order** with the same
crash-safe writers, so the output files are byte-identical to a single-machine run with the
same inputs, options and seed, and an interrupted run resumes the same way (finished
programs are read from ``state.jsonl`` and skipped).

A cluster given by address (``ray://host:10001``, ``host:6379`` or ``auto``) must have
``steptp`` installed on its nodes, and the input files must be readable there at the same
paths (sources are read by path in the task). Without an address a local cluster is
started (``num_cpus`` worker slots) and shut down at the end.
Source: Ray Core API (``ray.init``, ``ray.remote``, ``ray.get``, ``ray.shutdown``).
"""

from __future__ import annotations

import os
import socket
from collections import deque
from typing import Iterator, Sequence

from .generate import INTERNAL_ERROR, Options, ProgramResult, process_batch_safe
from ..programs import Source


class RayUnavailable(RuntimeError):
    """Ray is not installed (``pip install 'steptp[ray]'``) or the cluster cannot be reached."""


def _ray():
    try:
        import ray
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise RayUnavailable("--ray needs Ray: pip install 'steptp[ray]'") from e
    return ray


def check_reachable(address: str, timeout_s: float = 5.0) -> None:
    """Raise :class:`RayUnavailable` unless a TCP connection to the cluster ``address``
    (``ray://host:port`` or ``host:port``) opens within ``timeout_s`` seconds.

    ``ray.init`` keeps retrying an unreachable head node for minutes, so the address is
    probed first; ``auto`` (an address Ray looks up locally) is not probed."""
    if address == "auto":
        return
    hostport = address.split("://", 1)[1] if "://" in address else address
    host, sep, port = hostport.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise RayUnavailable(f"bad Ray cluster address {address!r}: expected ray://HOST:PORT, HOST:PORT or auto")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s).close()
    except OSError as e:
        raise RayUnavailable(f"cannot reach the Ray cluster at {address}: "
                             f"{e.strerror or type(e).__name__} (waited at most {timeout_s:.0f} s)") from None


def start_ray(address: str | None = None, num_cpus: int | None = None):
    """Connect to the cluster at ``address`` or start a local one with ``num_cpus`` CPUs.

    Returns ``(ray module, started)``; ``started`` tells whether this call initialised Ray
    (and so should shut it down). An already initialised Ray is reused as is. Raises
    :class:`RayUnavailable` when Ray is missing or the address cannot be reached."""
    ray = _ray()
    if ray.is_initialized():
        return ray, False
    if address:
        check_reachable(address)
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    kwargs = dict(include_dashboard=False, logging_level="ERROR", log_to_driver=False)
    try:
        if address:
            ray.init(address=address, **kwargs)
        else:
            ray.init(num_cpus=num_cpus, object_store_memory=256 * 1024 * 1024, **kwargs)
    except Exception as e:  # noqa: BLE001 - connection errors come in many types
        raise RayUnavailable(f"cannot start or reach the Ray cluster{' at ' + address if address else ''}: "
                             f"{type(e).__name__}: {e}") from None
    return ray, True


def ray_results(batches: Sequence[Sequence[Source]], opts: Options, address: str | None = None,
                in_flight: int = 4, num_cpus: int | None = None) -> Iterator[ProgramResult]:
    """Yield the :class:`ProgramResult` of every source of ``batches`` (lists of sources,
    e.g. from :func:`steptp.dataset.pipeline.program_batches`), in order, one Ray task per
    batch (at most ``in_flight`` submitted ahead of the one being recorded).

    ``address``/``num_cpus`` as in :func:`start_ray` (``num_cpus`` defaults to ``in_flight``
    // 2 for a local cluster). A task that dies (worker crash) is retried once by Ray and
    otherwise becomes the error of each of its programs, like an internal error on one
    machine."""
    ray, started = start_ray(address, num_cpus if num_cpus is not None else max(1, in_flight // 2))
    remote = ray.remote(num_cpus=1, max_retries=1)(process_batch_safe)
    try:
        pending: deque = deque()
        it = iter(batches)
        for batch in it:
            pending.append((batch, remote.remote(list(batch), opts)))
            if len(pending) >= in_flight:
                break
        while pending:
            batch, ref = pending.popleft()
            try:
                results = ray.get(ref)
            except Exception as e:  # noqa: BLE001 - a lost task costs its programs, not the run
                results = [ProgramResult(str(src.path), src.key, None, [], [],
                                         error=f"{INTERNAL_ERROR}Ray task failed: {type(e).__name__}: {e}")
                           for src in batch]
            nxt = next(it, None)
            if nxt is not None:
                pending.append((nxt, remote.remote(list(nxt), opts)))
            yield from results
    finally:
        if started:
            ray.shutdown()


__all__ = ["RayUnavailable", "check_reachable", "start_ray", "ray_results"]
