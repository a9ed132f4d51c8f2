"""Chapter 2, exercise 1: the gather behind the grouped GEMM.

``sorted_rows_P`` holds, for each of the P sorted slots, the routed row n = t·K + k it carries, or
N = T·K on a padding slot. The up kernel reads row t = n // K of x for each slot and zeros for
padding. Build that [P, H] matrix in plain PyTorch, without a Python loop over slots.
"""
import torch


def gather_rows(x_TH: torch.Tensor, sorted_rows_P: torch.Tensor, top_k: int) -> torch.Tensor:
    n_rows = x_TH.shape[0] * top_k
    valid_P = sorted_rows_P < n_rows
    t_P = torch.where(valid_P, sorted_rows_P.long() // top_k, 0)
    return x_TH[t_P] * valid_P[:, None].to(x_TH.dtype)
