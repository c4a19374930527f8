"""Two inputs through the same activation, then a product: sigmoid(x) * sigmoid(y).
The two sigmoid nests are identical up to their input, so tensor_concat_to_fuse_operators
and expression_reorder have sites."""

import torch
import torch.nn as nn

batch_size, dim = 4, 16


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x, y):
        return torch.sigmoid(x) * torch.sigmoid(y)


def get_inputs():
    return [torch.randn(batch_size, dim), torch.randn(batch_size, dim)]


def get_init_inputs():
    return []
