"""No check of the capacity: an overflowing destination writes into its neighbour's region."""
import torch


def capacity_rows(sends_TR, capacity):
    R = sends_TR.shape[1]
    rows_TR = torch.arange(R) * capacity + sends_TR.long().cumsum(0) - 1
    return torch.where(sends_TR, rows_TR, -1)


def padded_fraction(sends_TR, capacity):
    return 1 - int(sends_TR.sum()) / (sends_TR.shape[1] * capacity)
