"""A peer for the kernels race: a fused-MoE Triton kernel of vLLM's design, written here from scratch.

The design (vLLM's ``fused_moe``): align the routed rows per expert first — ``sorted_ids`` lists the
routed rows n = t·K + k expert by expert, each expert's run padded to BLOCK_M with the value N, and
``expert_ids`` names the expert of each BLOCK_M block — then ONE kernel per projection: program
(block m, column tile n), after a GROUP_M swizzle, gathers its rows of A (x[n // K] for the up
projection, the activated rows for the down one), multiplies by its expert's weight tile, optionally
scales by the routing weight, and writes rows back at n. The up projection writes the whole 2I-wide
gate|up product; one fused SiLU·mul kernel runs between the two (vLLM's ``silu_and_mul``), and the K
rows of a token are summed at the end. One tile config serves both projections, as in vLLM.

Tile configs (BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, warps, stages): the race tunes them per size
(:mod:`dispatch_book.bench.peer_search`: vLLM's shipped tables, then its tuner's grid); ``CONFIGS``
are 14 from the region vLLM's tuned H100/H200 tables use, seeds of that search. The alignment step
(``align``) is excluded from the peer's time, as in the recorded race.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

# (BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, warps, stages)
CONFIGS = ((16, 64, 128, 1, 4, 3), (16, 128, 128, 1, 4, 3), (16, 64, 64, 1, 4, 4), (32, 64, 128, 1, 4, 3),
           (32, 128, 64, 16, 4, 4), (64, 64, 64, 8, 4, 4), (64, 128, 64, 1, 4, 3), (64, 128, 128, 16, 8, 3),
           (64, 256, 64, 16, 8, 3), (128, 128, 64, 16, 8, 3), (128, 256, 64, 16, 8, 3), (128, 128, 128, 16, 8, 3),
           (128, 64, 64, 1, 4, 4), (256, 128, 64, 16, 8, 3))


@triton.jit
def _fused_moe_kernel(a_ptr, b_ptr, c_ptr, wt_ptr, sorted_ids_ptr, expert_ids_ptr, used_ptr,
                      N, KD, EM, num_valid, top_k, s_am, s_ak, s_be, s_bn, s_bk, s_cm, s_cn,
                      BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                      GROUP_M: tl.constexpr, MUL_WEIGHT: tl.constexpr):
    pid = tl.program_id(0)
    num_m, num_n = tl.cdiv(EM, BLOCK_M), tl.cdiv(N, BLOCK_N)
    group = GROUP_M * num_n
    first = (pid // group) * GROUP_M
    rows = tl.minimum(num_m - first, GROUP_M)
    pid_m = first + (pid % group) % rows
    pid_n = (pid % group) // rows
    if pid_m * BLOCK_M >= tl.load(used_ptr):
        return
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    n_M = tl.load(sorted_ids_ptr + offs_m)
    mask_m = n_M < num_valid
    e = tl.load(expert_ids_ptr + pid_m).to(tl.int64)
    offs_n = (pid_n * BLOCK_N + tl.arange(0, BLOCK_N)) % N
    offs_k = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + (n_M // top_k).to(tl.int64)[:, None] * s_am + offs_k[None, :] * s_ak
    b_ptrs = b_ptr + e * s_be + offs_k[:, None] * s_bk + offs_n[None, :] * s_bn
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, tl.cdiv(KD, BLOCK_K)):
        mask_k = offs_k < KD - k0 * BLOCK_K
        a = tl.load(a_ptrs, mask=mask_m[:, None] & mask_k[None, :], other=0.0)
        b = tl.load(b_ptrs, mask=mask_k[:, None], other=0.0)
        acc = tl.dot(a, b, acc)
        a_ptrs += BLOCK_K * s_ak
        b_ptrs += BLOCK_K * s_bk
    if MUL_WEIGHT:
        acc = acc * tl.load(wt_ptr + n_M, mask=mask_m, other=0.0)[:, None]
    offs_cn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    c_ptrs = c_ptr + n_M.to(tl.int64)[:, None] * s_cm + offs_cn[None, :] * s_cn
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=mask_m[:, None] & (offs_cn[None, :] < N))


@triton.jit
def _silu_mul_kernel(gu_ptr, h_ptr, I, s_g, s_h, BLOCK: tl.constexpr):
    """Row n, columns [j·BLOCK, (j+1)·BLOCK): h = silu(gate) · up, in fp32, stored in h's dtype."""
    n, j = tl.program_id(0).to(tl.int64), tl.program_id(1)
    offs = j * BLOCK + tl.arange(0, BLOCK)
    mask = offs < I
    gate = tl.load(gu_ptr + n * s_g + offs, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(gu_ptr + n * s_g + I + offs, mask=mask, other=0.0).to(tl.float32)
    tl.store(h_ptr + n * s_h + offs, (gate * tl.sigmoid(gate) * up).to(h_ptr.dtype.element_ty), mask=mask)


def silu_and_mul(gu_N2I: torch.Tensor) -> torch.Tensor:
    """h_NI = silu(gate) · up of a gate|up product [N, 2I] (rows contiguous), one launch."""
    if gu_N2I.dim() != 2 or gu_N2I.shape[1] % 2 or gu_N2I.stride(1) != 1:
        raise ValueError(f"gu_N2I must be [N, 2I] with unit column stride, got {tuple(gu_N2I.shape)} "
                         f"strides {gu_N2I.stride()}")
    N, I = gu_N2I.shape[0], gu_N2I.shape[1] // 2  # noqa: E741
    h_NI = torch.empty(N, I, device=gu_N2I.device, dtype=gu_N2I.dtype)
    if N:
        block = min(1024, triton.next_power_of_2(I))
        _silu_mul_kernel[(N, triton.cdiv(I, block))](gu_N2I, h_NI, I, gu_N2I.stride(0), h_NI.stride(0), BLOCK=block)
    return h_NI


def silu_and_mul_torch(gu_N2I: torch.Tensor) -> torch.Tensor:
    """Plain-PyTorch twin of :func:`silu_and_mul` (fp32 math, one rounding)."""
    gate, up = gu_N2I.float().chunk(2, dim=-1)
    return (F.silu(gate) * up).to(gu_N2I.dtype)


def align(ids_TK: torch.Tensor, E: int, block_m: int):
    """(sorted_ids [EM], expert_ids [EM / block_m], used_1): routed rows per expert, padded to block_m
    (padding holds N); EM = N + E·(block_m − 1) rounded up to block_m, the most any routing needs."""
    ids_N = ids_TK.reshape(-1).long()
    N = ids_N.numel()
    counts = torch.bincount(ids_N, minlength=E)
    padded = (counts + block_m - 1) // block_m * block_m
    ends = torch.cumsum(padded, 0)
    EM = triton.cdiv(N + E * (block_m - 1), block_m) * block_m
    order = torch.argsort(ids_N, stable=True)
    e_sorted = ids_N[order]
    first_of = torch.cumsum(counts, 0) - counts
    pos = (ends - padded)[e_sorted] + torch.arange(N, device=ids_N.device) - first_of[e_sorted]
    sorted_ids = torch.full((EM,), N, dtype=torch.int32, device=ids_N.device)
    sorted_ids[pos] = order.to(torch.int32)
    blocks = torch.arange(EM // block_m, device=ids_N.device) * block_m
    expert_ids = torch.searchsorted(ends, blocks, right=True).clamp_max(E - 1).to(torch.int32)
    return sorted_ids, expert_ids, ends[-1:].to(torch.int32)


def _gemm(a, b_ENK, c, wts, aligned, top_k, cfg, mul_weight):
    sorted_ids, expert_ids, used = aligned
    bm, bn, bk, gm, warps, stages = cfg
    N, KD = b_ENK.shape[1], b_ENK.shape[2]
    grid = (triton.cdiv(sorted_ids.numel(), bm) * triton.cdiv(N, bn),)
    _fused_moe_kernel[grid](a, b_ENK, c, wts, sorted_ids, expert_ids, used, N, KD, sorted_ids.numel(),
                            c.shape[0], top_k, *a.stride(), *b_ENK.stride(), *c.stride(), BLOCK_M=bm,
                            BLOCK_N=bn, BLOCK_K=bk, GROUP_M=gm, MUL_WEIGHT=mul_weight, num_warps=warps,
                            num_stages=stages)


def fused_moe(x_TH, weights_TK, ids_TK, gate_up_E2IH, down_EHI, aligned, cfg) -> torch.Tensor:
    """y_TH: up GEMM (2I wide) → SiLU·mul → down GEMM × routing weight → sum of each token's K rows."""
    T, K = ids_TK.shape
    I = down_EHI.shape[2]  # noqa: E741
    gu_N2I = torch.empty(T * K, 2 * I, device=x_TH.device, dtype=x_TH.dtype)
    wts_N = weights_TK.reshape(-1).float()
    _gemm(x_TH, gate_up_E2IH, gu_N2I, wts_N, aligned, K, cfg, False)
    h_NI = silu_and_mul(gu_N2I)
    out_NH = torch.empty(T * K, down_EHI.shape[1], device=x_TH.device, dtype=x_TH.dtype)
    _gemm(h_NI, down_EHI, out_NH, wts_N, aligned, 1, cfg, True)
    return out_NH.view(T, K, -1).sum(dim=1)


def warm(configs, H: int = 2048, I: int = 1024, E: int = 64, K: int = 8) -> None:  # noqa: E741
    """Compile each config of ``configs`` (both GEMMs and the activation; T = 1 and 16 specialise as
    every size does: T·K a multiple of 16 or not)."""
    dev, dt = torch.device("cuda"), torch.bfloat16
    gate_up, down = torch.zeros(E, 2 * I, H, device=dev, dtype=dt), torch.zeros(E, H, I, device=dev, dtype=dt)
    for T in (1, 16):
        x, w = torch.zeros(T, H, device=dev, dtype=dt), torch.ones(T, K, device=dev)
        ids = torch.arange(T * K, device=dev).view(T, K) % E
        for c in configs:
            try:
                fused_moe(x, w, ids, gate_up, down, align(ids, E, c[0]), tuple(c))
            except Exception:  # noqa: BLE001, S112 - the race skips a config this GPU cannot hold
                continue
    torch.cuda.synchronize()


def precompile(configs, workers: int = 7) -> None:
    """Compile ``configs`` in parallel processes (Triton's disk cache), before the race times any. The
    configs compiled into the cache are listed inside it (``peer_configs.json``) and not compiled again:
    a later run on the same cache starts no workers for them."""
    import json
    import os
    import pathlib
    import subprocess
    import sys

    cache = os.environ.get("TRITON_CACHE_DIR") or str(pathlib.Path.home() / ".triton" / "cache")  # Triton's default
    note = pathlib.Path(cache) / "peer_configs.json"
    done = {tuple(c) for c in json.loads(note.read_text())} if note.is_file() else set()
    configs = [list(c) for c in dict.fromkeys(tuple(c) for c in configs) if c not in done]
    code = "import json, sys; from dispatch_book.bench.peers import warm; warm(json.loads(sys.argv[1]))"
    procs = [subprocess.Popen([sys.executable, "-c", code, json.dumps(configs[w::workers])])
             for w in range(min(workers, len(configs)))]
    if all(p.wait() == 0 for p in procs) and configs:
        note.parent.mkdir(parents=True, exist_ok=True)
        note.write_text(json.dumps(sorted(done | {tuple(c) for c in configs})))
