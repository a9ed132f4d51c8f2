"""Dispatch and combine over ``torch.distributed``: one row per (token, expert) pair.

Rank r holds T_r tokens. Its routed rows n = t·K + k go to the rank that owns expert
``ids_TK[t, k]`` (:meth:`Placement.dest_rank_N`), and come back to be summed in k order:

    dispatch:  x_TH ──(sort rows by destination, stable)──▶ all_to_all_single of the counts per
               (rank, expert slot) ──(one host sync)──▶ all_to_all_single of the rows, each with its
               (slot, weight) packed behind it ──▶ sorted by local slot (stable) ──▶ x_MH, weight_M, counts_L
    combine:   out_MH ──(unsort)──▶ all_to_all_single back ──(unsort)──▶ out_NH ──▶ Σ_k in k order

Why the result is bit-identical to one device: rows arrive grouped by source rank (ascending) and,
within a source, in n order; the stable sort by expert keeps that order, so expert e sees exactly
the rows of the global batch (ranks' tokens concatenated in rank order) in the same order as the
single-device layer does. Each row's output is then the same, and :func:`combine_topk` adds a
token's K outputs in the same fixed order. NCCL on GPUs, gloo on CPU ranks: one code path.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

from dispatch import runtime
from dispatch.parallel.placement import Placement

if runtime.HAS_CUDA:
    import triton
    import triton.language as tl

    @triton.jit
    def _gather_sum_k(src, index, y, H, K: tl.constexpr, BLOCK_H: tl.constexpr):
        # y[t] = src[index[t·K]] + src[index[t·K + 1]] + ... in fp32, left to right, cast once.
        t = tl.program_id(0).to(tl.int64)
        cols = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
        m = cols < H
        acc = tl.zeros((BLOCK_H,), dtype=tl.float32)  # from 0, as kernels/combine.py (so -0.0 → +0.0 alike)
        for k in tl.static_range(0, K):
            acc += tl.load(src + tl.load(index + t * K + k).to(tl.int64) * H + cols, mask=m).to(tl.float32)
        tl.store(y + t * H + cols, acc.to(y.dtype.element_ty), mask=m)


def combine_topk(out_NH: torch.Tensor, top_k: int) -> torch.Tensor:
    """y_TH[t] = 0 + Σ_k out_NH[t·K + k], added in fp32 in k = 0, 1, ... order, cast once."""
    if out_NH.dim() != 2 or out_NH.shape[0] % top_k:
        raise ValueError(f"out_NH must be [T*K, H] with K={top_k}, got {tuple(out_NH.shape)}")
    out_TKH = out_NH.view(-1, top_k, out_NH.shape[1])
    acc_TH = out_TKH.new_zeros(out_TKH.shape[0], out_TKH.shape[2], dtype=torch.float32)
    for k in range(top_k):  # the same additions as dispatch.kernels.combine
        acc_TH = acc_TH + out_TKH[:, k].float()
    return acc_TH.to(out_NH.dtype)


def gather_combine(src_MH: torch.Tensor, index_N: torch.Tensor, top_k: int) -> torch.Tensor:
    """y_TH[t] = Σ_k src_MH[index_N[t·K + k]] in k order: :func:`combine_topk` of a gather, fused
    into one Triton launch on CUDA (every path of the layer sums through here, so a device's
    paths agree to the bit)."""
    if not src_MH.is_cuda:
        return combine_topk(src_MH[index_N], top_k)
    T, H = index_N.shape[0] // top_k, src_MH.shape[1]
    y_TH = src_MH.new_empty(T, H)
    if T:
        block = min(1024, triton.next_power_of_2(H))
        _gather_sum_k[(T, triton.cdiv(H, block))](src_MH, index_N, y_TH, H, K=top_k, BLOCK_H=block)
    return y_TH


def inverse(order_N: torch.Tensor) -> torch.Tensor:
    """inv[order_N[i]] = i: where row n sits after a permutation."""
    inv = torch.empty_like(order_N)
    inv[order_N] = torch.arange(order_N.shape[0], device=order_N.device)
    return inv


@dataclass(frozen=True)
class DispatchMeta:
    """What :func:`combine` needs to send rows home and sum them (one per dispatch call)."""

    num_tokens: int  # T on this rank
    top_k: int  # K
    order_N: torch.Tensor  # int64: send position i holds routed row order_N[i] (sorted by dest rank)
    send_counts: tuple[int, ...]  # rows this rank sent to each rank
    recv_counts: tuple[int, ...]  # rows this rank received from each rank
    recv_order_M: torch.Tensor  # int64: local position m holds received row recv_order_M[m]
    counts_L: tuple[int, ...]  # received rows per local expert slot


def _counts(index: torch.Tensor, n: int) -> torch.Tensor:
    """Histogram of ``index`` into n bins with no host sync (scatter_add, not bincount)."""
    return torch.zeros(n, dtype=torch.int64, device=index.device).scatter_add_(0, index, torch.ones_like(index))


def _a2a(x: torch.Tensor, send: tuple[int, ...], recv: tuple[int, ...], group) -> torch.Tensor:
    out = x.new_empty((sum(recv),) + tuple(x.shape[1:]))
    if dist.get_world_size(group) == 1:
        out.copy_(x)
    else:
        dist.all_to_all_single(out, x.contiguous(), list(recv), list(send), group=group)
    return out


def check_routing(x_TH: torch.Tensor, weights_TK: torch.Tensor, ids_TK: torch.Tensor, num_experts: int) -> None:
    """ValueError unless x_TH [T, H], weights_TK [T, K] float, ids_TK [T, K] int in [0, E)."""
    if x_TH.dim() != 2:
        raise ValueError(f"x must be [T, H], got shape {tuple(x_TH.shape)}")
    T = x_TH.shape[0]
    if ids_TK.dim() != 2 or ids_TK.shape[0] != T or weights_TK.shape != ids_TK.shape:
        raise ValueError(f"weights_TK and ids_TK must both be [T={T}, K], got {tuple(weights_TK.shape)} "
                         f"and {tuple(ids_TK.shape)}")
    if ids_TK.is_floating_point() or not weights_TK.is_floating_point():
        raise ValueError("ids_TK must be integer and weights_TK floating point")
    if ids_TK.numel() and (int(ids_TK.min()) < 0 or int(ids_TK.max()) >= num_experts):
        raise ValueError(f"expert ids must lie in [0, {num_experts})")


def dispatch(x_TH, weights_TK, ids_TK, placement: Placement, group=None):
    """Send each routed row to the rank computing its expert.

    Args:
        x_TH: this rank's tokens [T, H] (T may be 0). weights_TK fp32-castable [T, K],
        ids_TK int [T, K]: the routing of those tokens. placement: the same on every rank.
    Returns:
        (x_MH, weight_M fp32, counts_L, meta): the M rows this rank's L local experts must
        compute, grouped by local slot (expert ``placement.slots_RS[rank][l]`` gets the
        ``counts_L[l]`` rows of group l); ``meta`` for :func:`combine`.
    """
    if not isinstance(placement, Placement):
        raise ValueError(f"placement must be a dispatch.parallel.Placement, got {type(placement).__name__}")
    rank, R = dist.get_rank(group), dist.get_world_size(group)
    if placement.num_ranks != R:
        raise ValueError(f"placement is for {placement.num_ranks} ranks but the group has {R}")
    T, K = ids_TK.shape
    S = placement.slots_per_rank  # local slots of the largest rank
    dest_N = placement.dest_rank_N(ids_TK, rank)
    slot_N = placement.tables(x_TH.device)[2][dest_N, ids_TK.reshape(-1).long()]
    order_N = torch.argsort(dest_N, stable=True)

    # Counts per (destination, its local slot): one small exchange gives every size needed.
    send_RS = _counts(dest_N * S + slot_N, R * S)
    recv_RS = torch.empty_like(send_RS)
    if R == 1:
        recv_RS.copy_(send_RS)
    else:
        dist.all_to_all_single(recv_RS, send_RS, group=group)
    send_R, from_RS = send_RS.view(R, S).sum(1), recv_RS.view(R, S)  # from_RS[source, my slot]
    sizes = torch.cat([send_R, from_RS.sum(1), from_RS.sum(0)]).tolist()  # the one host sync
    L = len(placement.slots_RS[rank])
    send, recv, counts_L = tuple(sizes[:R]), tuple(sizes[R:2 * R]), tuple(sizes[2 * R:2 * R + L])

    # One exchange carries each row with its (local slot, weight) packed behind it as raw bits.
    meta_N2 = torch.stack([slot_N.to(torch.int32), weights_TK.float().reshape(-1).view(torch.int32)], dim=1)
    packed_NW = torch.cat([x_TH[torch.div(order_N, K, rounding_mode="floor")], meta_N2[order_N].view(x_TH.dtype)], 1)
    recv_MW = _a2a(packed_NW, send, recv, group)
    H = x_TH.shape[1]
    recv_meta = recv_MW[:, H:].contiguous().view(torch.int32)
    slot_M = recv_meta[:, 0].long()
    recv_order_M = torch.argsort(slot_M, stable=True)
    x_MH = recv_MW[recv_order_M, :H]
    weight_M = recv_meta[:, 1].contiguous().view(torch.float32)[recv_order_M]
    meta = DispatchMeta(T, K, order_N, send, recv, recv_order_M, counts_L)
    return x_MH, weight_M, counts_L, meta


def combine(out_MH: torch.Tensor, meta: DispatchMeta, group=None) -> torch.Tensor:
    """Send expert outputs home and sum each token's K rows in k order: out_MH [M, H] → y_TH [T, H]."""
    if out_MH.shape[0] != len(meta.recv_order_M):
        raise ValueError(f"out_MH must have the {len(meta.recv_order_M)} rows dispatch returned, got {out_MH.shape[0]}")
    back_MH = torch.empty_like(out_MH)
    back_MH[meta.recv_order_M] = out_MH
    home_NH = _a2a(back_MH, meta.recv_counts, meta.send_counts, group)
    return gather_combine(home_NH, inverse(meta.order_N), meta.top_k)
