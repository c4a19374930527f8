"""Scaled dot-product attention (torch.nn.functional.scaled_dot_product_attention) with batch and heads."""
import torch
import torch.nn as nn
import torch.nn.functional as F

batch, heads, seq, head_dim = 2, 2, 8, 4


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, q, k, v):
        return F.scaled_dot_product_attention(q, k, v)


def get_inputs():
    return [torch.randn(batch, heads, seq, head_dim) for _ in range(3)]


def get_init_inputs():
    return []
