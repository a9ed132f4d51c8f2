"""The expert-parallel MoE layer: a :class:`dispatch.MoELayer` spread over the ranks of a group.

    ep = parallelize(MoELayer(cfg, w), placement, group)      # or ExpertParallelMoE.from_layer(...)
    y_TH = ep(x_TH)                                           # this rank's tokens only

    x_TH → router (replicated) → weights_TK, ids_TK → dispatch (each token once per rank)
         → this rank's experts: the grouped GEMM on the tokens that arrived, each row computed
           only where it is routed → combine (rows home, Σ_k in k order) → + shared expert → y_TH

Rank r keeps only ``placement.slots_RS[r]``'s experts; router and shared expert are replicated.
Bit-identity: the grouped GEMM runs with a pinned :class:`GemmConfig`, so a routed row's output
depends only on that row (token, expert, weight), never on which other rows share its tiles. The
same layer on one device, ``MoELayer(cfg, w, path="triton", tiles=<the same config>)``, then gives
the same bits for the same tokens, at every world size and with replicated experts.
"""
from __future__ import annotations

import dataclasses

import torch
import torch.distributed as dist
from torch import nn

from dispatch.checks import check_launch
from dispatch.config import MoEConfig
from dispatch.kernels import tiles
from dispatch.kernels.gemv import decode_rows
from dispatch.kernels.grouped_gemm import grouped_down, grouped_up_swiglu
from dispatch.kernels.routing import route
from dispatch.kernels.sort import sort_by_expert
from dispatch.moe import MoELayer
from dispatch.parallel.dispatch import check_routing, combine, dispatch
from dispatch.parallel.launch import check_same_everywhere, fingerprint
from dispatch.placement import Placement
from dispatch.reference import check_input, router_logits, shared_reference


def pinned_config(device) -> tiles.GemmConfig:
    """The tile config both the expert-parallel layer and its one-device twin use by default: the tile
    resolver's batch-independent default (``tiles.resolve(..., pinned=True)``)."""
    return tiles.resolve("up", None, None, device, pinned=True).config


def pinned_decode_config(device) -> tiles.DecodeConfig:
    """The decode path's tiles for both the expert-parallel layer and ``moe_decode(..., config=)``."""
    return tiles.resolve("decode", None, None, device, pinned=True).config


def local_decode(x_MH, weights_MK, slots_MK, gate_up_L2IH, down_LHI, cfg: tiles.DecodeConfig, *,
                 activation: str = "silu") -> torch.Tensor:
    """The decode kernels (few rows) on the received tokens: rows m·K + k with slots_MK < L →
    out_VH [M·K, H] in fp32, weighted (the decode path sums fp32 rows, so they travel in fp32).
    Slot L lies outside [0, L): the kernels never form a group for it."""
    return decode_rows(x_MH, weights_MK, slots_MK, gate_up_L2IH, down_LHI, cfg, activation=activation)


def local_experts(x_MH, weights_MK, slots_MK, gate_up_L2IH, down_LHI, config: tiles.GemmConfig, *,
                  activation: str = "silu") -> torch.Tensor:
    """Rows m·K + k with slots_MK[m, k] < L through local expert slots_MK[m, k] (grouped GEMM,
    weighted): → out_VH [M·K, H] in x's dtype. Rows with slot L are not computed (left unset)."""
    M, K = slots_MK.shape
    L, H = gate_up_L2IH.shape[0], x_MH.shape[1]
    if M == 0 or L == 0:
        return x_MH.new_empty(M * K, H)
    # Slot L is a bin for the rows computed elsewhere: sorted last, its blocks marked unused (-1).
    routes = sort_by_expert(slots_MK, L + 1, config.block_m)
    routes = dataclasses.replace(routes, num_experts=L, block_expert_B=torch.where(
        routes.block_expert_B == L, -1, routes.block_expert_B))
    h_PI = grouped_up_swiglu(x_MH, routes, gate_up_L2IH, config=config, activation=activation)
    return grouped_down(h_PI, routes, down_LHI, weights_MK, config=config, zero_skipped=False)


class ExpertParallelMoE(nn.Module):
    """One MoE layer over the ranks of ``group``; build it with :meth:`from_layer` or :func:`parallelize`.

    capacity: None (exact splits, one host sync per call) or C, the most tokens any rank passes
    (static splits, no host sync: CUDA-graph capturable). path: "grouped" (the grouped GEMM, tiles
    ``config``, default :func:`pinned_config`; twin ``MoELayer(path="triton", tiles=...)``) or
    "decode" (the decode kernels for few rows, tiles ``decode_config``, default
    :func:`pinned_decode_config`; twin ``moe_decode(..., config=...)``). transport: "collective"
    (all_to_all_single over NCCL/gloo) or a :class:`dispatch.parallel.p2p.P2PTransport` (for
    "decode", built with ``rows_dtype=torch.float32``).
    """

    def __init__(self, cfg: MoEConfig, weights, placement: Placement | None = None, *, group=None,
                 capacity: int | None = None, config: tiles.GemmConfig | None = None, transport="collective",
                 path: str = "grouped", decode_config: tiles.DecodeConfig | None = None):
        super().__init__()
        weights.validate(cfg)
        if path not in ("grouped", "decode"):
            raise ValueError(f"path must be 'grouped' or 'decode', got {path!r}")
        ret = getattr(transport, "ret", None)  # a P2PTransport's return buffer
        if path == "decode" and ret is not None and ret.dtype != torch.float32:
            raise ValueError("the decode path returns fp32 rows: build the P2PTransport with rows_dtype=torch.float32")
        self.path = path
        self.decode_config = decode_config or pinned_decode_config(weights.gate_up_E2IH.device)
        if placement is not None and not isinstance(placement, Placement):
            raise ValueError(f"placement must be a dispatch.parallel.Placement, got {type(placement).__name__}")
        self.cfg, self.group, self.capacity, self.transport = cfg, group, capacity, transport
        self.rank, R = dist.get_rank(group), dist.get_world_size(group)
        self.placement = placement if placement is not None else Placement.contiguous(cfg.num_experts, R)
        if self.placement.num_experts != cfg.num_experts or self.placement.num_ranks != R:
            raise ValueError(f"placement is for E={self.placement.num_experts}, R={self.placement.num_ranks}; "
                             f"the layer has E={cfg.num_experts} on R={R} ranks")
        self.config = config or pinned_config(weights.gate_up_E2IH.device)
        check_same_everywhere(group, cfg=cfg, placement=self.placement, dtype=weights.gate_up_E2IH.dtype,
                              capacity=capacity, config=self.config, path=path, decode_config=self.decode_config)
        # ranks built from different weights would run and disagree with one device: compare at start
        check_same_everywhere(group, weights={n: fingerprint(t) for n, t in weights.tensors().items()})
        idx = torch.tensor(self.placement.slots_RS[self.rank], dtype=torch.long, device=weights.gate_up_E2IH.device)
        self.register_buffer("gate_up_L2IH", weights.gate_up_E2IH.index_select(0, idx).contiguous())
        self.register_buffer("down_LHI", weights.down_EHI.index_select(0, idx).contiguous())
        # Replicated parts only (no view that would keep every expert alive).
        self.replicated = dataclasses.replace(weights, gate_up_E2IH=weights.gate_up_E2IH.new_empty(0),
                                              down_EHI=weights.down_EHI.new_empty(0))

    @classmethod
    def from_layer(cls, layer: MoELayer, placement: Placement | None = None, group=None, **kw) -> "ExpertParallelMoE":
        """The expert-parallel form of ``layer`` (its config, weights and pinned tiles, if any)."""
        if not isinstance(layer, MoELayer):
            raise ValueError(f"layer must be a dispatch.MoELayer, got {type(layer).__name__}")
        if isinstance(layer.tiles, tiles.GemmConfig):
            kw.setdefault("config", layer.tiles)
        elif isinstance(layer.tiles, tiles.DecodeConfig):
            kw.setdefault("decode_config", layer.tiles)
        return cls(layer.cfg, layer.weights, placement, group=group, **kw)

    def experts(self, x_TH: torch.Tensor, weights_TK: torch.Tensor, ids_TK: torch.Tensor, *,
                check_ids: bool | None = None) -> torch.Tensor:
        """Routed experts only: dispatch → local experts → combine. [T, H] → [T, H]. ``check_ids``:
        raise for ids outside [0, E) (default on CPU); unchecked, such a row adds nothing."""
        cfg = self.cfg
        check_routing(x_TH, weights_TK, ids_TK, cfg.num_experts, cfg.hidden_size, cfg.top_k, check_ids)
        if x_TH.dtype != self.gate_up_L2IH.dtype:
            raise ValueError(f"x has dtype {x_TH.dtype} but the expert weights are {self.gate_up_L2IH.dtype}")
        check_launch("ExpertParallelMoE.experts", x_TH)
        if self.transport == "collective":
            x_MH, weights_MK, slots_MK, meta = dispatch(x_TH, weights_TK, ids_TK, self.placement, self.group,
                                                        capacity=self.capacity, check_ids=False)
            y_TH = combine(self._local(x_MH, weights_MK, slots_MK), meta, self.group)
        else:
            x_MH, weights_MK, slots_MK = self.transport.dispatch(x_TH, weights_TK, ids_TK)
            y_TH = self.transport.combine(self._local(x_MH, weights_MK, slots_MK), x_TH.shape[0])
        return y_TH.to(x_TH.dtype)  # (the decode path sums fp32 rows: one cast, as on one device)

    def _local(self, x_MH, weights_MK, slots_MK) -> torch.Tensor:
        act = self.cfg.activation
        if self.path == "decode":
            return local_decode(x_MH, weights_MK, slots_MK, self.gate_up_L2IH, self.down_LHI, self.decode_config,
                                activation=act)
        return local_experts(x_MH, weights_MK, slots_MK, self.gate_up_L2IH, self.down_LHI, self.config, activation=act)

    def forward(self, x_TH: torch.Tensor) -> torch.Tensor:
        check_input(x_TH, self.cfg)
        w = self.replicated
        weights_TK, ids_TK = route(router_logits(x_TH, self.cfg, w), self.cfg, w.bias_E)
        y_TH = self.experts(x_TH, weights_TK, ids_TK)
        shared_TH = shared_reference(x_TH, self.cfg, w)
        return y_TH if shared_TH is None else y_TH + shared_TH


def parallelize(layer: MoELayer, placement: Placement | None = None, group=None, **kw) -> ExpertParallelMoE:
    """gpt-fast style: the expert-parallel form of ``layer`` on this rank (see :class:`ExpertParallelMoE`)."""
    return ExpertParallelMoE.from_layer(layer, placement, group, **kw)
