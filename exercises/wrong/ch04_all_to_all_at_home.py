"""Every result computed at home with the destination's expert: right numbers, nothing sent."""
import torch


def round_trip(x_TH, dest_TK, expert):
    T, K = dest_TK.shape
    if T == 0:
        return x_TH.new_zeros(0, K, x_TH.shape[1])
    return torch.stack([torch.stack([expert(int(dest_TK[t, k]), x_TH[t]) for k in range(K)]) for t in range(T)])
