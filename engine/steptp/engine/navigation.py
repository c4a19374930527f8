"""Where a rewrite acts and what it may call things: references to nests and equations
(:class:`NestRef`, :class:`EqRef`, :class:`CreatedRef`), program navigation by path
(:func:`get_item`, :func:`replace_items`, :func:`expr_at`, :func:`replace_expr`,
:func:`value_occurrences`, :func:`map_nest_exprs`) and fresh names that never collide with
a name of the program or its signature (:func:`program_names`, :func:`fresh_index_name`,
:func:`fresh_tensor_name`).

Paths: a nest/equation path is ``(n, i, j, ...)`` (top-level nest ``n``, then body item
indices), as in :func:`steptp.leir.analysis.equation_instances`. An expression path is a
tuple of child indices (:func:`steptp.leir.ast.children`) inside an equation's value,
through value positions only (tensor subscripts are not entered).
"""

from __future__ import annotations

import itertools
import re
from collections import Counter, OrderedDict
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator

from ..leir import ast as A
from ..leir.fileformat import LeirModule


class RewriteError(ValueError):
    """A rewrite primitive cannot be applied (bad arguments, illegal result)."""


# ---------------------------------------------------------------------------
# References to nests / equations (bindings of Nest- and Eq-sorted metavariables)
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class NestRef:
    """A nest of the program by path (``(n,)`` top level, ``(n, i)`` nested...)."""

    path: tuple[int, ...]

    def __str__(self) -> str:
        return "nest" + _fmt_path(self.path)


@dataclass(frozen=True)
class EqRef:
    """An equation of the program by path (its last element is the body index)."""

    path: tuple[int, ...]

    def __str__(self) -> str:
        return "eq" + _fmt_path(self.path)


def _fmt_path(p) -> str:
    return "(" + ",".join(map(str, p)) + ")"


@dataclass(frozen=True)
class CreatedRef:
    """A nest or equation created by an earlier rewrite step of the same rule and named
    with ``as: name``; resolved to its current path by :class:`RewriteContext`."""

    name: str

    def __str__(self) -> str:
        return "?" + self.name


def _shift_path(path, parent: tuple, pos: int, delta: int):
    """``path`` after ``delta`` items were inserted (+) / removed (-) at ``parent + (pos,)``;
    ``None`` when the path itself was removed."""
    if path is None:
        return None
    k = len(parent)
    if len(path) > k and path[:k] == parent:
        if delta < 0 and pos <= path[k] < pos - delta:
            return None
        if path[k] >= pos + (0 if delta > 0 else -delta):
            return path[:k] + (path[k] + delta,) + path[k + 1:]
    return path


# ---------------------------------------------------------------------------
# Program navigation
# ---------------------------------------------------------------------------


def get_item(prog: A.Program, path: tuple[int, ...]):
    """The nest or equation at ``path``. Raises :class:`RewriteError` if absent."""
    try:
        node: Any = prog.nests[path[0]]
        for i in path[1:]:
            node = node.body[i]
        return node
    except (IndexError, AttributeError, TypeError):
        raise RewriteError(f"no nest or equation at path {_fmt_path(path)}") from None


def enclosing_loops(prog: A.Program, path: tuple[int, ...]) -> tuple[A.Loop, ...]:
    """The loops enclosing the item (equation or nest) at ``path``, outermost first: those
    of every nest on the path above it."""
    node = prog.nests[path[0]]
    loops = node.loops
    for i in path[1:-1]:
        node = node.body[i]
        loops += node.loops
    return loops


def get_nest(prog: A.Program, path: tuple[int, ...]) -> A.Nest:
    """The nest at ``path``; :class:`RewriteError` if absent or an equation."""
    n = get_item(prog, path)
    if not isinstance(n, A.Nest):
        raise RewriteError(f"path {_fmt_path(path)} is an equation, not a nest")
    return n


def replace_items(prog: A.Program, path: tuple[int, ...], new: tuple) -> A.Program:
    """Replace the item at ``path`` by the items ``new`` (zero, one or several)."""
    new = tuple(new)

    def rec(items: tuple, rest: tuple[int, ...]) -> tuple:
        i = rest[0]
        if not 0 <= i < len(items):
            raise RewriteError(f"no item at path {_fmt_path(path)}")
        if len(rest) == 1:
            return items[:i] + new + items[i + 1:]
        node = items[i]
        if not isinstance(node, A.Nest):
            raise RewriteError(f"path {_fmt_path(path)} goes through an equation")
        return items[:i] + (A.Nest(node.loops, rec(node.body, rest[1:])),) + items[i + 1:]

    nests = rec(prog.nests, tuple(path))
    for n in nests:
        if not isinstance(n, A.Nest):
            raise RewriteError("a top-level item must be a nest")
    return A.Program(nests)


def replace_item(prog: A.Program, path: tuple[int, ...], new) -> A.Program:
    """Replace the nest or equation at ``path`` by ``new``."""
    return replace_items(prog, path, (new,))


def value_children(e: A.Expr) -> tuple:
    """Children of ``e`` in value positions (a tensor's subscripts are not values)."""
    return () if isinstance(e, A.Tensor) else A.children(e)


def expr_at(e: A.Expr, epath: tuple[int, ...]) -> A.Expr:
    """The subterm of ``e`` at value path ``epath``."""
    for i in epath:
        e = value_children(e)[i]
    return e


def replace_expr(e: A.Expr, epath: tuple[int, ...], new: A.Expr) -> A.Expr:
    """``e`` with the subterm at value path ``epath`` replaced by ``new`` (only there)."""
    if not epath:
        return new
    kids = list(value_children(e))
    kids[epath[0]] = replace_expr(kids[epath[0]], epath[1:], new)
    return A.rebuild(e, tuple(kids))


def value_occurrences(e: A.Expr, target: A.Expr, prefix: tuple[int, ...] = ()) -> list[tuple[int, ...]]:
    """Paths of every occurrence of ``target`` in value positions of ``e`` (pre-order)."""
    out = []
    if e == target:
        out.append(prefix)
    for i, c in enumerate(value_children(e)):
        out.extend(value_occurrences(c, target, prefix + (i,)))
    return out


def map_nest_exprs(nest: A.Nest, fn: Callable[[A.Expr], A.Expr]) -> A.Nest:
    """Apply ``fn`` to every equation target and value inside ``nest`` (inner nests too)."""
    body = []
    for item in nest.body:
        if isinstance(item, A.Assign):
            t = fn(item.target)
            if not isinstance(t, A.Tensor):
                raise RewriteError("an equation target must stay a tensor")
            body.append(A.Assign(t, fn(item.value)))
        else:
            body.append(map_nest_exprs(item, fn))
    return A.Nest(nest.loops, tuple(body))


def nest_loop_vars(nest: A.Nest) -> set[str]:
    """Loop indices of a nest and of its inner nests."""
    out = {l.var for l in nest.loops}
    for item in nest.body:
        if isinstance(item, A.Nest):
            out |= nest_loop_vars(item)
    return out


class IdentityMemo:
    """Values computed from immutable objects (a program, its signature), kept for the last
    ``size`` keys by object identity. The entry holds the objects themselves, so their ids
    cannot be reused by other objects while it lives. Parameter domains and value functions
    ask the same whole-program question once per candidate; this answers it once per
    program."""

    def __init__(self, size: int = 32):
        self.size = size
        self._entries: "OrderedDict[tuple, tuple]" = OrderedDict()

    def get(self, objs: tuple, compute: Callable[[], Any], extra: Any = None):
        """``compute()`` for the objects ``objs`` (and the hashable ``extra``), memoised."""
        key = (tuple(id(o) for o in objs), extra)
        hit = self._entries.get(key)
        if hit is not None and all(a is b for a, b in zip(hit[0], objs)):
            return hit[1]
        value = compute()
        self._entries[key] = (objs, value)
        while len(self._entries) > self.size:
            self._entries.popitem(last=False)
        return value


def iter_tensors(prog: A.Program) -> Iterator[A.Tensor]:
    """Every tensor occurrence (targets, values, subscripts) in program order."""
    for _, eq in prog.equations():
        for x in A.walk(eq.target):
            if isinstance(x, A.Tensor):
                yield x
        for x in A.walk(eq.value):
            if isinstance(x, A.Tensor):
                yield x


# ---------------------------------------------------------------------------
# Names
# ---------------------------------------------------------------------------

#: Words an index name may not take (they lex as keywords / functions / dtypes).
RESERVED_INDEX_NAMES = frozenset({"inf", "and", "or", "ifthenelse"} | set(A.FUNCTIONS) | set(A.DTYPES))
#: Loop-index alphabet of the translator (reference-notes §1.3): a..z minus t b v x y z e.
INDEX_ALPHABET = tuple("acdfghijklmnopqrsuw")
#: Tensor-name alphabet (reference-notes §1.4): A..Z minus the loop kinds L P V B U and T.
TENSOR_ALPHABET = tuple("ACDEFGHIJKMNOQRSWXYZ")
_BOUND_RE = re.compile(r"^[tb][xyz]")


def program_names(module: LeirModule | A.Program, nests: Iterable[int] | None = None) -> set[str]:
    """Every name in use: tensors (program and signature) and loop indices of all nests, or
    with ``nests`` (top-level nest positions) only of those nests. Loop indices are local to
    their top-level nest (the translator gives every nest ``a, c, d...``), so a fresh index
    needs to avoid only the names of the nests a rewrite touches."""
    prog = module.program if isinstance(module, LeirModule) else module
    names: set[str] = set()
    if isinstance(module, LeirModule):
        names |= set(module.signature.names)
    for t in iter_tensors(prog):
        names.add(t.name)

    def rec(n: A.Nest):
        for l in n.loops:
            names.add(l.var)
        for item in n.body:
            if isinstance(item, A.Nest):
                rec(item)
            else:
                for x in itertools.chain(A.walk(item.target), A.walk(item.value)):
                    if isinstance(x, A.Index):
                        names.add(x.name)

    keep = None if nests is None else set(nests)
    for i, n in enumerate(prog.nests):
        if keep is None or i in keep:
            rec(n)
    return names


def _index_candidates() -> Iterator[str]:
    yield from INDEX_ALPHABET
    for a in INDEX_ALPHABET:
        for b in INDEX_ALPHABET:
            yield a + b
    for k in itertools.count(1):
        for a in INDEX_ALPHABET:
            yield f"{a}{k}"


def fresh_index_name(taken: set[str], kind: str | None = None, like: str | None = None,
                     prefix: str | None = None) -> str:
    """A new loop-index name not in ``taken`` (which is updated).

    For ``kind == "B"`` the name must encode the thread/block axis: it starts with
    ``prefix`` (e.g. ``"tx"``), or with the first two letters of ``like`` when ``like``
    is itself a bound name (``tx`` -> ``txa``). Otherwise names follow the translator's
    alphabet (``a c d f ...``, then ``aa ac ...``), skipping every taken or reserved word
    and every name that starts like a bound index.
    """
    if kind == "B":
        if prefix is None:
            if like is None or not _BOUND_RE.match(like):
                raise RewriteError(f"a bound (B) loop index needs a tx/ty/tz/bx/by/bz prefix (like={like!r})")
            prefix = like[:2]
        if not _BOUND_RE.match(prefix):
            raise RewriteError(f"bad bound-loop prefix {prefix!r}")
        for c in _index_candidates():
            name = prefix + c
            if name not in taken and name not in RESERVED_INDEX_NAMES:
                taken.add(name)
                return name
    for c in _index_candidates():
        if c not in taken and c not in RESERVED_INDEX_NAMES and not _BOUND_RE.match(c):
            taken.add(c)
            return c
    raise AssertionError("unreachable")  # pragma: no cover


def fresh_tensor_name(taken: set[str]) -> str:
    """A new tensor name not in ``taken`` (updated): ``A C D ...`` then ``Aa Ac ...``."""
    lower = INDEX_ALPHABET
    cands = itertools.chain(TENSOR_ALPHABET, (a + b for a in TENSOR_ALPHABET for b in lower),
                            (f"{a}{k}" for k in itertools.count(1) for a in TENSOR_ALPHABET))
    for c in cands:
        if c not in taken:
            taken.add(c)
            return c
    raise AssertionError("unreachable")  # pragma: no cover


def nest_diff(before: A.Program, after: A.Program) -> tuple[list[int], list[int]]:
    """Positions of the top-level nests only in ``before`` / only in ``after``: the multiset
    difference by value, in program order (of several equal nests, the first ones are the
    surplus). Used for a step's CoT (the nests it removes and adds) and its figures (the
    kernels it changes)."""

    def only(xs, ys) -> list[int]:
        left = Counter(xs) - Counter(ys)
        out = []
        for i, x in enumerate(xs):
            if left[x] > 0:
                out.append(i)
                left[x] -= 1
        return out

    return only(before.nests, after.nests), only(after.nests, before.nests)
