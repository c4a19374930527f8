"""stp: a step-level, verified post-training dataset builder for LLM-guided tensor program optimization.

Data flow (one subpackage per stage)::

    frontend (PyTorch -> LEIR) -> engine (rule YAML, one step) -> backend (LEIR -> TIR -> build)
        -> verify (3 seeded trials) -> cot -> dataset
"""

__version__ = "0.1.0"
