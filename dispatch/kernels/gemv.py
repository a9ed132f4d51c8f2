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
4. sum each token's K weighted rows with the one k-order combine (fp32, cast once; rows with an id
   outside [0, E) were never written and are selected away).

    x_TH ─┐                       h_NI (x dtype)              out_NH (fp32, weighted)
    ids ──┴─ _up_swiglu_kernel ──► rows × I ─ _down_kernel ──► rows × H ─ combine ─► y_TH
            grid (slots, P_up)               grid (slots, P_down)         grid (T, H/block_c)
    slots = min(E, T·K); P = min(tiles, ceil(programs / slots)); program (s, p) does tiles p, p+P, ...

Deterministic (no atomics, fixed orders). Launch configs: :class:`DecodeConfig` (tuned on an H200).
Plain-PyTorch twin: :func:`moe_decode_torch`; naive per-token loop: :func:`decode_loop_torch`.
"""
from __future__ import annotations

from dataclasses import astuple, dataclass, replace

import torch
import torch.nn.functional as F
import triton
from torch.library import custom_op

from dispatch import runtime
from dispatch.kernels.checks import check_experts_inputs, check_launch, no_backward, via_op
from dispatch.kernels.combine import combine_impl, combine_torch
from dispatch.kernels.gemv_kernels import _down_kernel, _up_swiglu_kernel
from dispatch.reference import swiglu, swiglu_expert


@dataclass(frozen=True)
class DecodeConfig:
    """Tile sizes of the three kernels (all powers of two, tl.dot needs >= 16)."""

    block_m: int = 16  # routed rows of one expert per tl.dot (padded)
    block_i: int = 32  # gate/up rows (of I) per up-kernel tile
    block_h: int = 256  # H chunk of the up kernel's reduction loop
    block_ho: int = 32  # down rows (of H) per down-kernel tile
    block_id: int = 128  # I chunk of the down kernel's reduction loop
    block_c: int = 1024  # H chunk per combine program
    num_warps: int = 4
    num_stages: int = 3
    programs: int = 1024  # aim for about this many programs per kernel; each loops over its tiles

    def __post_init__(self):
        for name in ("block_m", "block_i", "block_h", "block_ho", "block_id", "block_c"):
            v = getattr(self, name)
            if not isinstance(v, int) or v < 16 or v & (v - 1):
                raise ValueError(f"DecodeConfig.{name} must be a power of two >= 16, got {v!r}")
        if self.num_warps not in (1, 2, 4, 8, 16) or not 1 <= self.num_stages <= 8:
            raise ValueError(f"bad num_warps={self.num_warps} / num_stages={self.num_stages}")
        if not isinstance(self.programs, int) or self.programs < 1:
            raise ValueError(f"DecodeConfig.programs must be a positive int, got {self.programs!r}")

    def tiles_per_slot(self, slots: int, tiles: int) -> int:
        """Programs given to each used expert: ~programs / slots, at least 1, at most one per tile."""
        return max(1, min(tiles, -(-self.programs // slots)))


# Tuned on an H200 (bench_decode --tune, OLMoE / Mixtral / Qwen3 shapes, 1 and 64 tokens): thin tiles
# and many programs while few experts are used; wider tiles and ~2 programs per SM once the used
# experts alone give several waves of tiles (then fewer, longer programs amortise the grouping).
FEW_EXPERTS = DecodeConfig(block_i=32, block_h=256, block_ho=32, block_id=128, num_stages=3, programs=1056)
MANY_EXPERTS = DecodeConfig(block_i=64, block_h=128, block_ho=64, block_id=128, num_stages=3, programs=264)
INTERPRETER = DecodeConfig(block_i=16, block_h=32, block_ho=16, block_id=32, block_c=64, num_stages=1)


def default_config(T: int, K: int, E: int, H: int, I: int, device: torch.device) -> DecodeConfig:  # noqa: E741
    """The launch config ``moe_decode`` uses for these sizes (small tiles under the interpreter).

    ``MANY_EXPERTS`` once min(E, T·K) experts × I/64 tiles reach 4 waves of the device's SMs, else
    ``FEW_EXPERTS``; block_m covers about twice the mean rows per expert (T·K/E), so one tl.dot
    pass usually takes all of an expert's rows and its weights are streamed once.
    """
    if device.type != "cuda":
        return INTERPRETER
    base = MANY_EXPERTS if min(E, T * K) * -(-I // 64) >= 4 * runtime.num_sms(device) else FEW_EXPERTS
    block_m = min(64, max(16, triton.next_power_of_2(-(-2 * T * K // E))))
    return fit_shared(replace(base, block_m=block_m), runtime.max_shared_bytes(device))


def shared_bytes(cfg: DecodeConfig) -> int:
    """Shared memory of the larger kernel's pipelined tiles (2-byte elements): up streams x, gate and
    up tiles over H; down streams h and down tiles over I."""
    up = cfg.block_m * cfg.block_h + 2 * cfg.block_i * cfg.block_h
    down = cfg.block_m * cfg.block_id + cfg.block_ho * cfg.block_id
    return cfg.num_stages * max(up, down) * 2


def fit_shared(cfg: DecodeConfig, limit: int) -> DecodeConfig:
    """``cfg`` shrunk (stages, then the reduction chunks) until it fits ``limit`` bytes less 8 KiB of
    headroom: the H200 tiles are kept as tuned; a T4 (sm_75, 64 KiB) gets a smaller pipeline."""
    budget = limit - 8 * 1024
    while shared_bytes(cfg) > budget:
        if cfg.num_stages > 1:
            cfg = replace(cfg, num_stages=cfg.num_stages - 1)
        elif cfg.block_h > 32 or cfg.block_id > 32:
            cfg = replace(cfg, block_h=max(32, cfg.block_h // 2), block_id=max(32, cfg.block_id // 2))
        else:
            break
    return cfg


def moe_decode(x_TH, weights_TK, ids_TK, gate_up_E2IH, down_EHI, *, config: DecodeConfig | None = None,
               check_ids: bool = False) -> torch.Tensor:
    """The routed experts for a few tokens: y_TH = Σ_k weights_TK[t,k] · expert_{ids_TK[t,k]}(x_t).

    Same meaning as :func:`dispatch.reference.experts_reference`. Three launches, no host sync
    (CUDA-graph capturable): up+SwiGLU → down × weight → the k-order combine (fp32, cast once).
    Registered as ``torch.ops.dispatch.moe_decode`` (``torch.compile`` keeps it whole; no backward).

    Args:
        x_TH: [T, H] activations (copied if its last dim is not contiguous).
        weights_TK: [T, K] float. ids_TK: [T, K] int32/int64, 1 <= K <= E.
        gate_up_E2IH: [E, 2I, H], down_EHI: [E, H, I] (copied if their last dim is not contiguous).
        config: tile sizes (default: :func:`default_config`).
        check_ids: refuse ids outside [0, E) (one host sync); by default such rows add nothing.
    Returns: y_TH [T, H] in x's dtype.
    """
    T, K, E, H, I = check_experts_inputs(x_TH, weights_TK, ids_TK, gate_up_E2IH, down_EHI, check_ids=check_ids)
    if config is not None and not isinstance(config, DecodeConfig):
        raise ValueError(f"config must be a DecodeConfig (tiles of the decode kernels), got {type(config).__name__}")
    check_launch("moe_decode", x_TH)
    cfg = config or default_config(T, K, E, H, I, x_TH.device)
    op = torch.ops.dispatch.moe_decode if via_op(x_TH, weights_TK, gate_up_E2IH, down_EHI) else _moe_decode_impl
    return op(x_TH, weights_TK, ids_TK, gate_up_E2IH, down_EHI, list(astuple(cfg)))


def _moe_decode_impl(x_TH: torch.Tensor, weights_TK: torch.Tensor, ids_TK: torch.Tensor, gate_up_E2IH: torch.Tensor,
                   down_EHI: torch.Tensor, tiles: list[int]) -> torch.Tensor:
    (T, H), (K, E), I = x_TH.shape, (ids_TK.shape[1], gate_up_E2IH.shape[0]), down_EHI.shape[2]  # noqa: E741
    cfg = DecodeConfig(*tiles)
    if T == 0:
        return x_TH.new_empty(0, H)
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
    # rows with an id outside [0, E) were never written: the combine selects them away
    return combine_impl(out_NH, K, ids_TK, E, x_TH.dtype)


_moe_decode_op = custom_op("dispatch::moe_decode", _moe_decode_impl, mutates_args=())


@_moe_decode_op.register_fake
def _(x_TH, weights_TK, ids_TK, gate_up_E2IH, down_EHI, tiles):
    return torch.empty_like(x_TH)


no_backward(_moe_decode_op, "dispatch.kernels.gemv.moe_decode")


def moe_decode_torch(x_TH, weights_TK, ids_TK, gate_up_E2IH, down_EHI) -> torch.Tensor:
    """Plain-PyTorch twin of :func:`moe_decode`: the same grouping and the same roundings.

    Rows grouped by expert (each used expert's weights read once); products accumulated in fp32;
    h rounded to x's dtype; weighted rows kept in fp32 and summed over k in order, cast once.
    """
    T, K, E, H, I = check_experts_inputs(x_TH, weights_TK, ids_TK, gate_up_E2IH, down_EHI)
    ids_N = ids_TK.reshape(-1)
    out_NH = torch.zeros(T * K, H, dtype=torch.float32, device=x_TH.device)
    for e in torch.unique(ids_N).tolist():
        if not 0 <= e < E:
            continue  # such rows add nothing, as in the kernel
        rows = torch.nonzero(ids_N == e).flatten()
        x_MH = x_TH[rows // K].float()
        h_MI = swiglu(F.linear(x_MH, gate_up_E2IH[e].float())).to(x_TH.dtype).float()
        out_NH[rows] = F.linear(h_MI, down_EHI[e].float()) * weights_TK.reshape(-1)[rows, None].float()
    return combine_torch(out_NH, K, ids_TK=ids_TK, num_experts=E, dtype=x_TH.dtype)


def decode_loop_torch(x_TH, weights_TK, ids_TK, gate_up_E2IH, down_EHI) -> torch.Tensor:
    """The naive decode step: for every token, for every k, run its expert on that one row.

    Reads an expert's weights once per (token, k) that chose it: T·K expert-sized reads.
    Ids outside [0, E) add nothing.
    """
    T, K, E, H, I = check_experts_inputs(x_TH, weights_TK, ids_TK, gate_up_E2IH, down_EHI)
    y_TH = torch.zeros(T, H, dtype=torch.float32, device=x_TH.device)
    for t in range(T):
        for k in range(K):
            e = int(ids_TK[t, k])
            if not 0 <= e < E:
                continue
            y_TH[t] += (swiglu_expert(x_TH[t:t + 1], gate_up_E2IH[e], down_EHI[e])[0] * weights_TK[t, k]).float()
    return y_TH.to(x_TH.dtype)


def expert_bytes_read(ids_TK: torch.Tensor, H: int, I: int, itemsize: int) -> int:  # noqa: E741
    """Bytes of expert weights one decode step must read: distinct experts x 3·H·I x itemsize."""
    return int(torch.unique(ids_TK).numel()) * 3 * H * I * itemsize
