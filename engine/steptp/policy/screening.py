"""Screen many, propose few: :class:`ScreeningPolicy` (a cost model screens the wrapped
policy's proposals)."""

from __future__ import annotations

class ScreeningPolicy:
    """Screen many, propose few: asks the wrapped policy for up to ``screen`` proposals at a
    node (e.g. every matching rule x site x parameter of the engine, up to the cap), scores
    them with ``scorer`` and proposes the ``k`` best not proposed yet (re-scored at each call:
    the model learns online). A node whose screened list runs out is screened again (the
    engine then yields its further candidates). Proposals whose program was already proposed
    anywhere, or is the node or one of its ancestors in ``history``, are dropped."""

    def __init__(self, inner, scorer, screen: int = 32):
        self.inner = inner
        self.scorer = scorer
        self.screen = screen
        self._pool: dict[str, list] = {}
        self._seen: set[str] = set()
        self._dry: set[str] = set()

    def propose(self, node, history, k: int):
        """The ``k`` best-scored proposals at ``node`` (see the class docstring)."""
        from ..leir.printer import format_program

        def canonical(m):
            return format_program(m.program)

        pool = self._pool.setdefault(node.text, [])
        if len(pool) < k and node.text not in self._dry:
            fresh = list(self.inner.propose(node, history, self.screen))
            if not fresh:
                self._dry.add(node.text)
            back = {node.text} | {h.text for h in history}
            for p in fresh:
                t = canonical(p.module)
                if t not in self._seen and t not in back:
                    self._seen.add(t)
                    pool.append(p)
        if not pool:
            return []
        scores = self.scorer.score(node, pool)
        order = sorted(range(len(pool)), key=lambda i: (-scores[i], i))
        out = [pool[i] for i in order[:k]]
        keep = set(order[k:])
        pool[:] = [p for i, p in enumerate(pool) if i in keep]
        return out

    def close(self) -> None:
        close = getattr(self.inner, "close", None)
        if close is not None:
            close()

    def __getattr__(self, name):  # skipped / log of the wrapped policy
        if name in ("skipped", "log"):
            return getattr(self.inner, name)
        raise AttributeError(name)


__all__ = ["ScreeningPolicy"]
