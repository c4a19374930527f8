"""KernelBench-style PyTorch program corpus (paper §3.1).

``stp corpus`` writes self-contained ``.py`` programs in KernelBench's layout (``class
Model(nn.Module)``, ``get_inputs()``, ``get_init_inputs()``, only ``torch`` imported). Each
program instantiates one *program type* with randomized shapes and dtype.

Layout
------
``builder`` (settings, seeded draws, the work-counting builder) -> ``components``,
``layers``, ``heads`` (the component templates, registered into :data:`COMPONENTS`) ->
``render`` (one program from a :class:`ProgramType`) -> ``catalogue`` (the table of program
types, :data:`PROGRAM_TYPES`) -> ``generate`` (files, corpora, headers) -> ``check``
(verification through the translator).

Design
------
The registry is data. :data:`COMPONENTS` is a table of *component templates*: a head
(creates the program inputs, e.g. ``BMM`` or ``MultiHeadAttention``) or an op (maps the
running tensor ``x`` to a new one, e.g. ``Conv2d``, ``ReLU``, ``GroupNorm``). Most ops come
from small tables (unary expressions, reductions, convolution variants, losses...). A
program type is a *recipe*, a chain of component names:

* ``single``    one KernelBench level-1 style operator (``("Softmax",)``, ``("Conv2dDepthwise",)``)
* ``block``     a popular architecture (matmul + softmax, gemm + activation, attention, MLP)
* ``composite`` a fixed chain of 2-5 components in KernelBench level-2 style
  (``Conv2d -> ReLU -> BiasAdd``)
* ``random``    ``RandomN_<Head>``: a head plus ops drawn at generation time from the mixable
  components whose input-shape constraints hold, N components in total (N = 2..5)

When a chain starts with an op, an ``Input`` head of a rank the op accepts is inserted.

Shapes and the work budget
--------------------------
Every size is a named draw (log-uniform, up to :data:`MAX_DIM`), recorded by a
:class:`_Builder`. Building a recipe emits the code and sums an estimated *work*: FLOPs of
the naive loop nests (``2*M*N*K`` for a matmul, ``out * in_ch/groups * kernel`` for a
convolution, ``numel * L`` for a cumulative scan...) plus the elements of every input.
While the work exceeds the budget, a drawn size (chosen at random, larger sizes more
likely) is halved and the recipe is rebuilt. :data:`DEFAULT_BUDGET` keeps a
program small enough that CPU verification of its translation takes well under a second;
pass a larger ``budget`` (e.g. :data:`GPU_BUDGET`) for GPU runs.

A budget of at least :data:`GPU_BUDGET` (``stp corpus --gpu``) also selects the *GPU sizing*:
sizes are then doubled or halved until the program's estimated PyTorch-eager time on an H200
(``render.eager_estimate_us``, a per-component roofline with eager's efficiencies) lies in
:data:`GPU_TARGET_US`, inside the field's 0.1-15 ms per program (KernelBench resized its level
1-2 problems to that range because µs-scale tasks measure launch overhead), with no tensor over
:data:`GPU_MAX_BYTES`; the header then records ``eager_estimate_us``.
``benchmarks/gpu_corpus_sizes.py`` checks where the set lands with an independent estimate
(the real ATen ops traced on the meta device, and the translation's speed of light).

Dtypes
------
float16, float32 and float64 (drawn per program). Inputs and parameters are created in the
program's dtype (``DTYPE`` in the file; ``self.to(DTYPE)`` casts the parameters). A
component without a float16 CPU kernel in PyTorch (``avg_pool3d``) makes a float16 request
fall back to float32; the header records the request and the reason.

Determinism
-----------
Only ``random.Random(seed).random()`` is used; no clocks, no hash-order dependence. Same
arguments, byte-identical files. Each file's header records type, seed, requested dtype
and budget, which are exactly the arguments that regenerate it.
"""

from __future__ import annotations

from .builder import (CATEGORIES, DEFAULT_BUDGET, DTYPE_WEIGHTS, DTYPES, GPU_BUDGET, GPU_MAX_BYTES,  # noqa: I001
                      GPU_MAX_DIM, GPU_TARGET_US, MAX_DIM, CorpusError)
from .components import Component, COMPONENTS
from .render import program_source, ProgramType
from .catalogue import PROGRAM_TYPES
from .generate import generate_corpus, generate_program, parse_header, program_seed
from .check import format_report, verify_corpus

__all__ = [
    "DEFAULT_BUDGET", "GPU_BUDGET", "GPU_TARGET_US", "GPU_MAX_BYTES", "GPU_MAX_DIM", "MAX_DIM", "DTYPES",
    "DTYPE_WEIGHTS", "CATEGORIES",
    "Component", "ProgramType", "CorpusError", "COMPONENTS", "PROGRAM_TYPES",
    "generate_program", "generate_corpus", "verify_corpus", "format_report", "parse_header", "program_seed",
    "program_source",
]
