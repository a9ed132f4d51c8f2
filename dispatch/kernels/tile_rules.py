"""The heuristics' guesses: the tiles :func:`dispatch.kernels.tiles.resolve` falls back to without a
table (the configs and what fits a device: :mod:`dispatch.kernels.tile_configs`).

    pick_block_m, heuristic_gemm                  the grouped GEMM without a table (an H200 sweep's winners)
    heuristic_decode                              the decode kernels without a table
    heuristic_quant_gemm                          quantized experts: pinned grouped tiles
    heuristic_dense                               the decode step's dense GEMV (``linear_small``)
    invariant_dense                               its one config of batch-invariant mode, for every M

On Triton's interpreter (CPU tests) every heuristic answers with small fixed tiles (``INTERPRET_*``).
"""
from __future__ import annotations

import functools
from dataclasses import replace

import torch
import triton

from dispatch import runtime
from dispatch.kernels.tile_configs import (
    FEW_EXPERTS,
    HEADROOM,
    INTERPRET_CONFIG,
    INTERPRET_DECODE,
    MANY_EXPERTS,
    DecodeConfig,
    DenseGemvConfig,
    GemmConfig,
    fit_shared,
    fits_registers,
)
from dispatch.schemes import W8A8_GROUP


def interpreting(dev: torch.device) -> bool:
    """True where kernels run under Triton's interpreter (then the small fixed ``INTERPRET_*`` tiles)."""
    return runtime.INTERPRET or torch.device(dev).type != "cuda"


def next_pow2(n: int) -> int:
    return 1 << max(0, int(n) - 1).bit_length()


# ---- heuristics (unknown devices and shapes) ----

def pick_block_m(num_rows: int, num_experts: int, dev: torch.device) -> int:
    """Rows per block: larger blocks when each expert gets many rows (fewer, fuller tiles)."""
    if interpreting(dev):
        return INTERPRET_CONFIG.block_m
    rows_per_expert = num_rows / max(1, num_experts)
    if rows_per_expert >= 256 and (runtime.capability(dev) or (0, 0)) >= (8, 0):
        return 128
    return 64 if rows_per_expert >= 32 else 16 if rows_per_expert < 8 else 32


def heuristic_gemm(kind: str, block_m: int, dev: torch.device) -> GemmConfig:
    """Tiles for block_m rows without a table: the H200 sweep's winners, shrunk to the device."""
    if interpreting(dev):
        return replace(INTERPRET_CONFIG, block_m=block_m)
    return _heuristic_gemm(kind, block_m, runtime.max_shared_bytes(dev))


@functools.lru_cache(maxsize=None)  # launchers ask on every call: a lookup, not a computation
def _heuristic_gemm(kind: str, block_m: int, limit: int) -> GemmConfig:
    n_b = 2 if kind == "up" else 1
    if block_m <= 32:  # few rows per expert: weight-bandwidth bound, long K steps
        cfg = GemmConfig(block_m, 64, 128, 4, 3)
    elif kind == "up":
        cfg = GemmConfig(block_m, 128, 64, 8, 4 if block_m >= 128 else 3, 8 if block_m >= 128 else 1)
    else:
        cfg = GemmConfig(block_m, 256 if block_m <= 128 else 128, 64, 8, 3, 8 if block_m >= 128 else 1)
    while not fits_registers(cfg, n_b) and cfg.block_n > 32:
        cfg = replace(cfg, block_n=cfg.block_n // 2)
    return fit_shared(cfg, limit, n_b)


def heuristic_decode(T: int, K: int, E: int, H: int, I: int, dev: torch.device) -> DecodeConfig:  # noqa: E741
    """``MANY_EXPERTS`` (2 programs per SM) once min(E, T·K) used experts × I/64 tiles reach 4 waves
    of the SMs, else ``FEW_EXPERTS`` (8 per SM); block_m covers about twice the mean rows per expert
    (T·K/E), so one tl.dot pass usually takes all of an expert's rows and its weights are streamed once."""
    if interpreting(dev):
        return INTERPRET_DECODE
    return _heuristic_decode(T, K, E, I, runtime.num_sms(dev), runtime.max_shared_bytes(dev))


@functools.lru_cache(maxsize=4096)
def _heuristic_decode(T: int, K: int, E: int, I: int, sms: int, limit: int) -> DecodeConfig:  # noqa: E741
    many = min(E, T * K) * -(-I // 64) >= 4 * sms
    base = MANY_EXPERTS if many else FEW_EXPERTS
    block_m = min(64, max(16, next_pow2(-(-2 * T * K // E))))
    return fit_shared(replace(base, block_m=block_m, programs=(2 if many else 8) * sms), limit)


# ---- quantized experts ----

def heuristic_quant_gemm(T: int, K: int, E: int, dev: torch.device, w8a8: bool, late: bool = False) -> GemmConfig:
    """Pinned grouped tiles on 8-bit codes (``late``: the weights have one scale per row). The
    interpreter's small config on CPU. On a GPU, blocks of 64+ rows: w8a16 128 columns, 8 warps, 3
    stages, K steps of 64 (per row) or 128 (block scales, weight-first); w8a8 with block scales 64
    columns (each chunk's scaled product needs a second accumulator's registers, which 128 columns
    would spill); w8a8 per row 128 columns, K steps of 128, 8 warps, 3 stages (8 warps keep 128-column
    accumulators in registers). Thinner blocks: 64 columns, 4 warps. Pipeline stages shrunk to the
    device's shared memory. ``python -m dispatch.tune --quant`` replaces these with measured tiles per GPU."""
    if interpreting(dev):
        return replace(INTERPRET_CONFIG, block_k=W8A8_GROUP) if w8a8 else INTERPRET_CONFIG
    bm = pick_block_m(T * K, E, dev)
    bk = 64 if late and not w8a8 else W8A8_GROUP
    if bm < 64:
        cfg = GemmConfig(block_m=bm, block_n=64, block_k=W8A8_GROUP if w8a8 else 64, num_warps=4, num_stages=4)
    elif w8a8 and not late:
        cfg = GemmConfig(block_m=bm, block_n=64, block_k=bk, num_warps=8, num_stages=4)
    else:
        cfg = GemmConfig(block_m=bm, block_n=128, block_k=bk, num_warps=8, num_stages=3, group_m=8)
    budget = runtime.max_shared_bytes(dev) - HEADROOM
    act_bytes = 1 if w8a8 else 2
    while cfg.num_stages > 1 and cfg.num_stages * (bm * act_bytes + 2 * cfg.block_n) * cfg.block_k > budget:
        cfg = replace(cfg, num_stages=cfg.num_stages - 1)
    return cfg


# ---- the decode step's dense GEMV ----

DENSE_CPU_SMS = 132  # the heuristic on CPU sizes grids as for an H100/H200 (132 SMs)
DENSE_PROGRAMS_PER_SM = 2


def heuristic_dense(M: int, N: int, K: int, device, itemsize: int = 2) -> DenseGemvConfig:
    """At M = 1: 4 rows of W a program and the whole K (up to 2048) in one load — the fastest of
    nine candidates at all three of OLMoE's projection shapes on an H200 (``python -m
    dispatch_book.bench step_kernels``). At M = 2..16 (tl.dot): the widest row tile (16..128) that
    still gives >= 2 programs per SM, W tiles of 8K elements. Up to 3 stages when K takes several
    steps, as many as fit shared memory (``itemsize``: bytes of x's dtype). Depends on M only
    through M == 1, so a row's result is the same at every M in 2..16."""
    dev = torch.device(device)
    sms = runtime.num_sms(dev) if dev.type == "cuda" else DENSE_CPU_SMS
    lo, n = (4, 4) if M <= 1 else (16, 128)
    while n > lo and triton.cdiv(N, n) < DENSE_PROGRAMS_PER_SM * sms:
        n //= 2
    return _dense_tiles(n, K, M, dev, itemsize)


def _dense_tiles(n: int, K: int, M: int, dev: torch.device, itemsize: int) -> DenseGemvConfig:
    """Row tile ``n``, W tiles of 8K elements, 3 stages where K takes several steps (fewer where
    shared memory runs out)."""
    k = max(16, min(8192 // n, triton.next_power_of_2(max(K, 1))))
    stages = 1 if K <= k else 3
    limit = runtime.max_shared_bytes(dev) - HEADROOM if dev.type == "cuda" else 1 << 30
    cfg = DenseGemvConfig(block_n=n, block_k=k, num_warps=4, num_stages=stages)
    while cfg.num_stages > 1 and cfg.shared_bytes(M, itemsize) > limit:
        cfg = replace(cfg, num_stages=cfg.num_stages - 1)
    return cfg


def invariant_dense(N: int, K: int, device, itemsize: int = 2) -> DenseGemvConfig:
    """The one config of batch-invariant mode for a [N, K] weight, whatever the rows: on a GPU the
    widest row tile (16..128) that still gives one program per two SMs at one 16-row tile (a step of
    2..64 rows has up to 4 of them: more programs, each reusing its W tile from L2 across them), W
    tiles of 8K elements. On OLMoE's shapes on an H100 this is the fastest config at 1 and 64 rows
    together among ``DENSE_CONFIGS`` (the ``invariant_projection`` rows of ``python -m
    dispatch_book.bench step_kernels``): the QKV weight takes 64-row tiles, where a row tile of 16
    (enough programs at one row) is 2x slower at 64 rows. Under the interpreter wide tiles and the
    whole K in one step (few programs: the interpreter pays per program and per op)."""
    dev = torch.device(device)
    if dev.type == "cuda":
        n = 128
        while n > 16 and 2 * triton.cdiv(N, n) < runtime.num_sms(dev):
            n //= 2
        return _dense_tiles(n, K, 16, dev, itemsize)
    return DenseGemvConfig(block_n=64, block_k=max(16, min(1024, triton.next_power_of_2(max(K, 1)))), num_stages=1)
