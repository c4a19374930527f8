"""Alpha-equivalence of LEIR programs: the same program up to the names of bound things.

Two programs are *alpha-equivalent* when one becomes the other by renaming

* loop variables of serial, unrolled, vectorised and parallel loops (``L``, ``U``, ``V``,
  ``P``): a loop variable is bound by its loop, its name means nothing else;
* the free part of a thread-bound loop's variable: ``B`` loop variables carry their binding in
  their first two letters (``tx`` -> ``threadIdx.x``, ``bya`` -> ``blockIdx.y``,
  :attr:`steptp.leir.ast.Loop.thread_tag`), so ``tx`` -> ``ty`` is a real change (another
  thread axis) and is kept, while ``bxa`` -> ``bxq`` is a renaming;
* intermediate tensors (every tensor not in ``known``, the signature's inputs and outputs),
  consistently everywhere.

Dtypes, storage scopes, extents, loop kinds and order, and every expression stay as they
are. Used by :mod:`steptp.rewards` so that a completion that only renames things scores as
*unchanged* (issue 34), not as an optimisation step; not the search's CPU no-op test
(``loop_binding`` changes nothing on the CPU but is a real GPU step, and is not a renaming).
"""

from __future__ import annotations

from typing import Iterable

from . import ast as A


def alpha_normal(prog: A.Program, known: Iterable[str] = ()) -> A.Program:
    """``prog`` with every bound name replaced by a positional one (module docstring): loop
    variables by their nesting depth (``#0``, ``#1``..., a ``B`` loop's keeping its two binding
    letters: ``tx#0``), intermediate tensors by order of first appearance (``%0``, ``%1``...;
    tensors in ``known`` keep their names). The result is only for comparison (its names are
    not valid LEIR); two programs are alpha-equivalent exactly when their normal forms are
    equal. Linear in the size of the program."""
    keep = set(known)
    tensors: dict[str, str] = {}

    def tensor_name(name: str) -> str:
        if name in keep:
            return name
        return tensors.setdefault(name, f"%{len(tensors)}")

    def expr(e: A.Expr, scope: dict[str, str]) -> A.Expr:
        if isinstance(e, A.Index):
            return A.Index(scope.get(e.name, e.name))
        if isinstance(e, A.Tensor):
            name = tensor_name(e.name)
            return A.Tensor(name, e.dtype, e.scope, tuple(expr(i, scope) for i in e.indices))
        kids = A.children(e)
        return A.rebuild(e, tuple(expr(k, scope) for k in kids)) if kids else e

    def nest(n: A.Nest, scope: dict[str, str], depth: int) -> A.Nest:
        inner = dict(scope)
        loops = []
        for i, lp in enumerate(n.loops):
            name = (lp.var[:2] if lp.kind == "B" else "") + f"#{depth + i}"
            inner[lp.var] = name
            loops.append(A.Loop(lp.kind, lp.extent, name))
        body = []
        for item in n.body:
            if isinstance(item, A.Assign):
                target = expr(item.target, inner)
                body.append(A.Assign(target, expr(item.value, inner)))
            else:
                body.append(nest(item, inner, depth + len(n.loops)))
        return A.Nest(tuple(loops), tuple(body))

    return A.Program(tuple(nest(n, {}, 0) for n in prog.nests))


def alpha_equivalent(a: A.Program, b: A.Program, known: Iterable[str] = ()) -> bool:
    """True when ``a`` and ``b`` are the same program up to renaming loop variables and
    intermediate tensors (:func:`alpha_normal`; ``known``: the signature's tensor names, which
    are never renamed)."""
    known = frozenset(known)
    return a == b or alpha_normal(a, known) == alpha_normal(b, known)


__all__ = ["alpha_normal", "alpha_equivalent"]
