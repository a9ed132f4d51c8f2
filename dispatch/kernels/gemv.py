"""The decode path (1–64 tokens): grouped GEMV kernels that stream only the chosen experts' weights.

At decode sizes an MoE layer does almost no arithmetic: T·K routed rows (N ≤ 512) meet the weights
of at most min(E, N) experts, 3·H·I numbers each. The time is the time to *read those weights once*.
So the kernels below

1. group the N routed rows by expert **inside the kernel** (no sort launch, no host sync): every
   program counts the rows per expert in ``ids_TK``; the used experts, in id order, are the slots;
2. split each expert's matrices into thin tiles (``block_i`` rows of gate/up, ``block_ho`` rows of
   down) and deal the (slot, tile) items round-robin to a grid of ``config.programs`` programs, so
   every program streams the same number of tiles (±1) whichever experts the tokens chose;
3. apply a tile to all of its expert's rows at once (``tl.dot`` on ``block_m`` = 16 padded rows; or,
   with ``block_m`` = 1, one row at a time by FMAs on the CUDA cores, which the tuner tries at one
   token), with the whole reduction (over H for gate/up, over I for down) inside one program — no
   split-K partial sums to reduce (:mod:`dispatch.kernels.decode_split` splits I instead, at a few tokens);
4. sum each token's K weighted rows with the one k-order combine (fp32, cast once; rows with an id
   outside [0, E) were never written and are selected away).

A shared expert of S = n·I columns with no gate (DeepSeek-MoE's) can ride along (``shared=``): n more
experts, ids E .. E+n-1, that every token chooses with weight 1, read in place from the shared
weights' own tensors; the combine then sums K + n rows per token. One pass over the routed and the
shared weights instead of a second, torch-run MLP after the kernels (the kernels race times both).

    x_TH ─┐                       h_NI (x dtype)              out_NH (fp32, weighted)
    ids ──┴─ _up_swiglu_kernel ──► rows × I ─ _down_kernel ──► rows × H ─ combine ─► y_TH
            grid (G_up,)                     grid (G_down,)               grid (T, H chunks)
    items = used experts × tiles, slot-major; G = min(programs, min(E, T·K) × tiles);
    program p does items p, p + G, p + 2G, ...

Deterministic (no atomics, fixed orders). Launch configs: :func:`dispatch.kernels.tiles.resolve`.
Plain-PyTorch twin: :func:`moe_decode_torch`; naive per-token loop: :func:`decode_loop_torch`.
"""
from __future__ import annotations

from dataclasses import astuple
from typing import NamedTuple

import torch
import torch.nn.functional as F
import triton
from torch.library import custom_op

from dispatch import activations
from dispatch.checks import check_experts_inputs, check_launch, check_tensor, no_backward, via_op
from dispatch.kernels import decode_fused, decode_split, pdl, tiles
from dispatch.kernels import trace as trace_rows
from dispatch.kernels.combine import combine_impl, combine_torch
from dispatch.kernels.gemv_kernels import _down_kernel, _up_swiglu_kernel
from dispatch.kernels.quant_kernels import weight_operand
from dispatch.kernels.tiles import DecodeConfig
from dispatch.reference import gated_act, gated_expert, shared_as_experts


def moe_decode(x_TH, weights_TK, ids_TK, gate_up_E2IH, down_EHI, *, shared=None, config: DecodeConfig | None = None,
               check_ids: bool = False, activation: str = "silu") -> torch.Tensor:
    """The routed experts for a few tokens: y_TH = Σ_k weights_TK[t,k] · expert_{ids_TK[t,k]}(x_t).

    Same meaning as :func:`dispatch.reference.experts_reference`. Three launches (or, with
    ``config.fused``, the same items in one: :mod:`dispatch.kernels.decode_fused`; with ``config.split``,
    one launch of split items: :mod:`dispatch.kernels.decode_split`), no host sync
    (CUDA-graph capturable): up + the gated activation (``activation``: :mod:`dispatch.activations`,
    SwiGLU by default) → down × weight → the k-order combine (fp32, cast once).
    Registered as ``torch.ops.dispatch.moe_decode`` (``torch.compile`` keeps it whole; no backward).
    ``shared=(shared_gate_up_2SH, shared_down_HS)``: plus an ungated shared expert, S a multiple of I,
    run as S / I more experts of the same kernels (:func:`dispatch.reference.shared_reference`'s meaning).

    Args:
        x_TH: [T, H] activations (copied if its last dim is not contiguous).
        weights_TK: [T, K] float. ids_TK: [T, K] int32/int64, 1 <= K <= E.
        gate_up_E2IH: [E, 2I, H], down_EHI: [E, H, I] (copied if their last dim is not contiguous).
        config: tile sizes (default: :func:`dispatch.kernels.tiles.resolve`: tuned table or heuristic;
            with ``shared``, for K + n choices among E + n experts).
        check_ids: refuse ids outside [0, E) (one host sync); by default such rows add nothing.
    Returns: y_TH [T, H] in x's dtype.
    """
    T, K, E, H, I = check_experts_inputs(x_TH, weights_TK, ids_TK, gate_up_E2IH, down_EHI, check_ids=check_ids)
    if config is not None and not isinstance(config, DecodeConfig):
        raise ValueError(f"config must be a DecodeConfig (tiles of the decode kernels), got {type(config).__name__}")
    sgu, sdn = check_shared(shared, x_TH, I)
    act = activations.get(activation).code
    check_launch("moe_decode", x_TH)
    # no config: the tile policy picks one inside the op, where torch.compile does not trace it
    tile_ints = list(astuple(config)) if config is not None else []
    op = torch.ops.dispatch.moe_decode if via_op(x_TH, weights_TK, gate_up_E2IH, down_EHI, sgu, sdn) \
        else _moe_decode_impl
    return op(x_TH, weights_TK, ids_TK, gate_up_E2IH, down_EHI, sgu, sdn, tile_ints, act)


def check_shared(shared, x_TH, I: int):  # noqa: E741
    """(shared_gate_up_2SH, shared_down_HS) or (None, None); ValueError naming what was expected."""
    if shared is None:
        return None, None
    if not isinstance(shared, (tuple, list)) or len(shared) != 2:
        raise ValueError("shared must be a pair (shared_gate_up_2SH [2S, H], shared_down_HS [H, S]), "
                         f"got {type(shared).__name__}")
    sgu, sdn = shared
    for name, t in (("shared_gate_up_2SH", sgu), ("shared_down_HS", sdn)):
        check_tensor(name, t, dims=2)
        if t.dtype != x_TH.dtype or t.device != x_TH.device:
            raise ValueError(f"{name} must be {x_TH.dtype} on {x_TH.device} (x's), got {t.dtype} on {t.device}")
    H = x_TH.shape[1]
    S = sgu.shape[0] // 2
    if sgu.shape[1] != H or sgu.shape[0] % 2 or not S or tuple(sdn.shape) != (H, S) or S % I:
        raise ValueError(f"shared experts must be [2S, H={H}] and [H={H}, S] with S a multiple of I={I}, got "
                         f"{tuple(sgu.shape)} and {tuple(sdn.shape)}")
    return sgu, sdn


def _moe_decode_impl(x_TH: torch.Tensor, weights_TK: torch.Tensor, ids_TK: torch.Tensor, gate_up_E2IH: torch.Tensor,
                     down_EHI: torch.Tensor, shared_gate_up: torch.Tensor | None, shared_down: torch.Tensor | None,
                     tile_ints: list[int], act: int) -> torch.Tensor:
    shared = None if shared_gate_up is None else (shared_gate_up, shared_down)
    cfg = DecodeConfig(*tile_ints) if tile_ints else \
        decode_tiles(x_TH, ids_TK.shape[1], gate_up_E2IH.shape[0], down_EHI.shape[2], shared)
    return run_decode(x_TH, weights_TK, ids_TK, gate_up_E2IH, down_EHI, cfg, shared=shared,
                      activation=activations.by_code(act).name)


def decode_tiles(x_TH, K: int, E: int, I: int, shared=None) -> DecodeConfig:  # noqa: E741
    """The tiles :func:`moe_decode` takes without a config: the resolver's for x's T, H, dtype and
    device, with n shared experts riding along (``routing=n``: K + n choices among E + n experts)."""
    return tiles.resolve("decode", (x_TH.shape[0], K, E, x_TH.shape[1], I), x_TH.dtype, x_TH.device,
                         routing=n_shared(shared, I)).config


def run_decode(x_TH, weights_TK, ids_TK, gate_up_E2IH, down_EHI, cfg: DecodeConfig, *, shared=None,
               act=None, trace: list | None = None, activation: str = "silu") -> torch.Tensor:
    """y_TH with tiles ``cfg`` (inputs already checked; weights maybe quantized): three launches, or with
    ``cfg.fused`` one (:mod:`dispatch.kernels.decode_fused`), with ``cfg.split`` one of split items
    (:mod:`dispatch.kernels.decode_split`); ``act``: fp8 activations, three (:func:`decode_rows`).
    ``trace`` (a list; GPU only): each expert kernel's (name, :mod:`dispatch.kernels.trace` rows) appended;
    ``activation``: the gated activation (:mod:`dispatch.activations`)."""
    (T, H), E, I = x_TH.shape, gate_up_E2IH.shape[0], down_EHI.shape[2]  # noqa: E741
    if (cfg.fused or cfg.split) and act is None:  # one launch
        if T == 0 or E == 0:
            return torch.zeros(T, H, dtype=x_TH.dtype, device=x_TH.device)
        launch = decode_fused.fused_launch if cfg.fused else decode_split.split_launch
        op = _operands(x_TH, ids_TK, gate_up_E2IH, down_EHI, shared, activation)
        return launch(op, weights_TK, ids_TK, E, I, cfg, trace)
    ns = n_shared(shared, I)
    out_NH = decode_rows(x_TH, weights_TK, ids_TK, gate_up_E2IH, down_EHI, cfg, shared=shared, act=act, trace=trace,
                         activation=activation)
    # rows with an id outside [0, E) were never written: the combine selects them away
    return combine_impl(out_NH, ids_TK.shape[1], ids_TK, gate_up_E2IH.shape[0], x_TH.dtype, extra=ns)


def n_shared(shared, I: int) -> int:  # noqa: E741
    """n = S / I: how many experts of I columns the shared expert (shared_gate_up [2S, H], ...) rides as."""
    return 0 if shared is None else shared[0].shape[0] // 2 // I


class _Operands(NamedTuple):
    """What both launch paths pass their kernels: x with a contiguous last dim, each weight as
    :func:`~dispatch.kernels.quant_kernels.weight_operand` gives it, the shared weights (or stand-ins
    never read), n shared experts, N routed rows, the grouping's block sizes and the activation's code."""

    x_TH: torch.Tensor
    gate_up: tuple  # (weights or codes, scales, scale strides, constexprs)
    down: tuple
    sgu: torch.Tensor
    sdn: torch.Tensor
    ns: int
    N: int
    BLOCK_E: int
    CHUNK_N: int
    ACT: int

    @property
    def gate_up_arg(self) -> tuple:
        """gate/up as the kernels take it (``gemv_kernels.GROUPS["gate_up"]``)."""
        return _weight_arg(self.gate_up, self.sgu)

    @property
    def down_arg(self) -> tuple:
        """down as the kernels take it (``gemv_kernels.GROUPS["down"]``)."""
        return _weight_arg(self.down, self.sdn)


def _weight_arg(weight: tuple, shared: torch.Tensor) -> tuple:
    """(codes or weights, their expert and row strides, scales, their 3 strides, the shared weights, their row
    stride) of a weight operand (:func:`~dispatch.kernels.quant_kernels.weight_operand`)."""
    w, s, s_strides, _ = weight
    return (w, w.stride(0), w.stride(1), s, *s_strides, shared, shared.stride(0))


def _operands(x_TH, ids_TK, gate_up_E2IH, down_EHI, shared, activation: str = "silu") -> _Operands:
    (T, _), (K, E), I = x_TH.shape, (ids_TK.shape[1], gate_up_E2IH.shape[0]), down_EHI.shape[2]  # noqa: E741
    sgu, sdn = shared if shared is not None else (None, None)
    ns = n_shared(shared, I)
    if x_TH.stride(1) != 1:  # the kernels read x, and the weights, along a contiguous last dim
        x_TH = x_TH.contiguous()
    gate_up, down = weight_operand(gate_up_E2IH), weight_operand(down_EHI)
    if ns and (gate_up[3]["QUANT"] or down[3]["QUANT"]):
        raise ValueError("shared experts ride along with unquantized routed experts only")
    sgu = gate_up[0] if sgu is None else sgu if sgu.stride(1) == 1 else sgu.contiguous()  # never read without shared
    sdn = down[0] if sdn is None else sdn if sdn.stride(1) == 1 else sdn.contiguous()
    N = T * (K + ns)
    BLOCK_E = max(16, triton.next_power_of_2(E + ns))
    CHUNK_N = max(16, min(triton.next_power_of_2(N), 8192 // BLOCK_E))
    return _Operands(x_TH, gate_up, down, sgu, sdn, ns, N, BLOCK_E, CHUNK_N, activations.get(activation).code)


def decode_rows(x_TH, weights_TK, ids_TK, gate_up_E2IH, down_EHI, cfg: DecodeConfig, *, shared=None,
                act=None, trace: list | None = None, activation: str = "silu") -> torch.Tensor:
    """The first two launches of :func:`moe_decode` (inputs already checked): → out_NH [T·K, H] fp32,
    row t·K + k = weights_TK[t, k] · expert_{ids_TK[t, k]}(x_t); rows with an id outside [0, E) are left
    unwritten (expert parallelism sums them elsewhere, or never). The weights may be quantized
    (``dispatch.quant.QuantizedTensor``, block_h / block_id inside their scale blocks: chapter 7).
    ``shared`` (checked, unquantized weights only): [T·(K + n), H], the n shared experts' rows after
    each token's K. ``act(a) → (fp8 codes, scales)`` (w8a8, fp8 weights, ``block_m`` ≥ 16):
    x and h quantized before the kernel that multiplies them by the weights. ``trace``: as for run_decode."""
    (T, H), (K, E), I = x_TH.shape, (ids_TK.shape[1], gate_up_E2IH.shape[0]), down_EHI.shape[2]  # noqa: E741
    if T == 0 or E == 0:
        ns = n_shared(shared, I)
        return torch.zeros(T * (K + ns), H, dtype=torch.float32, device=x_TH.device)
    op = _operands(x_TH, ids_TK, gate_up_E2IH, down_EHI, shared, activation)
    g_const, d_const, x_TH, ns, N = op.gate_up[3], op.down[3], op.x_TH, op.ns, op.N
    slots = min(E + ns, N)  # at most this many distinct experts are used
    h_NI = torch.empty(N, I, dtype=x_TH.dtype, device=x_TH.device)
    out_NH = torch.empty(N, H, dtype=torch.float32, device=x_TH.device)
    tiles_u, tiles_d = triton.cdiv(I, cfg.block_i), triton.cdiv(H, cfg.block_ho)
    tr_up, tr_dn = trace_rows.buffers(trace, x_TH, ("up", slots * tiles_u), ("down", slots * tiles_d))
    xq, xs = act(x_TH) if act else (x_TH, x_TH)  # no act: xs never read
    x, ids, h = (xq, xq.stride(0)), (ids_TK, *ids_TK.stride()), (h_NI, h_NI.stride(0))
    dims = (N, K, E, H, I)
    _up_swiglu_kernel[(cfg.grid(slots, tiles_u),)](
        x, ids, op.gate_up_arg, (xs, xs.stride(0)), h, dims, tr_up,
        W8A8=act is not None, **g_const, TRACE=trace is not None,
        BLOCK_M=cfg.block_m, BLOCK_I=cfg.block_i, BLOCK_H=cfg.block_h, BLOCK_E=op.BLOCK_E, CHUNK_N=op.CHUNK_N,
        NUM_STAGES=cfg.num_stages, num_warps=cfg.num_warps, NS=ns, ACT=op.ACT, **pdl.launch_kw(x_TH.device, late=True))
    hq, hs = act(h_NI) if act else (h_NI, h_NI)
    _down_kernel[(cfg.grid(slots, tiles_d),)](
        (hq, hq.stride(0)), ids, (weights_TK, *weights_TK.stride()), op.down_arg, (out_NH, out_NH.stride(0)),
        (hs, hs.stride(0)), dims, tr_dn, W8A8=act is not None, **d_const, TRACE=trace is not None,
        BLOCK_M=cfg.block_m, BLOCK_HO=cfg.block_ho, BLOCK_I=cfg.block_id, BLOCK_E=op.BLOCK_E, CHUNK_N=op.CHUNK_N,
        NUM_STAGES=cfg.num_stages, num_warps=cfg.num_warps, NS=ns, **pdl.launch_kw(x_TH.device, late=True))
    return out_NH


_moe_decode_op = custom_op("dispatch::moe_decode", _moe_decode_impl, mutates_args=())


@_moe_decode_op.register_fake
def _(x_TH, weights_TK, ids_TK, gate_up_E2IH, down_EHI, shared_gate_up, shared_down, tile_ints, act):
    return torch.empty_like(x_TH)


no_backward(_moe_decode_op, "dispatch.kernels.gemv.moe_decode")


def moe_decode_torch(x_TH, weights_TK, ids_TK, gate_up_E2IH, down_EHI, *, shared=None,
                     activation: str = "silu") -> torch.Tensor:
    """Plain-PyTorch twin of :func:`moe_decode`: the same grouping and the same roundings.

    Rows grouped by expert (each used expert's weights read once); products accumulated in fp32;
    h rounded to x's dtype; weighted rows kept in fp32 and summed over k in order, cast once.
    ``shared``: the n shared experts (copies, :func:`dispatch.reference.shared_as_experts`) chosen by
    every token with weight 1 after its K; an id outside [0, E) still adds nothing.
    """
    T, K, E, H, I = check_experts_inputs(x_TH, weights_TK, ids_TK, gate_up_E2IH, down_EHI)
    sgu, sdn = check_shared(shared, x_TH, I)
    if sgu is None:
        return by_expert_torch(x_TH, weights_TK, ids_TK, gate_up_E2IH, down_EHI, activation=activation)
    gu, dn = shared_as_experts(sgu, sdn, I)
    n = gu.shape[0]
    ids = torch.where((ids_TK >= 0) & (ids_TK < E), ids_TK.long(), -1)  # must not alias a shared expert
    ids = torch.cat([ids, torch.arange(E, E + n, device=ids.device).expand(T, n)], dim=1)
    weights = torch.cat([weights_TK, weights_TK.new_ones(T, n)], dim=1)
    return by_expert_torch(x_TH, weights, ids, torch.cat([gate_up_E2IH, gu]), torch.cat([down_EHI, dn]),
                           activation=activation)


def by_expert_torch(x_TH, weights_TK, ids_TK, gate_up_E2IH, down_EHI, *, act=None,
                    row_dtype: torch.dtype = torch.float32, activation: str = "silu") -> torch.Tensor:
    """The twins' shared body (inputs already checked): per used expert, ``act(a)`` of each matmul
    input (default ``a.float()``) times the fp32 weights; h rounded to x's dtype; weighted routed
    rows stored in ``row_dtype``, then summed over k in order in fp32 and cast once to x's dtype.
    Ids outside [0, E) add nothing, as in the kernels."""
    act = act or (lambda a: a.float())
    T, K = ids_TK.shape
    E = gate_up_E2IH.shape[0]
    ids_N = ids_TK.reshape(-1)
    out_NH = torch.zeros(T * K, down_EHI.shape[1], dtype=torch.float32, device=x_TH.device)
    for e in torch.unique(ids_N).tolist():
        if not 0 <= e < E:
            continue
        rows = torch.nonzero(ids_N == e).flatten()
        h_MI = gated_act(F.linear(act(x_TH[rows // K]), gate_up_E2IH[e].float()), activation).to(x_TH.dtype)
        out_NH[rows] = F.linear(act(h_MI), down_EHI[e].float()) * weights_TK.reshape(-1)[rows, None].float()
    return combine_torch(out_NH.to(row_dtype), K, ids_TK=ids_TK, num_experts=E, dtype=x_TH.dtype)


def decode_loop_torch(x_TH, weights_TK, ids_TK, gate_up_E2IH, down_EHI, *, activation: str = "silu") -> torch.Tensor:
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
            y_TH[t] += (gated_expert(x_TH[t:t + 1], gate_up_E2IH[e], down_EHI[e], activation)[0]
                        * weights_TK[t, k]).float()
    return y_TH.to(x_TH.dtype)


def expert_bytes_read(ids_TK: torch.Tensor, H: int, I: int, itemsize: int) -> int:  # noqa: E741
    """Bytes of expert weights one decode step must read: distinct experts x 3·H·I x itemsize."""
    return int(torch.unique(ids_TK).numel()) * 3 * H * I * itemsize
