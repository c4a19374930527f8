"""The `stp` command line end to end: parse, lower, translate, apply, verify (issue 2's checks)."""

import re
import textwrap
from pathlib import Path

import pytest
from typer.testing import CliRunner

from steptp.cli import app
from steptp.leir import load_leir, parse_leir
from steptp.resources import rules_dir

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
runner = CliRunner()


def stp(*args):
    return runner.invoke(app, [str(a) for a in args])


def test_help_lists_every_command():
    res = stp("--help")
    assert res.exit_code == 0
    for cmd in ("parse", "lower", "translate", "verify", "apply", "dataset", "rules"):
        assert cmd in res.output


def test_parse_prints_canonical_text(tmp_path):
    src = tmp_path / "mm.leir"
    src.write_text(
        "% program: mm\n% input A: f32[2,3]\n% input W: f32[3,4]\n% output C: f32[2,4]\n"
        "B_{tx=0}^{2} L_{a=0}^{4} L_{c=0}^{3} [ C_{tx,a}^{f32,g} = C_{tx,a}^{f32,g} + A_{tx,c}^{f32,g}*W_{c,a}^{f32,g} ; ];\n")
    res = stp("parse", src)
    assert res.exit_code == 0, res.output
    assert "B^{2}_{tx=0}L^{4}_{a=0}L^{3}_{c=0}[C^{f32,g}_{tx,a}=C^{f32,g}_{tx,a}+A^{f32,g}_{tx,c}*W^{f32,g}_{c,a};];" \
        in res.output


def test_parse_error_names_file_line_and_column(tmp_path):
    bad = tmp_path / "bad.leir"
    bad.write_text("% program: bad\n% input A: f32[4]\n% output C: f32[4]\nB^{4}_{tx=0}[C^{f32,g}_{tx}=A^{f32,g}_{tx}+;];\n")
    res = stp("parse", bad)
    assert res.exit_code == 2
    assert f"{bad}:4:44: unexpected ';'" in res.output


def test_parse_reports_semantic_errors(tmp_path):
    bad = tmp_path / "oob.leir"
    bad.write_text("% program: oob\n% input A: f32[4]\n% output C: f32[4]\nB^{4}_{tx=0}[C^{f32,g}_{tx}=A^{f32,g}_{tx+1};];\n")
    res = stp("parse", bad)
    assert res.exit_code == 2 and "out-of-bounds access" in res.output


def test_lower_prints_tir_and_cuda():
    res = stp("lower", EXAMPLES / "matmul.leir")
    assert res.exit_code == 0, res.output
    assert "T.thread_binding" in res.output and "T.sblock" in res.output and "T.init()" in res.output
    res = stp("lower", EXAMPLES / "matmul.leir", "--cpu")
    assert res.exit_code == 0 and "T.thread_binding" not in res.output
    res = stp("lower", EXAMPLES / "matmul.leir", "--cuda")
    assert res.exit_code == 0 and "__global__" in res.output and "threadIdx.x" in res.output


HELD_OUT = {
    # KernelBench-style files (module-level shape constants, get_inputs/get_init_inputs) that are
    # not among the bundled examples, within the starter op set.
    "gemm_sigmoid_sum.py": """
        import torch
        import torch.nn as nn

        class Model(nn.Module):
            def __init__(self, in_features, out_features):
                super(Model, self).__init__()
                self.linear = nn.Linear(in_features, out_features)

            def forward(self, x):
                x = self.linear(x)
                x = torch.sigmoid(x)
                return torch.sum(x, dim=1, keepdim=True)

        batch_size = 6
        in_features = 10
        out_features = 5

        def get_inputs():
            return [torch.randn(batch_size, in_features)]

        def get_init_inputs():
            return [in_features, out_features]
    """,
    "bmm_softmax_tanh.py": """
        import torch
        import torch.nn as nn

        class Model(nn.Module):
            def __init__(self):
                super().__init__()

            def forward(self, a, b):
                x = torch.bmm(a, b)
                x = torch.softmax(x, dim=1)
                return torch.tanh(x) * 0.5 - 1.0

        def get_inputs():
            return [torch.randn(3, 4, 5), torch.randn(3, 5, 6)]

        def get_init_inputs():
            return []
    """,
    "mean_gelu_div.py": """
        import torch
        import torch.nn as nn
        import torch.nn.functional as F

        class Model(nn.Module):
            def __init__(self, divisor):
                super().__init__()
                self.divisor = divisor

            def forward(self, x, y):
                z = F.gelu(x + y) / self.divisor
                return torch.mean(torch.relu(z), dim=-1)

        def get_inputs():
            return [torch.randn(4, 7), torch.randn(1, 7)]

        def get_init_inputs():
            return [3.0]
    """,
}


@pytest.mark.parametrize("name", sorted(HELD_OUT))
def test_translate_held_out_programs_verify_against_pytorch(tmp_path, name):
    src = tmp_path / name
    src.write_text(textwrap.dedent(HELD_OUT[name]))
    out = tmp_path / (src.stem + ".leir")
    res = stp("translate", src, "-o", out, "--verify")
    assert res.exit_code == 0, res.output
    assert re.search(r"Equal\s+pass", res.output)
    module = load_leir(out)
    assert module.signature.outputs and module.program.nests


def test_translate_unknown_op_fails_with_op_and_node(tmp_path):
    src = tmp_path / "cummax.py"
    src.write_text(textwrap.dedent("""
        import torch
        import torch.nn as nn

        class Model(nn.Module):
            def forward(self, x):
                return torch.fft.fft(x).real

        def get_inputs():
            return [torch.randn(4, 4)]

        def get_init_inputs():
            return []
    """))
    res = stp("translate", src)
    assert res.exit_code == 1
    assert "fft" in res.output


def test_apply_loop_split_then_verify(tmp_path):
    out = tmp_path / "split.leir"
    res = stp("apply", rules_dir() / "loop_split.yaml", EXAMPLES / "matmul.leir", "--seed", "3", "-o", out)
    assert res.exit_code == 0, res.output
    first_line = res.output.splitlines()[0]
    after = load_leir(out)
    assert first_line.startswith(after.program and first_line)  # printed program is the written one
    original = load_leir(EXAMPLES / "matmul.leir")
    assert after.signature == original.signature
    assert len(after.program.nests[0].loops) == len(original.program.nests[0].loops) + 1
    assert "Loop split" in res.output  # the chain of thought follows the program
    res = stp("verify", EXAMPLES / "matmul.leir", out)
    assert res.exit_code == 0, res.output
    assert [l.split()[0] for l in res.output.splitlines()[:4]] == ["Diff", "Build", "Exec", "Equal"]
    assert all(l.split()[1] == "pass" for l in res.output.splitlines()[:4])


def test_apply_is_reproducible_and_site_selectable(tmp_path):
    a = stp("apply", rules_dir() / "loop_split.yaml", EXAMPLES / "matmul.leir", "--seed", "7")
    b = stp("apply", rules_dir() / "loop_split.yaml", EXAMPLES / "matmul.leir", "--seed", "7")
    assert a.exit_code == 0 and a.output == b.output
    listing = stp("apply", rules_dir() / "loop_split.yaml", EXAMPLES / "matmul.leir", "--all")
    assert listing.exit_code == 0
    lines = [l for l in listing.output.splitlines() if l.startswith("[")]
    # matmul loops 8, 16, 12 have 2 + 3 + 4 proper divisors
    assert len(lines) == 9
    pick = stp("apply", rules_dir() / "loop_split.yaml", EXAMPLES / "matmul.leir", "--site", "0")
    assert pick.exit_code == 0
    bad = stp("apply", rules_dir() / "loop_split.yaml", EXAMPLES / "matmul.leir", "--site", "99")
    assert bad.exit_code == 2 and "out of range" in bad.output


def test_apply_without_match_exits_nonzero():
    res = stp("apply", rules_dir() / "expand_log.yaml", EXAMPLES / "matmul.leir")
    assert res.exit_code == 1
    assert "rule 'expand_log' matches nothing in program 'matmul'" in res.output
    assert "log(?g)" in res.output


def test_apply_reports_a_broken_rule_file(tmp_path):
    broken = tmp_path / "broken.yaml"
    broken.write_text((rules_dir() / "loop_split.yaml").read_text().replace("category: operator", "category: 42"))
    res = stp("apply", broken, EXAMPLES / "matmul.leir")
    assert res.exit_code == 2
    assert "broken.yaml" in res.output and "category" in res.output


def test_verify_rejects_a_wrong_program(tmp_path):
    original = load_leir(EXAMPLES / "scale_bias.leir")
    text = (EXAMPLES / "scale_bias.leir").read_text()
    wrong_text = re.sub(r"(\d+\.\d+)", lambda m: repr(float(m.group(1)) + 0.5), text, count=1)
    assert wrong_text != text
    wrong = tmp_path / "wrong.leir"
    wrong.write_text(wrong_text)
    assert parse_leir(wrong_text).signature == original.signature
    res = stp("verify", EXAMPLES / "scale_bias.leir", wrong)
    assert res.exit_code == 1
    assert re.search(r"Equal\s+FAIL", res.output)
    same = stp("verify", EXAMPLES / "scale_bias.leir", EXAMPLES / "scale_bias.leir")
    assert same.exit_code == 1 and re.search(r"Diff\s+FAIL", same.output)


def test_rules_list_and_selftest():
    res = stp("rules", "list")
    assert res.exit_code == 0
    for rid in ("logsimp", "loop_split", "loop_reorder", "operator_fusion", "set_storage_scope"):
        assert rid in res.output
    res = stp("rules", "test", rules_dir() / "loop_reorder.yaml")
    assert res.exit_code == 0, res.output


def _cli_options() -> dict[str, list[tuple[str, str]]]:
    """``{flag: [(command, help), ...]}`` over every ``stp`` command."""
    import typer
    from typer.core import TyperOption

    from steptp.cli import app

    out: dict[str, list[tuple[str, str]]] = {}

    def walk(c, path):
        if hasattr(c, "commands"):
            for n, sub in c.commands.items():
                walk(sub, path + [n])
            return
        for p in c.params:
            if isinstance(p, TyperOption):
                for o in p.opts:
                    out.setdefault(o, []).append((" ".join(path), p.help or ""))

    walk(typer.main.get_command(app), [])
    return out


def test_one_meaning_per_flag_name():
    """Issue 35: a flag name means one thing in every `stp <cmd> --help` (`stp gpu` included),
    and says its unit."""
    opts = _cli_options()
    timeouts = opts["--timeout"]
    assert {c for c, _ in timeouts} >= {"verify", "dataset", "eval", "search", "gpu run"}
    assert all(h.startswith("Seconds: time limit of one verification check") or
               h.startswith("Seconds: time limit of the verification check") for _, h in timeouts), timeouts
    assert all(h.startswith("Seconds: time limit of one endpoint request") for _, h in opts["--request-timeout"])
    assert [c for c, _ in opts["--rounds"]] == ["dataset"]  # derived rounds; trees are --trees
    assert [c for c, _ in opts["--trees"]] == ["costmodel train"]
    assert [c for c, _ in opts["--batch"]] == ["gpu pack"]  # programs per library; the dataset's: --programs-per-task
    assert all("worker processes" in h for _, h in opts["-j"]), opts["-j"]
    assert all("threads" in h for _, h in opts["--concurrency"])
    assert all("learn" not in h for _, h in opts["--device"])  # where to run, never which timings to learn
    assert [c for c, _ in opts["--timings-of"]] == ["costmodel train"]
    assert [c for c, _ in opts["--repeat"]] == ["time"] and "Timing rounds" in opts["--repeat"][0][1]
    assert "--per-rule" in opts and [c for c, _ in opts["--per-rule"]] == ["dataset"]
