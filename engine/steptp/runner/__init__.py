"""The Builder / Runner spine (the roles TVM MetaSchedule separates, and its RPC split).

* **Builder** (a CPU box with the full install): LEIR -> TIR -> a built, exported module
  for a device (:func:`steptp.runner.builder.build`), CUDA C compiled once to PTX, kept in
  a cache keyed by (source, arch, compiler and version, flags)
  (:mod:`steptp.backend.cuda_runtime`).
* **Runner**: loads built modules with ``tvm_ffi`` and TVM's runtime libraries only, runs
  seeded trials with outputs poisoned, compares with the one tolerance rule
  (:mod:`steptp.runner.tolerance`) and times with ``time_evaluator``; always in a worker
  process (:mod:`steptp.runner.worker`, the one module that owns worker isolation), which a
  CUDA error discards.
* **Device facts** (:mod:`steptp.runner.device`): what this machine can run, the GPU's
  architecture from its compute capability, and the simulated CUDA device of the tests
  (``STP_CUDA_SIM=1``).

Modules of this package import nothing heavier than numpy at import time
(:mod:`steptp.runner.inputs`, :mod:`steptp.runner.tolerance` and
:mod:`steptp.runner.worker` run on a GPU node that has only numpy and ``apache-tvm-ffi``;
see :mod:`steptp.gpu.run`).
"""
