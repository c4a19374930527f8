"""Matrix multiplication C = A @ B (KernelBench level-1 style, small shapes)."""
import torch
import torch.nn as nn

M, K, N = 8, 12, 16


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, A: torch.Tensor, B: torch.Tensor) -> torch.Tensor:
        return torch.matmul(A, B)


def get_inputs():
    return [torch.randn(M, K), torch.randn(K, N)]


def get_init_inputs():
    return []
