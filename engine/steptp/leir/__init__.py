"""LEIR: the loop-equation IR (paper §2.2). AST, parser, canonical printer, file format, analysis."""

from .ast import *  # noqa: F401,F403
from .fileformat import LeirModule, Signature, TensorDecl, format_leir, load_leir, parse_leir, save_leir
from .parser import LeirSyntaxError, parse_expr, parse_program
from .printer import format_expr, format_loops, format_nest, format_node, format_program, format_tensor
