"""The offsets of the counts themselves: no expert padded to a multiple of block_m."""
import torch


def padded_offsets(counts_E: torch.Tensor, block_m: int) -> torch.Tensor:
    return torch.cat([counts_E.new_zeros(1), torch.cumsum(counts_E, 0)]).long()
