"""An expert with no rows still gets a block of padding slots."""
import torch


def padded_offsets(counts_E: torch.Tensor, block_m: int) -> torch.Tensor:
    padded_E = (counts_E.long().clamp_min(1) + block_m - 1) // block_m * block_m
    return torch.cat([padded_E.new_zeros(1), torch.cumsum(padded_E, 0)])
