"""Device facts, from the device: what ``--device`` can use here, and the GPU's limits.

One check for every command (``stp verify``, ``time``, ``dataset``, ``eval``, ``search``,
``gpu pack``): :func:`device_problem` returns '' or ONE line naming what is missing (driver,
CUDA runtime, TVM runtime, device, a driver older than the runtime, a device below compute
capability 7.5, no CUDA compiler), which the CLI prints before writing anything (exit 2).
:func:`device_limits` gives the :class:`~steptp.backend.hardware.GpuLimits` whose ``arch``
is the device's own (``sm_XY`` from its compute capability), so kernels are generated and
compiled for the GPU they run on, not for a fixed sm_90. The simulated device of the tests
(``STP_CUDA_SIM=1``, :mod:`steptp.backend.cuda_runtime`) answers both too.
"""

from __future__ import annotations

from ..backend.hardware import DEFAULT_GPU, GpuLimits

#: The devices of ``--device``.
DEVICES = ("cpu", "cuda")


def device_problem(device: str) -> str:
    """'' when ``--device DEVICE`` can be used here, else ``--device cuda: <what is missing>``
    (or ``--device X: unknown device``)."""
    if device == "cpu":
        return ""
    if device != "cuda":
        return f"--device {device}: unknown device (expected cpu or cuda)"
    from ..backend.cuda_runtime import cuda_available  # noqa: PLC0415

    why = cuda_available()
    return f"--device cuda: {why}" if why else ""


def device_limits(device: str = "cuda", arch: str | None = None) -> GpuLimits:
    """Launch limits and architecture to build for: ``arch`` if given, else (``cuda``) the
    device's compute capability (:func:`steptp.backend.cuda_runtime.device_arch`), else
    :data:`~steptp.backend.hardware.DEFAULT_GPU` (sm_90: the build-only GPU check on CPU
    machines)."""
    if arch is None and device == "cuda":
        from ..backend.cuda_runtime import device_arch  # noqa: PLC0415

        arch = device_arch()
    if arch is None or arch == DEFAULT_GPU.arch:
        return DEFAULT_GPU
    return DEFAULT_GPU.with_arch(arch)


__all__ = ["DEVICES", "device_problem", "device_limits"]
