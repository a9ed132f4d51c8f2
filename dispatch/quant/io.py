"""Quantized experts on disk (safetensors) and in transformers models.

File layout (one file, any number of layers, one scheme):

    layers.<l>.gate_up.q      int8 / F8_E4M3  [E, 2I, H]
    layers.<l>.gate_up.scale  F32             [E, ceil(2I / br), ceil(H / bc)]
    layers.<l>.down.q, layers.<l>.down.scale
    metadata: format = dispatch.quant/1, scheme, code_dtype, scale_dtype = float32,
              layers = "0,1,..", and per layer its blocks "<l>.gate_up.block" = "1x128"
"""
from __future__ import annotations

import copy
import pathlib

import torch

from dispatch.quant.formats import QuantizedExperts, QuantizedTensor, quantize_experts
from dispatch.schemes import get as get_scheme

FORMAT = "dispatch.quant/1"


def _as_layers(layers) -> dict[int, QuantizedExperts]:
    if isinstance(layers, QuantizedExperts):
        return {0: layers}
    if not isinstance(layers, dict) or not layers:
        raise ValueError("expected a QuantizedExperts or a non-empty dict {layer index: QuantizedExperts}")
    for k, v in layers.items():
        if not isinstance(k, int) or not isinstance(v, QuantizedExperts):
            raise ValueError(f"expected {{int: QuantizedExperts}}, got {type(k).__name__}: {type(v).__name__}")
    if len({v.scheme for v in layers.values()}) > 1:
        raise ValueError(f"one file holds one scheme, got {sorted({v.scheme for v in layers.values()})}")
    return layers


def save(path, layers) -> pathlib.Path:
    """Write ``layers`` ({layer index: QuantizedExperts}, or one) to a safetensors file."""
    from safetensors.torch import save_file

    layers = _as_layers(layers)
    scheme = next(iter(layers.values())).scheme
    tensors, meta = {}, {"format": FORMAT, "scheme": scheme, "code_dtype": str(get_scheme(scheme).dtype),
                         "scale_dtype": "torch.float32", "layers": ",".join(map(str, sorted(layers)))}
    for idx, qe in layers.items():
        for part in ("gate_up", "down"):
            t = getattr(qe, part)
            tensors[f"layers.{idx}.{part}.q"] = t.q.contiguous().cpu()
            tensors[f"layers.{idx}.{part}.scale"] = t.scale.contiguous().cpu()
            meta[f"{idx}.{part}.block"] = f"{t.block_rows}x{t.block_cols}"
    path = pathlib.Path(path)
    save_file(tensors, str(path), metadata=meta)
    return path


def load(path, device="cpu") -> dict[int, QuantizedExperts]:
    """Read a file written by :func:`save` → {layer index: QuantizedExperts} (validated)."""
    from safetensors import safe_open

    with safe_open(str(path), framework="pt", device=str(device)) as f:
        meta = f.metadata() or {}
        if meta.get("format") != FORMAT:
            raise ValueError(f"{path} is not a {FORMAT} file (metadata format={meta.get('format')!r})")
        scheme = get_scheme(meta.get("scheme", "")).name
        out = {}
        for idx in map(int, meta["layers"].split(",")):
            parts = {}
            for part in ("gate_up", "down"):
                br, bc = map(int, meta[f"{idx}.{part}.block"].split("x"))
                parts[part] = QuantizedTensor(f.get_tensor(f"layers.{idx}.{part}.q"),
                                              f.get_tensor(f"layers.{idx}.{part}.scale"), br, bc)
            out[idx] = QuantizedExperts(scheme, **parts)
    return out


def quantize_model(model, scheme: str) -> dict[int, QuantizedExperts]:
    """Every sparse MoE block of a transformers model → {layer index: QuantizedExperts}."""
    from dispatch.hf import config_from_hf, moe_blocks, weights_from_hf

    cfg = config_from_hf(model.config)
    out = {idx: quantize_experts(w.gate_up_E2IH, w.down_EHI, scheme)
           for idx, w in ((i, weights_from_hf(b, cfg)) for i, b in moe_blocks(model))}
    if not out:
        raise ValueError(f"{type(model).__name__} has no sparse MoE blocks to quantize")
    return out


def dequantized_model(model, layers: dict[int, QuantizedExperts]):
    """A copy of ``model`` whose experts hold the dequantized weights (model's dtype and device).

    The copy computes what the quantized kernels compute, in transformers' own modules: the way to
    measure a format's effect on perplexity and generated tokens on any device.
    """
    from dispatch.hf import moe_blocks

    blocks = dict(moe_blocks(model))
    if set(layers) != set(blocks):
        raise ValueError(f"quantized layers {sorted(layers)} do not match the model's MoE layers {sorted(blocks)}")
    out = copy.deepcopy(model)
    for idx, block in moe_blocks(out):
        ex, qe = block.experts, layers[idx]
        if tuple(ex.gate_up_proj.shape) != qe.gate_up.shape or tuple(ex.down_proj.shape) != qe.down.shape:
            raise ValueError(f"layer {idx}: experts {tuple(ex.gate_up_proj.shape)} / {tuple(ex.down_proj.shape)} "
                             f"vs quantized {qe.gate_up.shape} / {qe.down.shape}")
        gu, dn = qe.to(ex.gate_up_proj.device).dequantize(ex.gate_up_proj.dtype)
        with torch.no_grad():
            ex.gate_up_proj.copy_(gu)
            ex.down_proj.copy_(dn)
    return out
