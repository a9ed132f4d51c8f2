"""The expert-parallel MoE layer, and the single-device layer it is bit-identical to.

    x_TH (this rank's tokens) → router (replicated) → weights_TK, ids_TK
        → dispatch (rows to the ranks holding their experts) → local experts → combine (k order)
        → + shared expert (replicated) → y_TH

``moe_single`` is the same computation on one device over the global batch (every rank's tokens
concatenated in rank order); ``ExpertParallelMoE`` on R ranks returns, on each rank, exactly the
rows of that output belonging to its tokens — bit for bit, at every world size.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from dispatch.config import MoEConfig, MoEWeights
from dispatch.parallel.dispatch import check_routing, combine, dispatch, gather_combine, inverse
from dispatch.parallel.experts import ExpertFn, default_expert_fn, linear_rows, swiglu_rows
from dispatch.parallel.placement import Placement
from dispatch.reference import check_input, route_reference


def route_rows(x_TH: torch.Tensor, cfg: MoEConfig, w: MoEWeights):
    """Router with row-independent logits (so a token's routing never depends on its batch)."""
    return route_reference(linear_rows(x_TH, w.router_EH), cfg, w.bias_E)


def shared_rows(x_TH: torch.Tensor, cfg: MoEConfig, w: MoEWeights) -> torch.Tensor | None:
    """The shared expert (gated for Qwen2-MoE), row-independent, in x's dtype; None if absent."""
    if not cfg.shared_intermediate_size:
        return None
    out = swiglu_rows(x_TH, w.shared_gate_up_2SH, w.shared_down_HS)
    if cfg.shared_gate:
        out = torch.sigmoid(linear_rows(x_TH, w.shared_gate_1H)) * out
    return out.to(x_TH.dtype)


def experts_single(x_TH, weights_TK, ids_TK, gate_up_E2IH, down_EHI, expert_fn: ExpertFn) -> torch.Tensor:
    """The routed experts on one device: stable sort of rows n = t·K + k by expert, ``expert_fn``,
    unsort, k-order combine. [T, H] → [T, H]."""
    T, K = ids_TK.shape
    E = gate_up_E2IH.shape[0]
    ids_N = ids_TK.reshape(-1).long()
    order_N = torch.argsort(ids_N, stable=True)
    counts_E = tuple(torch.zeros(E, dtype=torch.int64, device=ids_N.device)
                     .scatter_add_(0, ids_N, torch.ones_like(ids_N)).tolist())
    out_sorted = expert_fn(x_TH[order_N // K], weights_TK.float().reshape(-1)[order_N], counts_E,
                           gate_up_E2IH, down_EHI)
    return gather_combine(out_sorted, inverse(order_N), K)


def moe_single(x_TH: torch.Tensor, cfg: MoEConfig, w: MoEWeights, expert_fn: ExpertFn | None = None) -> torch.Tensor:
    """The single-device layer the expert-parallel one must match bit for bit."""
    check_input(x_TH, cfg, w)
    expert_fn = expert_fn or default_expert_fn(x_TH.device)
    weights_TK, ids_TK = route_rows(x_TH, cfg, w)
    y_TH = experts_single(x_TH, weights_TK, ids_TK, w.gate_up_E2IH, w.down_EHI, expert_fn)
    shared_TH = shared_rows(x_TH, cfg, w)
    return y_TH if shared_TH is None else y_TH + shared_TH


class ExpertParallelMoE:
    """One MoE layer spread over the ranks of ``group``: rank r keeps only ``placement.slots_RS[r]``'s
    experts (router and shared expert are replicated).

    Args: cfg, w (full weights; only this rank's experts are kept), placement (default: contiguous),
    group (default: the world), expert_fn (default per device), transport ("collective" =
    all_to_all_single over NCCL/gloo, or a :class:`dispatch.parallel.p2p.P2PTransport`).
    """

    def __init__(self, cfg: MoEConfig, w: MoEWeights, placement: Placement | None = None, *, group=None,
                 expert_fn: ExpertFn | None = None, transport="collective"):
        from dispatch.parallel.launch import check_same_everywhere

        w.validate(cfg)
        if placement is not None and not isinstance(placement, Placement):
            raise ValueError(f"placement must be a dispatch.parallel.Placement, got {type(placement).__name__}")
        self.cfg, self.group = cfg, group
        self.rank, R = dist.get_rank(group), dist.get_world_size(group)
        self.placement = placement if placement is not None else Placement.contiguous(cfg.num_experts, R)
        if self.placement.num_experts != cfg.num_experts or self.placement.num_ranks != R:
            raise ValueError(f"placement is for E={self.placement.num_experts}, R={self.placement.num_ranks}; "
                             f"the layer has E={cfg.num_experts} on R={R} ranks")
        check_same_everywhere(group, cfg=cfg, placement=self.placement, dtype=w.gate_up_E2IH.dtype)
        self.slots = list(self.placement.slots_RS[self.rank])
        idx = torch.tensor(self.slots, dtype=torch.long, device=w.gate_up_E2IH.device)
        self.gate_up_L2IH = w.gate_up_E2IH.index_select(0, idx).contiguous()
        self.down_LHI = w.down_EHI.index_select(0, idx).contiguous()
        # Replicated parts only (empty expert tensors: no view that would keep all experts alive).
        self.shared = MoEWeights(router_EH=w.router_EH, gate_up_E2IH=w.gate_up_E2IH.new_empty(0),
                                 down_EHI=w.down_EHI.new_empty(0),
                                 bias_E=w.bias_E, shared_gate_up_2SH=w.shared_gate_up_2SH,
                                 shared_down_HS=w.shared_down_HS, shared_gate_1H=w.shared_gate_1H)
        self.expert_fn = expert_fn or default_expert_fn(w.gate_up_E2IH.device)
        self.transport = transport

    def experts(self, x_TH: torch.Tensor, weights_TK: torch.Tensor, ids_TK: torch.Tensor) -> torch.Tensor:
        """Routed experts only: dispatch → local experts → combine. [T, H] → [T, H]."""
        check_routing(x_TH, weights_TK, ids_TK, self.cfg.num_experts)
        if x_TH.shape[1] != self.cfg.hidden_size or ids_TK.shape[1] != self.cfg.top_k:
            raise ValueError(f"x must be [T, H={self.cfg.hidden_size}] and ids_TK [T, K={self.cfg.top_k}], got "
                             f"{tuple(x_TH.shape)} and {tuple(ids_TK.shape)}")
        if x_TH.dtype != self.gate_up_L2IH.dtype:
            raise ValueError(f"x has dtype {x_TH.dtype} but the expert weights are {self.gate_up_L2IH.dtype}")
        if self.transport == "collective":
            x_MH, weight_M, counts_L, meta = dispatch(x_TH, weights_TK, ids_TK, self.placement, self.group)
            return combine(self.expert_fn(x_MH, weight_M, counts_L, self.gate_up_L2IH, self.down_LHI), meta, self.group)
        x_MH, weight_M, counts_L, meta = self.transport.dispatch(x_TH, weights_TK, ids_TK)
        out_MH = self.expert_fn(x_MH, weight_M, counts_L, self.gate_up_L2IH, self.down_LHI)
        return self.transport.combine(out_MH, meta)

    def __call__(self, x_TH: torch.Tensor) -> torch.Tensor:
        if x_TH.dim() != 2 or x_TH.shape[1] != self.cfg.hidden_size:
            raise ValueError(f"x must have shape [T, H={self.cfg.hidden_size}], got {tuple(x_TH.shape)}")
        weights_TK, ids_TK = route_rows(x_TH, self.cfg, self.shared)
        y_TH = self.experts(x_TH, weights_TK, ids_TK)
        shared_TH = shared_rows(x_TH, self.cfg, self.shared)
        return y_TH if shared_TH is None else y_TH + shared_TH
