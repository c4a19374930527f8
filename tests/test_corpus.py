"""Program corpus (paper §3.1): registry, eager execution, determinism, budget, verify report."""

import math
import random
import re
import zlib
from collections import Counter

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from steptp.dataset import corpus
from steptp.dataset.corpus import (
    DEFAULT_BUDGET, DTYPES, GPU_BUDGET, PROGRAM_TYPES, CorpusError, generate_corpus, generate_program,
    parse_header, verify_corpus,
)

ALL_TYPES = sorted(PROGRAM_TYPES)


def _run(src: str):
    """Exec a generated program like a harness would; return (model, inputs, output, flops)."""
    ns = {"__name__": "corpus_program"}
    exec(compile(src, "<corpus>", "exec"), ns)
    torch.manual_seed(0)
    model = ns["Model"](*ns["get_init_inputs"]())
    inputs = ns["get_inputs"]()
    with torch.no_grad(), FlopCounterMode(display=False) as fc:
        out = model(*inputs)
    return model, inputs, out, fc.get_total_flops()


def _shape(text: str) -> tuple:
    return tuple(int(v) for v in re.findall(r"\d+", text))


# ---------------------------------------------------------------- registry

def test_at_least_189_distinct_types_in_every_category():
    assert len(PROGRAM_TYPES) >= 189
    assert len(set(PROGRAM_TYPES)) == len(PROGRAM_TYPES)
    cats = Counter(t.category for t in PROGRAM_TYPES.values())
    assert set(cats) == set(corpus.CATEGORIES)
    assert cats["single"] >= 90 and cats["composite"] >= 60 and cats["block"] >= 10
    for name, t in PROGRAM_TYPES.items():
        assert t.name == name and re.fullmatch(r"[A-Za-z][A-Za-z0-9_]*", name)
        if t.category == "composite":
            assert 2 <= len(t.recipe) <= 5 and name == "_".join(t.recipe)
        if t.category == "random":
            assert 2 <= t.random_len <= 5 and t.random_head


@pytest.mark.parametrize("name", [
    "MatmulSquare", "MatmulBatched", "MatmulUpperTriangular", "MatmulDiag", "MatmulTransposedB", "ReLU", "GELUTanh",
    "Mish", "Softmax", "LogSoftmax", "Sum", "Argmin", "LogSumExp", "CumsumExclusive", "MaskedCumsum",
    "BatchNorm2d", "BatchNorm2dEval", "InstanceNorm2d", "GroupNorm", "LayerNorm", "RMSNorm", "FrobeniusNorm",
    "MaxPool3d", "AvgPool1d", "Conv2dDepthwise", "Conv3dGrouped", "ConvTranspose2dDilated", "CrossEntropyLoss",
    "KLDivLoss", "TripletMarginLoss", "HingeLoss", "MatmulSoftmax", "GemmReLU", "MLP", "MultiHeadAttention",
    "GroupedQueryAttention", "MultiQueryAttention", "CausalAttention", "ScaledDotProductAttentionCausal",
    "Conv2d_ReLU_BiasAdd", "Gemm_Scale_ResidualAdd_Clamp_LogSumExp", "Random5_Conv3d",
])
def test_expected_types_registered(name):
    assert name in PROGRAM_TYPES


def test_components_table_drives_types():
    # composites only reference registered components; random compositions draw from the mixable ones
    mixable = [n for n, c in corpus.COMPONENTS.items() if c.mix]
    assert len(mixable) >= 30
    for t in PROGRAM_TYPES.values():
        assert all(c in corpus.COMPONENTS for c in t.recipe)


# ---------------------------------------------------------------- every type runs in eager

@pytest.mark.parametrize("name", ALL_TYPES)
def test_every_type_runs_in_eager_with_finite_outputs(name):
    base = zlib.crc32(name.encode())
    for k, dtype in enumerate(DTYPES):
        src = generate_program(name, base + k, dtype)
        h = parse_header(src)
        assert h["type"] == name and h["seed"] == base + k and h["requested_dtype"] == dtype
        assert h["dtype"] in (dtype, "float32")
        if h["dtype"] != dtype:
            assert dtype == "float16" and "no float16 CPU kernel" in src
        assert 0 < h["work"] <= h["budget"] == DEFAULT_BUDGET
        assert src.count("class Model(nn.Module)") == 1 and "def get_inputs" in src and "def get_init_inputs" in src
        assert not [ln for ln in src.splitlines() if ln.startswith(("import", "from")) and "torch" not in ln]
        model, inputs, out, flops = _run(src)
        want_dtype = getattr(torch, h["dtype"])
        for t in inputs:
            assert t.dtype in (want_dtype, torch.int64, torch.bool)
        for p in list(model.parameters()) + [b for b in model.buffers() if b.is_floating_point()]:
            assert p.dtype == want_dtype
        oshape, odtype = h["output"].rsplit(" ", 1)
        assert tuple(out.shape) == _shape(oshape), (name, out.shape, h["output"])
        assert str(out.dtype) == f"torch.{odtype}"
        if out.is_floating_point():
            assert torch.isfinite(out).all(), f"{name} {dtype}: non-finite output"
        # the estimate is conservative: real matmul/conv FLOPs and input elements fit the budget
        assert flops <= h["work"]
        assert sum(t.numel() for t in inputs) <= h["work"]


def test_float16_falls_back_where_cpu_lacks_a_kernel():
    src = generate_program("AvgPool3d", 1, "float16")
    h = parse_header(src)
    assert h["dtype"] == "float32" and h["requested_dtype"] == "float16"
    assert "DTYPE = torch.float32" in src and "avg_pool3d" in src.splitlines()[7]
    src = generate_program("ReLU", 1, "f16")
    assert "DTYPE = torch.float16" in src


# ---------------------------------------------------------------- determinism and names

def test_corpus_is_byte_identical_for_the_same_seed(tmp_path):
    a = generate_corpus(tmp_path / "a", 40, seed=7)
    b = generate_corpus(tmp_path / "b", 40, seed=7)
    c = generate_corpus(tmp_path / "c", 40, seed=8)
    assert [p.name for p in a] == [p.name for p in b]
    assert all(p.read_bytes() == q.read_bytes() for p, q in zip(a, b))
    assert (tmp_path / "a" / "corpus.json").read_bytes() == (tmp_path / "b" / "corpus.json").read_bytes()
    assert [p.read_bytes() for p in a] != [p.read_bytes() for p in c]


def test_rerun_with_fewer_programs_removes_only_stale_corpus_files(tmp_path):
    generate_corpus(tmp_path, 12, seed=2)
    (tmp_path / "mine.py").write_text("x = 1\n")
    paths = generate_corpus(tmp_path, 5, seed=2)
    assert sorted(p.name for p in tmp_path.glob("*.py")) == sorted([p.name for p in paths] + ["mine.py"])


def test_corpus_covers_every_type_with_unique_names_and_reproducible_headers(tmp_path):
    paths = generate_corpus(tmp_path, len(PROGRAM_TYPES), seed=1)
    assert len({p.name for p in paths}) == len(paths)
    seen = Counter()
    for p in paths:
        text = p.read_text()
        h = parse_header(p)
        seen[h["type"]] += 1
        assert p.name.endswith(f"_{h['type']}.py")
        # the header holds exactly what regenerates the file
        assert generate_program(h["type"], h["seed"], h["requested_dtype"], h["budget"]) == text
    assert set(seen) == set(PROGRAM_TYPES) and set(seen.values()) == {1}
    dtypes = Counter(parse_header(p)["requested_dtype"] for p in paths)
    assert set(dtypes) == set(DTYPES)


def test_generate_program_is_deterministic_and_rng_driven():
    r1, r2 = random.Random(5), random.Random(5)
    assert generate_program("Random5_Input", r1) == generate_program("Random5_Input", r2)
    assert generate_program("Conv2d_ReLU_BiasAdd", 5) != generate_program("Conv2d_ReLU_BiasAdd", 6)
    assert PROGRAM_TYPES["Softmax"](3, "float64") == generate_program("Softmax", 3, "float64")


def test_types_argument_and_errors(tmp_path):
    paths = generate_corpus(tmp_path, 5, seed=0, types=["ReLU", "MLP"], dtypes=["float64"])
    assert {parse_header(p)["type"] for p in paths} == {"ReLU", "MLP"}
    assert {parse_header(p)["dtype"] for p in paths} == {"float64"}
    with pytest.raises(CorpusError, match="unknown program type"):
        generate_program("NoSuchOp", 0)
    with pytest.raises(CorpusError, match="unknown dtype"):
        generate_program("ReLU", 0, "int8")
    with pytest.raises(CorpusError, match="budget"):
        generate_program("TransformerBlock", 0, budget=10)


# ---------------------------------------------------------------- budget

def test_budget_bounds_work_and_a_larger_budget_gives_larger_shapes():
    small, large = [], []
    for i, name in enumerate(ALL_TYPES):
        hs = parse_header(generate_program(name, i, budget=DEFAULT_BUDGET))
        hl = parse_header(generate_program(name, i, budget=GPU_BUDGET))
        assert hs["work"] <= DEFAULT_BUDGET and hl["work"] <= GPU_BUDGET
        small.append(hs["work"])
        large.append(hl["work"])
    assert max(small) <= DEFAULT_BUDGET < max(large)
    assert sum(large) > 100 * sum(small)
    big = max(max(_shape(parse_header(generate_program("Matmul2D", s, budget=GPU_BUDGET))["inputs"]))
              for s in range(20))
    assert big > 4096


def test_tiny_budget_shrinks_shapes():
    for s in range(10):
        h = parse_header(generate_program("Conv2d", s, budget=20000))
        assert h["work"] <= 20000
        _run(generate_program("Conv2d", s, budget=20000))


# ---------------------------------------------------------------- verify_corpus report

class _FakeError(Exception):
    def __init__(self, msg, op=None):
        super().__init__(msg)
        if op:
            self.op = op


class _Res:
    def __init__(self, equal):
        self.equal, self.build, self.exec = equal, True, True
        self.max_abs_err, self.max_rel_err, self.reason, self.trials = (0.0 if equal else 1.5), 0.0, "", 3


class _Tr:
    def __init__(self, equal):
        self.equal = equal

    def verify(self, trials=3, seed=0, **kwargs):
        assert trials == 3 and kwargs == {"timeout_s": 5}
        return _Res(self.equal)


def test_verify_corpus_groups_failures_by_op(tmp_path, monkeypatch):
    import steptp.frontend as frontend

    paths = generate_corpus(tmp_path, 8, seed=0, types=["ReLU", "Softmax", "Cumprod", "Conv2d_ReLU_BiasAdd"])

    def fake_translate(path):
        h = parse_header(path)
        if h["type"] == "Cumprod":
            raise _FakeError(f"unsupported op 'cumprod' at node cumprod_1 in {path}", op="cumprod")
        if h["type"] == "Softmax":
            raise _FakeError("no handler for operator 'softmax' (argument dim)")
        return _Tr(equal=h["type"] == "ReLU")

    monkeypatch.setattr(frontend, "translate_file", fake_translate, raising=False)
    seen = []
    rep = verify_corpus(paths, progress=lambda d, n, r: seen.append(d), verify_kwargs={"timeout_s": 5})
    assert seen == list(range(1, 9))
    assert rep["total"] == 8 and rep["ok"] == 2 and math.isclose(rep["success_rate"], 0.25)
    assert rep["translated"] == 4
    fo = rep["failures_by_op"]
    assert fo["cumprod"]["count"] == 2 and fo["cumprod"]["stages"] == {"translate": 2}
    assert fo["softmax"]["types"] == ["Softmax"]
    assert fo["Conv2d+ReLU+BiasAdd"]["stages"] == {"mismatch": 2}
    assert len(rep["failures"]) == 6 and sum(v["total"] for v in rep["by_category"].values()) == 8
    # reasons are normalized (paths and numbers stripped) so equal causes group together
    assert len(fo["cumprod"]["reasons"]) == 1
    text = corpus.format_report(rep)
    assert "verified 2/8" in text and "cumprod" in text and "Conv2d+ReLU+BiasAdd" in text


# ---- shapes that strategies need (issue 19, "Reach") ------------------------------------------
# The translator emits one nest per operator; these block types give the program shapes that
# strategies otherwise met only in hand-written examples. Each entry: type -> the rule that must
# match its translation.
_SHAPE_TYPES = {
    "TwinActivation": "tensor_concat_to_fuse_operators",    # the same operator on two inputs
    "SiameseConv1d": "partially_equivalent_then_correct",   # one shared-weight conv on two inputs
    "SiameseConv2d": "partially_equivalent_then_correct",
    "GroupedReduce": "loop_fusion",                         # reduction over a reshaped view: o*f+i
    "LogProduct": "expand_log",                             # log of a product of positive factors
    "LogSum": "logsimp",                                    # sum of logs of positive factors
    "SharedFactorSum": "collect",                           # g(x)*y + g(x)*z + y (one nest per operator)
    "ExpProduct": "powsimp",                                # exp(x)*exp(y), exp(x)/exp(y)
}


def test_strategy_shape_types_exist_with_composites():
    for name in _SHAPE_TYPES:
        assert name in PROGRAM_TYPES and PROGRAM_TYPES[name].category == "block"
        assert any(t.recipe[:1] == (name,) and t.category == "composite" for t in PROGRAM_TYPES.values()), name


@pytest.mark.parametrize("name", ["TwinActivation", "SiameseConv1d", "GroupedReduce", "LogProduct", "LogSum",
                                  "SharedFactorSum", "ExpProduct"])
def test_strategy_shape_types_match_their_rule_after_translation(name, tmp_path):
    from steptp.engine import list_candidates
    from steptp.frontend.translate import translate_file
    from steptp.resources import rules_dir
    from steptp.rules import load_rule

    p = tmp_path / f"{name}.py"
    p.write_text(corpus.generate_program(name, 3, "float32", budget=1 << 14))
    module = translate_file(p).module
    rule = load_rule(rules_dir() / f"{_SHAPE_TYPES[name]}.yaml")
    assert list_candidates(rule, module), (name, _SHAPE_TYPES[name])


# ---------------------------------------------------------------- GPU sizing (issue 44)

def _meta_run(src: str):
    """Exec a generated program on PyTorch's meta device (shapes only, no data): (model, inputs, output)."""
    ns = {"__name__": "corpus_program"}
    with torch.device("meta"):
        exec(compile(src, "<corpus>", "exec"), ns)
        model = ns["Model"](*ns["get_init_inputs"]())
        inputs = ns["get_inputs"]()
        with torch.no_grad():
            out = model(*inputs)
    return model, inputs, out


def test_gpu_sizing_puts_every_type_in_the_field_range_with_valid_shapes():
    """Every type at the --gpu budget: the estimated eager time is in 0.1-15 ms for all but a
    few capped types, the program runs in PyTorch (meta device) with the header's output shape,
    no input, weight or buffer is over GPU_MAX_BYTES, and the header regenerates the file."""
    ests = []
    for i, name in enumerate(ALL_TYPES):
        dtype = DTYPES[i % len(DTYPES)]
        src = generate_program(name, i, dtype, GPU_BUDGET)
        h = parse_header(src)
        assert h["budget"] == GPU_BUDGET and 0 < h["work"] <= GPU_BUDGET
        est = float(h["eager_estimate_us"].split()[0])
        ests.append(est)
        model, inputs, out = _meta_run(src)
        assert tuple(out.shape) == _shape(h["output"].rsplit(" ", 1)[0]), name
        tensors = list(inputs) + list(model.parameters()) + list(model.buffers())
        assert max(t.numel() * t.element_size() for t in tensors) <= corpus.GPU_MAX_BYTES, name
        if i % 25 == 0:
            assert generate_program(h["type"], h["seed"], h["requested_dtype"], h["budget"]) == src
    in_range = [100 <= e <= 15000 for e in ests]
    assert sum(in_range) >= 0.98 * len(ests), sorted(ests)[:10]
    lo, hi = corpus.GPU_TARGET_US
    assert lo <= sorted(ests)[len(ests) // 2] <= hi


def test_gpu_sizing_grows_what_the_default_keeps_small():
    """The GPU sizing only acts at the GPU budget: the default corpus has no estimate in its
    headers, and the same seed at the GPU budget is far larger."""
    for i, name in enumerate(["ReLU", "Softmax", "Matmul2D", "Conv2d", "LayerNorm"]):
        small = parse_header(generate_program(name, i, "float32"))
        big = parse_header(generate_program(name, i, "float32", GPU_BUDGET))
        assert "eager_estimate_us" not in small and "eager_estimate_us" in big
        n_small = sum(math.prod(_shape(s)) for s in re.findall(r"\(([\d, ]*)\)", small["inputs"]))
        n_big = sum(math.prod(_shape(s)) for s in re.findall(r"\(([\d, ]*)\)", big["inputs"]))
        assert n_big > 100 * n_small, name
