"""LayerNorm over the feature dimension followed by tanh."""
import torch
import torch.nn as nn

batch_size, features = 4, 16


class Model(nn.Module):
    def __init__(self, features):
        super().__init__()
        self.norm = nn.LayerNorm(features)

    def forward(self, x):
        return torch.tanh(self.norm(x))


def get_inputs():
    return [torch.randn(batch_size, features)]


def get_init_inputs():
    return [features]
