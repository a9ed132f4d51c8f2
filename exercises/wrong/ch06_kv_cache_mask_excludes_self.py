"""The mask stops before the row's own position: the new token cannot attend to itself."""
import torch


def cache_write(cache_BSD: torch.Tensor, new_BD: torch.Tensor, pos_B: torch.Tensor) -> None:
    cache_BSD[torch.arange(new_BD.shape[0]), pos_B] = new_BD.to(cache_BSD.dtype)


def decode_mask(pos_B: torch.Tensor, S: int) -> torch.Tensor:
    return torch.arange(S)[None, :] < pos_B[:, None]
