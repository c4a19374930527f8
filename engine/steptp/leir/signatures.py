"""A program's signature as a JSON dict (dataset entries, GPU packs, search rounds) and back.

``{"name", "tensors": [{"name", "role", "dtype", "shape"}]}`` is how every dictionary entry
stores the signature of its programs (:mod:`steptp.dataset`, :mod:`steptp.gpu.pack`, the
``pack`` runner's round entries); these two functions are the one conversion, at the bottom of
the house so that every layer may use them.
"""

from __future__ import annotations

from .fileformat import LeirModule, Signature, TensorDecl


def signature_dict(module: LeirModule) -> dict:
    """The signature of ``module`` as stored in dictionary entries: ``{"name", "tensors":
    [{"name", "role", "dtype", "shape"}]}``."""
    return {"name": module.signature.name,
            "tensors": [{"name": t.name, "role": t.role, "dtype": t.dtype, "shape": list(t.shape)}
                        for t in module.signature.tensors]}


def signature_of(sig):
    """A :class:`~steptp.leir.fileformat.Signature` from a record's ``signature`` dict
    (``{name, tensors: [{name, role, dtype, shape}]}``); ``None`` and a Signature pass through."""
    if sig is None or isinstance(sig, Signature):
        return sig
    return Signature(sig["name"], tuple(TensorDecl(t["name"], t["role"], t["dtype"], tuple(t["shape"]))
                                        for t in sig["tensors"]))


__all__ = ["signature_dict", "signature_of"]
