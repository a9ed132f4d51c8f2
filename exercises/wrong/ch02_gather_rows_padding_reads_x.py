"""Padding slots read a row of x (the last token's) instead of zeros."""
import torch


def gather_rows(x_TH: torch.Tensor, sorted_rows_P: torch.Tensor, top_k: int) -> torch.Tensor:
    t_P = (sorted_rows_P.long() // top_k).clamp_max(x_TH.shape[0] - 1)
    return x_TH[t_P]
