"""Quantized experts (chapter 7's int8 / fp8 codes) in the lean forward and the command.

A transformers model quantized with :func:`dispatch.quant.quantize_model` and
:func:`dispatch.quant.swap_experts` holds a ``QuantizedExpertsModule`` in each MoE block: it answers
transformers' experts call with our quantized kernels whatever ``experts_implementation`` says,
so ``experts_implementation="dispatch"`` and the engine both take such a model as it is.

In the lean forward a quantized layer keeps the router, the selection bias and the shared expert
in the model's dtype (``MoEWeights`` whose expert tensors are zero-byte stand-ins, for the
shapes only) and runs the routed experts as:

    CUDA (moe_path "auto" / "decode" / "triton")   ``quantized_forward``: the decode kernels up to
                                                   the scheme's tuned crossover (64 without one), the
                                                   grouped GEMM above (fp8: sm_89+)
    CPU, moe_path "torch" (the default)            the plain-PyTorch reference on the weights
                                                   dequantized once (codes × scales, in the model's
                                                   dtype): what the kernels compute, any scheme
    CPU, moe_path "decode" / "triton"              the same kernels under Triton's interpreter
                                                   (int8 only: the interpreter has no e4m3)
"""
from __future__ import annotations

import types

import torch

from dispatch import schemes
from dispatch.config import MoEConfig, MoEWeights
from dispatch.quant.formats import QuantizedExperts


def scheme_name(name: str) -> str:
    """'int8' | 'fp8' (per-channel scales: one a row, applied after the reduction) | a full scheme name
    of :mod:`dispatch.schemes` → the full name."""
    return schemes.full_name(name)


def check_device(scheme: str, device: torch.device) -> None:
    """fp8 codes need an sm_89+ GPU for the kernels: a clear error on an older GPU (a T4)."""
    schemes.get(scheme).check_device(device)


def quantize(model, scheme: str, *, w8a8: bool = False):
    """Quantize every MoE block's experts of a transformers model in place (``swap_experts``)."""
    from dispatch.quant import quantize_model, swap_experts

    scheme = scheme_name(scheme)
    check_device(scheme, next(model.parameters()).device)
    return swap_experts(model, quantize_model(model, scheme), w8a8=w8a8)


def quantized_layer(block, cfg: MoEConfig, qe: QuantizedExperts) -> MoEWeights:
    """Router, bias and shared expert of ``block`` as :class:`MoEWeights`; the routed experts are
    zero-byte stand-ins in the router's dtype (shapes only: the codes live in ``qe``)."""
    from dispatch.hf import weights_from_hf

    z = torch.zeros((), dtype=block.gate.weight.dtype, device=block.gate.weight.device)
    stand_in = types.SimpleNamespace(gate_up_proj=z.expand(qe.gate_up.shape), down_proj=z.expand(qe.down.shape))
    parts = {n: getattr(block, n) for n in ("gate", "shared_experts", "shared_expert", "shared_expert_gate")
             if hasattr(block, n)}
    return weights_from_hf(types.SimpleNamespace(experts=stand_in, **parts), cfg)


class QuantLayer:
    """One quantized MoE layer of the lean forward: ``__call__(x_TH, path)`` → y_TH."""

    def __init__(self, cfg: MoEConfig, w: MoEWeights, qe: QuantizedExperts, w8a8: bool):
        self.cfg, self.w, self.qe, self.w8a8 = cfg, w, qe, w8a8
        self._dequantized = None

    def __call__(self, x_TH: torch.Tensor, path: str) -> torch.Tensor:
        from dispatch.reference import experts_reference, route_reference, router_logits, shared_reference

        if path == "torch":
            if self._dequantized is None:  # once: the CPU reference reads the dequantized weights
                self._dequantized = self.qe.dequantize(x_TH.dtype)
            weights_TK, ids_TK = route_reference(router_logits(x_TH, self.cfg, self.w), self.cfg, self.w.bias_E)
            y_TH = experts_reference(x_TH, weights_TK.to(x_TH.dtype), ids_TK, *self._dequantized,
                                     activation=self.cfg.activation)
        else:
            from dispatch.kernels.routing import route
            from dispatch.moe import kernel_router_logits
            from dispatch.quant.modules import quantized_forward

            weights_TK, ids_TK = route(kernel_router_logits(x_TH, self.cfg, self.w), self.cfg, self.w.bias_E)
            y_TH = quantized_forward(self.qe, x_TH, ids_TK, weights_TK, w8a8=self.w8a8, activation=self.cfg.activation)
        shared_TH = shared_reference(x_TH, self.cfg, self.w)
        return y_TH if shared_TH is None else y_TH + shared_TH
