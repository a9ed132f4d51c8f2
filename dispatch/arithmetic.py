"""Roofline arithmetic: parameters, bytes and FLOPs of an MoE layer and model, and their floors.

Everything here is counting, no measurement: the numbers later chapters race against.
A decoded batch of T tokens must at least read every weight it uses once (bytes / HBM bandwidth)
and do its multiply-adds (FLOPs / matmul throughput); the larger of the two is the floor. The
ceilings are arguments (``hbm_bps`` bytes/s, ``flops_per_s`` FLOP/s): pass the ones measured on,
or quoted for, the GPU in question.

Conventions: a multiply-add is 2 FLOPs; weights are read once per step (ideal caching); the KV
cache and attention-score FLOPs (they grow with the context) are left out unless asked for;
``bytes_per_param`` = 2 for bf16.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from dispatch.config import MoEConfig


@dataclass(frozen=True)
class ModelShape:
    """Model-level numbers around the MoE layer (build with ``dispatch.hf.model_shape_from_hf``)."""

    moe: MoEConfig
    num_layers: int
    vocab_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    tie_embeddings: bool = False
    attention_extra_params: int = 0  # per layer: q/k norms, qkv biases
    dense_layers: int = 0  # layers with a dense SwiGLU MLP instead of the MoE block
    dense_intermediate_size: int = 0

    def __post_init__(self):
        if not 0 <= self.dense_layers <= self.num_layers:
            raise ValueError(f"dense_layers={self.dense_layers} must be in [0, num_layers={self.num_layers}]")

    @property
    def moe_layers(self) -> int:
        return self.num_layers - self.dense_layers


def expert_params(cfg: MoEConfig) -> int:
    """Parameters of one routed SwiGLU expert: gate, up and down, 3·H·I."""
    return 3 * cfg.hidden_size * cfg.intermediate_size


def layer_params(cfg: MoEConfig) -> dict[str, int]:
    """Parameters of one MoE layer: router E·H, experts E·3HI, shared expert 3HS (+ its gate H)."""
    H, S = cfg.hidden_size, cfg.shared_intermediate_size
    return {"router": cfg.num_experts * H, "experts": cfg.num_experts * expert_params(cfg),
            "shared": 3 * H * S + (H if cfg.shared_gate else 0)}


def param_counts(shape: ModelShape) -> dict[str, int]:
    """Total and active parameters of a model, by part. Active = total minus the E−K unused experts."""
    m, H, L = shape.moe, shape.moe.hidden_size, shape.num_layers
    q, kv = shape.num_heads * shape.head_dim, shape.num_kv_heads * shape.head_dim
    lp = layer_params(m)
    parts = {
        "embedding": shape.vocab_size * H,
        "lm_head": 0 if shape.tie_embeddings else shape.vocab_size * H,
        "attention": L * (2 * H * q + 2 * H * kv + shape.attention_extra_params),
        "norms": L * 2 * H + H,
        "router": shape.moe_layers * lp["router"],
        "experts": shape.moe_layers * lp["experts"],
        "shared": shape.moe_layers * lp["shared"],
        "dense_mlp": shape.dense_layers * 3 * H * shape.dense_intermediate_size,
    }
    parts["total"] = sum(parts.values())
    parts["active_experts"] = shape.moe_layers * m.top_k * expert_params(m)
    parts["active"] = parts["total"] - parts["experts"] + parts["active_experts"]
    return parts


def expected_unique_experts(num_experts: int, top_k: int, tokens: int) -> float:
    """Expected number of distinct experts T tokens touch under uniform routing: E·(1 − (1 − K/E)^T).

    Each token picks K of E without replacement, so one expert is missed by one token with
    probability 1 − K/E, and by all T tokens with (1 − K/E)^T.
    """
    return num_experts * (1.0 - (1.0 - top_k / num_experts) ** tokens)


def expected_unique_experts_skewed(inclusion_E: torch.Tensor, tokens: int) -> float:
    """Expected distinct experts T independent tokens touch when a token chooses expert e with
    probability ``inclusion_E[e]`` (its share of tokens; the E values sum to K): Σ_e 1 − (1 − p_e)^T.
    Uniform routing (p_e = K/E) gives :func:`expected_unique_experts`; skew gives fewer."""
    p = torch.as_tensor(inclusion_E, dtype=torch.float64)
    if p.dim() != 1 or bool(((p < 0) | (p > 1)).any()):
        raise ValueError(f"inclusion_E must be a [E] vector of probabilities, got {tuple(p.shape)}")
    return float((1.0 - (1.0 - p) ** tokens).sum())


def expert_parallel_exchange(cfg: MoEConfig, ranks: int, tokens: int, itemsize: int = 2) -> dict[str, float]:
    """Expected bytes one rank sends per MoE layer under expert parallelism (chapter 4), uniform routing
    over a contiguous placement of E / R experts a rank, T = ``tokens`` per rank:

    * ``pairs``: every (token, expert) row whose expert lives elsewhere, T·K·(R−1)/R rows of H;
    * ``dispatch``: each token once per other rank holding one of its experts — a rank misses all K of
      a token's experts with probability C(E − E/R, K) / C(E, K) — so T·(R−1)·(1 − that) rows of H;
    * ``combine``: the rows computed elsewhere coming home, T·K·(R−1)/R rows of H.
    """
    import math

    E, K, R = cfg.num_experts, cfg.top_k, ranks
    if R < 1 or E % R:
        raise ValueError(f"ranks must divide the {E} experts, got {ranks}")
    miss = math.comb(E - E // R, K) / math.comb(E, K)
    row = cfg.hidden_size * itemsize
    remote = tokens * K * (R - 1) / R
    return {"pairs": remote * row, "dispatch": tokens * (R - 1) * (1 - miss) * row, "combine": remote * row}


def unique_experts(ids_TK: torch.Tensor) -> int:
    """Exact number of distinct experts a given routing ids_TK [T, K] touches."""
    return int(torch.unique(ids_TK).numel())


def ridge(hbm_bps: float, flops_per_s: float) -> float:
    """FLOPs per byte where the memory floor meets the compute floor: flops_per_s / hbm_bps."""
    _check_ceilings(hbm_bps, flops_per_s)
    return flops_per_s / hbm_bps


def _check_ceilings(hbm_bps, flops_per_s) -> None:
    for name, v in (("hbm_bps", hbm_bps), ("flops_per_s", flops_per_s)):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0 or v == float("inf"):
            raise ValueError(f"{name} must be a positive finite number, got {v!r}")


@dataclass(frozen=True)
class Roofline:
    """FLOPs and bytes of some work, and its floors under two ceilings: ``hbm_bps`` (bytes/s) and
    ``flops_per_s`` (FLOP/s)."""

    flops: float
    bytes: float
    hbm_bps: float
    flops_per_s: float

    def __post_init__(self):
        _check_ceilings(self.hbm_bps, self.flops_per_s)

    @property
    def intensity(self) -> float:
        """FLOPs per byte (compare with :func:`ridge` of the same ceilings)."""
        return self.flops / self.bytes

    @property
    def t_memory_s(self) -> float:
        return self.bytes / self.hbm_bps

    @property
    def t_compute_s(self) -> float:
        return self.flops / self.flops_per_s

    @property
    def floor_s(self) -> float:
        return max(self.t_memory_s, self.t_compute_s)

    @property
    def bound(self) -> str:
        return "memory" if self.t_memory_s >= self.t_compute_s else "compute"


def expert_layer_roofline(cfg: MoEConfig, tokens: int, *, hbm_bps: float, flops_per_s: float,
                          bytes_per_param: int = 2, ids_TK: torch.Tensor | None = None) -> Roofline:
    """The routed experts of one layer at T tokens (what the kernels of chapters 2–3 race against).

    FLOPs: T·K·6·H·I. Bytes: the weights of the experts touched (exact for a given ids_TK, else
    the uniform-routing expectation) plus reading x_TH and writing y_TH once.
    """
    touched = unique_experts(ids_TK) if ids_TK is not None else expected_unique_experts(cfg.E, cfg.K, tokens)
    flops = 2.0 * tokens * cfg.top_k * expert_params(cfg)
    nbytes = (touched * expert_params(cfg) + 2 * tokens * cfg.hidden_size) * bytes_per_param
    return Roofline(flops, nbytes, hbm_bps, flops_per_s)


def decode_step_roofline(shape: ModelShape, tokens: int = 1, *, hbm_bps: float, flops_per_s: float,
                         bytes_per_param: int = 2, context: int = 0) -> Roofline:
    """One decode step of the whole model for a batch of T tokens (one new token per sequence).

    Bytes: every non-expert weight once (attention, norms, routers, shared or dense MLPs, lm_head),
    T embedding rows, and per MoE layer the expected distinct experts of T tokens. FLOPs:
    2 · T · (active parameters − embedding), plus attention scores 4·L·(heads·head_dim)·context
    per token when ``context`` > 0. The KV cache is not counted.
    """
    p, m = param_counts(shape), shape.moe
    non_expert = p["total"] - p["embedding"] - p["experts"]
    experts = shape.moe_layers * expected_unique_experts(m.E, m.K, tokens) * expert_params(m)
    nbytes = (non_expert + tokens * m.hidden_size + experts) * bytes_per_param
    per_token = 2 * (p["active"] - p["embedding"]) + 4 * shape.num_layers * shape.num_heads * shape.head_dim * context
    return Roofline(float(tokens * per_token), float(nbytes), hbm_bps, flops_per_s)
