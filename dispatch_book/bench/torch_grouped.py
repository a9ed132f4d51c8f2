"""torch's grouped GEMM as a race contestant: transformers' "grouped_mm" experts path, on our tensors.

transformers 5 (``integrations/moe.py``, ``grouped_mm_experts_forward``) runs a layer's routed experts
as: sort the T·K (token, choice) pairs by expert (``torch.sort``), gather each pair's token row, count
rows per expert with ``histc`` (graph-safe, where ``bincount`` is not) and take their running sum as
group offsets, then ``grouped_mm`` over the gate|up weights (transposed views of [E, 2I, H]),
SiLU·mul, ``grouped_mm`` over the down weights, scale each row by its routing weight, undo the sort
and sum each token's K rows. :func:`grouped_mm_experts` is that sequence written out (no bias, no
expert-parallel sentinels: a dense layer's case), so the race can time it under a CUDA graph like
ours and the peer, on the same inputs; :func:`unavailable_reason` says why it cannot run here.
``torch.nn.functional.grouped_mm`` where this torch has it (2.10+), else ``torch._grouped_mm``.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F


def _grouped_mm():
    return getattr(F, "grouped_mm", None) or getattr(torch, "_grouped_mm", None)


def unavailable_reason(device: torch.device, dtype: torch.dtype) -> str | None:
    """Why torch's grouped GEMM cannot run here (None if it can): no such op in this torch, a GPU before
    sm_80, or a CPU torch whose kernel does not take this dtype."""
    if _grouped_mm() is None:
        return f"torch {torch.__version__} has neither torch.nn.functional.grouped_mm nor torch._grouped_mm"
    device = torch.device(device)
    cap = torch.cuda.get_device_capability(device) if device.type == "cuda" else None
    if cap is not None and cap < (8, 0):
        return f"grouped_mm needs sm_80 or newer, this GPU is sm_{cap[0]}{cap[1]}"
    if device.type == "cpu" and dtype not in (torch.float32, torch.bfloat16):
        return f"grouped_mm on the CPU takes fp32 or bf16, not {dtype}"
    return None


def grouped_mm_experts(x_TH, weights_TK, ids_TK, gate_up_E2IH, down_EHI) -> torch.Tensor:
    """y_TH = Σ_k weights_TK[t,k] · expert_{ids_TK[t,k]}(x_t), as transformers' grouped_mm path runs it."""
    mm = _grouped_mm()
    if mm is None:
        raise RuntimeError(unavailable_reason(x_TH.device, x_TH.dtype))
    T, K = ids_TK.shape
    E, H = gate_up_E2IH.shape[0], x_TH.shape[1]
    ids_N, wts_N = ids_TK.reshape(-1), weights_TK.reshape(-1)
    ids_g, perm = torch.sort(ids_N)  # pairs grouped by expert
    x_g = x_TH[perm // K]
    counts = ids_g.float() if x_TH.device.type == "cpu" else ids_g.int()  # histc: float on CPU, int on CUDA
    offs = torch.cumsum(torch.histc(counts, bins=E, min=0, max=E - 1), dim=0, dtype=torch.int32)
    gu_N2I = mm(x_g.to(gate_up_E2IH.dtype), gate_up_E2IH.transpose(-2, -1), offs=offs)
    gate, up = gu_N2I.chunk(2, dim=-1)
    h_NI = F.silu(gate) * up
    out_NH = mm(h_NI, down_EHI.transpose(-2, -1), offs=offs)
    out_NH = out_NH * wts_N[perm].unsqueeze(-1).to(out_NH.dtype)
    inv = torch.empty_like(perm)
    inv[perm] = torch.arange(perm.numel(), device=perm.device)
    return out_NH[inv].view(T, K, H).sum(dim=1).to(x_TH.dtype)
