"""What a tile config is, the named configs, and what fits a device: the types and limits the rules of
:mod:`dispatch.kernels.tile_rules` and the resolver :func:`dispatch.kernels.tiles.resolve` work with.

    GemmConfig / DecodeConfig / DenseGemvConfig   the launch configs (frozen, validated)
    INTERPRET_*, FEW_EXPERTS, MANY_EXPERTS        the named configs the decode and interpreter rules pick
    DENSE_CONFIGS                                 the dense GEMV's sweep candidates
    shared_bytes, fits_registers, fit_shared      what fits: the pipeline's shared memory, accumulators
    chunk_fits, fit_scheme, fit_w8a8              quantized experts: chunks inside the scale blocks,
                                                  w8a8's 16-row three-launch form
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from dispatch.schemes import W8A8_GROUP

HEADROOM = 8 * 1024  # shared memory left to Triton's own scratch (layout conversions, barriers)


def _pow2(cls, obj, names, one=()):
    """Each of ``names`` a power of two >= 16 (those in ``one`` may also be 1); warps and stages in range."""
    for name in names:
        v = getattr(obj, name)
        if not (name in one and v == 1) and (not isinstance(v, int) or v < 16 or v & (v - 1)):
            raise ValueError(f"{cls}.{name} must be {'1 or ' if name in one else ''}a power of two >= 16, got {v!r}")
    if obj.num_warps not in (1, 2, 4, 8, 16):
        raise ValueError(f"{cls}.num_warps must be 1, 2, 4, 8 or 16, got {obj.num_warps!r}")
    if not isinstance(obj.num_stages, int) or not 1 <= obj.num_stages <= 8:
        raise ValueError(f"{cls}.num_stages must be an int in [1, 8], got {obj.num_stages!r}")


@dataclass(frozen=True)
class GemmConfig:
    """Tiles of one grouped-GEMM launch: BLOCK_M rows × BLOCK_N columns, K step BLOCK_K; ``group_m``
    blocks share a column sweep (programs launched together reuse x rows and weight tiles in L2)."""

    block_m: int = 64
    block_n: int = 64
    block_k: int = 64
    num_warps: int = 4
    num_stages: int = 3
    group_m: int = 1

    def __post_init__(self):
        _pow2("GemmConfig", self, ("block_m", "block_n", "block_k"))
        if not isinstance(self.group_m, int) or self.group_m < 1:
            raise ValueError(f"GemmConfig.group_m must be a positive int, got {self.group_m!r}")


@dataclass(frozen=True)
class DecodeConfig:
    """Tiles of the three decode kernels (powers of two >= 16: tl.dot needs 16; ``block_m`` = 1: one
    row at a time by FMAs on the CUDA cores, no tensor-core padding, for one token)."""

    block_m: int = 16  # routed rows of one expert per tl.dot (padded), or 1 (FMAs)
    block_i: int = 32  # gate/up rows (of I) per up-kernel tile
    block_h: int = 256  # H chunk of the up kernel's reduction loop
    block_ho: int = 32  # down rows (of H) per down-kernel tile
    block_id: int = 128  # I chunk of the down kernel's reduction loop
    num_warps: int = 4
    num_stages: int = 3
    programs: int = 1024  # the grid of each kernel; a program loops over (expert, tile) items
    fused: int = 0  # 0: three launches; n ≥ 1: one (dispatch.kernels.decode_fused), down items n slots behind
    split: int = 0  # 1: one launch of split items (dispatch.kernels.decode_split: block_i, block_h, block_ho)

    def __post_init__(self):
        _pow2("DecodeConfig", self, ("block_m", "block_i", "block_h", "block_ho", "block_id"), one=("block_m",))
        if not isinstance(self.fused, int) or self.fused < 0:
            raise ValueError(f"DecodeConfig.fused must be 0 (three launches) or the lag n ≥ 1 of one launch, "
                             f"got {self.fused!r}")
        if self.split not in (0, 1) or isinstance(self.split, bool) or (self.split and self.fused):
            raise ValueError(f"DecodeConfig.split must be 0 or 1 (split items), and 1 only with fused=0; "
                             f"got split={self.split!r}, fused={self.fused!r}")
        if not isinstance(self.programs, int) or self.programs < 1:
            raise ValueError(f"DecodeConfig.programs must be a positive int, got {self.programs!r}")

    def grid(self, slots: int, tiles: int) -> int:
        """Programs of one decode kernel: ``programs``, or fewer when at most slots × tiles items exist."""
        return max(1, min(self.programs, slots * tiles))


@dataclass(frozen=True)
class DenseGemvConfig:
    """Launch config of ``dense_gemv.linear_small``: ``block_n`` rows of W per program, K step
    ``block_k`` (powers of two; the tl.dot variant uses max(block_n, 16) rows), warps and stages."""

    block_n: int = 16
    block_k: int = 256
    num_warps: int = 4
    num_stages: int = 3

    def __post_init__(self):
        for name, low in (("block_n", 1), ("block_k", 16)):
            v = getattr(self, name)
            if not isinstance(v, int) or v < low or v & (v - 1):
                raise ValueError(f"DenseGemvConfig.{name} must be a power of two >= {low}, got {v!r}")
        if self.num_warps not in (1, 2, 4, 8, 16):
            raise ValueError(f"DenseGemvConfig.num_warps must be 1, 2, 4, 8 or 16, got {self.num_warps!r}")
        if not isinstance(self.num_stages, int) or not 1 <= self.num_stages <= 8:
            raise ValueError(f"DenseGemvConfig.num_stages must be an int in [1, 8], got {self.num_stages!r}")

    def rows(self, M: int) -> int:
        """Rows of W one program owns at M input rows (tl.dot needs 16)."""
        return self.block_n if M <= 1 else max(self.block_n, 16)

    def shared_bytes(self, M: int, itemsize: int) -> int:
        """Shared memory of the pipelined loop: stages × (x tile + W tile)."""
        x_rows = 1 if M <= 1 else 16
        return self.num_stages * (x_rows + self.rows(M)) * self.block_k * itemsize


# The interpreter runs numpy per program: small tiles keep CPU tests fast. One policy for both families.
INTERPRET_CONFIG = GemmConfig(block_m=16, block_n=32, block_k=32, num_warps=4, num_stages=1)
INTERPRET_DECODE = DecodeConfig(block_i=16, block_h=32, block_ho=16, block_id=32, num_stages=1)
# Batch-invariant mode under the interpreter: wide tiles (a whole expert of the small CPU model in one
# item), as few programs and interpreted ops as possible; one config for every T, so row-invariant.
INVARIANT_INTERPRET_DECODE = DecodeConfig(block_m=16, block_i=64, block_h=128, block_ho=128, block_id=64,
                                          num_stages=1)
# Decode heuristics: thin tiles and many programs while few experts are
# used; wider tiles and 2 programs per SM once the used experts alone give several waves of tiles.
# On another GPU the grid scales with its SMs (8 and 2 per SM): a grid of whole waves.
FEW_EXPERTS = DecodeConfig(block_i=32, block_h=256, block_ho=32, block_id=128, num_stages=3, programs=1056)
MANY_EXPERTS = DecodeConfig(block_i=64, block_h=128, block_ho=64, block_id=128, num_stages=3, programs=264)
# The dense GEMV (``linear_small``): candidates for a GPU sweep (M = 1 and M = 8, OLMoE's K = 2048), the
# heuristic's picks among them: whole rows in one step, thin and wide W tiles (4K-8K elements), shallow
# and deep pipelines.
DENSE_CONFIGS = (
    DenseGemvConfig(block_n=4, block_k=2048, num_warps=4, num_stages=1),
    DenseGemvConfig(block_n=4, block_k=1024, num_warps=4, num_stages=3),
    DenseGemvConfig(block_n=8, block_k=512, num_warps=4, num_stages=3),
    DenseGemvConfig(block_n=16, block_k=256, num_warps=4, num_stages=3),
    DenseGemvConfig(block_n=16, block_k=512, num_warps=4, num_stages=3),
    DenseGemvConfig(block_n=32, block_k=256, num_warps=8, num_stages=3),
    DenseGemvConfig(block_n=64, block_k=64, num_warps=4, num_stages=3),
    DenseGemvConfig(block_n=64, block_k=128, num_warps=4, num_stages=3),
    DenseGemvConfig(block_n=128, block_k=64, num_warps=4, num_stages=3),
)


# ---- what fits: shared memory (both families) and accumulator registers ----

def shared_bytes(cfg, n_b_tiles: int = 1, elt: int = 2) -> int:
    """Shared memory of the software pipeline: ``num_stages`` copies of the tiles one K step loads.
    GEMM: the A tile and ``n_b_tiles`` weight tiles (up: gate and up, 2; down: 1). Decode: the larger
    of the up kernel (x, gate, up chunks over H) and the down kernel (h, down chunks over I)."""
    if isinstance(cfg, GemmConfig):
        per_stage = cfg.block_m * cfg.block_k + n_b_tiles * cfg.block_n * cfg.block_k
    else:
        per_stage = max(cfg.block_m * cfg.block_h + 2 * cfg.block_i * cfg.block_h,
                        cfg.block_m * cfg.block_id + cfg.block_ho * cfg.block_id)
    return cfg.num_stages * per_stage * elt


def fits_registers(cfg: GemmConfig, n_b_tiles: int) -> bool:
    """fp32 accumulators ≤ 128 registers a thread: beyond it they spill to local memory (128×128 tiles
    on 4 warps would need 256 accumulator registers a thread)."""
    return cfg.block_m * cfg.block_n * n_b_tiles <= 128 * 32 * cfg.num_warps


def fit_shared(cfg, limit: int, n_b_tiles: int = 1):
    """``cfg`` shrunk until its pipeline fits ``limit`` bytes less ``HEADROOM``: first the stages (down
    to 2 for a GEMM, 1 for decode), then the K/reduction chunks' partners (GEMM: BLOCK_N, then
    BLOCK_K; decode: block_h and block_id). Never block_m: the sort's padding depends on it."""
    budget = limit - HEADROOM
    gemm = isinstance(cfg, GemmConfig)
    while shared_bytes(cfg, n_b_tiles) > budget:
        if cfg.num_stages > (2 if gemm else 1):
            cfg = replace(cfg, num_stages=cfg.num_stages - 1)
        elif gemm and cfg.block_n > 32:
            cfg = replace(cfg, block_n=cfg.block_n // 2)
        elif gemm and cfg.block_k > 16:
            cfg = replace(cfg, block_k=cfg.block_k // 2)
        elif not gemm and (cfg.block_h > 32 or cfg.block_id > 32):
            cfg = replace(cfg, block_h=max(32, cfg.block_h // 2), block_id=max(32, cfg.block_id // 2))
        else:
            break
    return cfg


# ---- quantized experts: chunks inside the scale blocks ----

def chunk_fits(block: int, scale_cols: int, cols: int) -> bool:
    """A reduction chunk of ``block`` columns lies inside one scale block of ``scale_cols`` columns
    (or one scale covers all ``cols`` columns of the row)."""
    return scale_cols >= cols or scale_cols % block == 0


def fit_w8a8(cfg: DecodeConfig) -> DecodeConfig:
    """``cfg`` for w8a8 decode: 16-row tiles (MMAs; no one-row FMA path), reduction chunks of 32 (an
    fp8 MMA's K) to 128 (one activation scale), three launches (h is quantized between them)."""
    return replace(cfg, block_m=max(16, cfg.block_m), block_h=min(W8A8_GROUP, max(32, cfg.block_h)),
                   block_id=min(W8A8_GROUP, max(32, cfg.block_id)), fused=0, split=0)


def fit_scheme(cfg: DecodeConfig, gate_up_cols: tuple[int, int], down_cols: tuple[int, int],
               w8a8: bool = False) -> DecodeConfig:
    """``cfg`` with its reduction chunks shrunk to fit inside the scale blocks (group-128, 128×128):
    ``*_cols`` = (columns a scale covers, columns of a row) of gate_up (over H) and down (over I);
    ``w8a8``: then through :func:`fit_w8a8`. What every quantized decode config goes through."""
    def fit(block, cols):
        while not chunk_fits(block, *cols) and block > 16:
            block //= 2
        return block
    cfg = replace(cfg, block_h=fit(cfg.block_h, gate_up_cols), block_id=fit(cfg.block_id, down_cols),
                  block_i=fit(cfg.block_i, down_cols) if cfg.split else cfg.block_i)  # split: down's chunk is an I tile
    return fit_w8a8(cfg) if w8a8 else cfg
