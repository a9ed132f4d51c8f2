"""Load balance, measured: how tokens spread over experts, what capacity limits cost, where experts go.

Shape legend: T tokens · E experts · K experts per token · L layers · R ranks · S slots per rank.

- Expert load: :func:`expert_counts`, :func:`load_stats` (busiest / mean, coefficient of variation).
- Capacity at inference: :func:`capacity_keep_mask` — the rule a capacity-limited layer applies.
- Balancing in training: :func:`aux_loss` (Switch), :func:`z_loss` (ST-MoE), :func:`update_bias`
  (DeepSeek-V3's auxiliary-loss-free bias).
- Placement: :func:`greedy_placement` (EPLB-style) plans a
  :class:`~dispatch.placement.Placement`, the map from ranks to expert replicas that the
  expert-parallel layer of chapter 4 runs; ``Placement.contiguous`` is the load-blind baseline.
- Specialisation: :func:`top_tokens` — which tokens each expert takes.
"""
from __future__ import annotations

import math

import torch

from dispatch.placement import Placement

# Reference points for OLMoE-1B-7B on WikiText-2 with a capacity factor applied at inference
# (2,048 tokens per forward): fraction of routed pairs dropped and perplexity, for chapter 5's
# comparison. No values for CF 1.5 and 1.25.
OLMOE_WIKITEXT2_CAPACITY = (
    {"capacity_factor": None, "dropped": 0.0, "ppl": 12.85},
    {"capacity_factor": 2.0, "dropped": 0.096, "ppl": 20.19},
    {"capacity_factor": 1.0, "dropped": 0.286, "ppl": 92.14},
)


# ---------------------------------------------------------------- load
def expert_counts(ids_TK: torch.Tensor, num_experts: int, keep_TK: torch.Tensor | None = None) -> torch.Tensor:
    """Routed (token, choice) pairs per expert: counts_E int64 (dropped pairs excluded if ``keep_TK``)."""
    flat = ids_TK.reshape(-1).long()
    if keep_TK is not None:
        if keep_TK.shape != ids_TK.shape or keep_TK.dtype != torch.bool:
            raise ValueError(f"keep_TK must be a bool tensor shaped like ids_TK {tuple(ids_TK.shape)}, "
                             f"got {keep_TK.dtype} {tuple(keep_TK.shape)}")
        flat = flat[keep_TK.reshape(-1)]
    if flat.numel():
        lo, hi = (int(v) for v in torch.aminmax(flat))
        if lo < 0 or hi >= num_experts:
            raise ValueError(f"ids_TK must hold expert ids in [0, {num_experts}), got {lo}..{hi}")
    return torch.bincount(flat, minlength=num_experts).cpu()


def load_stats(counts_E) -> dict:
    """``max_over_mean`` (1.0 = perfect balance), ``min_over_mean`` and ``cv`` (std / mean)."""
    c = torch.as_tensor(counts_E, dtype=torch.float64)
    mean = c.mean().item()
    if mean == 0:
        return {"max_over_mean": 1.0, "min_over_mean": 1.0, "cv": 0.0}
    return {"max_over_mean": c.max().item() / mean, "min_over_mean": c.min().item() / mean,
            "cv": c.std(unbiased=False).item() / mean}


# ---------------------------------------------------------------- capacity
def capacity(num_tokens: int, top_k: int, num_experts: int, capacity_factor: float) -> int:
    """Slots per expert: ``ceil(capacity_factor · T·K / E)`` (the mean load times the factor)."""
    if capacity_factor <= 0:
        raise ValueError(f"capacity_factor must be > 0, got {capacity_factor}")
    return math.ceil(capacity_factor * num_tokens * top_k / num_experts)


def capacity_keep_mask(ids_TK: torch.Tensor, num_experts: int, capacity_factor: float | None) -> torch.Tensor:
    """Which (token, choice) pairs an expert with ``capacity(T, K, E, cf)`` slots accepts.

    Priority rule: every token's first choice (k = 0) before any second choice (k = 1), and so
    on; within one k, tokens in order. A pair over its expert's capacity is dropped: it
    contributes nothing and the residual stream carries the token past that expert.
    ``capacity_factor=None`` is dropless (all True).

    Example: ids_TK = [[0, 1], [0, 2], [0, 1]], E = 4, cf = 1.0 → capacity ceil(6/4) = 2;
    order (t0,k0)=0 (t1,k0)=0 (t2,k0)=0 (t0,k1)=1 (t1,k1)=2 (t2,k1)=1 → expert 0 keeps t0, t1
    and drops t2 → keep_TK = [[T, T], [T, T], [F, T]].
    """
    if ids_TK.dim() != 2:
        raise ValueError(f"ids_TK must be [T, K], got shape {tuple(ids_TK.shape)}")
    T, K = ids_TK.shape
    if capacity_factor is None or T == 0:
        return torch.ones_like(ids_TK, dtype=torch.bool)
    if ids_TK.numel() and (ids_TK.min() < 0 or ids_TK.max() >= num_experts):
        raise ValueError(f"ids_TK must hold expert ids in [0, {num_experts}), got {ids_TK.min()}..{ids_TK.max()}")
    cap = capacity(T, K, num_experts, capacity_factor)
    ids_N = ids_TK.t().reshape(-1).long()  # n = k·T + t: the priority order
    onehot_NE = torch.nn.functional.one_hot(ids_N, num_experts)
    pos_N = (onehot_NE.cumsum(0) * onehot_NE).sum(1) - 1  # place of each pair in its expert's queue
    return (pos_N < cap).reshape(K, T).t()


# ---------------------------------------------------------------- training-time balancing
def aux_loss(logits_TE: torch.Tensor, ids_TK: torch.Tensor) -> torch.Tensor:
    """Switch-Transformer load-balancing loss of one layer: ``E · Σ_e f_e · P_e`` with
    f_e = pairs routed to e / T (sums to K) and P_e = mean softmax probability of e.
    Equals transformers' ``load_balancing_loss_func`` for one layer; K when perfectly balanced.
    """
    E = logits_TE.shape[-1]
    probs_TE = torch.softmax(logits_TE.float(), dim=-1)
    f_E = expert_counts(ids_TK, E).to(probs_TE.device, torch.float32) / logits_TE.shape[0]
    return E * (f_E * probs_TE.mean(0)).sum()


def z_loss(logits_TE: torch.Tensor) -> torch.Tensor:
    """ST-MoE router z-loss: mean over tokens of logsumexp(logits)² (keeps router logits small)."""
    return torch.logsumexp(logits_TE.float(), dim=-1).square().mean()


def update_bias(bias_E: torch.Tensor, counts_E: torch.Tensor, rate: float) -> torch.Tensor:
    """DeepSeek-V3's auxiliary-loss-free step: ``bias_e += rate · sign(mean load − load_e)``.

    Overloaded experts lose ``rate``, underloaded gain it, experts exactly at the mean keep their
    bias. The bias is added to the scores only to *choose* experts, never to weight them.
    Example: counts [6, 2, 4], rate 0.1 → mean 4 → bias + [-0.1, +0.1, 0].
    """
    if tuple(counts_E.shape) != tuple(bias_E.shape) or bias_E.dim() != 1:
        raise ValueError(f"bias_E and counts_E must both be [E], got {tuple(bias_E.shape)} and {tuple(counts_E.shape)}")
    c = counts_E.to(bias_E.device, torch.float32)
    return bias_E + rate * torch.sign(c.mean() - c)


# ---------------------------------------------------------------- placement
def greedy_placement(load_E, num_ranks: int, slots_per_rank: int) -> Placement:
    """EPLB-style: replicate the hottest experts into the spare slots, then pack greedily.

    1. Every expert gets one replica; each of the ``R·S − E`` spare slots goes to the expert with
       the largest load per replica (at most one replica per rank; ties: lower expert id).
    2. Experts, heaviest load per replica first, put their replicas on the least-loaded ranks
       that still have a free slot (ties: lowest rank). Should fewer such ranks remain than the
       expert has replicas, it gets fewer replicas (never fewer than one: free slots always
       outnumber the replicas still to place).
    Replicas split their expert's tokens equally, the rule ``dispatch.parallel`` serves them by.
    With ``slots_per_rank = E / R`` there are no replicas: a load-aware partition of the experts.
    """
    load = [float(x) for x in load_E]
    E, R, S = len(load), num_ranks, slots_per_rank
    if R < 1 or S < 1 or R * S < E:
        raise ValueError(f"{R} ranks × {S} slots cannot hold {E} experts")
    if any(x < 0 for x in load):
        raise ValueError("load_E must be non-negative")
    n_E = [1] * E
    for _ in range(R * S - E):
        cand = [e for e in range(E) if n_E[e] < R]
        if not cand:
            break
        n_E[max(cand, key=lambda e: (load[e] / n_E[e], -e))] += 1
    slots = [[] for _ in range(R)]
    rank_load = [0.0] * R
    for e in sorted(range(E), key=lambda e: (-load[e] / n_E[e], e)):
        free = sorted((r for r in range(R) if len(slots[r]) < S), key=lambda r: (rank_load[r], r))
        chosen = free[: n_E[e]]
        for r in chosen:
            slots[r].append(e)
            rank_load[r] += load[e] / len(chosen)
    return Placement(E, R, tuple(map(tuple, slots)))


# ---------------------------------------------------------------- specialisation
def top_tokens(tokens_T: torch.Tensor, ids_TK: torch.Tensor, num_experts: int, *, top: int = 5,
               min_count: int = 10) -> list[list[tuple[int, float, int]]]:
    """For each expert, the tokens it takes most *selectively*.

    For every vocabulary token seen at least ``min_count`` times, share = fraction of its
    occurrences routed (any k) to the expert. Returns, per expert, up to ``top`` entries
    ``(token_id, share, count)`` sorted by share then count (ties: lower token id).
    """
    T, K = ids_TK.shape
    if tokens_T.shape != (T,):
        raise ValueError(f"tokens_T must be [{T}], got {tuple(tokens_T.shape)}")
    tok_N = tokens_T.long().repeat_interleave(K)
    V = int(tokens_T.max().item()) + 1 if T else 1
    hits_VE = torch.zeros(V, num_experts, dtype=torch.int64)
    hits_VE.index_put_((tok_N, ids_TK.reshape(-1).long()), torch.ones_like(tok_N), accumulate=True)
    seen_V = torch.bincount(tokens_T.long(), minlength=V)
    out = []
    for e in range(num_experts):
        rows = [(v, hits_VE[v, e].item() / seen_V[v].item(), seen_V[v].item())
                for v in torch.nonzero((seen_V >= min_count) & (hits_VE[:, e] > 0)).flatten().tolist()]
        rows.sort(key=lambda x: (-x[1], -x[2], x[0]))
        out.append(rows[:top])
    return out
