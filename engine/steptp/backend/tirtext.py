"""Fast TVMScript -> PrimFunc for the text :mod:`steptp.backend.tvmscript` emits.

``tvm.script.from_source`` is a general parser: it converts the Python ``ast`` into its own
``doc`` tree, evaluates every sub-expression separately (one ``compile`` per node, each
result stored under a temporary name), keeps a scoped variable table, attaches source spans
and finally runs the well-formedness checks: 15-20 ms (median) per corpus kernel measured
alone, more inside the pipeline. The direct build below takes about 2 ms for the same kernels.

:func:`build_primfunc` walks the Python ``ast`` of the text once and drives the same
IRBuilder calls the parser makes (``T.prim_func``/``T.arg``/``T.func_name``, ``for`` frames,
``with`` frames, ``T.buffer_store``, ``T.evaluate``, ``IRBuilder.name``), in the same order,
with the same names. Every expression is compiled once into a Python code object and
evaluated against the bound names and the parser's own globals (``T``, ``I``, ``tvm``...);
arithmetic, comparisons, ``and``/``or``/``not`` and unary minus are rewritten into calls of
the parser's operator dispatch (``tvm.script.parser.core.evaluator._eval_op``), so e.g.
``a < b`` becomes ``tirx.LT`` with the parser's ``_auto_broadcast`` rules, not Python's
operator. The result is structurally equal (``tvm.ir.assert_structural_equal``) to the
``main`` function of ``from_source`` (tested on the examples, the rule tests and corpus
programs, CPU/GPU/verification forms: tests/test_tir_direct.py).

Only the subset the lowering emits is accepted (module docstring of
:mod:`steptp.backend.tvmscript`): one ``@I.ir_module class`` holding one
``@T.prim_func(s_tir=...)`` function with ``T.Buffer`` parameters; statements ``for`` (over
``range(...)`` or a ``T.*`` loop frame), ``with`` (frames, no ``as``), assignments of a
buffer element, of a new buffer or of new block iterators, and expression statements.
Anything else (``if``, ``while``, slices, ``lambda``, a name bound twice or shadowing a
parser global...) or any error raises :class:`Unsupported`, and the caller falls back to
``from_source``, which gives the real diagnostic. The function is checked with
``tvm.s_tir.analysis.verify_well_formed`` as ``from_source`` does; a failure is
:class:`Unsupported` too.
"""

from __future__ import annotations

import ast
import collections
from typing import Any


class Unsupported(Exception):
    """The text is outside the subset :func:`build_primfunc` handles, or building it failed;
    parse it with ``tvm.script.from_source`` instead."""


class _Runtime:
    """TVM objects the builder needs, imported once (``tvm`` is imported lazily)."""

    def __init__(self) -> None:
        import tvm  # noqa: PLC0415
        from tvm.script.ir_builder import IRBuilder  # noqa: PLC0415
        from tvm.script.parser.core import doc  # noqa: PLC0415
        from tvm.script.parser.core.entry import _default_globals  # noqa: PLC0415
        from tvm.script.parser.core.evaluator import _eval_op  # noqa: PLC0415
        from tvm.tirx import is_buffer_var  # noqa: PLC0415
        from tvm.tirx.script import builder as T  # noqa: PLC0415

        self.tvm = tvm
        self.IRBuilder = IRBuilder
        self.T = T
        self.ForFrame = T.frame.ForFrame
        self.Frame = tvm.script.ir_builder.base.IRBuilderFrame
        self.is_buffer_var = is_buffer_var
        self.Var = tvm.ir.Var
        self.is_prim_expr = tvm.ir.is_prim_expr
        self.const = tvm.tirx.const
        self.verify = tvm.s_tir.analysis.verify_well_formed
        self.IRModule = tvm.IRModule
        self.globals: dict[str, Any] = dict(_default_globals())
        self.reserved = frozenset(self.globals)
        # operator helpers: the parser evaluates every BinOp/UnaryOp/Compare/BoolOp with
        # _eval_op (operand-type dispatch, e.g. tirx.LT with _auto_broadcast for "<")
        helpers: dict[str, Any] = {}
        for name in ("Add", "Sub", "Mult", "Div", "FloorDiv", "Mod", "Pow", "LShift", "RShift", "BitOr",
                     "BitXor", "BitAnd", "Eq", "NotEq", "Lt", "LtE", "Gt", "GtE"):
            helpers[_HELPER + name] = _binary(_eval_op, getattr(doc, name)())
        for name in ("USub", "UAdd", "Not", "Invert"):
            helpers[_HELPER + name] = _unary(_eval_op, getattr(doc, name)())
        helpers[_HELPER + "And"] = _boolop(_eval_op, doc.And())
        helpers[_HELPER + "Or"] = _boolop(_eval_op, doc.Or())
        self.globals.update(helpers)


_HELPER = "__stp_op_"


def _binary(eval_op, op):
    def f(a, b):
        return eval_op(op, [a, b])
    return f


def _unary(eval_op, op):
    def f(a):
        return eval_op(op, [a])
    return f


def _boolop(eval_op, op):
    """``a and b and ...`` as the parser evaluates it (ExprEvaluator._eval_bool_op): operands
    in order, short-circuit only while the value is a Python bool. Operands after the
    first arrive as thunks (``lambda: expr``)."""
    is_and = op.__class__.__name__ == "And"

    def f(value, *rest):
        for thunk in rest:
            if isinstance(value, bool) and (value is not is_and):
                return value
            value = eval_op(op, [value, thunk()])
        return value
    return f


_RT: _Runtime | None = None


def _runtime() -> _Runtime:
    global _RT
    if _RT is None:
        _RT = _Runtime()
    return _RT


# ---------------------------------------------------------------------------
# Expressions: Python ast -> code object
# ---------------------------------------------------------------------------

_PLAIN = (ast.Call, ast.Attribute, ast.Subscript, ast.Name, ast.Constant, ast.Tuple, ast.List, ast.Dict,
          ast.keyword, ast.Load, ast.Store)


class _Rewrite(ast.NodeTransformer):
    """Operators -> helper calls; anything outside the expression subset -> Unsupported."""

    def generic_visit(self, node):
        if not isinstance(node, _PLAIN):
            raise Unsupported(f"expression node {type(node).__name__}")
        return super().generic_visit(node)

    def visit_Name(self, node):
        if node.id.startswith(_HELPER) or not isinstance(node.ctx, ast.Load):
            raise Unsupported(f"name {node.id}")
        return node

    def visit_Subscript(self, node):
        if isinstance(node.slice, ast.Slice) or (isinstance(node.slice, ast.Tuple)
                                                 and any(isinstance(e, ast.Slice) for e in node.slice.elts)):
            raise Unsupported("slice")
        return self.generic_visit(node)

    def _call(self, name, args, like):
        f = ast.copy_location(ast.Name(id=_HELPER + name, ctx=ast.Load()), like)
        return ast.copy_location(ast.Call(func=f, args=args, keywords=[]), like)

    def visit_BinOp(self, node):
        return self._call(type(node.op).__name__, [self.visit(node.left), self.visit(node.right)], node)

    def visit_UnaryOp(self, node):
        return self._call(type(node.op).__name__, [self.visit(node.operand)], node)

    def visit_Compare(self, node):
        if len(node.ops) != 1 or type(node.ops[0]).__name__ in ("Is", "IsNot", "In", "NotIn"):
            raise Unsupported("chained or identity comparison")
        return self._call(type(node.ops[0]).__name__, [self.visit(node.left), self.visit(node.comparators[0])], node)

    def visit_BoolOp(self, node):
        vals = [self.visit(v) for v in node.values]
        noargs = ast.arguments(posonlyargs=[], args=[], kwonlyargs=[], kw_defaults=[], defaults=[])
        thunks = [ast.copy_location(ast.Lambda(args=noargs, body=v), v) for v in vals[1:]]
        return self._call(type(node.op).__name__, [vals[0], *thunks], node)


_CODE_CACHE: "collections.OrderedDict[str, Any]" = collections.OrderedDict()
_CODE_CACHE_SIZE = 4096


def _code(node: ast.expr, lines: list[str] | None):
    """Code object of one expression; the last 4096 are cached by their source text (the
    rewrite is purely syntactic, names resolve at evaluation). Only single-line expressions
    are cached, and only when ``lines`` is given (ASCII text split at ``\\n`` only, so that
    ``lineno``/``col_offset``, which count UTF-8 bytes, index it exactly)."""
    key = None
    if lines is not None and node.lineno == node.end_lineno:
        key = lines[node.lineno - 1][node.col_offset:node.end_col_offset]
        hit = _CODE_CACHE.get(key)
        if hit is not None:
            _CODE_CACHE.move_to_end(key)
            return hit
    expr = ast.Expression(body=_Rewrite().visit(node))  # new nodes carry their origin's location
    code = compile(expr, "<tirtext>", "eval")
    if key is not None:
        _CODE_CACHE[key] = code
        if len(_CODE_CACHE) > _CODE_CACHE_SIZE:
            _CODE_CACHE.popitem(last=False)
    return code


# ---------------------------------------------------------------------------
# Statements
# ---------------------------------------------------------------------------


class _Builder:
    def __init__(self, rt: _Runtime, lines: list[str] | None):
        self.rt = rt
        self.lines = lines
        self.bound: list = []  # every Var/Buffer bound so far (the parser's var_table.exist, conservatively)

    def known(self, v) -> bool:
        return any(v.same_as(x) for x in self.bound)

    def add(self, name: str, v, env: dict) -> None:
        self.rt.IRBuilder.name(name, v)
        env[name] = v
        self.bound.append(v)

    def eval(self, node: ast.expr, env: dict) -> Any:
        return eval(_code(node, self.lines), env)  # noqa: S307 - our own lowering's text

    def bind(self, name: str, env: dict) -> None:
        if name in env or name in self.rt.reserved or name.startswith(_HELPER) or name == "__builtins__":
            raise Unsupported(f"name {name!r} bound twice or shadows a parser global")

    def body(self, stmts: list[ast.stmt], env: dict) -> None:
        for s in stmts:
            if isinstance(s, ast.Assign):
                self.assign(s, env)
            elif isinstance(s, ast.With):
                self.with_(s, env)
            elif isinstance(s, ast.For):
                self.for_(s, env)
            elif isinstance(s, ast.Expr):
                self.expr_stmt(s, env)
            else:
                raise Unsupported(f"statement {type(s).__name__}")

    def for_(self, node: ast.For, env: dict) -> None:
        # tirx parser visit_for: range(...) is intercepted at the AST level
        rt = self.rt
        if node.orelse or getattr(node, "type_comment", None):
            raise Unsupported("for-else")
        it = node.iter
        if isinstance(it, ast.Call) and isinstance(it.func, ast.Name) and it.func.id == "range":
            args = [self.eval(a, env) for a in it.args]
            kwargs = {kw.arg: self.eval(kw.value, env) for kw in it.keywords}
            if any(k is None for k in kwargs):
                raise Unsupported("**kwargs")
            if len(args) == 1:
                frame = rt.T.serial(0, args[0], **kwargs)
            elif len(args) == 2:
                frame = rt.T.serial(args[0], args[1], **kwargs)
            elif len(args) == 3:
                frame = rt.T.serial(args[0], args[1], step=args[2], **kwargs)
            else:
                raise Unsupported("range arity")
        else:
            frame = self.eval(it, env)
        if not isinstance(frame, rt.ForFrame) or not isinstance(node.target, ast.Name):
            raise Unsupported("for loop form")
        name = node.target.id
        self.bind(name, env)
        inner, mark = dict(env), len(self.bound)
        with frame as var:
            if not isinstance(var, rt.Var):
                raise Unsupported("loop over several variables")
            self.add(name, var, inner)
            self.body(node.body, inner)
        del self.bound[mark:]  # the scope's names are gone (parser: var_table frame popped)

    def with_(self, node: ast.With, env: dict) -> None:
        # tirx parser visit_with; no "as" targets in our subset
        if len(node.items) != 1 or node.items[0].optional_vars is not None:
            raise Unsupported("with form")
        frame = self.eval(node.items[0].context_expr, env)
        if not isinstance(frame, self.rt.Frame):
            raise Unsupported("with over a non-frame")
        mark = len(self.bound)
        with frame:
            self.body(node.body, dict(env))
        del self.bound[mark:]

    def assign(self, node: ast.Assign, env: dict) -> None:
        # tirx parser visit_assign + bind_assign_value
        rt = self.rt
        if len(node.targets) != 1:
            raise Unsupported("chained assignment")
        lhs = node.targets[0]
        rhs = self.eval(node.value, env)
        if isinstance(lhs, ast.Subscript):
            if isinstance(lhs.slice, ast.Tuple):
                if any(isinstance(e, (ast.Starred, ast.Slice)) for e in lhs.slice.elts):
                    raise Unsupported("starred or sliced store")
                indices = [self.eval(e, env) for e in lhs.slice.elts]
            elif isinstance(lhs.slice, ast.Slice):
                raise Unsupported("sliced store")
            else:
                indices = self.eval(lhs.slice, env)
            buf = self.eval(lhs.value, env)
            if not rt.is_buffer_var(buf):
                raise Unsupported("store into a non-buffer")
            rt.T.buffer_store(buf, rhs, indices)
        elif isinstance(lhs, ast.Name):
            self.bind(lhs.id, env)
            if not (rt.is_buffer_var(rhs) or (isinstance(rhs, rt.Var) and not self.known(rhs))):
                raise Unsupported("assignment of a value other than a new buffer or variable")
            self.add(lhs.id, rhs, env)
        elif isinstance(lhs, ast.Tuple):
            names = []
            for e in lhs.elts:
                if not isinstance(e, ast.Name):
                    raise Unsupported("nested assignment target")
                self.bind(e.id, env)
                names.append(e.id)
            if len(set(names)) != len(names):
                raise Unsupported("duplicate assignment target")
            vals = list(rhs) if isinstance(rhs, (list, tuple, rt.tvm.ir.Array)) else None
            if vals is None or len(vals) != len(names):
                raise Unsupported("tuple assignment arity")
            for n, v in zip(names, vals):
                if not (isinstance(v, rt.Var) and not self.known(v)):
                    raise Unsupported("tuple assignment of non-variables")
                self.add(n, v, env)
        else:
            raise Unsupported("assignment target")

    def expr_stmt(self, node: ast.Expr, env: dict) -> None:
        # tirx parser visit_expr_stmt, the cases our lowering emits
        rt = self.rt
        res = self.eval(node.value, env)
        if res is None or isinstance(res, str):
            return
        if isinstance(res, rt.Frame) or hasattr(res, "frames"):
            raise Unsupported("frame statement")
        if isinstance(res, rt.Var):
            return
        if rt.is_prim_expr(res):
            rt.T.evaluate(res)
        elif isinstance(res, (int, bool)):
            rt.T.evaluate(rt.const(res))
        else:
            raise Unsupported(f"expression statement of type {type(res).__name__}")


def _function(tree: ast.Module) -> ast.FunctionDef:
    """The one ``@T.prim_func`` of ``@I.ir_module class ...``; Unsupported otherwise."""
    if len(tree.body) != 1 or not isinstance(tree.body[0], ast.ClassDef):
        raise Unsupported("not one class")
    cls = tree.body[0]
    dec = cls.decorator_list
    if (len(dec) != 1 or not isinstance(dec[0], ast.Attribute) or dec[0].attr != "ir_module"
            or not isinstance(dec[0].value, ast.Name) or dec[0].value.id != "I" or cls.bases or cls.keywords):
        raise Unsupported("class is not a plain @I.ir_module")
    if len(cls.body) != 1 or not isinstance(cls.body[0], ast.FunctionDef):
        raise Unsupported("module holds other than one function")
    fn = cls.body[0]
    if fn.name == cls.name or fn.returns is not None or getattr(fn, "type_params", None):
        raise Unsupported("function signature")
    a = fn.args
    if a.posonlyargs or a.vararg or a.kwonlyargs or a.kwarg or a.defaults or a.kw_defaults:
        raise Unsupported("function arguments")
    if len(fn.decorator_list) != 1:
        raise Unsupported("function decorators")
    d = fn.decorator_list[0]
    if (not isinstance(d, ast.Call) or not isinstance(d.func, ast.Attribute) or d.func.attr != "prim_func"
            or not isinstance(d.func.value, ast.Name) or d.func.value.id != "T" or d.args):
        raise Unsupported("decorator is not T.prim_func(...)")
    for kw in d.keywords:
        if kw.arg != "s_tir" or not isinstance(kw.value, ast.Constant) or not isinstance(kw.value.value, bool):
            raise Unsupported("prim_func keyword")
    return fn


def build_primfunc(text: str):
    """Build the PrimFunc of a TVMScript text of our lowering without the TVMScript parser.

    ``text``: an ``@I.ir_module`` class with one ``@T.prim_func(s_tir=...)`` function, as
    :func:`steptp.backend.tvmscript.lower_module` emits it (CPU, CUDA and verification
    forms). Returns the ``tvm.tirx.PrimFunc``, structurally equal to the function that
    ``tvm.script.from_source(text)`` returns in its module (parameters, buffers, names,
    loops, blocks, expressions; source spans are not attached).

    Raises :class:`Unsupported` for text outside the subset described in the module
    docstring, for any error while building (the caller should re-parse with
    ``from_source`` for the diagnostic), and when ``tvm.s_tir.analysis.verify_well_formed``
    rejects the function. Source: mirrors tvm/tirx/script/parser/parser.py
    (``visit_function_def``, ``visit_for``, ``visit_with``, ``visit_assign``,
    ``bind_assign_value``, ``visit_expr_stmt``) and the operator dispatch of
    tvm/script/parser/core/evaluator.py (``_eval_op``, ``_eval_bool_op``), TVM 0.27.
    """
    try:
        tree = ast.parse(text)
    except Exception as e:  # noqa: BLE001 - SyntaxError, ValueError (NUL), RecursionError...
        raise Unsupported(f"not Python: {e}") from None
    fn = _function(tree)
    rt = _runtime()
    b = _Builder(rt, text.split("\n") if text.isascii() and "\r" not in text else None)
    s_tir = False
    for kw in fn.decorator_list[0].keywords:
        s_tir = kw.value.value
    env = dict(rt.globals)
    try:
        with rt.IRBuilder() as ib:
            with rt.T.prim_func(is_private=False, s_tir=s_tir, persistent=False):
                rt.T.func_name(fn.name)
                for arg in fn.args.args:
                    if arg.annotation is None:
                        raise Unsupported("parameter without annotation")
                    b.bind(arg.arg, env)
                    ann = b.eval(arg.annotation, env)
                    if not rt.is_buffer_var(ann):
                        raise Unsupported("parameter is not a T.Buffer")
                    param = rt.T.arg(arg.arg, ann)
                    env[arg.arg] = param
                    b.bound.append(param)
                b.body(fn.body, env)
        func = ib.get()
    except Unsupported:
        raise
    except Exception as e:  # noqa: BLE001 - any TVM or Python error: let the real parser report it
        raise Unsupported(f"{type(e).__name__}: {e}") from None
    try:
        ok = rt.verify(rt.IRModule({fn.name: func}))
    except Exception as e:  # noqa: BLE001
        raise Unsupported(f"not well-formed: {e}") from None
    if not ok:
        raise Unsupported("not well-formed")
    return func


__all__ = ["Unsupported", "build_primfunc"]
