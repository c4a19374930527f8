"""Max reduction over the last dimension (values only)."""
import torch
import torch.nn as nn

batch, rows, dim = 2, 4, 16


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return torch.amax(x, dim=-1)


def get_inputs():
    return [torch.randn(batch, rows, dim)]


def get_init_inputs():
    return []
