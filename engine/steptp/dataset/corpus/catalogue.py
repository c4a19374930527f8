"""The catalogue of program types (paper §3.1), a table to scan and extend: single operators
(one per component), popular blocks (:data:`_BLOCKS`), KernelBench level-2 style chains
(:data:`_COMPOSITES`, one chain per line) and random compositions of 2-5 components. A new
program type is a new line here."""

from __future__ import annotations

import re
from typing import Sequence

from .components import COMPONENTS
from .render import ProgramType


# --------------------------------------------------------------------------------------
# program types
# --------------------------------------------------------------------------------------

PROGRAM_TYPES: dict[str, ProgramType] = {}


def _type(name: str, category: str, family: str, recipe: Sequence[str] = (), *, head: str = "",
          length: int = 0, description: str = "") -> None:
    if name in PROGRAM_TYPES:
        raise RuntimeError(f"program type {name} registered twice")
    if not re.fullmatch(r"[A-Za-z][A-Za-z0-9_]*", name):
        raise RuntimeError(f"bad program type name {name!r}")
    for c in recipe:
        if c not in COMPONENTS:
            raise RuntimeError(f"program type {name}: unknown component {c}")
    PROGRAM_TYPES[name] = ProgramType(name, category, family, tuple(recipe), head, length, description)


# single operators: every non-mixing-only op and every head is a level-1 style type
_SINGLE_SKIP = {"BatchNorm", "InstanceNorm", "MaxPool", "AvgPool", "Gemm", "Matmul", "BMM",
                "MatmulSoftmaxHead", "MatmulScaleSoftmaxHead", "SwiGLU", "FFNResidual", "ResidualAdd",
                "BiasAdd", "Multiply", "ScaledDotProductAttention", "ScaledDotProductAttentionCausal",
                "Attention", "CausalAttention", "MultiHeadAttention", "MultiHeadAttentionSDPA",
                "CausalMultiHeadAttention", "GroupedQueryAttention", "GroupedQueryAttentionCausal",
                "MultiQueryAttention", "MultiQueryAttentionCausal", "CrossAttention", "TransformerBlock",
                "TwinActivation", "SiameseConv1d", "SiameseConv2d", "GroupedReduce", "LogProduct", "LogSum",
                "SharedFactorSum", "ExpProduct"}
for _n, _c in COMPONENTS.items():
    if _n not in _SINGLE_SKIP:
        _type(_n, "single", _c.family, (_n,))
_type("Conv2dDepthwiseSeparable", "single", "conv", ("Conv2dDepthwise", "Conv2dPointwise"))

# popular blocks (paper §3.1: matmul + softmax, gemm + activation, attention, MLP)
_BLOCKS = {
    "MatmulSoftmax": ("MatmulSoftmaxHead",), "MatmulScaleSoftmax": ("MatmulScaleSoftmaxHead",),
    "GemmSoftmax": ("Gemm", "Softmax"), "GemmReLU": ("Gemm", "ReLU"), "GemmGELU": ("Gemm", "GELU"),
    "GemmSiLU": ("Gemm", "SiLU"), "GemmTanh": ("Gemm", "Tanh"), "GemmSigmoid": ("Gemm", "Sigmoid"),
    "MLP": ("Gemm", "ReLU", "Gemm"), "MLPGELU": ("Gemm", "GELU", "Gemm"),
    "DeepMLP": ("Gemm", "ReLU", "Gemm", "ReLU", "Gemm"), "SwiGLU": ("SwiGLU",), "FFNResidual": ("FFNResidual",),
    "GemmCrossEntropy": ("Gemm", "CrossEntropyLoss"), "GemmMSELoss": ("Gemm", "MSELoss"),
    "ScaledDotProductAttention": ("ScaledDotProductAttention",),
    "ScaledDotProductAttentionCausal": ("ScaledDotProductAttentionCausal",),
    "Attention": ("Attention",), "CausalAttention": ("CausalAttention",),
    "MultiHeadAttention": ("MultiHeadAttention",), "MultiHeadAttentionSDPA": ("MultiHeadAttentionSDPA",),
    "CausalMultiHeadAttention": ("CausalMultiHeadAttention",), "GroupedQueryAttention": ("GroupedQueryAttention",),
    "GroupedQueryAttentionCausal": ("GroupedQueryAttentionCausal",), "MultiQueryAttention": ("MultiQueryAttention",),
    "MultiQueryAttentionCausal": ("MultiQueryAttentionCausal",), "CrossAttention": ("CrossAttention",),
    "TransformerBlock": ("TransformerBlock",),
    # shapes for graph / loop / math strategies: the same operator on two inputs, a shared-weight
    # convolution on two inputs, a reduction over a reshaped view, logs of products and sums of logs,
    # a factor shared by two products plus a residual, products of exponentials
    "TwinActivation": ("TwinActivation",), "SiameseConv1d": ("SiameseConv1d",), "SiameseConv2d": ("SiameseConv2d",),
    "GroupedReduce": ("GroupedReduce",), "LogProduct": ("LogProduct",), "LogSum": ("LogSum",),
    "SharedFactorSum": ("SharedFactorSum",), "ExpProduct": ("ExpProduct",),
}
for _n, _r in _BLOCKS.items():
    _type(_n, "block", COMPONENTS[_r[0]].family if len(_r) == 1 else "block", _r)

# KernelBench level-2 style chains (2-5 components); the type name is the chain
_COMPOSITES = """
Conv2d ReLU BiasAdd | ConvTranspose2d BiasAdd Clamp Scale Divide | Conv2d Mish Mish | ConvTranspose2d Subtract Tanh
Conv3d Softmax MaxPool MaxPool | Conv3d ReLU LeakyReLU GELU Sigmoid | Conv3d Divide Max GlobalAvgPool BiasAdd
Gemm Scale LeakyReLU | ConvTranspose2d MaxPool HardTanh Mean Tanh | ConvTranspose2d BatchNorm Tanh MaxPool GroupNorm
ConvTranspose3d Mean AddConst Softmax Tanh | Gemm Divide Sum Scale | ConvTranspose3d BatchNorm Subtract
ConvTranspose2d Mish AddConst HardTanh Scale | Conv2d InstanceNorm Divide | ConvTranspose2d GELU GroupNorm
ConvTranspose3d BiasAdd ResidualAdd Multiply ResidualAdd | Conv2d AddConst Scale Sigmoid GroupNorm
Gemm Scale ResidualAdd Clamp LogSumExp | Conv3d GroupNorm Mean | Conv3d Min Softmax | Conv2d Min Tanh Tanh
ConvTranspose3d AddConst HardSwish | Conv3d HardSwish GroupNorm Mean | Gemm Mish Mish | Gemm GroupNorm HardTanh
Conv2d ClampMax AddConst Multiply | Conv2d Scale Min | Gemm Multiply BatchNorm | ConvTranspose3d LayerNorm GELU Scale
Conv2d Subtract HardSwish MaxPool Mish | ConvTranspose2d Min Sum GELU AddConst | Gemm Swish BiasAdd GroupNorm
ConvTranspose3d AvgPool Clamp Softmax Scale | Gemm Scale ResidualAdd | Gemm BatchNorm GELU ReLU
ConvTranspose2d GlobalAvgPool BiasAdd LogSumExp Sum | Conv3d Max LogSumExp ReLU | Gemm Sigmoid LogSumExp
Conv2d Subtract Tanh Subtract AvgPool | Conv3d Mish Tanh | Conv3d Scale Tanh Multiply Sigmoid
ConvTranspose3d Softmax Sigmoid | ConvTranspose3d Scale AvgPool BiasAdd Scale | Gemm Subtract Mean LogSumExp GELU
Conv2d Mish BatchNorm | Gemm Scale HardTanh GELU | Conv2d Multiply LeakyReLU GELU | Gemm Sigmoid Sum
Conv2d ReLU HardSwish | ConvTranspose3d LogSumExp HardSwish Subtract Clamp | Gemm Swish Scale
ConvTranspose3d Swish GroupNorm HardSwish | ConvTranspose3d ReLU GroupNorm | Gemm GroupNorm LeakyReLU Sum
Gemm ReLU Divide | Gemm LogSumExp LeakyReLU GELU | Conv2d AvgPool Sigmoid Sum | Gemm Dropout Softmax
Conv2d GELU GlobalAvgPool | Gemm ClampMax Subtract | Conv2d HardSwish ReLU | Gemm Sigmoid Scale ResidualAdd
Conv2d Divide LeakyReLU | ConvTranspose3d BatchNorm AvgPool AvgPool | Conv2d BatchNorm Scale
ConvTranspose3d LeakyReLU Multiply LeakyReLU Max | Gemm GroupNorm ClampMax BiasAdd | Gemm BiasAdd ReLU
ConvTranspose3d Scale BatchNorm GlobalAvgPool | ConvTranspose3d MaxPool MaxPool Sum
Conv3d Multiply InstanceNorm Clamp Multiply | Gemm Max Subtract GELU | Gemm Swish Divide Clamp Tanh
Conv2d Tanh Scale BiasAdd MaxPool | Conv3d GroupNorm ClampMax Clamp Dropout | Gemm BatchNorm Scale Softmax
Conv2d GroupNorm Scale MaxPool Clamp | Gemm Divide GELU | Conv2d Subtract Subtract Mish
Gemm GroupNorm Swish Multiply Swish | ConvTranspose3d MaxPool Softmax Subtract Swish
Conv3d LeakyReLU Sum Clamp GELU | ConvTranspose2d Softmax BiasAdd Scale Sigmoid
Conv2d GroupNorm Tanh HardSwish ResidualAdd | ConvTranspose2d AddConst ClampMax GELU Scale
Gemm BiasAdd HardTanh Mish GroupNorm | Gemm AddConst Swish Tanh GELU | ConvTranspose3d Multiply Max GlobalAvgPool Clamp
Gemm BatchNorm BiasAdd Divide Swish | Gemm GELU Softmax | Gemm Subtract Multiply ReLU | ConvTranspose3d Clamp Divide
Conv2d Flatten Gemm | Conv2d ReLU MaxPool Flatten Gemm | Conv1d ReLU MaxPool | Conv1d GELU LayerNorm
BMM Scale Softmax | BMM InstanceNorm ResidualAdd Multiply | Gemm Gemm | Gemm LayerNorm GELU | Gemm RMSNorm SiLU
Matmul Mish Mish | Matmul Scale ResidualAdd | Matmul GELU Softmax | Conv2d BatchNorm ReLU MaxPool
Conv2d ReLU GlobalAvgPool Flatten Gemm | ConvTranspose1d Tanh BiasAdd | Conv3d Softplus L2Norm
Gemm LogSoftmax | Conv2d LayerNorm ReLU | ConvTranspose2d RMSNorm GELU
TwinActivation Scale | TwinActivation Sum | TwinActivation LayerNorm | TwinActivation Softmax
SiameseConv1d ReLU | SiameseConv2d ReLU | SiameseConv2d BatchNorm | SiameseConv2d GELU GlobalAvgPool
GroupedReduce Scale | GroupedReduce Tanh | LogProduct Mean | LogProduct Scale | LogProduct Sum
LogSum Mean | LogSum Sum | LogSum ReLU
SharedFactorSum Mean | SharedFactorSum ReLU | SharedFactorSum Sum | ExpProduct Sum | ExpProduct Scale | ExpProduct Mean
"""
for _chain in (c.split() for c in _COMPOSITES.replace("\n", "|").split("|") if c.strip()):
    _type("_".join(_chain), "composite", "composite", _chain)

# random compositions (paper §3.1: "sampling and assembling 2-5 components")
_RANDOM_HEADS = ("Gemm", "Conv2d", "Conv3d", "ConvTranspose2d", "Input")
for _len in (2, 3, 4, 5):
    for _h in _RANDOM_HEADS:
        _type(f"Random{_len}_{_h}", "random", "random", head=_h, length=_len)
