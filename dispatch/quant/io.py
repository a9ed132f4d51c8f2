"""Quantized experts on disk (safetensors) and in transformers models.

File layout (one file, any number of layers, one scheme):

    layers.<l>.gate_up.q      int8 / F8_E4M3  [E, 2I, H]
    layers.<l>.gate_up.scale  F32             [E, ceil(2I / br), ceil(H / bc)]
    layers.<l>.down.q, layers.<l>.down.scale
    metadata: format = dispatch.quant/1, scheme, code_dtype, scale_dtype = float32,
              layers = "0,1,..", and per layer its blocks "<l>.gate_up.block" = "1x128",
              sha256 = the content hash (:func:`content_hash`: every tensor and metadata entry)

``save`` writes the file whole or not at all (a temporary file renamed over it); ``load`` checks
the hash (a file without one loads with a ``checkpoint.UnverifiedWarning``, or is refused under
``strict=True``), then the codes (int8 never -128, fp8 never NaN) and the scales (finite, in
``[float32 tiny, float32 max / qmax]``): a corrupted file is a ValueError naming what is wrong.
"""
from __future__ import annotations

import copy
import hashlib
import pathlib
import warnings

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
        if not isinstance(k, int) or isinstance(k, bool) or k < 0 or not isinstance(v, QuantizedExperts):
            raise ValueError(f"expected {{layer index >= 0: QuantizedExperts}}, got {k!r}: {type(v).__name__}")
    if len({v.scheme for v in layers.values()}) > 1:
        raise ValueError(f"one file holds one scheme, got {sorted({v.scheme for v in layers.values()})}")
    return layers


def content_hash(tensors: dict[str, torch.Tensor], meta: dict[str, str]) -> str:
    """SHA-256 of every tensor (name, dtype, shape, bytes) and metadata entry but "sha256", in name order."""
    h = hashlib.sha256()
    for k in sorted(meta):
        if k != "sha256":
            h.update(f"{k}={meta[k]}\n".encode())
    for name in sorted(tensors):
        t = tensors[name].detach().contiguous().cpu()
        h.update(f"{name}:{t.dtype}:{tuple(t.shape)}\n".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().data)
    return h.hexdigest()


def save(path, layers) -> pathlib.Path:
    """Write ``layers`` ({layer index: QuantizedExperts}, or one) to a safetensors file, whole or not
    at all, with its content hash. Layers that share tensors are written as copies."""
    from safetensors.torch import save_file

    from dispatch import files

    layers = _as_layers(layers)
    scheme = next(iter(layers.values())).scheme
    tensors, meta = {}, {"format": FORMAT, "scheme": scheme, "code_dtype": str(get_scheme(scheme).dtype),
                         "scale_dtype": "torch.float32", "layers": ",".join(map(str, sorted(layers)))}
    seen = set()
    for idx, qe in layers.items():
        for part in ("gate_up", "down"):
            t = getattr(qe, part)
            for kind, x in (("q", t.q), ("scale", t.scale)):
                x = x.detach().contiguous().cpu()
                if x.untyped_storage().data_ptr() in seen:  # one layer object under two indices
                    x = x.clone()
                seen.add(x.untyped_storage().data_ptr())
                tensors[f"layers.{idx}.{part}.{kind}"] = x
            meta[f"{idx}.{part}.block"] = f"{t.block_rows}x{t.block_cols}"
    meta["sha256"] = content_hash(tensors, meta)
    path = pathlib.Path(path)
    with files.replacing(path) as tmp:
        save_file(tensors, str(tmp), metadata=meta)
    return path


def _check_codes(name: str, q: torch.Tensor) -> None:
    """int8 codes lie in [-127, 127]; e4m3 codes are never NaN (the quantizer makes neither)."""
    b = q.view(torch.uint8)
    bad = (b == 0x80) if q.dtype == torch.int8 else ((b & 0x7F) == 0x7F)
    if bool(bad.any()):
        raise ValueError(f"{name} holds {int(bad.sum())} code(s) {'-128' if q.dtype == torch.int8 else 'NaN'}, "
                         "which quant.save never writes: the file is corrupted")


def load(path, device="cpu", *, strict: bool = False) -> dict[int, QuantizedExperts]:
    """Read a file written by :func:`save` → {layer index: QuantizedExperts}, verified (see above)."""
    from safetensors import SafetensorError, safe_open

    from dispatch.checkpoint import UnverifiedWarning

    path = pathlib.Path(path)
    if path.is_dir():
        raise IsADirectoryError(f"{path} is a folder; quant.load reads the one .safetensors file quant.save wrote")
    if not path.is_file():
        raise FileNotFoundError(f"no quantized experts file at {path}")
    try:
        with safe_open(str(path), framework="pt", device="cpu") as f:
            meta = f.metadata() or {}
            if meta.get("format") != FORMAT:
                raise ValueError(f"{path} is not a {FORMAT} file (metadata format={meta.get('format')!r})")
            tensors = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118 (safe_open has no __iter__)
    except SafetensorError as e:
        raise ValueError(f"{path} is not a readable safetensors file: {e}") from None
    if "sha256" not in meta:
        msg = f"{path} carries no content hash (written before quant.save recorded one): not verified"
        if strict:
            raise ValueError(msg + "; strict=True refuses it")
        warnings.warn(msg, UnverifiedWarning, stacklevel=2)
    elif content_hash(tensors, meta) != meta["sha256"]:
        raise ValueError(f"{path} does not match its content hash: corrupted or changed after saving")
    try:
        scheme = get_scheme(meta.get("scheme", "")).name
        out = {}
        for idx in map(int, meta["layers"].split(",")):
            parts = {}
            for part in ("gate_up", "down"):
                br, bc = map(int, meta[f"{idx}.{part}.block"].split("x"))
                q, scale = tensors[f"layers.{idx}.{part}.q"], tensors[f"layers.{idx}.{part}.scale"]
                _check_codes(f"{path}: layers.{idx}.{part}.q", q)
                parts[part] = QuantizedTensor(q, scale, br, bc)
            out[idx] = QuantizedExperts(scheme, **parts)
    except (KeyError, ValueError) as e:
        raise ValueError(f"{path}: {e.args[0] if isinstance(e, ValueError) else f'missing entry {e}'}") from None
    return {i: qe.to(device) for i, qe in out.items()} if str(device) != "cpu" else out


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
