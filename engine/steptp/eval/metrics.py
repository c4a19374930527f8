"""Scores of an evaluation run: progressive pass rates (paper §4.3, Table 2) and pass@k
(Chen et al. 2021, "Evaluating Large Language Models Trained on Code", eq. 1)."""

from __future__ import annotations

from math import comb

#: progressive verification stages, in order (paper §4.2/§4.3: Diff, Build, Exec, Equal)
STAGES = ("diff", "build", "exec", "equal")


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k of one problem with ``n`` samples of which ``c`` pass:
    ``1 - C(n-c, k) / C(n, k)`` (Chen et al. 2021, eq. 1); 1.0 when ``n - c < k``.
    Raises ``ValueError`` unless ``0 <= c <= n`` and ``1 <= k <= n``."""
    if not (0 <= c <= n) or not (1 <= k <= n):
        raise ValueError(f"pass@k needs 0 <= c <= n and 1 <= k <= n (n={n}, c={c}, k={k})")
    if n - c < k:
        return 1.0
    return 1.0 - comb(n - c, k) / comb(n, k)


def mean_pass_at_k(counts: list[tuple[int, int]], k: int) -> float | None:
    """Mean of :func:`pass_at_k` over problems ``[(n, c), ...]`` that have at least ``k``
    samples; None when none has."""
    vals = [pass_at_k(n, c, k) for n, c in counts if n >= k]
    return sum(vals) / len(vals) if vals else None


__all__ = ["STAGES", "pass_at_k", "mean_pass_at_k"]
