"""Log-softmax over the last dimension."""
import torch
import torch.nn as nn

batch, dim = 4, 16


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return torch.log_softmax(x, dim=-1)


def get_inputs():
    return [torch.randn(batch, dim)]


def get_init_inputs():
    return []
