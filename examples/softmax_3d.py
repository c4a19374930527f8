"""Softmax over the last dimension of a 3-D tensor (nn.Softmax(dim=-1))."""
import torch
import torch.nn as nn

batch, rows, dim = 2, 4, 16


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.softmax = nn.Softmax(dim=-1)

    def forward(self, x):
        return self.softmax(x)


def get_inputs():
    return [torch.randn(batch, rows, dim)]


def get_init_inputs():
    return []
