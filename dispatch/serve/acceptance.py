"""Which drafted tokens a verify step keeps: greedy matching and speculative sampling, on the device.

Shapes: B rows · k drafted tokens · V vocabulary. A verify step feeds row b the tokens
[t, d_1, …, d_k] (t: its last token, not yet in the cache; d_j: the drafts) at consecutive
positions and gets logits L_0 … L_k, where L_j is the target's distribution of the token after
d_j (d_0 = t). Both functions return ``(out_BK1, n_B)``: the row emits ``out[b, :n_b + 1]`` —
its first n_b drafts, which the target accepted, and one token of the target's own — so every
verify step emits between 1 and k+1 tokens. No host sync and static shapes: the whole step can
be captured in a CUDA graph (``n_B`` stays on the device).

greedy_accept: t_j = argmax L_j; n = the number of leading drafts with d_{j+1} = t_j; out = t.
    Exactly the tokens greedy decoding emits one step at a time, if L_j has the bits a one-token
    step would give (batch-invariant mode, :mod:`dispatch.engine.invariant`).

speculative_sample (Leviathan et al. 2023; Chen et al. 2023): p_j = the target's sampling
    distribution at j (temperature, top-p: :func:`dispatch.engine.sampling.sampling_probs`), q_j the
    drafter's. Draft d_{j+1} is accepted with probability min(1, p_j(d) / q_j(d)); at the first
    rejection j = n the row emits a token drawn from the residual max(0, p_n − q_n) (renormalised),
    and if all k are accepted, one drawn from p_k. Then each emitted token is distributed exactly as
    if drawn from the target one step at a time: P(emit x) = q(x)·min(1, p(x)/q(x)) +
    (1 − Σ_y min(p(y), q(y))) · max(0, p(x) − q(x)) / Σ_y max(0, p(y) − q(y)) = min(p, q)(x) +
    max(0, p(x) − q(x)) = p(x). A deterministic drafter (prompt lookup, ``q_BKV=None``) proposes
    with q_j = a point mass on d_{j+1}: accept with probability p_j(d), residual p_j without d.

Worked example (greedy, k = 3): drafts [5, 7, 2], argmaxes t = [5, 7, 9, 4] → n = 2, the row
emits [5, 7, 9]: two drafts, then the target's 9 where it disagreed with the draft 2.
"""
from __future__ import annotations

import torch

from dispatch.engine.sampling import draw, sampling_probs
from dispatch.kernels.spec_step import leading


def _check(drafts_BK: torch.Tensor, logits_BK1V: torch.Tensor) -> tuple[int, int, int]:
    if drafts_BK.dim() != 2 or logits_BK1V.dim() != 3 or drafts_BK.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"drafts must be int [B, k] and logits [B, k+1, V], got {drafts_BK.dtype} "
                         f"{tuple(drafts_BK.shape)} and {tuple(logits_BK1V.shape)}")
    (B, k), (B2, K1, V) = drafts_BK.shape, logits_BK1V.shape
    if B2 != B or K1 != k + 1:
        raise ValueError(f"logits must be [B={B}, k+1={k + 1}, V] for drafts [B, k], got {tuple(logits_BK1V.shape)}")
    return B, k, V


def greedy_accept(drafts_BK: torch.Tensor, logits_BK1V: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(out_BK1 = argmax of every verified position, n_B = drafts that match it, leading); see the module."""
    _check(drafts_BK, logits_BK1V)
    out_BK1 = logits_BK1V.argmax(dim=-1)
    return out_BK1, leading(drafts_BK == out_BK1[:, :-1])


def speculative_sample(drafts_BK: torch.Tensor, q_BKV: torch.Tensor | None, logits_BK1V: torch.Tensor,
                       temperature: torch.Tensor | float, top_p: torch.Tensor | float = 1.0, *,
                       generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Speculative sampling (module docstring): ``q_BKV`` the drafter's distributions (rows sum to 1) or
    None for a deterministic drafter. Returns (out_BK1: the kept drafts, then the drawn token, then
    fillers that are never emitted; n_B)."""
    B, k, V = _check(drafts_BK, logits_BK1V)
    if q_BKV is not None and tuple(q_BKV.shape) != (B, k, V):
        raise ValueError(f"q must be [B={B}, k={k}, V={V}] (the drafter's distributions), got {tuple(q_BKV.shape)}")
    p_BK1V = sampling_probs(logits_BK1V.reshape(B * (k + 1), V), temperature, top_p).view(B, k + 1, V)
    d_BK1 = drafts_BK.long()[..., None]
    p_d = p_BK1V[:, :k].gather(-1, d_BK1)[..., 0]  # [B, k]: the target's probability of each draft
    q_d = q_BKV.float().gather(-1, d_BK1)[..., 0] if q_BKV is not None else torch.ones_like(p_d)
    u_BK = torch.rand(B, k, device=p_d.device, generator=generator)
    n_B = leading(u_BK * q_d < p_d)  # accept d with probability min(1, p/q)
    # the residual at every position (then the row's own, at n): max(0, p - q), and p itself after k drafts
    q_full = q_BKV.float() if q_BKV is not None else torch.zeros_like(p_BK1V[:, :k]).scatter_(-1, d_BK1, 1.0)
    residual_BK1V = torch.cat([(p_BK1V[:, :k] - q_full).clamp_(min=0.0), p_BK1V[:, k:]], dim=1)
    pick_BV = residual_BK1V.gather(1, n_B[:, None, None].expand(B, 1, V))[:, 0]
    x_B = draw(pick_BV, generator)
    j = torch.arange(k + 1, device=p_d.device)[None, :]
    drafts_pad = torch.cat([drafts_BK.long(), torch.zeros_like(drafts_BK[:, :1].long())], dim=1)
    out_BK1 = torch.where(j < n_B[:, None], drafts_pad, x_B[:, None])
    return out_BK1, n_B
