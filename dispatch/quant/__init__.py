"""Quantized experts: int8 and fp8 e4m3 expert weights with their scales (chapter 7).

    formats.py   SCHEMES, quantize_tensor / quantize_experts → QuantizedExperts (exact .nbytes())
    io.py        save / load (safetensors), quantize_model (transformers), dequantized_model
    modules.py   QuantizedExpertsModule / swap_experts: our quantized kernels inside a transformers model
    accuracy.py  the gates: per-layer error for every preset, perplexity, greedy-token agreement

The kernels that read the codes and dequantize in registers are the decode and grouped-GEMM kernels
themselves, behind one constexpr switch (``QUANT``, :mod:`dispatch.kernels.quant_kernels`); their
launchers for quantized experts: ``dispatch.kernels.quant_gemv`` (decode, weight-only) and
``dispatch.kernels.quant_grouped`` (grouped GEMM, w8a16 and fp8 w8a8).
"""
from dispatch.quant.accuracy import greedy, greedy_agreement, layer_error, perplexity
from dispatch.quant.formats import (
           SCHEMES,
           QuantizedExperts,
           QuantizedTensor,
           Scheme,
           get_scheme,
           quantize_experts,
           quantize_tensor,
)
from dispatch.quant.io import dequantized_model, load, quantize_model, save
from dispatch.quant.modules import QuantizedExpertsModule, swap_experts

__all__ = ["SCHEMES", "QuantizedExperts", "QuantizedExpertsModule", "QuantizedTensor", "Scheme",
           "dequantized_model", "get_scheme", "greedy", "greedy_agreement", "layer_error", "load", "perplexity",
           "quantize_experts", "quantize_model", "quantize_tensor", "save", "swap_experts"]
