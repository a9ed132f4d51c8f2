"""Paged-cache blocks copied from one pool into another in one pass: the KV handoff's copy.

    copy_blocks(src, dst, src_ids, dst_ids)     dst[:, dst_ids[i]] = src[:, src_ids[i]], every i

Both pools are [L, NB, *block] (NB may differ, the rest must not), contiguous. torch's twin,
``dst.index_copy_(1, d, src.index_select(1, s))``, passes the bytes twice (a gather into a temporary,
then a scatter out of it); this kernel reads each element once and writes it once, like a plain
copy of the same bytes. One program per (layer, block, tile of the block's elements).
"""
from __future__ import annotations

import math

import torch
import triton
import triton.language as tl


@triton.jit
def _copy_blocks_kernel(src, dst, src_ids, dst_ids, src_layer, dst_layer, N: tl.constexpr, BLOCK: tl.constexpr):
    """Layer pid(0), pair pid(1), elements of tile pid(2): dst[l, dst_ids[i]] = src[l, src_ids[i]]."""
    layer = tl.program_id(0).to(tl.int64)
    i = tl.program_id(1)
    s = tl.load(src_ids + i).to(tl.int64)
    d = tl.load(dst_ids + i).to(tl.int64)
    offs = tl.program_id(2) * BLOCK + tl.arange(0, BLOCK)
    m = offs < N
    x = tl.load(src + layer * src_layer + s * N + offs, mask=m)
    tl.store(dst + layer * dst_layer + d * N + offs, x, mask=m)


def copy_blocks(src: torch.Tensor, dst: torch.Tensor, src_ids, dst_ids, *, tile: int = 8192,
                num_warps: int | None = None) -> None:
    """``dst[:, dst_ids[i]] = src[:, src_ids[i]]`` for every i, launched on the current stream.
    ``src_ids``/``dst_ids``: block numbers on the host (sequences of ints, or CPU tensors), checked against
    the pools before the launch, then copied to the pools' device. ``tile``: elements a program copies (a
    power of two; fewer when a block holds fewer); ``num_warps``: 8 from 4096-element tiles, else 4."""
    if tile < 16 or tile & (tile - 1):
        raise ValueError(f"tile must be a power of two >= 16, got {tile}")
    if num_warps is not None and num_warps not in (1, 2, 4, 8, 16, 32):
        raise ValueError(f"num_warps must be a power of two in 1..32, got {num_warps}")
    if src.dim() < 3 or src.shape[0] != dst.shape[0] or src.shape[2:] != dst.shape[2:] or src.dtype != dst.dtype:
        raise ValueError(f"pools of different layouts: {tuple(src.shape)} {src.dtype}, {tuple(dst.shape)} {dst.dtype}"
                         " (expected [L, NB, *block] with the same L, block and dtype)")
    if not (src.is_contiguous() and dst.is_contiguous()) or src.device != dst.device:
        raise ValueError("both pools must be contiguous and on one device")
    s, d = (torch.as_tensor(x, dtype=torch.long, device="cpu").reshape(-1) for x in (src_ids, dst_ids))
    if s.shape != d.shape:
        raise ValueError(f"one destination per source block: {len(s)} sources, {len(d)} destinations")
    for name, ids, nb in (("src_ids", s, src.shape[1]), ("dst_ids", d, dst.shape[1])):
        if len(ids) and not (0 <= int(ids.min()) and int(ids.max()) < nb):
            raise ValueError(f"{name} must lie in [0, {nb}): got {ids.min().item()}..{ids.max().item()}")
    if len(set(d.tolist())) != len(d):
        raise ValueError("dst_ids repeats a block: two sources would race for one destination")
    n = s.numel()
    if n == 0:
        return
    ids = torch.stack([s, d]).to(src.device, non_blocking=True)
    N = math.prod(src.shape[2:])
    BLOCK = min(tile, triton.next_power_of_2(N))
    grid = (src.shape[0], n, triton.cdiv(N, BLOCK))
    _copy_blocks_kernel[grid](src, dst, ids[0], ids[1], src.stride(0), dst.stride(0), N=N, BLOCK=BLOCK,
                              num_warps=num_warps or (8 if BLOCK >= 4096 else 4))


def copy_blocks_reference(src: torch.Tensor, dst: torch.Tensor, src_ids, dst_ids) -> None:
    """The plain-PyTorch twin: a gather into a temporary, then a scatter (the bytes pass twice)."""
    d = torch.as_tensor(dst_ids, dtype=torch.long).to(dst.device)
    dst.index_copy_(1, d, src.index_select(1, torch.as_tensor(src_ids, dtype=torch.long).to(src.device)))
