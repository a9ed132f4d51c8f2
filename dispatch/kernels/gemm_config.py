"""Moved to :mod:`dispatch.kernels.tiles` (the one tile policy). This alias keeps old imports working
until every caller imports ``tiles``; it defines nothing of its own."""
from dispatch.kernels.tiles import INTERPRET_CONFIG, GemmConfig, next_pow2, pick_block_m  # noqa: F401
