"""Tile configs must fit the GPU they run on: the persistent kernel's H200 tiles shrink on a T4."""
import pytest

import dispatch  # noqa: F401
from dispatch.kernels.gemm_config import GemmConfig, shared_bytes
from dispatch.kernels.persistent import fit_shared

T4, H200 = 64 * 1024, 227 * 1024  # max shared memory per block (bytes)


@pytest.mark.parametrize("block_m", [16, 32, 64, 128])
@pytest.mark.parametrize("n_b_tiles,block_n", [(2, 128), (1, 256)])  # up (gate + up tiles), down
def test_fit_shared(block_m, n_b_tiles, block_n):
    cfg = GemmConfig(block_m, block_n, 64, 8, 3)
    assert fit_shared(cfg, n_b_tiles, H200) == cfg  # the measured H200 tiles are kept as they are
    small = fit_shared(cfg, n_b_tiles, T4)
    assert shared_bytes(small.block_m, small.block_n, small.block_k, small.num_stages, n_b_tiles, 2) <= T4
    assert small.block_m == block_m  # rows per block are the sort's contract: never changed
    # hand check of the formula: stages · (BM·BK + tiles·BN·BK) · 2 bytes
    assert shared_bytes(64, 128, 64, 3, 2, 2) == 3 * (64 * 64 + 2 * 128 * 64) * 2 == 122880


@pytest.mark.parametrize("block_m", [16, 32, 64])
@pytest.mark.parametrize("base", ["FEW_EXPERTS", "MANY_EXPERTS"])
def test_decode_tiles_fit(block_m, base):
    from dataclasses import replace

    from dispatch.kernels import gemv

    cfg = replace(getattr(gemv, base), block_m=block_m)
    assert gemv.fit_shared(cfg, H200) == cfg  # the tiles tuned on the H200 stay as they are
    small = gemv.fit_shared(cfg, T4)
    assert gemv.shared_bytes(small) <= T4 - 8 * 1024 and small.block_m == block_m
    # hand check: 3 stages · (16·256 + 2·32·256) · 2 bytes for the up kernel of FEW_EXPERTS
    assert gemv.shared_bytes(replace(gemv.FEW_EXPERTS, block_m=16)) == 3 * (16 * 256 + 2 * 32 * 256) * 2
