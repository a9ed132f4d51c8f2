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
