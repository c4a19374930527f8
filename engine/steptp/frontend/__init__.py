"""PyTorch -> LEIR frontend (paper §3.2 stage i).

Public API::

    from steptp.frontend import translate_file, translate_model, TranslationError

    tr = translate_file("examples/matmul.py", dtype="f32")   # KernelBench-style file
    tr.module          # LeirModule: signature (inputs, params, outputs) + program
    tr.param_values    # real values of the param/constant tensors, by LEIR name
    tr.reference(x)    # run the PyTorch model, outputs by LEIR name
    tr.verify()        # 3 seeded trials against PyTorch (steptp.verify.verify_against)

Modules: ``loader`` (KernelBench files), ``trace`` (torch.export capture), ``ops`` (one
lowering per ATen op, registry ``OPS``), ``ir`` (values, nests, binding policy, index
simplification), ``naming`` (fresh names), ``translate`` (the driver).
"""

from .ir import TranslationError
from .loader import LoadedProgram, load_program, parse_dtype
from .ops import OPS
from .translate import Translation, translate_file, translate_model

__all__ = ["TranslationError", "Translation", "translate_model", "translate_file", "load_program",
           "LoadedProgram", "parse_dtype", "OPS", "supported_ops"]


def supported_ops() -> list[str]:
    """Names of the ATen ops with a lowering (schema names without the ``aten::`` prefix)."""
    return sorted(OPS)
