"""The one tile policy: every launch config of the grouped GEMM and the decode kernels comes from here.

Order of choice, for a layer shape (E, H, I, K), a dtype, a token count T and a device:

1. Triton's interpreter (CPU tests): small fixed tiles (``INTERPRET_CONFIG``, ``INTERPRET_DECODE``).
2. The device's tuned table (``dispatch/tables/<device-slug>.json``, written by ``python -m
   dispatch.tune``): up tiles, down tiles, decode tiles and the decode/grouped crossover, per
   token-count bucket (the nearest tuned bucket in log2).
3. Heuristics for unknown devices and shapes, shrunk to fit the device's shared memory (a T4's 64 KiB).

A pinned :class:`GemmConfig` also makes results independent of batching: a row-blocked GEMM with a
fixed K-loop order computes each sorted row the same way alone or among many (expert parallelism
relies on it). Up and down share ``block_m``: it fixes how the sort pads each expert's rows.
"""
from __future__ import annotations

import functools
import os
from dataclasses import asdict, dataclass, replace

import torch

from dispatch import runtime, tables

DECODE_MAX_TOKENS = 64  # the crossover where no table says otherwise: decode for T ≤ 64
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


# The interpreter runs numpy per program: small tiles keep CPU tests fast. One policy for both families.
INTERPRET_CONFIG = GemmConfig(block_m=16, block_n=32, block_k=32, num_warps=4, num_stages=1)
INTERPRET_DECODE = DecodeConfig(block_i=16, block_h=32, block_ho=16, block_id=32, num_stages=1)
# Decode heuristics: thin tiles and many programs while few experts are
# used; wider tiles and 2 programs per SM once the used experts alone give several waves of tiles.
# On another GPU the grid scales with its SMs (8 and 2 per SM): a grid of whole waves.
FEW_EXPERTS = DecodeConfig(block_i=32, block_h=256, block_ho=32, block_id=128, num_stages=3, programs=1056)
MANY_EXPERTS = DecodeConfig(block_i=64, block_h=128, block_ho=64, block_id=128, num_stages=3, programs=264)


def interpreting(dev: torch.device) -> bool:
    """True where kernels run under Triton's interpreter (then the small fixed tiles above)."""
    return runtime.INTERPRET or torch.device(dev).type != "cuda"


def next_pow2(n: int) -> int:
    return 1 << max(0, int(n) - 1).bit_length()


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


def _dev_props(dev) -> tuple[str, int]:
    """(name, SMs) of a CUDA device, read once per device by :mod:`dispatch.runtime`."""
    return runtime.device_name(dev), runtime.num_sms(dev)


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
    return _heuristic_decode(T, K, E, I, _dev_props(dev)[1], runtime.max_shared_bytes(dev))


@functools.lru_cache(maxsize=4096)
def _heuristic_decode(T: int, K: int, E: int, I: int, sms: int, limit: int) -> DecodeConfig:  # noqa: E741
    many = min(E, T * K) * -(-I // 64) >= 4 * sms
    base = MANY_EXPERTS if many else FEW_EXPERTS
    block_m = min(64, max(16, next_pow2(-(-2 * T * K // E))))
    return fit_shared(replace(base, block_m=block_m, programs=(2 if many else 8) * sms), limit)


# ---- the tuned tables ----

def _slug(dev) -> str | None:
    """Whose table to read: this device's; env DISPATCH_TILE_TABLE=none reads none, =<slug> another's."""
    if interpreting(dev):
        return None
    slug = os.environ.get("DISPATCH_TILE_TABLE") or tables.device_slug(_dev_props(dev)[0])
    return None if slug == "none" else slug


@functools.lru_cache(maxsize=4096)
def _lookup(slug: str | None, K: int, E: int, H: int, I: int, dtype, T: int, kind: str,  # noqa: E741
            within: float | None = None):
    """The table's answer, cached: ``kind`` "up"/"down"/"decode" → a config or None; "crossover" → int."""
    e = tables.entry(slug, E, H, I, K, dtype) if slug else None
    if kind == "crossover":
        return int(e["crossover"]) if e and "crossover" in e else DECODE_MAX_TOKENS
    return tuned(e, T, kind, within)


def tuned(entry: dict | None, T: int, kind: str, within: float | None = None):
    """The tuned config of ``kind`` ("up", "down", "decode") nearest T in ``entry`` (``within``: at
    most that far in log2, see ``tables.nearest_bucket``), or None."""
    if not entry:
        return None
    b = tables.nearest_bucket(entry.get("buckets", {}), T, kind, within)
    if b is None:
        return None
    return (DecodeConfig if kind == "decode" else GemmConfig)(**b[kind])


def gemm_configs(T: int, K: int, E: int, H: int, I: int, dtype, dev) -> tuple[GemmConfig, GemmConfig]:  # noqa: E741
    """(up, down) tiles for T tokens: the table's, else the heuristics' (they share block_m)."""
    slug = _slug(dev)
    up, down = _lookup(slug, K, E, H, I, dtype, T, "up"), _lookup(slug, K, E, H, I, dtype, T, "down")
    if up is not None and down is not None and up.block_m == down.block_m:
        return up, down
    bm = pick_block_m(T * K, E, dev)
    return heuristic_gemm("up", bm, dev), heuristic_gemm("down", bm, dev)


def gemm_config(kind: str, block_m: int, T: int, K: int, E: int, H: int, I: int, dtype, dev) -> GemmConfig:  # noqa: E741
    """Tiles of one kernel when the rows were already sorted with ``block_m``."""
    cfg = gemm_configs(T, K, E, H, I, dtype, dev)[0 if kind == "up" else 1]
    return cfg if cfg.block_m == block_m else heuristic_gemm(kind, block_m, dev)


def decode_config(T: int, K: int, E: int, H: int, I: int, dtype, dev,  # noqa: E741
                  scheme: str | None = None) -> DecodeConfig:
    """The decode kernels' tiles for T tokens: the table's, else :func:`heuristic_decode`. With
    ``scheme`` (experts quantized in that scheme, chapter 7) the table's entry for those codes comes
    first (``python -m dispatch.tune --quant SCHEME`` writes it; 'fp8-channel+w8a8': then the
    weight-only scheme's), then the unquantized one's."""
    slug = _slug(dev)
    for s in dict.fromkeys((scheme, scheme.removesuffix("+w8a8")) if scheme else ()):
        cfg = _lookup(slug, K, E, H, I, quant_key(dtype, s), T, "decode")
        if cfg is not None:
            return cfg
    return _lookup(slug, K, E, H, I, dtype, T, "decode") or heuristic_decode(T, K, E, H, I, dev)


def quant_gemm_configs(T: int, K: int, E: int, H: int, I: int, dtype, dev,  # noqa: E741
                       scheme: str) -> tuple[GemmConfig, GemmConfig] | None:
    """(up, down) tiles of the grouped GEMM on experts quantized in ``scheme`` ('fp8-channel+w8a8'):
    the table's bucket nearest T if within 2× of it (tuned sizes only stand for their neighbours;
    ``python -m dispatch.tune --quant`` tunes w8a8), else None (the launcher's default)."""
    slug, key = _slug(dev), quant_key(dtype, scheme)
    up, down = (_lookup(slug, K, E, H, I, key, T, kind, 1) for kind in ("up", "down"))
    return (up, down) if up is not None and down is not None else None


def quant_key(dtype, scheme: str) -> str:
    """The dtype part of a table key for experts quantized in ``scheme``: 'bfloat16+int8-channel'."""
    return f"{str(dtype).removeprefix('torch.')}+{scheme}"


def decode_max_tokens(K: int, E: int, H: int, I: int, dtype, dev, scheme: str | None = None) -> int:  # noqa: E741
    """The decode/grouped crossover: the decode path for T ≤ this (tuned per shape, else 64). With
    ``scheme``: the crossover of experts quantized in it (weight-only; '<scheme>+w8a8': both paths on
    fp8 activations), where ``python -m dispatch.tune --quant`` measured it, else 64."""
    return _lookup(_slug(dev), K, E, H, I, quant_key(dtype, scheme) if scheme else dtype, 0, "crossover")


def as_dict(cfg) -> dict:
    """A config as the table stores it."""
    return asdict(cfg)
