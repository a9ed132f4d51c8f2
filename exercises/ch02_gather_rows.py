"""Chapter 2, exercise 1: the gather behind the grouped GEMM.

``sorted_rows_P`` holds, for each of the P sorted slots, the routed row n = t·K + k it carries, or
N = T·K on a padding slot. The up kernel reads row t = n // K of x for each slot and zeros for
padding. Build that [P, H] matrix in plain PyTorch, without a Python loop over slots.
"""
import torch


def gather_rows(x_TH: torch.Tensor, sorted_rows_P: torch.Tensor, top_k: int) -> torch.Tensor:
    raise NotImplementedError("complete gather_rows in exercises/ch02_gather_rows.py")
