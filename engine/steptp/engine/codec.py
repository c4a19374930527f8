"""The one LEIR AST <-> egglog codec: a table of constructors drives the schema text, the
encoder (AST -> s-expression, for program facts and, with holes, for rule queries) and the
decoder (egglog ``TermDag`` -> AST), as egglog-python keeps its conversions in one place
(``egglog/egraph_state.py``).

Sorts and constructors (:data:`CONSTRUCTORS`, in schema order)::

    Term : (INT i64) (FLT String) (IDX String) (TNS name dtype scope TL) (NEG Term)
           (BIN op Term Term) (CALL func TL) (CMP op Term Term) (BOOL op Term Term) (NOT Term)
    TL   : (TNil) (TCons Term TL)          ; subscript / argument lists
    Lp   : (LOOP kind extent var)          ; one loop descriptor
    LL   : (LNil) (LCons Lp LL)            ; a nest's loop list

Each constructor row names the AST class and, per argument, the AST field and its *kind*:
``String`` (a name or operator, an egglog string literal), ``Float`` (a float literal
stored as the string of its ``repr``: exact, ``inf`` included), ``i64``, ``Term``, ``Args``
(a call's argument list) and ``Subscript`` (a tensor's subscript list; both ``TL`` cons
lists, kept apart so that a query encoder may splice the one and not the other).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from egglog import bindings as B

from ..leir import ast as A

#: egglog sort of each argument kind
KIND_SORT = {"String": "String", "Float": "String", "i64": "i64", "Term": "Term", "Args": "TL",
             "Subscript": "TL", "Lp": "Lp", "LL": "LL"}


@dataclass(frozen=True)
class Constructor:
    """One egglog constructor of an AST node class: ``fields`` pairs each argument's AST
    field name with its kind (see the module docstring); ``sort`` is the result sort."""

    name: str
    node: type
    fields: tuple[tuple[str, str], ...]
    sort: str = "Term"


#: AST node constructors, in schema order.
CONSTRUCTORS: tuple[Constructor, ...] = (
    Constructor("INT", A.Int, (("value", "i64"),)),
    Constructor("FLT", A.Float, (("value", "Float"),)),
    Constructor("IDX", A.Index, (("name", "String"),)),
    Constructor("TNS", A.Tensor, (("name", "String"), ("dtype", "String"), ("scope", "String"),
                                  ("indices", "Subscript"))),
    Constructor("NEG", A.Neg, (("operand", "Term"),)),
    Constructor("NOT", A.Not, (("operand", "Term"),)),
    Constructor("BIN", A.BinOp, (("op", "String"), ("lhs", "Term"), ("rhs", "Term"))),
    Constructor("CMP", A.Compare, (("op", "String"), ("lhs", "Term"), ("rhs", "Term"))),
    Constructor("BOOL", A.BoolOp, (("op", "String"), ("lhs", "Term"), ("rhs", "Term"))),
    Constructor("CALL", A.Call, (("func", "String"), ("args", "Args"))),
    Constructor("LOOP", A.Loop, (("kind", "String"), ("extent", "i64"), ("var", "String")), "Lp"),
)

#: cons lists: sort -> (nil, cons, element sort)
LISTS = {"TL": ("TNil", "TCons", "Term"), "LL": ("LNil", "LCons", "Lp")}

BY_NODE: dict[type, Constructor] = {c.node: c for c in CONSTRUCTORS}
BY_NAME: dict[str, Constructor] = {c.name: c for c in CONSTRUCTORS}

#: Term constructors with one Term argument (``NEG``, ``NOT``) and with an operator and two
#: Term arguments (``BIN``, ``CMP``, ``BOOL``): the analyses recurse through them generically.
UNARY = tuple(c.name for c in CONSTRUCTORS if c.sort == "Term" and [k for _, k in c.fields] == ["Term"])
BINARY = tuple(c.name for c in CONSTRUCTORS
               if c.sort == "Term" and [k for _, k in c.fields] == ["String", "Term", "Term"])


def _constructor_decl(c: Constructor) -> str:
    return f"(constructor {c.name} ({' '.join(KIND_SORT[k] for _, k in c.fields)}) {c.sort})"


def _list_decls(sort: str) -> list[str]:
    nil, cons, elem = LISTS[sort]
    return [f"(constructor {nil} () {sort})", f"(constructor {cons} ({elem} {sort}) {sort})"]


#: egglog declarations of the sorts, the list constructors and :data:`CONSTRUCTORS`.
SCHEMA_DECLS = "\n".join(["(sort Term) (sort TL) (sort Lp) (sort LL)", *_list_decls("TL"),
                          *[_constructor_decl(c) for c in CONSTRUCTORS], *_list_decls("LL")])


def sx_str(s: str) -> str:
    """egglog string literal."""
    return json.dumps(s)


def float_key(v: float) -> str:
    """Canonical text of a float literal as stored in the e-graph (``repr``)."""
    return repr(float(v))


def cons_list(items: list[str], tail: str = "(TNil)", cons: str = "TCons") -> str:
    """egglog cons list ``(TCons a (TCons b (TNil)))`` of encoded items (``tail``: e.g. a
    ``TL`` query variable for a trailing splice)."""
    out = tail
    for it in reversed(items):
        out = f"({cons} {it} {out})"
    return out


class Encoder:
    """AST -> egglog s-expression text, driven by :data:`CONSTRUCTORS`.

    ``memo=True`` memoises terms per node (program facts: identical subterms are encoded
    once). Query encoders (:func:`steptp.engine.patterns.to_sexp`) subclass it and override
    :meth:`term` (metavariables), :meth:`field` (name slots) and :meth:`subscript` (list
    splices). Raises ``TypeError`` for an object no constructor encodes."""

    def __init__(self, memo: bool = True):
        self.memo: dict[Any, str] | None = {} if memo else None

    def term(self, e) -> str:
        """s-expression of an expression (memoised when enabled)."""
        if self.memo is not None:
            s = self.memo.get(e)
            if s is not None:
                return s
        c = BY_NODE.get(type(e))
        if c is None or c.sort != "Term":
            raise TypeError(f"not a LEIR expression: {e!r}")
        s = self.node(c, e)
        if self.memo is not None:
            self.memo[e] = s
        return s

    def node(self, c: Constructor, e) -> str:
        """``(NAME arg...)`` of node ``e`` by its constructor row ``c``."""
        field = self.field
        return f"({c.name} {' '.join([field(getattr(e, f), k) for f, k in c.fields])})"

    def field(self, v, kind: str) -> str:
        """One constructor argument of the given kind."""
        if kind == "Term":
            return self.term(v)
        if kind == "String":
            return sx_str(v)
        if kind == "Float":
            return sx_str(float_key(v))
        if kind == "i64":
            return str(v)
        if kind == "Args":
            return self.tlist(v)
        if kind == "Subscript":
            return self.subscript(v)
        raise TypeError(f"unknown argument kind {kind!r}")

    def tlist(self, items) -> str:
        """s-expression of an argument list."""
        return cons_list([self.term(it) for it in items])

    def subscript(self, items) -> str:
        """s-expression of a subscript list."""
        return self.tlist(items)

    def loop(self, l: A.Loop) -> str:
        """s-expression of a loop descriptor."""
        return self.node(BY_NODE[A.Loop], l)

    def loops(self, loops) -> str:
        """s-expression of a loop list."""
        return cons_list([self.loop(l) for l in loops], "(LNil)", "LCons")


def decode_term(td, tid: int, memo: dict):
    """egglog ``TermDag`` node ``tid`` -> AST node (Term, Lp by :data:`CONSTRUCTORS`),
    tuple (``TL``/``LL`` lists), ``frozenset`` (egglog sets) or a Python literal.
    ``memo`` caches per node id. Raises ``TypeError`` for an unknown constructor."""
    r = memo.get(tid)
    if r is not None:
        return r
    t = td.get(tid)
    if isinstance(t, B.TermLit):
        r = t.value.value
    else:
        r = _node(t.name, [decode_term(td, a, memo) for a in t.args])
    memo[tid] = r
    return r


def _node(name: str, vals: list):
    """The decoded value of constructor ``name`` applied to the decoded ``vals``: an AST node
    (:data:`CONSTRUCTORS`), a tuple (``TL``/``LL`` cons lists) or a ``frozenset`` (egglog
    sets). Raises ``TypeError`` for an unknown constructor."""
    c = BY_NAME.get(name)
    if c is not None:
        return c.node(*[float(v) if k == "Float" else v for v, (_, k) in zip(vals, c.fields)])
    if name in ("TNil", "LNil"):
        return ()
    if name in ("TCons", "LCons"):
        return (vals[0],) + vals[1]
    if name in ("set-of", "set-empty"):
        return frozenset(vals)
    raise TypeError(f"unexpected egglog term {name}")


class FrozenDecoder:
    """Rows of an e-graph snapshot (``egglog.bindings.EGraph.freeze()``) decoded as
    :func:`decode_term` decodes ``print-function`` output: AST nodes (Term, Lp), tuples
    (``TL``/``LL``) and Python literals.

    ``print-function`` extracts every Term cell through a fresh extractor (about 150 µs per
    command plus ~6 µs per cell); one snapshot serves every relation of a loaded program.
    The e-graph is union-free (egraph.py), so each e-class of a constructor sort has one
    node: its constructor row. Raises ``TypeError`` for a sort or e-class it cannot decode.
    """

    _CTORS = tuple(BY_NAME) + tuple(n for nil, cons, _ in LISTS.values() for n in (nil, cons))

    def __init__(self, eg, frozen):
        self.eg = eg
        self.functions = frozen.functions
        self.nodes: dict[tuple, tuple] = {}  # (sort, e-class value) -> (constructor, input sorts, inputs)
        for name in self._CTORS:
            f = self.functions.get(name)
            if f is None:
                continue
            sort, sorts = f.output_sort, f.input_sorts
            for r in f.rows:
                self.nodes[(sort, r.output)] = (name, sorts, r.inputs)
        self.memo: dict[tuple, Any] = {}
        self._prim = {"i64": eg.value_to_i64, "String": eg.value_to_string, "bool": eg.value_to_bool,
                      "f64": eg.value_to_f64}

    def value(self, sort: str, v):
        """The decoded value ``v`` of egglog sort ``sort``."""
        prim = self._prim.get(sort)
        if prim is not None:
            return prim(v)
        key = (sort, v)
        r = self.memo.get(key)
        if r is not None:
            return r
        node = self.nodes.get(key)
        if node is None:
            raise TypeError(f"no constructor node for a value of sort {sort}")
        name, sorts, args = node
        r = _node(name, [self.value(s, a) for s, a in zip(sorts, args)])
        self.memo[key] = r
        return r

    def rows(self, fn: str) -> list[list]:
        """All rows of relation ``fn`` (inputs only), decoded; ``[]`` if it has none."""
        f = self.functions.get(fn)
        if f is None:
            return []
        sorts = f.input_sorts
        val = self.value
        return [[val(s, v) for s, v in zip(sorts, r.inputs)] for r in f.rows if not r.subsumed]


__all__ = ["FrozenDecoder", "KIND_SORT", "Constructor", "CONSTRUCTORS", "LISTS", "BY_NODE", "BY_NAME", "UNARY", "BINARY",
           "SCHEMA_DECLS", "sx_str", "float_key", "cons_list", "Encoder", "decode_term"]
