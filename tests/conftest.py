"""Shared test set-up: a test names what it needs, and a skip says what is missing (issue 46).

``@pytest.mark.needs("lightgbm")`` (several names allowed) skips the test with one uniform
reason per missing requirement; anything else the suite needs is a dependency of the package
or of the ``test`` extra, and its absence is a failure, never a skip. Requirements:

* ``lightgbm``: the learned cost model (``pip install '.[costmodel]'``);
* ``torch``: PyTorch (a dependency of the package; named for a bare ``pip install`` of parts);
* ``gpu``: a usable CUDA device (driver, CUDA 13 runtime, TVM runtime, compute capability
  >= 7.5), as :func:`steptp.backend.cuda_runtime.cuda_available` decides, and not the
  simulated device;
* ``cuda_compiler``: CUDA C to PTX with nvcc on the PATH, else NVRTC (the ``nvrtc`` extra:
  ``cuda-bindings`` + ``nvidia-cuda-nvrtc``), as the package itself chooses
  (:func:`steptp.backend.cuda_runtime.cuda_compiler`), so simulated-device tests run on a
  machine without nvcc;
* ``nvcc``: nvcc itself (the Build pass's batched ``nvcc --ptx`` round, which has no NVRTC form).

:func:`missing` gives the reason (or None) for use in a ``skipif`` or inside a test.
"""

from __future__ import annotations

import functools
import importlib

import pytest


def _module(name: str, hint: str) -> str | None:
    try:
        importlib.import_module(name)
    except ImportError:  # a blocked module (sys.modules[name] = None) raises ImportError too
        return f"needs {name}, which is not installed ({hint})"
    return None


def _gpu() -> str | None:
    from steptp.backend import cuda_runtime as cr

    if cr.simulated():
        return "needs a CUDA GPU (the simulated device STP_CUDA_SIM=1 is on)"
    problem = cr.cuda_available(need_nvcc=False)
    return None if problem is None else f"needs a usable CUDA GPU: {problem}"


def _cuda_compiler() -> str | None:
    from steptp.backend import cuda_runtime as cr

    if cr.cuda_compiler() is None:
        return ("needs a CUDA compiler: neither nvcc on the PATH nor NVRTC "
                "(pip install '.[nvrtc]': cuda-bindings + nvidia-cuda-nvrtc)")
    return None


def _nvcc() -> str | None:
    from steptp.backend import cuda_runtime as cr

    return None if cr.nvcc_path() else "needs nvcc on the PATH (the batched nvcc --ptx round has no NVRTC form)"


#: requirement -> check returning None when present, else the skip reason
REQUIREMENTS = {
    "lightgbm": lambda: _module("lightgbm", "pip install '.[costmodel]'"),
    "torch": lambda: _module("torch", "pip install torch"),
    "gpu": _gpu,
    "cuda_compiler": _cuda_compiler,
    "nvcc": _nvcc,
}


@functools.lru_cache(maxsize=None)
def missing(what: str) -> str | None:
    """The skip reason when requirement ``what`` is absent, else None (cached per process)."""
    if what not in REQUIREMENTS:
        raise KeyError(f"unknown test requirement {what!r}; known: {', '.join(REQUIREMENTS)}")
    return REQUIREMENTS[what]()


def pytest_configure(config):
    config.addinivalue_line("markers", "needs(*what): skip, naming it, when a requirement is missing: "
                                       + ", ".join(REQUIREMENTS))


def pytest_runtest_setup(item):
    for mark in item.iter_markers("needs"):
        for what in mark.args:
            reason = missing(what)
            if reason:
                pytest.skip(reason)
