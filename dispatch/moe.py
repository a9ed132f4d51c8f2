"""The one entry point: an MoE layer that picks its kernel path by token count and device.

    y = moe(x, cfg, w)                     # x [T, H] or [B, S, H]
    layer = MoELayer(cfg, w); y = layer(x)
    layer = MoELayer.from_hf(block, hf_config)   # a transformers MoE block

Paths (``path=``):
    "torch"   the plain-PyTorch reference (CPU without Triton's interpreter lands here)
    "triton"  routing kernel → sort → grouped GEMM up+SwiGLU → grouped down×weight → combine
    "decode"  routing kernel → the grouped-GEMV decode kernels (``dispatch.kernels.gemv``)
    "auto"    "decode" for T ≤ the shape's crossover (``tiles.decode_max_tokens``: the device's tuned
              table, else DECODE_MAX_TOKENS), else "triton"; "torch" where Triton cannot run
The router matmul and the shared expert run in torch on every path.
"""
from __future__ import annotations

import torch
from torch import nn

from dispatch import runtime
from dispatch.config import MoEConfig, MoEWeights
from dispatch.kernels import tiles
from dispatch.reference import (check_input, experts_reference, route_reference, router_logits,
                                shared_reference)

PATHS = ("auto", "triton", "decode", "torch")
DECODE_MAX_TOKENS = tiles.DECODE_MAX_TOKENS  # the crossover where no tuned table names one


def _route(logits_TE, cfg, bias_E, use_kernel: bool):
    if use_kernel:
        from dispatch.kernels.routing import route

        return route(logits_TE, cfg, bias_E)
    weights_TK, ids_TK = route_reference(logits_TE, cfg, bias_E)
    return weights_TK.float(), ids_TK


def pick_path(T: int, x_TH: torch.Tensor, path: str = "auto", crossover: int = DECODE_MAX_TOKENS) -> str:
    """Which path runs ``T`` tokens of ``x_TH`` (raises ValueError for an impossible request)."""
    if path not in PATHS:
        raise ValueError(f"path must be one of {PATHS}, got {path!r}")
    can_triton = runtime.triton_ok(x_TH) and not (x_TH.device.type == "cpu" and x_TH.dtype == torch.bfloat16)
    if path == "auto":
        if not can_triton:
            return "torch"
        return "decode" if T <= crossover else "triton"
    if path in ("triton", "decode") and not can_triton:
        raise ValueError(f"path={path!r} needs CUDA or Triton's interpreter with fp32/fp16 on CPU "
                         f"(x is {x_TH.dtype} on {x_TH.device}, interpreter={runtime.INTERPRET})")
    return path


def moe(x: torch.Tensor, cfg: MoEConfig, w: MoEWeights, *, path: str = "auto", config=None) -> torch.Tensor:
    """One MoE layer: router → top-K → routed experts (+ shared expert). x [T, H] or [B, S, H].

    ``config`` pins the grouped GEMM's tiles (``GemmConfig``) on the "triton" path.
    """
    if isinstance(x, torch.Tensor) and x.dim() == 3:
        return moe(x.reshape(-1, x.shape[-1]), cfg, w, path=path, config=config).view(x.shape)
    check_input(x, cfg, w)
    T = x.shape[0]
    chosen = pick_path(T, x, path, tiles.decode_max_tokens(cfg.K, cfg.E, cfg.H, cfg.I, x.dtype, x.device))
    if T == 0:
        return x.new_zeros(0, cfg.hidden_size)
    weights_TK, ids_TK = _route(router_logits(x, cfg, w), cfg, w.bias_E, use_kernel=chosen != "torch")
    if chosen == "torch":
        y = experts_reference(x, weights_TK.to(x.dtype), ids_TK, w.gate_up_E2IH, w.down_EHI)
    elif chosen == "decode":
        from dispatch.kernels.gemv import moe_decode

        y = moe_decode(x, weights_TK, ids_TK, w.gate_up_E2IH, w.down_EHI)
    else:
        from dispatch.kernels.grouped_gemm import moe_experts

        y = moe_experts(x, weights_TK, ids_TK, w.gate_up_E2IH, w.down_EHI, config=config)
    shared = shared_reference(x, cfg, w)
    return y if shared is None else y + shared


class MoELayer(nn.Module):
    """``moe`` as a module: holds the config and the weights (as buffers, inference only)."""

    def __init__(self, cfg: MoEConfig, w: MoEWeights, *, path: str = "auto", config=None):
        super().__init__()
        w.validate(cfg)
        if path not in PATHS:
            raise ValueError(f"path must be one of {PATHS}, got {path!r}")
        self.cfg, self.path, self.gemm_config = cfg, path, config
        self._names = list(w.tensors())
        for name, t in w.tensors().items():
            self.register_buffer(name, t)

    @classmethod
    def from_hf(cls, block: nn.Module, hf_config, **kw) -> "MoELayer":
        """From a transformers MoE block (e.g. ``OlmoeSparseMoeBlock``) and its model config."""
        from dispatch.hf import config_from_hf, weights_from_hf

        cfg = config_from_hf(hf_config)
        return cls(cfg, weights_from_hf(block, cfg), **kw)

    @property
    def weights(self) -> MoEWeights:
        return MoEWeights(**{n: getattr(self, n) for n in self._names})

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return moe(x, self.cfg, self.weights, path=self.path, config=self.gemm_config)

    def extra_repr(self) -> str:
        c = self.cfg
        return f"H={c.H}, I={c.I}, E={c.E}, K={c.K}, shared={c.shared_intermediate_size}, path={self.path!r}"
