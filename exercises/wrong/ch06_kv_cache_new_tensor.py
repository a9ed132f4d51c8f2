"""A new cache built and its contents copied back into a fresh tensor: the captured graph's cache never changes."""
import torch


def cache_write(cache_BSD: torch.Tensor, new_BD: torch.Tensor, pos_B: torch.Tensor) -> None:
    b_B = torch.arange(new_BD.shape[0])
    cache_BSD = cache_BSD.clone()
    cache_BSD[b_B, pos_B] = new_BD.to(cache_BSD.dtype)


def decode_mask(pos_B: torch.Tensor, S: int) -> torch.Tensor:
    return torch.arange(S)[None, :] <= pos_B[:, None]
