"""Chapter 6, exercise 1: the static KV cache of a decode step.

The cache is allocated once, here one layer's [B_cache, S, D] (rows, positions, values of a
position; the engine's caches are [L, B, S, kv, D]), and a captured CUDA graph keeps its address:
a step writes *into* it, never builds a new one. The step's B rows are the cache's first B rows
(B ≤ B_cache: a bucket may be larger than the batch), and row b of a ragged batch sits at its own
position ``pos_B[b]``. Complete, with no Python loop over rows and no ``.item()`` or ``.tolist()``
(a graph cannot wait for the host):

* ``cache_write(cache_BSD, new_BD, pos_B)``: store ``new_BD[b]`` at ``cache_BSD[b, pos_B[b]]``
  for every b, in place, and touch nothing else;
* ``decode_mask(pos_B, S)``: bool [B, S], True where row b may attend: positions ≤ ``pos_B[b]``.

Example: S = 4, pos_B [2, 0] → the mask [[T, T, T, F], [T, F, F, F]], and the write fills
``cache_BSD[0, 2]`` and ``cache_BSD[1, 0]``.
"""
import torch


def cache_write(cache_BSD: torch.Tensor, new_BD: torch.Tensor, pos_B: torch.Tensor) -> None:
    b_B = torch.arange(new_BD.shape[0], device=new_BD.device)
    cache_BSD[b_B, pos_B] = new_BD.to(cache_BSD.dtype)


def decode_mask(pos_B: torch.Tensor, S: int) -> torch.Tensor:
    return torch.arange(S, device=pos_B.device)[None, :] <= pos_B[:, None]
