"""Gemm, tanh-approximated GELU, then a sum over features (kept as a column)."""
import torch
import torch.nn as nn
import torch.nn.functional as F

batch_size, in_features, out_features = 8, 16, 12


class Model(nn.Module):
    def __init__(self, in_features, out_features):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)

    def forward(self, x):
        x = F.gelu(self.linear(x), approximate="tanh")
        return x.sum(dim=1, keepdim=True)


def get_inputs():
    return [torch.randn(batch_size, in_features)]


def get_init_inputs():
    return [in_features, out_features]
