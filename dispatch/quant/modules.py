"""Quantized experts inside a transformers model: a drop-in for its experts modules.

transformers 5's MoE blocks call ``block.experts(hidden_TH, ids_TK, weights_TK)`` (OLMoE, Mixtral,
Qwen2/3-MoE, DeepSeek-V3 alike). :class:`QuantizedExpertsModule` answers that call with our kernels
on the quantized codes: the decode kernels up to the scheme's tuned crossover (``DECODE_MAX_TOKENS``
without one), else the grouped GEMM (optionally fp8 w8a8, at every size). :func:`swap_experts` puts
one in every MoE block of a model.
"""
from __future__ import annotations

import torch
from torch import nn

from dispatch import activations
from dispatch.quant.formats import QuantizedExperts


def quantized_forward(experts: QuantizedExperts, hidden_states: torch.Tensor, top_k_index: torch.Tensor,
                      top_k_weights: torch.Tensor, *, w8a8: bool = False, activation: str = "silu") -> torch.Tensor:
    """y_TH of a transformers experts call, on the quantized kernels: the decode kernels up to the
    crossover of this shape and scheme (``tiles.resolve("crossover", ...)``: the device's table for the codes,
    '<scheme>+w8a8' with fp8 activations; else ``DECODE_MAX_TOKENS``), else the grouped GEMM; both
    weight-only (w8a16), or both on fp8 activations (``w8a8``)."""
    from dispatch.kernels import tiles
    from dispatch.kernels.quant_gemv import moe_decode_quant
    from dispatch.kernels.quant_grouped import moe_experts_quant

    w_TK = top_k_weights.float()
    shape = (0, top_k_index.shape[-1], experts.E, experts.H, experts.I)
    scheme = experts.scheme + ("+w8a8" if w8a8 else "")
    if hidden_states.shape[0] <= tiles.resolve("crossover", shape, hidden_states.dtype, hidden_states.device,
                                               scheme=scheme).config:
        return moe_decode_quant(hidden_states, w_TK, top_k_index, experts, w8a8=w8a8, activation=activation)
    return moe_experts_quant(hidden_states, w_TK, top_k_index, experts, w8a8=w8a8, activation=activation)


class QuantizedExpertsModule(nn.Module):
    """forward(hidden_TH, ids_TK, weights_TK) → y_TH, computed from ``experts``' codes and scales.

    The codes live in the frozen ``experts`` (not in buffers): move them with ``experts.to(device)``
    before building the module, on the device the model runs on. ``activation``: the experts' gated
    activation (:mod:`dispatch.activations`; :func:`swap_experts` passes the model's ``hidden_act``).
    """

    def __init__(self, experts: QuantizedExperts, *, w8a8: bool = False, activation: str = "silu"):
        super().__init__()
        if not isinstance(experts, QuantizedExperts):
            raise ValueError(f"experts must be a QuantizedExperts, got {type(experts).__name__}")
        activations.get(activation)
        self.quantized, self.w8a8, self.num_experts, self.activation = experts, w8a8, experts.E, activation

    def forward(self, hidden_states: torch.Tensor, top_k_index: torch.Tensor,
                top_k_weights: torch.Tensor) -> torch.Tensor:
        return quantized_forward(self.quantized, hidden_states, top_k_index, top_k_weights, w8a8=self.w8a8,
                                 activation=self.activation)

    def extra_repr(self) -> str:
        q = self.quantized
        return f"{q.scheme}, E={q.E}, H={q.H}, I={q.I}, w8a8={self.w8a8}"


def swap_experts(model, layers: dict[int, QuantizedExperts], *, w8a8: bool = False):
    """Replace the experts of every MoE block of ``model`` (in place) by quantized ones; returns it."""
    from dispatch.hf import moe_blocks

    blocks = dict(moe_blocks(model))
    if set(layers) != set(blocks):
        raise ValueError(f"quantized layers {sorted(layers)} do not match the model's MoE layers {sorted(blocks)}")
    dev = next(model.parameters()).device
    act = activations.from_hf(getattr(model.config, "hidden_act", "silu")).name
    for idx, block in blocks.items():
        ex, qe = block.experts, layers[idx]
        if hasattr(ex, "gate_up_proj") and tuple(ex.gate_up_proj.shape) != qe.gate_up.shape:
            raise ValueError(f"layer {idx}: experts {tuple(ex.gate_up_proj.shape)} vs quantized {qe.gate_up.shape}")
        block.experts = QuantizedExpertsModule(qe.to(dev), w8a8=w8a8, activation=act)
    return model
