"""Scale and bias: x * scale + bias with a per-channel learnable bias."""
import torch
import torch.nn as nn

batch_size, channels = 8, 32


class Model(nn.Module):
    def __init__(self, channels, scale):
        super().__init__()
        self.scale = scale
        self.bias = nn.Parameter(torch.randn(channels))

    def forward(self, x):
        return x * self.scale + self.bias


def get_inputs():
    return [torch.randn(batch_size, channels)]


def get_init_inputs():
    return [channels, 0.5]
