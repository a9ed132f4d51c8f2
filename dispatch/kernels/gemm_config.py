"""Tile configurations of the grouped GEMMs: one pinned config, or autotuning keyed on shape.

A :class:`GemmConfig` pins every tile size. Pinning matters beyond speed: with a fixed config,
each sorted row's result depends only on that row (a row-blocked GEMM with a fixed K-loop order),
so a row computed alone and in a batch of many is bitwise identical. Expert parallelism relies on it.

Without a config, ``BLOCK_M`` is picked from the token count (it fixes how rows are sorted into
blocks, so it is chosen before the sort) and ``triton.autotune`` picks BLOCK_N / BLOCK_K / warps /
stages, keyed on (next power of two of N, H, I, BLOCK_M). Configs that do not fit the device's
shared memory are pruned, and small ones (BLOCK_K 32, 2 stages) keep a T4 (sm_75, 64 KiB) covered.
Under Triton's interpreter there is no autotuning: one small fixed config.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from dispatch import runtime


@dataclass(frozen=True)
class GemmConfig:
    """Tile sizes of one grouped-GEMM launch (rows BLOCK_M × columns BLOCK_N, K step BLOCK_K)."""

    block_m: int = 64
    block_n: int = 64
    block_k: int = 64
    num_warps: int = 4
    num_stages: int = 3

    def __post_init__(self):
        for name in ("block_m", "block_n", "block_k"):
            v = getattr(self, name)
            if not isinstance(v, int) or v < 16 or v & (v - 1):
                raise ValueError(f"GemmConfig.{name} must be a power of two >= 16, got {v!r}")
        if self.num_warps not in (1, 2, 4, 8, 16):
            raise ValueError(f"GemmConfig.num_warps must be 1, 2, 4, 8 or 16, got {self.num_warps!r}")
        if not isinstance(self.num_stages, int) or self.num_stages < 1:
            raise ValueError(f"GemmConfig.num_stages must be a positive int, got {self.num_stages!r}")


# The interpreter runs numpy per program: small tiles keep CPU tests fast.
INTERPRET_CONFIG = GemmConfig(block_m=16, block_n=32, block_k=32, num_warps=4, num_stages=1)


def next_pow2(n: int) -> int:
    return 1 << max(0, int(n) - 1).bit_length()


def pick_block_m(num_rows: int, num_experts: int, dev: torch.device) -> int:
    """Rows per block: larger blocks when each expert gets many rows (fewer, fuller tiles)."""
    if runtime.INTERPRET or dev.type != "cuda":
        return INTERPRET_CONFIG.block_m
    rows_per_expert = num_rows / max(1, num_experts)
    if rows_per_expert >= 256 and (runtime.capability(dev) or (0, 0)) >= (8, 0):
        return 128
    return 64 if rows_per_expert >= 32 else 16 if rows_per_expert < 8 else 32


def _cfg(bn, bk, w, s):
    import triton

    return triton.Config({"BLOCK_N": bn, "BLOCK_K": bk}, num_warps=w, num_stages=s)


def autotune_configs(kind: str) -> list:
    """Candidate configs: Hopper/Ampere-friendly ones plus small ones that fit an sm_75 T4."""
    if kind == "up":  # two accumulators (gate and up): BLOCK_N 128 is a 256-wide product
        return [_cfg(128, 64, 8, 4), _cfg(128, 64, 8, 3), _cfg(256, 64, 8, 3), _cfg(64, 64, 4, 4),
                _cfg(64, 32, 4, 2), _cfg(32, 32, 4, 2)]
    return [_cfg(256, 64, 8, 3), _cfg(128, 64, 8, 3), _cfg(128, 64, 4, 4), _cfg(64, 64, 4, 4),
            _cfg(64, 32, 4, 2), _cfg(32, 32, 4, 2)]


def shared_bytes(block_m: int, block_n: int, block_k: int, stages: int, n_b_tiles: int, elt: int) -> int:
    """Shared memory of the pipelined A and B tiles (what decides whether a config fits)."""
    return stages * (block_m * block_k + n_b_tiles * block_n * block_k) * elt


def make_pruner(n_b_tiles: int):
    """An ``early_config_prune`` that drops configs over the device's shared memory, and configs
    whose fp32 accumulators need more than 128 registers a thread (they spill: on the H200 the up
    kernel with BLOCK_M=128, BLOCK_N=128 and 4 warps ran 5x slower than with 8 warps)."""

    def prune(configs, named_args, **kwargs):
        bm = kwargs.get("BLOCK_M", named_args.get("BLOCK_M", 64))
        elt = 2
        limit = runtime.max_shared_bytes()
        kept = [c for c in configs
                if shared_bytes(bm, c.kwargs["BLOCK_N"], c.kwargs["BLOCK_K"], max(c.num_stages, 1), n_b_tiles, elt)
                <= limit and bm * c.kwargs["BLOCK_N"] * n_b_tiles <= 128 * 32 * c.num_warps]
        if not kept:  # keep the smallest so something always runs
            kept = [min(configs, key=lambda c: c.kwargs["BLOCK_N"] * c.kwargs["BLOCK_K"] * max(c.num_stages, 1))]
        return kept

    return prune
