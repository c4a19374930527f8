"""Batched matrix multiplication."""
import torch
import torch.nn as nn

batch_size, m, k, n = 4, 8, 12, 6


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, A, B):
        return torch.bmm(A, B)


def get_inputs():
    return [torch.randn(batch_size, m, k), torch.randn(batch_size, k, n)]


def get_init_inputs():
    return []
