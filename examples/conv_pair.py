"""Two inputs through one padded 2-D convolution (shared weights), outputs added."""
import torch
import torch.nn as nn

batch, channels, out_channels, size = 1, 2, 2, 6


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(channels, out_channels, kernel_size=3, padding=1, bias=False)

    def forward(self, x, y):
        return self.conv(x) + self.conv(y)


def get_inputs():
    return [torch.randn(batch, channels, size, size), torch.randn(batch, channels, size, size)]


def get_init_inputs():
    return []
