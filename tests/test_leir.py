"""LEIR grammar, canonical printer, .leir file format and analysis."""

import math

import pytest
from hypothesis import given, settings, strategies as st

from steptp.leir import (
    LeirSyntaxError, format_leir, format_program, parse_expr, parse_leir, parse_program,
)
from steptp.leir import ast as A
from steptp.leir.analysis import LeirSemanticError, analyze, reduction_axes

MATMUL = "B^{8}_{tx=0}L^{16}_{a=0}L^{12}_{c=0}[D^{f64,g}_{tx,a}=D^{f64,g}_{tx,a}+A^{f64,g}_{tx,c}*C^{f64,g}_{c,a};];"

# Programs in the shapes the paper's translator and strategies emit (reference-notes §1.7, §6.2).
CORPUS = [
    MATMUL,
    "B^{4}_{tx=0}L^{32}_{a=0}[D^{f64,g}_{tx}=max(D^{f64,g}_{tx},A^{f64,g}_{tx,a});];"
    "B^{4}_{tx=0}L^{32}_{a=0}[E^{f64,g}_{tx}=E^{f64,g}_{tx}+exp(A^{f64,g}_{tx,a}-D^{f64,g}_{tx});];"
    "B^{4}_{tx=0}L^{32}_{a=0}[C^{f64,g}_{tx,a}=exp(A^{f64,g}_{tx,a}-D^{f64,g}_{tx})/E^{f64,g}_{tx};];",
    "B^{8}_{tx=0}L^{4}_{a=0}L^{20}_{c=0}[D^{f64,g}_{tx,a,c}=if_then_else(2<=c&c<18,A^{f64,g}_{tx,a,c-2},-inf);];",
    "B^{1024}_{tx=0}[I^{f64,g}_{tx}=-H^{i64,g}_{C^{i64,g}_{tx}}*E^{f64,g}_{tx,C^{i64,g}_{tx}};];",
    "B^{1}_{tx=0}[C^{f64,g}=sqrt(E^{f64,g});];",
    "B^{128}_{tx=0}L^{40}_{a=0}L^{40}_{c=0}[C^{f64,g}_{tx,a}=C^{f64,g}_{tx,a}+if_then_else(c<=a,A^{f64,g}_{tx,c},0);];",
    "B^{8}_{tx=0}B^{16}_{tya=0}P^{4}_{f=0}V^{4}_{g=0}U^{2}_{h=0}[D^{f16,s}_{tx,tya}=A^{f16,l}_{c*457+tx,c+5+g}**(1/2);];",
    "B^{4}_{bx=0}L^{8}_{a=0}[X^{f32,l}_{bx,a}=0;L^{8}_{c=0}[X^{f32,l}_{bx,a}=X^{f32,l}_{bx,a}+Y^{f32,g}_{bx,c};];];",
    "B^{10}_{tx=0}[H^{i64,g}_{tx}=if_then_else(tx!=-100,1,0);D^{bool,g}_{tx}=!(tx<3)|tx>=5&tx//2%3==1;];",
    "B^{2}_{tx=0}[E^{f32,g}_{tx}=1e-05+2.5*tanh(erf(abs(log(min(A^{f32,g}_{tx},3.0)))))-2**-1;];",
]


@pytest.mark.parametrize("text", CORPUS)
def test_canonical_round_trip(text):
    prog = parse_program(text)
    printed = format_program(prog)
    assert printed == text
    assert parse_program(printed) == prog


def test_matmul_ast_shape():
    prog = parse_program(MATMUL)
    (nest,) = prog.nests
    assert [(l.kind, l.extent, l.var) for l in nest.loops] == [("B", 8, "tx"), ("L", 16, "a"), ("L", 12, "c")]
    (eq,) = nest.body
    assert eq.target == A.Tensor("D", "f64", "g", (A.Index("tx"), A.Index("a")))
    assert eq.value == A.BinOp("+", eq.target, A.BinOp(
        "*", A.Tensor("A", "f64", "g", (A.Index("tx"), A.Index("c"))),
        A.Tensor("C", "f64", "g", (A.Index("c"), A.Index("a")))))
    assert nest.loops[0].thread_tag == "threadIdx.x"


def test_subscript_first_and_whitespace_are_accepted():
    text = """B_{tx=0}^{8} L_{a=0}^{16} L_{c=0}^{12} [
        D_{tx,a}^{f64,g} = D_{tx,a}^{f64,g} + A_{tx,c}^{f64,g} * C_{c,a}^{f64,g} ;
    ];"""
    assert format_program(parse_program(text)) == MATMUL


def test_correction_form_is_a_nested_nest():
    text = "B^{4}_{tx=0}[X^{f32,g}_{tx}=0;]L^{8}_{c=0}[X^{f32,g}_{tx}=X^{f32,g}_{tx}+Y^{f32,g}_{tx,c};];"
    prog = parse_program(text)
    (outer,) = prog.nests
    assert isinstance(outer.body[1], A.Nest)
    assert format_program(prog) == (
        "B^{4}_{tx=0}[X^{f32,g}_{tx}=0;L^{8}_{c=0}[X^{f32,g}_{tx}=X^{f32,g}_{tx}+Y^{f32,g}_{tx,c};];];")


def test_comparison_chain_expands_to_and():
    e = parse_expr("if_then_else(1<=c<7,1,0)")
    cond = e.args[0]
    assert cond == A.BoolOp("and", A.Compare("<=", A.Int(1), A.Index("c")), A.Compare("<", A.Index("c"), A.Int(7)))


def test_operator_precedence_and_associativity():
    assert parse_expr("a-b-c") == A.BinOp("-", A.BinOp("-", A.Index("a"), A.Index("b")), A.Index("c"))
    assert parse_expr("a-(b-c)") == A.BinOp("-", A.Index("a"), A.BinOp("-", A.Index("b"), A.Index("c")))
    assert parse_expr("-a**2") == A.Neg(A.BinOp("**", A.Index("a"), A.Int(2)))
    assert parse_expr("a**b**c") == A.BinOp("**", A.Index("a"), A.BinOp("**", A.Index("b"), A.Index("c")))
    assert parse_expr("c*2+d*3") == A.BinOp("+", A.BinOp("*", A.Index("c"), A.Int(2)),
                                          A.BinOp("*", A.Index("d"), A.Int(3)))
    assert parse_expr("1.0e-5") == A.Float(1e-5)
    assert parse_expr("-inf") == A.Neg(A.Float(math.inf))
    assert parse_expr("ifthenelse(a<1,2,3)").func == "if_then_else"


@pytest.mark.parametrize("text,line,col,fragment", [
    ("B^{8}_{tx=0}[D^{f64,g}_{tx}=A^{f99,g}_{tx};];", 1, 32, "dtype code"),
    ("B^{8}_{q=0}[D^{f64,g}_{q}=1;];", 1, 8, "bound loop index 'q'"),
    ("B^{8}_{tx=0}[D^{f64,g}_{tx}=exp(1,2);];", 1, 29, "exp takes 1 argument"),
    ("B^{8}_{tx=0}[D^{f64,g}_{tx}=1+;];", 1, 31, "unexpected ';'"),
    ("B^{8}_{tx=0}[\nD^{f64,g}_{tx}=1", 2, 17, "unexpected end of input"),
    ("B^{8}_{tx=1}[D^{f64,g}_{tx}=1;];", 1, 11, "lower bound must be 0"),
    ("B^{8}_{tx=0}[D^{f64,g}_{tx}=1#;];", 1, 30, "unexpected character '#'"),
])
def test_syntax_errors_name_line_column_and_expectation(text, line, col, fragment):
    with pytest.raises(LeirSyntaxError) as info:
        parse_program(text, "prog.leir")
    err = info.value
    assert (err.source, err.line, err.column) == ("prog.leir", line, col)
    assert fragment in str(err)
    assert str(err).startswith(f"prog.leir:{line}:{col}:")


def test_expected_tokens_are_listed():
    with pytest.raises(LeirSyntaxError) as info:
        parse_program("B^{8}_{tx=0}[D^{f64,g}_{tx}=1+;];")
    assert "a tensor name" in info.value.expected
    assert "an integer" in info.value.expected


LEIR_FILE = """% program: Gemm ReLU
% input A: f32[8,12]
% param W: f32[16,12]
% output C: f32[8,16]
% a free comment
B^{8}_{tx=0}L^{16}_{a=0}L^{12}_{c=0}[D^{f32,g}_{tx,a}=D^{f32,g}_{tx,a}+A^{f32,g}_{tx,c}*W^{f32,g}_{a,c};];
B^{8}_{tx=0}L^{16}_{a=0}[C^{f32,g}_{tx,a}=max(D^{f32,g}_{tx,a},0.0);];
"""


def test_leir_file_round_trip():
    m = parse_leir(LEIR_FILE, "gemm.leir")
    assert m.signature.name == "Gemm ReLU"
    assert [(t.role, t.name, t.dtype, t.shape) for t in m.signature.tensors] == [
        ("input", "A", "f32", (8, 12)), ("param", "W", "f32", (16, 12)), ("output", "C", "f32", (8, 16))]
    text = format_leir(m)
    assert parse_leir(text) == m
    assert "% a free comment" not in text


def test_leir_file_errors_keep_line_numbers():
    bad = LEIR_FILE.replace("max(D^{f32,g}_{tx,a},0.0)", "max(D^{f32,g}_{tx,a},0.0")
    with pytest.raises(LeirSyntaxError) as info:
        parse_leir(bad, "gemm.leir")
    assert info.value.line == 7
    with pytest.raises(LeirSyntaxError) as info:
        parse_leir(LEIR_FILE.replace("f32[16,12]", "f33[16,12]"), "gemm.leir")
    assert (info.value.line, "unknown dtype 'f33'" in str(info.value)) == (3, True)
    with pytest.raises(LeirSyntaxError) as info:
        parse_leir(LEIR_FILE.replace("% output C: f32[8,16]", "% output C f32[8,16]"), "gemm.leir")
    assert info.value.line == 4


def test_analysis_shapes_reductions_and_init():
    m = parse_leir(LEIR_FILE)
    info = analyze(m.program, m.signature)
    assert info.intermediates == ["D"]
    assert info.shapes["D"] == (8, 16)
    first, second = info.equations
    assert first.reduction_axes == ("c",) and first.init == 0.0
    assert second.reduction_axes == () and second.init is None


def test_analysis_accumulates_onto_a_buffer_written_earlier():
    m = parse_leir("""% program: linear
% input A: f32[2,3]
% param W: f32[4,3]
% param Bias: f32[4]
% output C: f32[2,4]
B^{2}_{tx=0}L^{4}_{a=0}L^{3}_{c=0}[C^{f32,g}_{tx,a}=C^{f32,g}_{tx,a}+A^{f32,g}_{tx,c}*W^{f32,g}_{a,c};];
B^{2}_{tx=0}L^{4}_{a=0}[C^{f32,g}_{tx,a}=C^{f32,g}_{tx,a}+Bias^{f32,g}_{a};];
""")
    inits = [s.init for s in analyze(m.program, m.signature).equations]
    assert inits == [0.0, None]


def test_analysis_max_init_and_compound_shape():
    prog = parse_program(
        "B^{4}_{tx=0}L^{3}_{a=0}[D^{f64,g}_{tx*3+a}=A^{f64,g}_{tx,a};];"
        "B^{12}_{tx=0}[E^{f64,g}=max(E^{f64,g},D^{f64,g}_{tx});];")
    from steptp.leir import Signature, TensorDecl
    sig = Signature("t", (TensorDecl("A", "input", "f64", (4, 3)), TensorDecl("E", "output", "f64", ())))
    info = analyze(prog, sig)
    assert info.shapes["D"] == (12,)
    assert info.equations[1].init == -math.inf


def test_analysis_rejects_out_of_bounds_and_bad_dtypes():
    from steptp.leir import Signature, TensorDecl
    sig = Signature("t", (TensorDecl("A", "input", "f64", (4,)), TensorDecl("C", "output", "f64", (4,))))
    with pytest.raises(LeirSemanticError, match="out-of-bounds access 'A\\^\\{f64,g\\}_\\{tx\\+1\\}'"):
        analyze(parse_program("B^{4}_{tx=0}[C^{f64,g}_{tx}=A^{f64,g}_{tx+1};];"), sig)
    # the same read under an if_then_else guard is legal (lazy evaluation)
    analyze(parse_program("B^{4}_{tx=0}[C^{f64,g}_{tx}=if_then_else(tx<3,A^{f64,g}_{tx+1},0.0);];"), sig)
    with pytest.raises(LeirSemanticError, match="declared f64 in the signature but used as f32"):
        analyze(parse_program("B^{4}_{tx=0}[C^{f32,g}_{tx}=1.0;];"), sig)
    with pytest.raises(LeirSemanticError, match="writes input tensor A"):
        analyze(parse_program("B^{4}_{tx=0}[A^{f64,g}_{tx}=1.0;C^{f64,g}_{tx}=1.0;];"), sig)
    with pytest.raises(LeirSemanticError, match="not bound by an enclosing loop"):
        analyze(parse_program("B^{4}_{tx=0}[C^{f64,g}_{tx}=A^{f64,g}_{q};];"), sig)
    with pytest.raises(LeirSemanticError, match="output tensor C is never written"):
        analyze(parse_program("B^{4}_{tx=0}[D^{f64,g}_{tx}=A^{f64,g}_{tx};];"), sig)


def test_reduction_axes_only_for_self_reference():
    (nest,) = parse_program(MATMUL).nests
    assert reduction_axes(nest.loops, nest.body[0]) == ["c"]
    plain = A.Assign(A.Tensor("C", "f64", "g", (A.Index("tx"),)), A.Tensor("A", "f64", "g", (A.Index("a"),)))
    assert reduction_axes(nest.loops, plain) == []


# ---------------------------------------------------------------------------
# Property: random ASTs survive print -> parse unchanged
# ---------------------------------------------------------------------------

idx_names = st.sampled_from(["tx", "a", "c", "bxa", "d1", "g"])
leaf = st.one_of(
    st.integers(0, 10**6).map(A.Int),
    st.one_of(st.floats(0, 1e6, allow_nan=False), st.just(math.inf)).map(A.Float),
    idx_names.map(A.Index),
)


def _tensor(indices):
    return st.builds(A.Tensor, st.sampled_from(["A", "D", "Lb", "Xy2"]), st.sampled_from(sorted(A.DTYPES)),
                     st.sampled_from(["g", "s", "l"]), indices)


exprs = st.recursive(
    leaf,
    lambda sub: st.one_of(
        st.builds(A.Neg, sub),
        st.builds(A.Not, sub),
        st.builds(A.BinOp, st.sampled_from(A.BIN_OPS), sub, sub),
        st.builds(A.Compare, st.sampled_from(A.CMP_OPS), sub, sub),
        st.builds(A.BoolOp, st.sampled_from(["and", "or"]), sub, sub),
        st.builds(A.Call, st.sampled_from(["exp", "tanh"]), st.tuples(sub)),
        st.builds(A.Call, st.just("max"), st.tuples(sub, sub)),
        st.builds(A.Call, st.just("if_then_else"), st.tuples(sub, sub, sub)),
        _tensor(st.lists(sub, max_size=3).map(tuple)),
    ),
    max_leaves=12,
)


@settings(max_examples=300, deadline=None)
@given(exprs, _tensor(st.lists(idx_names.map(A.Index), max_size=3).map(tuple)))
def test_print_parse_round_trip_property(expr, target):
    prog = A.Program((A.Nest((A.Loop("B", 4, "tx"), A.Loop("L", 3, "a")), (A.Assign(target, expr),)),))
    assert parse_program(format_program(prog)) == prog


def test_redundant_parentheses_are_dropped_in_canonical_text():
    assert format_program(parse_program("B^{2}_{tx=0}[D^{f32,g}_{tx}=((A^{f32,g}_{(tx)})+(1));];")) == \
        "B^{2}_{tx=0}[D^{f32,g}_{tx}=A^{f32,g}_{tx}+1;];"
