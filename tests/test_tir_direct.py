"""backend.tirtext: the TVMScript text of our lowering built directly with TVM's IRBuilder
is the PrimFunc ``tvm.script.from_source`` gives (structurally equal, same names), for the
examples and every rule self-test program in the CPU, CUDA and verification forms; text
outside the subset falls back to the TVM parser (same result, same BuildError)."""

from __future__ import annotations

from pathlib import Path

import pytest

from steptp.backend import BuildError, LoweringError, lower_module
from steptp.backend.build import _parse_globals, _parse_tvmscript
from steptp.backend.tirtext import Unsupported, build_primfunc

ROOT = Path(__file__).resolve().parents[1]


def _modules():
    """Examples (.leir and the PyTorch .py files) and the rules' before/after programs."""
    from steptp.frontend.translate import translate_file
    from steptp.leir.fileformat import LeirModule, load_leir, parse_leir
    from steptp.leir.parser import parse_program
    from steptp.rules import load_rules

    mods = [(str(p.name), load_leir(p)) for p in sorted((ROOT / "examples").glob("*.leir"))]
    mods += [(str(p.name), translate_file(p).module) for p in sorted((ROOT / "examples").glob("*.py"))]
    for rule in load_rules():
        for t in rule.tests:
            before = parse_leir(t.before)
            mods.append((f"{rule.id}[{t.index}].before", before))
            if t.after:
                mods.append((f"{rule.id}[{t.index}].after", LeirModule(before.signature, parse_program(t.after))))
    return mods


FORMS = {"cpu": ("cpu", False), "cuda": ("cuda", False), "verify": ("cpu", True)}


def _texts(forms=tuple(FORMS)):
    out, seen = [], set()
    for name, m in _modules():
        for form, (target, poison) in ((f, FORMS[f]) for f in forms):
            try:
                text = lower_module(m, None, target, poison=poison).text
            except LoweringError:
                continue
            if target == "cuda" and "wmma." in text:
                continue  # tensor-core kernels (wmma intrinsics over buffer regions) take the parser
            if text not in seen:
                seen.add(text)
                out.append((f"{name} {form}", text))
    return out


def _from_source(text):
    import tvm

    return tvm.script.from_source(text, extra_vars=_parse_globals())["main"]


@pytest.mark.parametrize("form", list(FORMS))  # one test per form: the three share the suite's workers
def test_direct_build_equals_tvm_parser_on_examples_and_rule_programs(form):
    import tvm

    texts = _texts((form,))
    assert len(texts) >= 200 and {label.rsplit(" ", 1)[1] for label, _ in texts} == {form}
    for label, text in texts:
        fast = build_primfunc(text)  # our own lowering never needs the fallback
        ref = _from_source(text)
        try:
            tvm.ir.assert_structural_equal(fast, ref)
        except ValueError as e:
            raise AssertionError(f"{label}: {e}") from None
        assert fast.script() == ref.script(), label  # structural equality ignores names; this shows them


def test_parse_tvmscript_takes_the_direct_path_and_the_parser_for_other_text():
    import tvm

    from steptp.leir import load_leir

    text = lower_module(load_leir(ROOT / "examples" / "matmul.leir"), None, "cpu").text
    want = _from_source(text)

    def no_parser(*_a, **_k):
        raise AssertionError("the TVMScript parser was called")

    real = tvm.script.from_source
    tvm.script.from_source = no_parser
    try:
        got = _parse_tvmscript(text)
    finally:
        tvm.script.from_source = real
    tvm.ir.assert_structural_equal(got, want)
    # outside the subset (an `if`, a bare prim_func): Unsupported, and the parser's answer
    other = ("@I.ir_module\nclass Module:\n    @T.prim_func(s_tir=True)\n"
             "    def main(A: T.Buffer((4,), \"float32\")):\n"
             "        for i in range(4):\n"
             "            if i < 2:\n"
             "                A[i] = T.float32(1)\n")
    bare = "@T.prim_func(s_tir=True)\ndef main(A: T.Buffer((4,), 'float32')):\n    A[1] = A[0] + T.float32(1)\n"
    for t in (other, bare):
        with pytest.raises(Unsupported):
            build_primfunc(t)
        ref = tvm.script.from_source(t, extra_vars=_parse_globals())
        ref = ref["main"] if isinstance(ref, tvm.IRModule) else ref
        tvm.ir.assert_structural_equal(_parse_tvmscript(t), ref)


@pytest.mark.parametrize("text,needle", [
    ("this is not ( TVMScript", "does not parse"),
    ("@I.ir_module\nclass Module:\n    @T.prim_func(s_tir=True)\n    def main(A: T.Buffer((4,), \"float32\")):\n"
     "        A[0] = undefined_name\n", "undefined_name"),
    # builds, but s_tir's well-formedness check rejects it (loop var inside a block)
    ("@I.ir_module\nclass Module:\n    @T.prim_func(s_tir=True)\n"
     "    def main(A: T.Buffer((8,), \"float32\"), B: T.Buffer((8,), \"float32\")):\n"
     "        for i in range(8):\n            with T.sblock(\"B\"):\n"
     "                v_i = T.axis.spatial(8, i)\n                B[i] = A[v_i]\n", "not well-formed"),
])
def test_bad_text_still_raises_build_error_through_the_parser(text, needle):
    with pytest.raises(Unsupported):
        build_primfunc(text)
    with pytest.raises(BuildError, match="TVMScript does not parse") as e:
        _parse_tvmscript(text)
    assert needle in str(e.value)
