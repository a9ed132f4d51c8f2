"""Dispatch and combine over ``torch.distributed``: each token sent once per destination rank.

Rank r holds T_r tokens. Routed row n = t·K + k is computed by rank ``dest_N[n]``
(:meth:`Placement.dest_rank_N`). Token t travels to each rank that computes at least one of its
K rows, **once**, with its K expert ids and K weights packed behind it (an id the destination
must not compute is sent as -1). On arrival the destination expands each token to its own rows:

    dispatch:  x_TH ─▶ one copy of token t per destination d (t order) ─▶ all_to_all_single
               ─▶ x_MH, weights_MK, slots_MK (local slot of each of the K rows; L = not here)
    experts:   out_VH, rows m·K + k (only rows with slots_MK < L mean anything)
    combine:   each computed row back to its home, at n = t·K + k ─▶ combine(out_NH, K) in k order

Two ways to size the exchange (DeepEP's two modes are the model):

* ``capacity=None`` ("normal"): one small all-to-all of the counts and one host sync give exact
  splits; only real tokens go out and only computed rows come back.
* ``capacity=C`` ("low latency"): every source owns a region of C token rows in every destination
  (C = the most tokens any rank passes: a token goes to a rank at most once, so that bound always
  holds) and C·K rows come back per region. Splits are static and there is no host sync: the
  round trip can be captured in a CUDA graph. The price: padded regions travel too.

Bit-identity with one device: each row's result depends only on that row (pinned tiles, see
``layer.py``), and :func:`dispatch.kernels.combine.combine` adds a token's K rows in k order.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

from dispatch.checks import check_ids_in_range, check_routing_inputs
from dispatch.kernels.combine import combine as combine_k
from dispatch.placement import Placement


@dataclass(frozen=True)
class DispatchMeta:
    """What :func:`combine` needs to send computed rows home (one per dispatch call)."""

    num_tokens: int  # T on this rank
    top_k: int  # K
    home_N: torch.Tensor  # int64 [T·K]: row of the returned buffer holding routed row n's result
    keep_V: torch.Tensor | None  # normal mode: received rows m·K + k this rank computed, in order
    send: tuple[int, ...] | None  # normal mode: rows back to each source / to each destination
    recv: tuple[int, ...] | None
    capacity: int | None  # C token rows per source region (low-latency mode)


def check_routing(x_TH, weights_TK, ids_TK, num_experts: int, hidden: int, top_k: int,
                  check_ids: bool | None = None) -> None:
    """ValueError unless the routing passes :func:`dispatch.checks.check_routing_inputs` and
    fits this layer (H = ``hidden``, K = ``top_k``); ``check_ids`` (default: on CPU; on a GPU it would
    cost a host sync) also refuses ids outside [0, E). Unchecked, a row whose id lies outside [0, E)
    is computed nowhere and contributes nothing."""
    T, K = check_routing_inputs(x_TH, weights_TK, ids_TK, num_experts)
    if x_TH.shape[1] != hidden:
        raise ValueError(f"x_TH must be [T, H={hidden}], got {tuple(x_TH.shape)}")
    if K != top_k:
        raise ValueError(f"ids_TK and weights_TK must be [T={T}, K={top_k}], got {tuple(ids_TK.shape)}")
    if x_TH.device.type == "cpu" if check_ids is None else check_ids:
        check_ids_in_range(ids_TK, num_experts)


def plan(ids_TK: torch.Tensor, placement: Placement, rank: int):
    """(dest_TK, sends_TR, pos_TR): the rank computing each routed row (R: none, for an id outside
    [0, E)); whether token t goes to rank d; its position among the tokens this rank sends to d
    (t order). No host sync."""
    T, K = ids_TK.shape
    R, E = placement.num_ranks, placement.num_experts
    valid_TK = (ids_TK >= 0) & (ids_TK < E)
    dest_TK = placement.dest_rank_N(ids_TK.clamp(0, E - 1), rank).view(T, K)
    dest_TK = torch.where(valid_TK, dest_TK, R)  # never used as an address
    sends_TR = torch.zeros(T, R + 1, dtype=torch.bool, device=ids_TK.device)
    sends_TR = sends_TR.scatter_(1, dest_TK, True)[:, :R]
    pos_TR = sends_TR.long().cumsum(0) - 1
    return dest_TK, sends_TR, pos_TR


def _a2a(x: torch.Tensor, send, recv, group, zero_row: bool = False) -> torch.Tensor:
    """all_to_all_single; send/recv None = equal splits (static: no host sync). ``zero_row``: one
    more row of zeros after the received ones (where rows computed nowhere point)."""
    rows = x.shape[0] if recv is None else sum(recv)
    full = x.new_empty((rows + zero_row,) + tuple(x.shape[1:]))
    out = full[:rows]
    if zero_row:
        full[rows:].zero_()
    if dist.get_world_size(group) == 1:
        out.copy_(x)
    else:
        dist.all_to_all_single(out, x.contiguous(), None if recv is None else list(recv),
                               None if send is None else list(send), group=group)
    return full


def _pack(x_TH, weights_TK, ids_TK, dest_TK, d_J, t_J):
    """Rows j = (destination d_J, token t_J): x with K ids (-1 where d does not compute the row)
    and K fp32 weights packed behind it as raw bits, in x's dtype."""
    ids_JK = torch.where(dest_TK[t_J] == d_J[:, None], ids_TK[t_J].to(torch.int32), -1)
    meta_JK2 = torch.cat([ids_JK, weights_TK[t_J].float().view(torch.int32)], 1)
    return torch.cat([x_TH[t_J], meta_JK2.view(x_TH.dtype)], 1)


def _unpack(recv_MW, H: int, K: int, slot_E: torch.Tensor, L: int):
    meta_MK2 = recv_MW[:, H:].contiguous().view(torch.int32)
    ids_MK = meta_MK2[:, :K]
    slots_MK = torch.where(ids_MK >= 0, slot_E[ids_MK.clamp(min=0).long()], L)
    slots_MK = torch.where(slots_MK < 0, L, slots_MK)  # (an expert this rank does not hold: not here)
    return recv_MW[:, :H], meta_MK2[:, K:].contiguous().view(torch.float32), slots_MK


def dispatch(x_TH, weights_TK, ids_TK, placement: Placement, group=None, *, capacity: int | None = None,
             check_ids: bool | None = None):
    """Send each token once to every rank that computes one of its rows.

    Args:
        x_TH [T, H] (T may be 0), weights_TK [T, K] float, ids_TK [T, K] int in [0, E): this
        rank's tokens and their routing. placement: the same on every rank. capacity: None for
        exact splits (one host sync), else C ≥ T token rows per source region (static), the same
        on every rank. check_ids: see :func:`check_routing`.
    Returns:
        (x_MH, weights_MK fp32, slots_MK, meta): the M tokens this rank received; slots_MK the
        local slot computing each of their K rows (L = len(placement.slots_RS[rank]): not here).
    """
    if not isinstance(placement, Placement):
        raise ValueError(f"placement must be a dispatch.parallel.Placement, got {type(placement).__name__}")
    rank, R = dist.get_rank(group), dist.get_world_size(group)
    if placement.num_ranks != R:
        raise ValueError(f"placement is for {placement.num_ranks} ranks but the group has {R}")
    H = x_TH.shape[1] if x_TH.dim() == 2 else -1
    K = ids_TK.shape[1] if ids_TK.dim() == 2 else -1
    check_routing(x_TH, weights_TK, ids_TK, placement.num_experts, H, K, check_ids)
    T = x_TH.shape[0]
    if capacity is not None and (not isinstance(capacity, int) or capacity < max(T, 1)):
        raise ValueError(f"capacity must be an int >= the tokens on this rank (T={T}) and >= 1, got {capacity!r}")
    dest_TK, sends_TR, pos_TR = plan(ids_TK, placement, rank)
    slot_E = placement.tables(x_TH.device)[2][rank]
    L = len(placement.slots_RS[rank])
    if capacity is None:  # exact splits: tokens and rows per destination, one exchange, one sync
        counts_R2 = torch.stack([sends_TR.sum(0), torch.bincount(dest_TK.reshape(-1), minlength=R + 1)[:R]], 1)
        got_R2 = _a2a(counts_R2, None, None, group)
        sizes = torch.cat([counts_R2, got_R2], 1).T.tolist()  # the one host sync
        d_J, t_J = torch.nonzero(sends_TR.T, as_tuple=True)  # by destination, then t
        recv_MW = _a2a(_pack(x_TH, weights_TK, ids_TK, dest_TK, d_J, t_J), sizes[0], sizes[2], group)
        x_MH, weights_MK, slots_MK = _unpack(recv_MW, H, K, slot_E, L)
        keep_V = torch.nonzero((slots_MK < L).reshape(-1)).squeeze(1)
        home_N = torch.empty(T * K, dtype=torch.long, device=x_TH.device)
        home_N[torch.argsort(dest_TK.reshape(-1), stable=True)] = torch.arange(T * K, device=x_TH.device)
        home_N.clamp_(max=sum(sizes[1]))  # rows computed nowhere (dest R, sorted last): the zero row
        meta = DispatchMeta(T, K, home_N, keep_V, tuple(sizes[3]), tuple(sizes[1]), None)
        return x_MH, weights_MK, slots_MK, meta
    C = capacity
    d_J = torch.arange(R, device=x_TH.device).repeat(T)  # every (t, d) pair; unsent ones to a spare row
    t_J = torch.arange(T, device=x_TH.device).repeat_interleave(R)
    row_J = torch.where(sends_TR.reshape(-1), d_J * C + pos_TR.reshape(-1), R * C)
    packed_JW = _pack(x_TH, weights_TK, ids_TK, dest_TK, d_J, t_J)
    send_W = packed_JW.new_zeros(R * C + 1, packed_JW.shape[1])
    send_W[:, H:].view(torch.int32)[:, :K] = -1  # padding rows: no row to compute
    send_W.index_copy_(0, row_J, packed_JW)
    x_MH, weights_MK, slots_MK = _unpack(_a2a(send_W[: R * C], None, None, group), H, K, slot_E, L)
    d_TK = dest_TK.clamp(max=R - 1)
    home_TK = d_TK * (C * K) + pos_TR.gather(1, d_TK) * K + torch.arange(K, device=x_TH.device)
    home_N = torch.where(dest_TK < R, home_TK, R * C * K).reshape(-1)  # computed nowhere: the zero row
    return x_MH, weights_MK, slots_MK, DispatchMeta(T, K, home_N, None, None, None, C)


def combine(out_VH: torch.Tensor, meta: DispatchMeta, group=None) -> torch.Tensor:
    """Computed rows home, then Σ_k in k order: out_VH [M·K, H] (rows m·K + k) → y_TH [T, H]."""
    if out_VH.dim() != 2:
        raise ValueError(f"out_VH must be [M*K, H], got {tuple(out_VH.shape)}")
    if meta.capacity is None:
        back_VH = out_VH.index_select(0, meta.keep_V)
        home_VH = _a2a(back_VH, meta.send, meta.recv, group, zero_row=True)
    else:
        home_VH = _a2a(out_VH, None, None, group, zero_row=True)
    return combine_k(home_VH.index_select(0, meta.home_N), meta.top_k)
