"""A measurement of an idea, not a path of the library: the shared expert as more routed experts.

A DeepSeek-MoE layer runs a shared SwiGLU MLP of S = n·I intermediate columns on every token; every
contestant of the kernels race runs it in torch, apart (three GEMVs, SiLU·mul, an add). SwiGLU is
separable over the intermediate dimension,

    W_down (silu(W_gate x) ⊙ W_up x) = Σ_j W_down[:, j] (silu(W_gate[j] x) ⊙ W_up[j] x)

over n chunks j of I columns, so the shared MLP is exactly n more experts of the routed experts'
shape, chosen by every token with weight 1. ``fused_shared_decode`` stacks them after the E routed
experts (a copy made once, outside the timed call) and runs chapter 3's decode kernels on K + n
choices per token: one pass over the weights for the routed and the shared experts together.
"""
from __future__ import annotations

import torch

from dispatch.config import MoEConfig, MoEWeights


def shared_as_experts(cfg: MoEConfig, w: MoEWeights) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The shared MLP as n = S / I experts ([n, 2I, H] gate|up, [n, H, I] down), or None where it is
    not n whole experts (no shared expert, S not a multiple of I, or a gated one: Qwen2-MoE)."""
    S, I = cfg.shared_intermediate_size, cfg.I  # noqa: E741
    if not S or S % I or cfg.shared_gate:
        return None
    gu, dn = w.shared_gate_up_2SH, w.shared_down_HS
    n = S // I
    gate_up = torch.stack([torch.cat([gu[j * I:(j + 1) * I], gu[S + j * I:S + (j + 1) * I]]) for j in range(n)])
    down = torch.stack([dn[:, j * I:(j + 1) * I] for j in range(n)])
    return gate_up, down


def fused_shared_decode(cfg: MoEConfig, w: MoEWeights, x_TH, weights_TK, ids_TK):
    """A function computing routed + shared experts in one decode pass (chapter 3's kernels) on
    E + n stacked experts, or None where :func:`shared_as_experts` is None."""
    from dispatch.kernels.gemv import moe_decode

    shared = shared_as_experts(cfg, w)
    if shared is None:
        return None
    gate_up = torch.cat([w.gate_up_E2IH, shared[0]])
    down = torch.cat([w.down_EHI, shared[1]])
    n, T = shared[0].shape[0], x_TH.shape[0]
    extra_ids = torch.arange(cfg.E, cfg.E + n, device=ids_TK.device, dtype=ids_TK.dtype).expand(T, n)
    extra_w = torch.ones(T, n, device=weights_TK.device, dtype=weights_TK.dtype)

    def run():
        ids = torch.cat([ids_TK, extra_ids], dim=1)
        return moe_decode(x_TH, torch.cat([weights_TK, extra_w], dim=1), ids, gate_up, down)
    return run
