"""Chapter 1, exercise 1: padded expert offsets.

The sort gives every expert a contiguous run of slots, padded up to a multiple of ``block_m`` so
that every block of ``block_m`` slots belongs to one expert. An expert with no rows gets no slots.
Return ``offsets_E1`` (int64, E + 1 entries): ``offsets_E1[e]`` is expert e's first slot and
``offsets_E1[E]`` the number of slots used. No Python loop over experts: use tensor operations.

Example: counts [3, 0, 5], block_m 4 → [0, 4, 4, 12].
"""
import torch


def padded_offsets(counts_E: torch.Tensor, block_m: int) -> torch.Tensor:
    raise NotImplementedError("complete padded_offsets in exercises/ch01_offsets.py")
