"""GPU hardware limits: the one table the backend (and rules) check against.

The limits are the CUDA compute-capability limits that hold for every architecture from
sm_70 to sm_90 (CUDA C++ Programming Guide, "Features and Technical Specifications",
table "Technical Specifications per Compute Capability"); they are the numbers the Step-TP
paper states in its search prompts (reference-notes §2, §9: block x/y/z = 2^31-1 / 65535 /
65535, thread x/y/z = 1024 / 1024 / 64).

TVM 0.27 does **not** enforce any of them when it emits CUDA (tvm-0.27-notes §3.4: a
2048-thread kernel gets ``__launch_bounds__(2048)`` and compiles), so
:mod:`steptp.backend.preflight` checks them before a kernel is handed to nvcc.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Mapping


@dataclass(frozen=True)
class GpuLimits:
    """Per-kernel launch limits of one GPU architecture.

    * ``max_extent``: largest extent a loop may have when bound to a thread tag
      (``threadIdx.x`` ... ``blockIdx.z``), in threads / blocks.
    * ``max_threads_per_block``: product of the ``threadIdx.{x,y,z}`` extents of one kernel.
    * ``max_static_shared_bytes``: statically declared ``__shared__`` memory per block, bytes
      (48 KiB; more needs dynamic shared memory, which the LEIR lowering never emits).
    * ``arch``: the ``sm_XX`` name passed to TVM's CUDA target and to ``nvcc -arch``.
    """

    name: str
    arch: str
    max_extent: Mapping[str, int] = field(default_factory=dict)
    max_threads_per_block: int = 1024
    max_static_shared_bytes: int = 48 * 1024
    warp_size: int = 32

    def limit(self, tag: str) -> int:
        """Largest legal extent for a thread tag; ``KeyError`` for an unknown tag."""
        return self.max_extent[tag]

    def __reduce__(self):
        # ``max_extent`` is usually a read-only MappingProxyType, which does not pickle; the
        # limits travel to worker processes (GPU verification), so pickle it as a dict.
        return (_limits_from_state, (self.name, self.arch, dict(self.max_extent), self.max_threads_per_block,
                                     self.max_static_shared_bytes, self.warp_size))

    def with_arch(self, arch: str, name: str | None = None) -> "GpuLimits":
        """The same limits for another ``sm_XX`` architecture (every architecture from sm_70
        on shares them; see the module docstring)."""
        return GpuLimits(name=name or f"CUDA {arch}", arch=arch, max_extent=self.max_extent,
                         max_threads_per_block=self.max_threads_per_block,
                         max_static_shared_bytes=self.max_static_shared_bytes, warp_size=self.warp_size)


def _limits_from_state(name, arch, max_extent, max_threads_per_block, max_static_shared_bytes, warp_size):
    return GpuLimits(name, arch, MappingProxyType(dict(max_extent)), max_threads_per_block, max_static_shared_bytes,
                     warp_size)


#: Thread tags in canonical order (threads first, then blocks; x, y, z).
THREAD_TAGS: tuple[str, ...] = ("threadIdx.x", "threadIdx.y", "threadIdx.z",
                                "blockIdx.x", "blockIdx.y", "blockIdx.z")

_COMMON_EXTENTS = MappingProxyType({
    "threadIdx.x": 1024,
    "threadIdx.y": 1024,
    "threadIdx.z": 64,
    "blockIdx.x": 2**31 - 1,
    "blockIdx.y": 65535,
    "blockIdx.z": 65535,
})

#: NVIDIA H100 (Hopper, compute capability 9.0): the default target of the backend.
H100 = GpuLimits(name="NVIDIA H100", arch="sm_90", max_extent=_COMMON_EXTENTS)

#: The limits used when a caller does not pass any.
DEFAULT_GPU = H100

#: Shorthands used across the package (same numbers as :data:`DEFAULT_GPU`).
MAX_THREADS_PER_BLOCK: int = DEFAULT_GPU.max_threads_per_block
THREAD_LIMITS: Mapping[str, int] = DEFAULT_GPU.max_extent


#: Vector widths (lanes of a ``V`` loop) that TVM 0.27's CUDA code generation can express
#: per LEIR dtype (probed: ``tvm.compile(target=cuda)`` raises "Cannot convert type
#: float32x12 to CUDA type" otherwise; every width listed here also passes nvcc --ptx).
CUDA_VECTOR_LANES: Mapping[str, frozenset] = MappingProxyType({
    "f32": frozenset({2, 3, 4, 6, 8}), "f16": frozenset({2, 4, 6, 8}), "bf16": frozenset({2, 4, 8}),
    "f64": frozenset({2, 3, 4}), "bool": frozenset({2, 3, 4}),
    **{d: frozenset({2, 3, 4, 8}) for d in ("i8", "i16", "i32", "i64", "u8", "u16", "u32", "u64")},
})


def is_thread_tag(tag: str) -> bool:
    """``True`` for ``threadIdx.*`` tags (threads of a block), ``False`` for ``blockIdx.*``."""
    return tag.startswith("threadIdx.")


__all__ = ["GpuLimits", "THREAD_TAGS", "H100", "DEFAULT_GPU", "MAX_THREADS_PER_BLOCK", "THREAD_LIMITS", "CUDA_VECTOR_LANES",
           "is_thread_tag"]
