"""A Python loop over rows indexed by pos_B[b]: each index reads a value on the host, which a graph cannot."""
import torch


def cache_write(cache_BSD: torch.Tensor, new_BD: torch.Tensor, pos_B: torch.Tensor) -> None:
    for b in range(new_BD.shape[0]):
        cache_BSD[b, int(pos_B[b])] = new_BD[b]


def decode_mask(pos_B: torch.Tensor, S: int) -> torch.Tensor:
    return torch.arange(S)[None, :] <= pos_B[:, None]
