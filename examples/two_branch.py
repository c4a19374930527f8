"""Two independent element-wise branches joined by a product (tanh(x) * sigmoid(x) + x):
the branch nests can be reordered, inlined or fused."""

import torch
import torch.nn as nn

batch_size, dim = 4, 16


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return torch.tanh(x) * torch.sigmoid(x) + x


def get_inputs():
    return [torch.randn(batch_size, dim)]


def get_init_inputs():
    return []
