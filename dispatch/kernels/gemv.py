"""The decode path (1–64 tokens): grouped GEMV kernels that stream only the chosen experts' weights.

At decode sizes an MoE layer does almost no arithmetic: T·K routed rows (N ≤ 512) meet the weights
of at most min(E, N) experts, 3·H·I numbers each. The time is the time to *read those weights once*.
So the kernels below

1. group the N routed rows by expert **inside the kernel** (no sort launch, no host sync): program
   ``slot`` finds the slot-th smallest expert id present in ``ids_TK`` and the rows routed to it;
2. split each expert's matrices into thin tiles (``block_i`` rows of gate/up, ``block_ho`` rows of
   down) so that (used experts × tiles) keep every SM streaming weights; the grid is capped near
   ``config.programs`` and a program loops over several tiles of its expert when there are more;
3. apply a tile to all of its expert's rows at once (``tl.dot`` on ``block_m`` = 16 padded rows),
   with the whole reduction (over H for gate/up, over I for down) inside one program — no split-K
   partial sums to reduce;
4. sum each token's K weighted rows in a third small kernel, in fixed k order in fp32, cast once.

    x_TH ─┐                       h_NI (x dtype)              out_NH (fp32, weighted)
    ids ──┴─ _up_swiglu_kernel ──► rows × I ─ _down_kernel ──► rows × H ─ _combine_kernel ─► y_TH
            grid (slots, P_up)               grid (slots, P_down)         grid (T, H/block_c)
    slots = min(E, T·K); P = min(tiles, ceil(programs / slots)); program (s, p) does tiles p, p+P, ...

Deterministic (no atomics, fixed orders). Launch configs: :func:`dispatch.kernels.tiles.decode_config`.
Plain-PyTorch twin: :func:`moe_decode_torch`; naive per-token loop: :func:`decode_loop_torch`.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from dispatch import runtime  # noqa: F401  (sets TRITON_INTERPRET before triton loads)
import triton

from dispatch.kernels import tiles
from dispatch.kernels.gemv_kernels import _combine_kernel, _down_kernel, _up_swiglu_kernel
from dispatch.kernels.tiles import DecodeConfig  # noqa: F401  (re-exported: the decode launch config)
from dispatch.kernels.tiles import heuristic_decode as default_config  # noqa: F401  (old name, kept for callers)


def check_decode_inputs(x_TH, weights_TK, ids_TK, gate_up_E2IH, down_EHI) -> tuple[int, int, int, int, int]:
    """Raise ValueError unless the inputs form one decode call; return (T, K, E, H, I)."""
    named = {"x_TH": x_TH, "weights_TK": weights_TK, "ids_TK": ids_TK,
             "gate_up_E2IH": gate_up_E2IH, "down_EHI": down_EHI}
    for name, t in named.items():
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if x_TH.dim() != 2 or not x_TH.is_floating_point():
        raise ValueError(f"x_TH must be a floating [T, H] tensor, got {x_TH.dtype} {tuple(x_TH.shape)}")
    T, H = x_TH.shape
    if gate_up_E2IH.dim() != 3 or down_EHI.dim() != 3:
        raise ValueError(f"gate_up_E2IH must be [E, 2I, H] and down_EHI [E, H, I], got "
                         f"{tuple(gate_up_E2IH.shape)} and {tuple(down_EHI.shape)}")
    E, I2, Hg = gate_up_E2IH.shape
    I = I2 // 2  # noqa: E741
    if I2 % 2 or Hg != H or tuple(down_EHI.shape) != (E, H, I) or I < 1:
        raise ValueError(f"with x_TH [T, H={H}] expected gate_up_E2IH [E, 2I, {H}] and down_EHI [E, {H}, I], "
                         f"got {tuple(gate_up_E2IH.shape)} and {tuple(down_EHI.shape)}")
    if ids_TK.dim() != 2 or ids_TK.shape[0] != T or ids_TK.shape[1] < 1:
        raise ValueError(f"ids_TK must be [T={T}, K>=1], got {tuple(ids_TK.shape)}")
    if ids_TK.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"ids_TK must be int32 or int64, got {ids_TK.dtype}")
    if tuple(weights_TK.shape) != tuple(ids_TK.shape) or not weights_TK.is_floating_point():
        raise ValueError(f"weights_TK must be a floating tensor shaped like ids_TK {tuple(ids_TK.shape)}, "
                         f"got {weights_TK.dtype} {tuple(weights_TK.shape)}")
    if not (x_TH.dtype == gate_up_E2IH.dtype == down_EHI.dtype):
        raise ValueError(f"x_TH, gate_up_E2IH and down_EHI must share one dtype, got "
                         f"{x_TH.dtype}, {gate_up_E2IH.dtype}, {down_EHI.dtype}")
    devices = {t.device for t in named.values()}
    if len(devices) > 1:
        raise ValueError(f"all inputs must be on one device, got {sorted(map(str, devices))}")
    if not runtime.triton_ok(x_TH):
        raise ValueError(f"Triton cannot run on {x_TH.device} here (CUDA, or CPU under TRITON_INTERPRET=1)")
    if x_TH.device.type == "cpu" and x_TH.dtype == torch.bfloat16:
        raise ValueError("bf16 is not supported under Triton's CPU interpreter; use float32 or float16 on CPU")
    return T, ids_TK.shape[1], E, H, I


def moe_decode(x_TH, weights_TK, ids_TK, gate_up_E2IH, down_EHI, *, config: DecodeConfig | None = None,
               check_ids: bool | None = None) -> torch.Tensor:
    """The routed experts for a few tokens: y_TH = Σ_k weights_TK[t,k] · expert_{ids_TK[t,k]}(x_t).

    Same meaning as :func:`dispatch.reference.experts_reference`. Three launches, no host sync
    (CUDA-graph capturable): up+SwiGLU → down × weight → combine (fixed k order, fp32, cast once).

    Args:
        x_TH: [T, H] activations (copied if its last dim is not contiguous). weights_TK: [T, K] float. ids_TK: [T, K] int32/int64.
        gate_up_E2IH: [E, 2I, H], down_EHI: [E, H, I] (copied if their last dim is not contiguous).
        config: tile sizes (default: :func:`dispatch.kernels.tiles.decode_config`: tuned table or heuristic).
        check_ids: verify 0 <= ids < E before launching (one host sync). Default: on CPU only; on a
            GPU ids come from the router kernel, and a row with an id outside [0, E) adds nothing.
    Returns: y_TH [T, H] in x's dtype.
    """
    T, K, E, H, I = check_decode_inputs(x_TH, weights_TK, ids_TK, gate_up_E2IH, down_EHI)
    if check_ids is None:
        check_ids = x_TH.device.type == "cpu"
    if check_ids and T and not bool(((ids_TK >= 0) & (ids_TK < E)).all()):
        raise ValueError(f"ids_TK must hold expert ids in [0, {E}), got min {int(ids_TK.min())} max {int(ids_TK.max())}")
    cfg = config or tiles.decode_config(T, K, E, H, I, x_TH.dtype, x_TH.device)
    y_TH = torch.empty(T, H, dtype=x_TH.dtype, device=x_TH.device)
    if T == 0:
        return y_TH
    if x_TH.stride(1) != 1:  # the kernels read x, and the weights, along a contiguous last dim
        x_TH = x_TH.contiguous()
    if gate_up_E2IH.stride(-1) != 1:
        gate_up_E2IH = gate_up_E2IH.contiguous()
    if down_EHI.stride(-1) != 1:
        down_EHI = down_EHI.contiguous()
    N = T * K
    slots = min(E, N)  # at most this many distinct experts are used
    BLOCK_E = max(16, triton.next_power_of_2(E))
    CHUNK_N = max(16, min(triton.next_power_of_2(N), 8192 // BLOCK_E))
    h_NI = torch.empty(N, I, dtype=x_TH.dtype, device=x_TH.device)
    out_NH = torch.empty(N, H, dtype=torch.float32, device=x_TH.device)
    _up_swiglu_kernel[(slots, cfg.tiles_per_slot(slots, triton.cdiv(I, cfg.block_i)))](
        x_TH, ids_TK, gate_up_E2IH, h_NI, N, K, E, H, I,
        x_TH.stride(0), ids_TK.stride(0), ids_TK.stride(1),
        gate_up_E2IH.stride(0), gate_up_E2IH.stride(1), h_NI.stride(0),
        BLOCK_M=cfg.block_m, BLOCK_I=cfg.block_i, BLOCK_H=cfg.block_h, BLOCK_E=BLOCK_E, CHUNK_N=CHUNK_N,
        NUM_STAGES=cfg.num_stages, num_warps=cfg.num_warps)
    _down_kernel[(slots, cfg.tiles_per_slot(slots, triton.cdiv(H, cfg.block_ho)))](
        h_NI, ids_TK, weights_TK, down_EHI, out_NH, N, K, E, H, I,
        ids_TK.stride(0), ids_TK.stride(1), weights_TK.stride(0), weights_TK.stride(1),
        down_EHI.stride(0), down_EHI.stride(1), h_NI.stride(0), out_NH.stride(0),
        BLOCK_M=cfg.block_m, BLOCK_HO=cfg.block_ho, BLOCK_I=cfg.block_id, BLOCK_E=BLOCK_E, CHUNK_N=CHUNK_N,
        NUM_STAGES=cfg.num_stages, num_warps=cfg.num_warps)
    _combine_kernel[(T, triton.cdiv(H, cfg.block_c))](
        out_NH, ids_TK, y_TH, K, E, H, ids_TK.stride(0), ids_TK.stride(1), out_NH.stride(0), y_TH.stride(0),
        BLOCK_C=cfg.block_c, num_warps=4)
    return y_TH


def moe_decode_torch(x_TH, weights_TK, ids_TK, gate_up_E2IH, down_EHI) -> torch.Tensor:
    """Plain-PyTorch twin of :func:`moe_decode`: the same grouping and the same roundings.

    Rows grouped by expert (each used expert's weights read once); products accumulated in fp32;
    h rounded to x's dtype; weighted rows kept in fp32 and summed over k in order, cast once.
    """
    T, K, E, H, I = check_decode_inputs(x_TH, weights_TK, ids_TK, gate_up_E2IH, down_EHI)
    ids_N = ids_TK.reshape(-1)
    out_NH = torch.zeros(T * K, H, dtype=torch.float32, device=x_TH.device)
    for e in torch.unique(ids_N).tolist():
        if not 0 <= e < E:
            continue  # such rows add nothing, as in the kernel
        rows = torch.nonzero(ids_N == e).flatten()
        x_MH = x_TH[rows // K].float()
        gate_MI, up_MI = F.linear(x_MH, gate_up_E2IH[e].float()).chunk(2, dim=-1)
        h_MI = (F.silu(gate_MI) * up_MI).to(x_TH.dtype).float()
        out_NH[rows] = F.linear(h_MI, down_EHI[e].float()) * weights_TK.reshape(-1)[rows, None].float()
    y_TH = torch.zeros(T, H, dtype=torch.float32, device=x_TH.device)
    for k in range(K):  # fixed k order
        y_TH += out_NH.view(T, K, H)[:, k]
    return y_TH.to(x_TH.dtype)


def decode_loop_torch(x_TH, weights_TK, ids_TK, gate_up_E2IH, down_EHI) -> torch.Tensor:
    """The naive decode step: for every token, for every k, run its expert on that one row.

    Reads an expert's weights once per (token, k) that chose it: T·K expert-sized reads.
    """
    T, K, E, H, I = check_decode_inputs(x_TH, weights_TK, ids_TK, gate_up_E2IH, down_EHI)
    y_TH = torch.zeros(T, H, dtype=torch.float32, device=x_TH.device)
    for t in range(T):
        for k in range(K):
            e = int(ids_TK[t, k])
            gate, up = F.linear(x_TH[t:t + 1], gate_up_E2IH[e]).chunk(2, dim=-1)
            y_TH[t] += (F.linear(F.silu(gate) * up, down_EHI[e])[0] * weights_TK[t, k]).float()
    return y_TH.to(x_TH.dtype)


def expert_bytes_read(ids_TK: torch.Tensor, H: int, I: int, itemsize: int) -> int:  # noqa: E741
    """Bytes of expert weights one decode step must read: distinct experts x 3·H·I x itemsize."""
    return int(torch.unique(ids_TK).numel()) * 3 * H * I * itemsize
