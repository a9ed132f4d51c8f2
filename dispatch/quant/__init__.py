"""Quantized experts: int8 and fp8 e4m3 expert weights with their scales (chapter 7).

    formats.py   quantize_tensor / quantize_experts → QuantizedExperts (exact .nbytes()); the schemes
                 themselves are :mod:`dispatch.schemes`
    io.py        save / load (safetensors), quantize_model (transformers), dequantized_model
    modules.py   QuantizedExpertsModule / swap_experts: our quantized kernels inside a transformers model
    accuracy.py  the gates: per-layer error for every preset, perplexity, greedy-token agreement

The kernels that read the codes and dequantize in registers are the decode and grouped-GEMM kernels
themselves, behind one constexpr switch (``QUANT``, :mod:`dispatch.kernels.quant_kernels`); their
launchers for quantized experts: ``dispatch.kernels.quant_gemv`` (decode, weight-only) and
``dispatch.kernels.quant_grouped`` (grouped GEMM, w8a16 and fp8 w8a8).

The names below load on first use: ``formats`` is plain PyTorch beneath the kernels (layer 1 of
CONTRIBUTING.md's layers), and ``import dispatch.quant.formats`` loads nothing else of this package.
"""
import importlib

_LAZY = {
    "greedy": "accuracy", "greedy_agreement": "accuracy", "layer_error": "accuracy", "perplexity": "accuracy",
    "SCHEMES": "formats", "QuantizedExperts": "formats", "QuantizedTensor": "formats", "Scheme": "formats",
    "get_scheme": "formats", "quantize_experts": "formats", "quantize_tensor": "formats",  # schemes: dispatch.schemes
    "dequantized_model": "io", "load": "io", "quantize_model": "io", "save": "io",
    "QuantizedExpertsModule": "modules", "swap_experts": "modules",
}

_MODULES = ("accuracy", "formats", "io", "modules")
__all__ = sorted(_LAZY)


def __getattr__(name: str):
    if name in _MODULES:  # ``quant.formats`` after ``from dispatch import quant``
        return importlib.import_module(f"dispatch.quant.{name}")
    if name in _LAZY:
        value = getattr(importlib.import_module(f"dispatch.quant.{_LAZY[name]}"), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'dispatch.quant' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_LAZY) | set(_MODULES))
