"""The one tile resolver: every launch config of the kernels comes from :func:`resolve`, with where it
came from.

    resolve(kind, shape, dtype, device, *, scheme=None, routing=0, config=None, pinned=False, ...)
        → Tiles(config, source)      source: "pinned" | "table" | "heuristic"

    kind        config                           what launches it
    "grouped"   (up, down) GemmConfig, one block_m   moe_experts, moe_experts_quant (scheme=)
    "up"/"down" GemmConfig for rows sorted in ``block_m``   grouped_up_swiglu / grouped_down
    "decode"    DecodeConfig                     moe_decode (routing=n: a shared expert riding along as
                                                 n more experts), moe_decode_quant (scheme=), moe_decode_1
    "crossover" int: decode for T ≤ it           moe(path="auto"), the experts backend, quantized experts
    "dense"     DenseGemvConfig (shape: M, N, K)  linear_small
    batch-invariant mode (:mod:`dispatch.engine.invariant`): every T (or M) reduces a row as one token does
    "decode_invariant"  DecodeConfig: T's tiles when of the one-token kind (rows per tl.dot, no
                        split sum), else the one-token tiles                  its moe_decode
    "dense_invariant"   DenseGemvConfig (shape: M, N, K; M unused)   linear_small(invariant=True)

Order of choice, for a layer shape (T, K, E, H, I), a dtype and a device:

1. ``config``: the caller's, as given ("pinned"); ``pinned=True``: the batch-independent default that
   expert parallelism and its one-device twin share (a row's bits then depend on that row alone).
2. The device's tuned table ("table"): the shipped ``dispatch/tables/<device-slug>.json`` with the
   user's own table layered over it (:mod:`dispatch.tables`: ``$DISPATCH_TABLES`` or
   ``~/.cache/dispatch/tables``, where ``python -m dispatch.tune`` writes), nearest token bucket.
   Never on Triton's interpreter; ``DISPATCH_TILE_TABLE=none`` reads none, ``=<slug>`` another's.
3. The heuristics of :mod:`dispatch.kernels.tile_rules` ("heuristic"), fitted to the device
   (:mod:`dispatch.kernels.tile_configs`: what fits).

Quantized experts (``scheme``, e.g. 'int8-channel' or 'fp8-channel+w8a8'): the decode lookup tries the
scheme's entry, then the weight-only scheme's, then the unquantized one's, and the result is shrunk so
that no reduction chunk straddles a scale block (w8a8: 16-row tiles, three launches).
A pinned config also makes results independent of batching: a row-blocked GEMM with a fixed K-loop
order computes each sorted row the same way alone or among many. Up and down share ``block_m``: it
fixes how the sort pads each expert's rows.
"""
from __future__ import annotations

import functools
import os
from dataclasses import asdict, dataclass, replace
from typing import NamedTuple

import torch

from dispatch import runtime, schemes, tables
from dispatch.kernels.tile_configs import (  # noqa: F401  (the configs and rules, re-exported: one import for callers)
    DENSE_CONFIGS,
    FEW_EXPERTS,
    HEADROOM,
    INTERPRET_CONFIG,
    INTERPRET_DECODE,
    INVARIANT_INTERPRET_DECODE,
    MANY_EXPERTS,
    W8A8_GROUP,
    DecodeConfig,
    DenseGemvConfig,
    GemmConfig,
    chunk_fits,
    fit_scheme,
    fit_shared,
    fit_w8a8,
    fits_registers,
    shared_bytes,
)
from dispatch.kernels.tile_rules import (  # noqa: F401  (the heuristics, re-exported)
    heuristic_decode,
    heuristic_dense,
    heuristic_gemm,
    heuristic_quant_gemm,
    interpreting,
    invariant_dense,
    next_pow2,
    pick_block_m,
)

DECODE_MAX_TOKENS = 64  # the crossover where no table says otherwise: decode for T ≤ 64
KINDS = ("grouped", "up", "down", "decode", "crossover", "dense", "decode_invariant", "dense_invariant")
SOURCES = ("pinned", "table", "heuristic")


class Shape(NamedTuple):
    """The sizes a tile choice depends on: T tokens, K experts per token, E experts, H hidden, I expert
    intermediate (kind "dense": T rows M, then N outputs as E and K inputs as H; K and I unused)."""

    T: int
    K: int
    E: int
    H: int
    I: int  # noqa: E741


@dataclass(frozen=True)
class Tiles:
    """A resolved launch config and where it came from ("pinned", "table" or "heuristic")."""

    config: object
    source: str


def resolve(kind: str, shape: Shape | tuple | None, dtype, device, *, scheme: str | None = None, routing: int = 0,
            config=None, pinned: bool = False, block_m: int | None = None, table: bool = True) -> Tiles:
    """The launch config of ``kind`` (see the module docstring) for ``shape`` = (T, K, E, H, I) in
    ``dtype`` on ``device``. ``scheme``: experts quantized in it; ``routing``: n experts every token
    also chooses (a shared expert riding along in the decode kernels, looked up as K + n among E + n);
    ``config``: the caller's; ``pinned``: the batch-independent default; ``block_m``: kinds "up"/"down",
    the rows' sort; ``table=False``: skip the tables (the tuner's starting points). Unknown kinds,
    schemes or a config of the wrong type are a ValueError."""
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
    base, w8a8 = _scheme(scheme)
    if config is not None:
        return Tiles(_checked(kind, config), "pinned")
    dev = torch.device(device)
    if pinned:
        return Tiles(_pinned(kind, dev), "pinned")
    if shape is None:
        raise ValueError(f"resolve({kind!r}) needs a shape (T, K, E, H, I) unless config= or pinned=True")
    if kind in ("dense", "dense_invariant"):  # shape (M, N, K): rows, outputs, inputs
        M, N, Kd = shape
        rule = heuristic_dense(M, N, Kd, dev, dtype.itemsize) if kind == "dense" else \
            invariant_dense(N, Kd, dev, dtype.itemsize)
        return Tiles(rule, "heuristic")
    T, K, E, H, I = shape  # noqa: E741
    if kind == "decode_invariant":  # every T reduces a row as one token does (see dispatch.engine.invariant)
        if interpreting(dev):
            return Tiles(INVARIANT_INTERPRET_DECODE, "heuristic")
        got = resolve("decode", (1, K, E, H, I), dtype, dev, table=table)
        cfg, src = got.config, got.source
        if cfg.block_m < 16 or cfg.split:  # FMAs, or a split sum over I: the plain tl.dot tiles
            cfg, src = heuristic_decode(1, K, E, H, I, dev), "heuristic"
        one = Tiles(replace(cfg, split=0), src)
        if T > 1:  # T's own tiles where they keep the one-token rows per tl.dot and the unsplit sum
            got = resolve("decode", (T, K, E, H, I), dtype, dev, table=table)
            if got.config.block_m == one.config.block_m and not got.config.split:
                return got
        return one
    slug = _slug(dev) if table else None
    user = tables.user_dir_key()
    if kind == "crossover":
        got = _lookup(slug, user, K, E, H, I, quant_key(dtype, scheme) if scheme else dtype, 0, "crossover")
        return Tiles(DECODE_MAX_TOKENS, "heuristic") if got is None else Tiles(got, "table")
    if kind == "decode":
        n = int(routing)
        for s in dict.fromkeys((scheme, base) if scheme else ()):
            got = _lookup(slug, user, K + n, E + n, H, I, quant_key(dtype, s), T, "decode")
            if got is not None:
                return Tiles(_fit(got, base, w8a8, H, I), "table")
        got = _lookup(slug, user, K + n, E + n, H, I, dtype, T, "decode")
        src = "table" if got is not None else "heuristic"
        got = got or heuristic_decode(T, K + n, E + n, H, I, dev)
        return Tiles(_fit(got, base, w8a8, H, I) if scheme else got, src)
    if scheme:  # grouped GEMM on codes: the table's (w8a8 entries, within 2× of a tuned bucket), else pinned defaults
        key = quant_key(dtype, scheme)
        up, down = (_lookup(slug, user, K, E, H, I, key, T, k, 1) for k in ("up", "down"))
        if up is not None and down is not None:
            return Tiles((up, down) if kind == "grouped" else up if kind == "up" else down, "table")
        gu, dn = schemes.get(base).per_row(H), schemes.get(base).per_row(I)
        cfg = heuristic_quant_gemm(T, K, E, dev, w8a8, late=gu and dn)
        return Tiles((cfg, cfg) if kind == "grouped" else cfg, "heuristic")
    up, down = _lookup(slug, user, K, E, H, I, dtype, T, "up"), _lookup(slug, user, K, E, H, I, dtype, T, "down")
    tabled = up is not None and down is not None and up.block_m == down.block_m
    if kind == "grouped":
        if tabled:
            return Tiles((up, down), "table")
        bm = pick_block_m(T * K, E, dev)
        return Tiles((heuristic_gemm("up", bm, dev), heuristic_gemm("down", bm, dev)), "heuristic")
    got = (up if kind == "up" else down) if tabled else None
    if got is not None and (block_m is None or got.block_m == block_m):
        return Tiles(got, "table")
    return Tiles(heuristic_gemm(kind, block_m or pick_block_m(T * K, E, dev), dev), "heuristic")


def _scheme(scheme: str | None) -> tuple[str | None, bool]:
    """(weight scheme's name, w8a8?) of a label 'int8-channel' / 'fp8-channel+w8a8' (:func:`schemes.parse`:
    a ValueError for an unknown one)."""
    if scheme is None:
        return None, False
    s, w8a8 = schemes.parse(scheme)
    return s.name, w8a8


def _fit(cfg: DecodeConfig, base: str | None, w8a8: bool, H: int, I: int) -> DecodeConfig:  # noqa: E741
    """A decode config shrunk to the scale blocks of experts quantized in ``base`` (none: as it is)."""
    if base is None:
        return cfg
    s = schemes.get(base)
    return fit_scheme(cfg, (s.block(H)[1], H), (s.block(I)[1], I), w8a8)


def fit_quant(cfg: DecodeConfig, scheme: str, H: int, I: int) -> DecodeConfig:  # noqa: E741
    """``cfg`` as :func:`resolve` hands it to experts [E, 2I, H] / [E, H, I] quantized in ``scheme``
    ('<scheme>+w8a8' too): reduction chunks inside the scale blocks (the tuner's candidates pass here)."""
    base, w8a8 = _scheme(scheme)
    return _fit(cfg, base, w8a8, H, I)


def _checked(kind: str, config):
    """A caller's config of the type ``kind`` takes (a GemmConfig for both grouped kernels, or a pair)."""
    want = {"grouped": GemmConfig, "up": GemmConfig, "down": GemmConfig, "decode": DecodeConfig,
            "dense": DenseGemvConfig, "crossover": int, "decode_invariant": DecodeConfig,
            "dense_invariant": DenseGemvConfig}[kind]
    if kind == "grouped" and isinstance(config, GemmConfig):
        return config, config
    if kind == "grouped" and isinstance(config, (tuple, list)) and len(config) == 2 \
            and all(isinstance(c, GemmConfig) for c in config):
        return tuple(config)
    if kind != "grouped" and isinstance(config, want) and not isinstance(config, bool):
        return config
    pair = " or an (up, down) pair of them" if kind == "grouped" else ""
    raise ValueError(f"config for {kind!r} must be a {want.__name__}{pair}, got {config!r}")


def _pinned(kind: str, dev: torch.device):
    """The batch-independent defaults of expert parallelism and its one-device twin."""
    gemm = INTERPRET_CONFIG if interpreting(dev) else GemmConfig()
    if kind == "grouped":
        return gemm, gemm
    if kind in ("up", "down"):
        return gemm
    if kind == "decode":
        return INTERPRET_DECODE if interpreting(dev) else FEW_EXPERTS
    raise ValueError(f"no pinned default for {kind!r}")


# ---- the tuned tables ----

def _slug(dev) -> str | None:
    """Whose table to read: this device's; env DISPATCH_TILE_TABLE=none reads none, =<slug> another's."""
    if interpreting(dev):
        return None
    slug = os.environ.get("DISPATCH_TILE_TABLE") or tables.device_slug(runtime.device_name(dev))
    return None if slug == "none" else slug


@functools.lru_cache(maxsize=4096)
def _lookup(slug: str | None, user: str, K: int, E: int, H: int, I: int, dtype, T: int, kind: str,  # noqa: E741
            within: float | None = None):
    """The table's answer, cached (``user``: the user's table folder, part of the key): ``kind``
    "up"/"down"/"decode" → a config or None; "crossover" → int or None."""
    e = tables.entry(slug, E, H, I, K, dtype) if slug else None
    if kind == "crossover":
        return int(e["crossover"]) if e and "crossover" in e else None
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


def quant_key(dtype, scheme: str) -> str:
    """The dtype part of a table key for experts quantized in ``scheme``: 'bfloat16+int8-channel'."""
    return f"{str(dtype).removeprefix('torch.')}+{scheme}"


def as_dict(cfg) -> dict:
    """A config as the table stores it."""
    return asdict(cfg)


# ---- shortcuts: resolve(...).config under the names the chapters and benchmarks call ----

def gemm_configs(T: int, K: int, E: int, H: int, I: int, dtype, dev) -> tuple[GemmConfig, GemmConfig]:  # noqa: E741
    """(up, down) tiles for T tokens: ``resolve("grouped", ...)``."""
    return resolve("grouped", Shape(T, K, E, H, I), dtype, dev).config


def decode_config(T: int, K: int, E: int, H: int, I: int, dtype, dev,  # noqa: E741
                  scheme: str | None = None) -> DecodeConfig:
    """The decode kernels' tiles for T tokens: ``resolve("decode", ..., scheme=scheme)``."""
    return resolve("decode", Shape(T, K, E, H, I), dtype, dev, scheme=scheme).config


def decode_max_tokens(K: int, E: int, H: int, I: int, dtype, dev, scheme: str | None = None) -> int:  # noqa: E741
    """The decode/grouped crossover: the decode path for T ≤ this (tuned per shape and scheme, else 64):
    ``resolve("crossover", ...)``."""
    return resolve("crossover", Shape(0, K, E, H, I), dtype, dev, scheme=scheme).config
