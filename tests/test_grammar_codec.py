"""One grammar (rule patterns and values parsed by ``pattern.lark``, which imports and
extends ``grammar.lark``) and one AST <-> egglog codec (``steptp.engine.codec``)."""

from __future__ import annotations

from fractions import Fraction
from importlib import resources
from pathlib import Path

import pytest

from steptp.engine import codec
from steptp.engine import patterns as P
from steptp.engine.domains import parse_value
from steptp.engine.egraph import SCHEMA, EggSession, ProgramIndex
from steptp.leir import ast as A
from steptp.leir import parse_leir, parse_program
from steptp.leir.parser import RULE_TEXT_STARTS, LeirSyntaxError, parse_rule_text
from steptp.rules import RuleError, load_rule_text

RULES_DIR = Path(__file__).resolve().parent.parent / "rules"

SOFTMAX = """% program: softmax
% input A: f32[4,8]
% output C: f32[4,8]
B^{4}_{tx=0}L^{8}_{a=0}[D^{f32,g}_{tx}=max(D^{f32,g}_{tx},A^{f32,g}_{tx,a});];
B^{4}_{tx=0}L^{8}_{a=0}[E^{f32,g}_{tx}=E^{f32,g}_{tx}+exp(A^{f32,g}_{tx,a}-D^{f32,g}_{tx});];
B^{4}_{tx=0}L^{8}_{a=0}[C^{f32,g}_{tx,a}=if_then_else(a<1&!(tx>=2),-inf,exp(A^{f32,g}_{tx,a}-D^{f32,g}_{tx})/E^{f32,g}_{tx}*2.5e-1);];
"""


# ---------------------------------------------------------------------------
# One grammar
# ---------------------------------------------------------------------------


def test_pattern_grammar_extends_the_leir_grammar():
    text = resources.files("steptp.leir").joinpath("pattern.lark").read_text()
    assert "%import .grammar (" in text and "%extend atom" in text and "%override tensor" in text
    src = Path(P.__file__).read_text()
    assert "class _Parser" not in src and "_Parser" not in Path(P.__file__).with_name("domains.py").read_text()
    assert set(RULE_TEXT_STARTS) == {"pattern_expr", "pattern_loops", "pattern_equation", "pattern_nest",
                                     "pattern_item", "value", "where_clause"}
    match_src = Path(P.__file__).with_name("match.py").read_text()
    assert "tokenize" not in match_src and "_split_and" not in match_src and "tokenize" not in src


def test_patterns_parse_to_the_leir_ast_with_holes():
    w1, w2 = P.PVar("_w1"), P.PVar("_w2")
    assert P.parse_expr_pattern("log(?a*?b)") == A.Call("log", (A.BinOp("*", P.PVar("a"), P.PVar("b")),))
    assert P.parse_expr_pattern("?X^{?dt,g}_{?i,tx}") == A.Tensor(P.PVar("X"), P.PVar("dt"), "g",
                                                                    (P.PVar("i"), A.Index("tx")))
    # a tensor without superscript (and a bare name) matches any dtype and scope
    assert P.parse_expr_pattern("D_{tx}") == A.Tensor("D", w1, w2, (A.Index("tx"),))
    assert P.parse_expr_pattern("D") == A.Tensor("D", w1, w2, ())
    # both script orders, whitespace anywhere, the boolean words of preconditions
    assert P.parse_expr_pattern("?X _{?i} ^{f32 , g}") == P.parse_expr_pattern("?X^{f32,g}_{?i}")
    assert P.parse_expr_pattern("?a and ?b or ?c") == P.parse_expr_pattern("?a & ?b | ?c") == \
        A.BoolOp("or", A.BoolOp("and", P.PVar("a"), P.PVar("b")), P.PVar("c"))
    assert P.parse_expr_pattern("1<=?c<7") == A.BoolOp("and", A.Compare("<=", A.Int(1), P.PVar("c")),
                                                       A.Compare("<", P.PVar("c"), A.Int(7)))
    assert P.parse_expr_pattern("-?a**?b") == A.Neg(A.BinOp("**", P.PVar("a"), P.PVar("b")))
    # loops: metavariable kind/extent/index, integer arithmetic extents, splices
    assert P.parse_loops_pattern("?k^{?n/?f}_{?io=0}L_{?ii=0}^{?f}") == (
        A.Loop(P.PVar("k"), A.BinOp("/", P.PVar("n"), P.PVar("f")), P.PVar("io")),
        A.Loop("L", P.PVar("f"), P.PVar("ii")))
    assert P.parse_loops_pattern("*?pre L^{4}_{?i=0} *?post") == (P.PSplice("pre"), A.Loop("L", 4, P.PVar("i")),
                                                                  P.PSplice("post"))
    # a loop kind letter followed by {dtype,scope} is a tensor
    assert P.parse_equation_pattern("B^{f32,g}_{?i}=?v;") == A.Assign(A.Tensor("B", "f32", "g", (P.PVar("i"),)),
                                                                      P.PVar("v"))
    nest = P.parse_nest_pattern("*?L[?F^{f32,g}_{*?s,?a-1}=0.0;]L^{2}_{j=0}[?e=1;];")
    assert nest.loops == (P.PSplice("L"),) and len(nest.body) == 2
    assert nest.body[0].target.indices == (P.PSplice("s"), A.BinOp("-", P.PVar("a"), A.Int(1)))
    assert nest.body[1] == A.Nest((A.Loop("L", 2, "j"),), (A.Assign(P.PVar("e"), A.Int(1)),))
    assert P.parse_item_template("?X_{?i}=?X_{?i}+1.0") == P.parse_equation_pattern("?X_{?i}=?X_{?i}+1.0;")
    assert isinstance(P.parse_item_template("?k^{?n}_{?i=0}[?e=1;];"), A.Nest)


def test_wildcards_are_numbered_in_text_order():
    # the wildcards of a tensor without superscript come after those of its subscript
    t = P.parse_expr_pattern("A_{B}^{_,_}", wild="_p3_")
    assert (t.dtype, t.scope, t.indices[0].dtype) == (P.PVar("_p3_3"), P.PVar("_p3_4"), P.PVar("_p3_1"))
    t = P.parse_expr_pattern("A^{_,_}_{B}")
    assert (t.dtype, t.indices[0].scope) == (P.PVar("_w1"), P.PVar("_w4"))
    t = P.parse_expr_pattern("A_{B}")
    assert (t.indices[0].dtype, t.dtype) == (P.PVar("_w1"), P.PVar("_w3"))


def test_value_language():
    assert parse_value("?n/?f") == ("op", "/", ("var", "n"), ("var", "f"))
    assert parse_value("loops_of(?N)") == ("call", "loops_of", [("var", "N")])
    assert parse_value("f()") == ("call", "f", [])
    assert parse_value("not ?n == 2 or ?m and \"s\"") == (
        "or", ("not", ("cmp", "==", ("var", "n"), ("lit", 2))), ("and", ("var", "m"), ("lit", "s")))
    assert parse_value("-3") == ("op", "-", ("lit", 0), ("lit", 3))
    assert parse_value("V") == ("lit", "V") and parse_value("nothing") == ("lit", "nothing")
    assert parse_value("1.5") == ("lit", Fraction(3, 2))  # a decimal is an exact rational (issue 54)
    for bad in ("?n < 2 < 3", "1.5.2", "?a ?b", "?n >"):
        with pytest.raises(P.PatternError):
            parse_value(bad)


def test_pattern_errors_name_line_and_column():
    with pytest.raises(P.PatternError, match=r"line 1, column 8 in 'log\(\?a\*\)'"):
        P.parse_expr_pattern("log(?a*)")
    with pytest.raises(P.PatternError, match=r"unexpected ';'.* at line 2, column 4"):
        P.parse_nest_pattern("L^{4}_{i=0}[A=1;\n B=;];")
    with pytest.raises(P.PatternError, match="loop lower bound must be 0 at line 1, column 10"):
        P.parse_loops_pattern("L^{4}_{i=1}")
    with pytest.raises(P.PatternError, match="log takes 1 argument"):
        P.parse_expr_pattern("log(?a,?b)")
    with pytest.raises(P.PatternError, match="expected a loop descriptor"):
        P.parse_loops_pattern("")
    with pytest.raises(P.PatternError, match="expected .*a metavariable"):
        parse_value("?n > 2 and ?n <")
    with pytest.raises(ValueError, match="unknown entry rule"):
        parse_rule_text("1", "program", None)


def test_broken_rule_names_file_field_line_and_column():
    text = (RULES_DIR / "loop_split.yaml").read_text().replace('"?k^{?n}_{?i=0}"', '"?k^{?n}_{?i=0"')
    with pytest.raises(RuleError, match=r"broken\.yaml:23:23: match\.loop: .*expected '\}' at line 1, column 14"):
        load_rule_text(text, "broken.yaml")
    text = (RULES_DIR / "loop_split.yaml").read_text().replace('"factorizable(?n)"', '{check: "?n > 2 and"}')
    with pytest.raises(RuleError, match=r"broken\.yaml:25:24: where\[0\]\.check: .*line 1, column 11"):
        load_rule_text(text, "broken.yaml")


def test_where_clauses_parse_with_the_grammar():
    w = P.parse_where_clause
    assert w("nest_pos(?N, -1, _)") == ("item", ("call", "nest_pos", [("var", "N"), ("neg", ("lit", 1)), ("wild",)]))
    assert w('not scope_of(?Y, l)') == ("not", ("item", ("call", "scope_of", [("var", "Y"), ("lit", "l")])))
    assert w("?ho + ?kk == ?hp + 1") == ("cmp", "==", ("op", "+", ("var", "ho"), ("var", "kk")),
                                         ("op", "+", ("var", "hp"), ("lit", 1)))
    assert w("not (loop_info(?n, ?q, P, _, _) and ?q < ?p)") == ("not", ("item", ("group", [
        ("item", ("call", "loop_info", [("var", "n"), ("var", "q"), ("lit", "P"), ("wild",), ("wild",)])),
        ("cmp", "<", ("var", "q"), ("var", "p"))])))
    # "and", "not" and "or" are words where a value stands
    assert w("f(and, not)") == ("item", ("call", "f", [("lit", "and"), ("lit", "not")]))
    for bad in ("nest(?n) and nest(?m)", "?a < ?b < ?c", "?x = 1", "not ()", "nest(?n ?m)", "?x // 2 == 1"):
        with pytest.raises(P.PatternError, match="line 1, column"):
            w(bad)


def _where_atoms(*items):
    from steptp.engine.match import _WhereCompiler

    wc = _WhereCompiler({}, "r")
    return [wc.compile_item(it, f"where[{i}]") for i, it in enumerate(items)]


def test_where_clauses_compile_to_egglog_atoms():
    assert _where_atoms("nest_pos(?n, -1, _)", 'scope_of(?X, "s")', "not scope_of(?X, l)") == [
        (["(nest_pos mv_n -1 anon_tmp_1)"], None), (['(scope_of mv_X "s")'], None), ([], ['(scope_of mv_X "l")'])]
    # f(...) op rhs: the rhs's temporaries come before f's
    assert _where_atoms("loop_count(?n) == item_count(?n) + 1") == [
        (["(= tmp_2 (loop_count mv_n))", "(= tmp_1 (item_count mv_n))", "(= tmp_2 (+ tmp_1 1))"], None)]
    assert _where_atoms("?a + ?b * -?c == (?d - 1) % 3") == [
        (["(= (+ mv_a (* mv_b (- 0 mv_c))) (% (- mv_d 1) 3))"], None)]
    assert _where_atoms("not (loop_info(?n, ?q, P, _, _) and ?q < ?p)") == [
        ([], ['(loop_info mv_n mv_q "P" anon_tmp_1 anon_tmp_2)', "(< mv_q mv_p)"])]


@pytest.mark.parametrize("item, message", [
    ("frob(?n)", "unknown relation 'frob'"),
    ("nest(?n, ?m)", "nest takes 1 argument"),
    ("?x == loop_count(?n, ?m)", "loop_count takes 1 argument"),
    ("not ?x > 2", "'not' applies to a relation"),
    ("not (nest(?a) and not nest(?b))", "cannot contain another negation"),
    ("loop_count(?n)", "is a function: compare it"),
    ("nest(?n) == 1", "unexpected '==' after nest"),
    ("?x == nest(?n)", "nest is not a function"),
    ("?x / 0 == 1", "divides by zero"),
    ("nest(?n + 1)", "bad argument 1 of nest"),
    ("(nest(?n))", "expected a relation atom or a comparison"),
    ("nest(?n) and nest(?m)", r"unexpected 'and'.*line 1, column 10"),
])
def test_bad_where_clauses_are_refused(item, message):
    from steptp.engine.match import CompileError

    with pytest.raises(CompileError, match=message) as e:
        _where_atoms(item)
    assert e.value.field == "where[0]"


def test_broken_where_clause_names_file_and_field():
    text = (RULES_DIR / "loop_split.yaml").read_text().replace('"factorizable(?n)"', '"factorizable(?n) and"')
    with pytest.raises(RuleError, match=r"broken\.yaml:25:23: where\[0\]: unexpected 'and'.*line 1, column 18"):
        load_rule_text(text, "broken.yaml")


def test_leir_programs_refuse_metavariables():
    with pytest.raises(LeirSyntaxError):
        parse_program("B^{4}_{tx=0}[C^{f32,g}_{tx}=?a;];")
    with pytest.raises(LeirSyntaxError):
        parse_program("?k^{4}_{tx=0}[C^{f32,g}_{tx}=1.0;];")


# ---------------------------------------------------------------------------
# One codec
# ---------------------------------------------------------------------------


def test_schema_is_generated_from_the_constructor_table():
    for c in codec.CONSTRUCTORS:
        decl = f"(constructor {c.name} ({' '.join(codec.KIND_SORT[k] for _, k in c.fields)}) {c.sort})"
        assert decl in SCHEMA
    assert "(constructor TCons (Term TL) TL)" in SCHEMA and "(constructor LCons (Lp LL) LL)" in SCHEMA
    assert codec.UNARY == ("NEG", "NOT") and codec.BINARY == ("BIN", "CMP", "BOOL")
    assert {c.node for c in codec.CONSTRUCTORS if c.sort == "Term"} == {
        A.Int, A.Float, A.Index, A.Tensor, A.Neg, A.Not, A.BinOp, A.Compare, A.BoolOp, A.Call}


def test_encode_decode_round_trip_through_egglog():
    module = parse_leir(SOFTMAX)
    s = EggSession()
    ix = s.load_program(module)
    rows = s.rows("eq_def")
    assert sorted((tuple(r) for r in rows), key=lambda r: r[0]) == [
        (eid, eq.target, eq.value) for eid, eq in enumerate(ix.eqs)]
    loops = {tuple(r) for r in s.rows("loop_at")}
    assert loops == {(nid, p, l) for nid, nest in enumerate(ix.nests) for p, l in enumerate(nest.loops)}
    assert ProgramIndex.build(module.program).eqs == ix.eqs


def test_query_encoder_is_the_program_encoder_without_holes():
    e = parse_leir(SOFTMAX).program.nests[2].body[0].value
    enc = codec.Encoder()
    assert P.to_sexp(e, {}) == enc.term(e) == codec.Encoder(memo=False).term(e)
    assert enc.term(A.Float(0.25)) == '(FLT "0.25")' and enc.term(A.Float(float("inf"))) == '(FLT "inf")'
    assert enc.loops((A.Loop("L", 4, "a"),)) == '(LCons (LOOP "L" 4 "a") (LNil))'
    # holes: metavariables by sort, splices with tl_last atoms
    pat = P.parse_expr_pattern("?X^{?dt,g}_{*?s,?a-1}")
    aux: list[str] = []
    out = P.to_sexp(pat, {"X": P.STRING, "dt": P.STRING, "s": P.LIST, "a": P.STRING}, aux)
    assert out.startswith('(TNS mv_X mv_dt "g" anon_tl') and len(aux) == 1
    assert aux[0].endswith(' mv_s (BIN "-" (IDX mv_a) (INT 1)))')
    assert P.loop_sexp(P.parse_loops_pattern("?k^{?n}_{i=0}")[0]) == '(LOOP mv_k mv_n "i")'
    with pytest.raises(TypeError):
        enc.term("not a node")
    with pytest.raises(P.PatternError, match="cannot compile"):
        P.to_sexp(A.Loop("L", 4, "a"), {})
