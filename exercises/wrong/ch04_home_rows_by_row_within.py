"""Within one destination the rows leave last first: not n order."""
import torch


def send_order(dest_N):
    N = dest_N.numel()
    return torch.argsort(dest_N * (N + 1) + (N - 1 - torch.arange(N)))


def home_rows(dest_N):
    order_N = send_order(dest_N)
    home_N = torch.empty_like(order_N)
    home_N[order_N] = torch.arange(order_N.numel())
    return home_N
