"""Gemm followed by ReLU: relu(x @ W^T + b) (KernelBench level-2 style)."""
import torch
import torch.nn as nn

batch_size, in_features, out_features = 8, 12, 16


class Model(nn.Module):
    def __init__(self, in_features, out_features):
        super().__init__()
        self.gemm = nn.Linear(in_features, out_features)

    def forward(self, x):
        return torch.relu(self.gemm(x))


def get_inputs():
    return [torch.randn(batch_size, in_features)]


def get_init_inputs():
    return [in_features, out_features]
