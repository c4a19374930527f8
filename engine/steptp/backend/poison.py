"""The poison NaN of each floating point dtype: one table for the lowering and the comparison.

A poisoned build (:func:`steptp.backend.tvmscript.lower_module` ``poison=True``) fills every
floating point intermediate and output with this quiet NaN before the program runs, so an
element never written (or computed from one) carries this exact pattern into the outputs (x86
and LLVM propagate a NaN operand's payload; default NaNs such as ``log(-1)`` have other
payloads). :mod:`steptp.runner.tolerance` recognises it afterwards, here and on a GPU node
(the pack carries this module: :data:`steptp.gpu.pack.RUNTIME_FILES`).

Imports nothing, so the backend (which lowers) and the runner (which compares) both sit above
it and neither imports the other for it.
"""

from __future__ import annotations

#: Poison NaN of each floating point TVM dtype: ``(integer view dtype, bit pattern)``.
#: Verification runs start every floating point intermediate and output as this NaN, so an
#: element never written (or computed from one) is recognisable afterwards.
POISON_BITS = {"float16": ("uint16", 0x7E5D), "bfloat16": ("uint16", 0x7FDD), "float32": ("uint32", 0x7FC0DEAD),
               "float64": ("uint64", 0x7FF8DEADBEEFDEAD)}

__all__ = ["POISON_BITS"]
