"""Mean reduction over one dimension."""
import torch
import torch.nn as nn

batch_size, dim1, dim2 = 4, 16, 8


class Model(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.dim = dim

    def forward(self, x):
        return torch.mean(x, dim=self.dim)


def get_inputs():
    return [torch.randn(batch_size, dim1, dim2)]


def get_init_inputs():
    return [1]
