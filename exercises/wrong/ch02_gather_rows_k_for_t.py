"""The token of routed row n taken as n % K (its choice) instead of n // K."""
import torch


def gather_rows(x_TH: torch.Tensor, sorted_rows_P: torch.Tensor, top_k: int) -> torch.Tensor:
    n_rows = x_TH.shape[0] * top_k
    valid_P = sorted_rows_P < n_rows
    t_P = torch.where(valid_P, sorted_rows_P.long() % top_k, 0)
    return x_TH[t_P] * valid_P[:, None].to(x_TH.dtype)
