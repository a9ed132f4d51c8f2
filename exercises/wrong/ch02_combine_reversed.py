"""A token's K rows summed from k = K-1 down to 0: another order, other bits."""
import torch


def combine(out_NH: torch.Tensor, top_k: int) -> torch.Tensor:
    out_TKH = out_NH.view(-1, top_k, out_NH.shape[-1])
    acc_TH = out_TKH[:, top_k - 1].float()
    for k in range(top_k - 2, -1, -1):
        acc_TH = acc_TH + out_TKH[:, k].float()
    return acc_TH.to(out_NH.dtype)
