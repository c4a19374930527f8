"""GELU activation (exact erf form)."""
import torch
import torch.nn as nn
import torch.nn.functional as F

batch_size, dim = 8, 64


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return F.gelu(x)


def get_inputs():
    return [torch.randn(batch_size, dim)]


def get_init_inputs():
    return []
