"""Tuning quantized experts (``python -m dispatch.tune --quant SCHEMES``, chapter 7).

* **Decode** (T ≤ ``QUANT_MAX_T``): the coordinate descent of :mod:`dispatch.tune.search` started
  from the bf16 decode's tiles (what the launcher takes without an entry; at one token also from
  one-row FMA tiles, ``decode_starts``), plus a step of longer reduction chunks; every candidate
  is shrunk to fit the scale blocks. From ``GROUPED_MIN_T`` tokens the weight-only grouped GEMM
  (its default tiles) is timed too, and the entry's crossover is where it first beats the decode
  path: a layer of codes changes paths where its own two paths cross, not where bf16's do (codes
  halve the decode path's bytes but add conversions to the grouped GEMM's MMAs).
  Entry 'bfloat16+<scheme>'.
* **w8a8** (fp8 schemes on sm_89+; ``--quant fp8-channel+w8a8``: this part alone), entry
  'bfloat16+<scheme>+w8a8'. Decode (T ≤ ``QUANT_MAX_T``): the same descent on fp8 activations, from
  the weight-only entry's tiles, every candidate through ``fit_w8a8`` (16-row tiles, three launches);
  from ``GROUPED_MIN_T`` the w8a8 grouped GEMM timed beside it, for the entry's crossover. Grouped
  (T ≥ ``QUANT_GROUPED_MIN_T``): up and down tiles separately around the launcher's default
  (``tile_rules.heuristic_quant_gemm``; its block_m, so the sort is the default's), each candidate checked
  against the default's output; then the whole path with the chosen pair against the default,
  the faster kept.
"""
from __future__ import annotations

import functools
from dataclasses import replace

from dispatch import quant, runtime, tables
from dispatch import schemes as registry
from dispatch.config import PRESETS
from dispatch.kernels import tiles
from dispatch.kernels.grouped_gemm import grouped_down, grouped_up_swiglu
from dispatch.kernels.quant_gemv import moe_decode_quant, moe_decode_quant_torch
from dispatch.kernels.quant_grouped import moe_experts_quant, moe_experts_quant_torch
from dispatch.kernels.sort import sort_by_expert
from dispatch.kernels.tiles import DecodeConfig, GemmConfig
from dispatch.reference import rel_err
from dispatch.tune.search import (
    GROUPED_MIN_T,
    TOLERANCE,
    _best,
    crossover,
    decode_starts,
    decode_steps,
    descend_from,
    make_case,
)

QUANT_CHUNKS = ((256, 256), (512, 256), (256, 512))  # (block_h, block_id): longer chunks of 1-byte codes
# (block_i, block_h, block_ho, block_id), 3 stages: up and down tiles moved together, which a descent one
# step at a time does not reach: the best of a side-by-side sweep of 288 whole tiles on 1-byte codes
QUANT_TILES = ((64, 256, 128, 256), (64, 256, 64, 512), (32, 256, 128, 256))
QUANT_MAX_T = 64  # decode tiles tuned up to here
QUANT_GROUPED_MIN_T = 128  # w8a8 grouped tiles tuned from here
# (BLOCK_N, BLOCK_K, warps, stages, group_m) around the defaults: per-row scales (128, 128, 8, 3, 8),
# where an H200 sweep of 12 such tiles (OLMoE, Qwen3, DeepSeek-MoE at T = 4096) ranked 3 stages first
# for both kernels together; down holds one accumulator, so it may go twice as wide. Block scales
# (64, 128, 8, 4, 1): each 128-column chunk's product is a second accumulator, so narrower tiles
QUANT_GEMM = {
    "up": ((128, 128, 8, 3, 8), (128, 128, 8, 4, 8), (128, 64, 8, 4, 8), (128, 64, 8, 5, 8),
           (128, 128, 8, 3, 16), (128, 128, 8, 3, 4), (64, 128, 4, 4, 8), (64, 256, 4, 3, 8),
           (64, 128, 8, 4, 1), (64, 128, 8, 4, 8), (64, 128, 8, 3, 8), (32, 128, 4, 4, 8)),
    "down": ((128, 128, 8, 3, 8), (128, 128, 8, 4, 8), (256, 128, 8, 3, 8), (256, 64, 8, 4, 8),
             (128, 64, 8, 5, 8), (128, 128, 8, 3, 16), (64, 128, 4, 4, 8), (256, 128, 8, 2, 8),
             (64, 128, 8, 4, 1), (64, 128, 8, 4, 8), (64, 128, 8, 3, 8), (128, 128, 8, 4, 1)),
}


def quant_steps(base: DecodeConfig, sms: int, T: int | None = None):
    """The decode steps (at T), then the reduction chunks once more, longer: a load of 1-byte codes
    carries half the bytes of bf16, so longer chunks keep as many bytes in flight; then whole tiles
    (``QUANT_TILES``)."""
    return (*decode_steps(base, sms, T), lambda b: [replace(b, block_h=h, block_id=d) for h, d in QUANT_CHUNKS],
            whole_tiles)


def whole_tiles(b: DecodeConfig) -> list[DecodeConfig]:
    """``b`` with each of ``QUANT_TILES`` (3 stages): the last step of a quantized descent, and of
    ``--refine --quant``."""
    return [replace(b, block_i=i, block_h=h, block_ho=o, block_id=d, num_stages=3) for i, h, o, d in QUANT_TILES]


def w8a8_schemes(schemes, dev) -> tuple[str, ...]:
    """The schemes whose grouped w8a8 tiles are tuned here: fp8 codes, on a device with fp8 tensor
    cores (the interpreter counts: it runs w8a8 in fp32)."""
    cap = runtime.capability(dev)
    return tuple(s for s in schemes if registry.get(s).w8a8 and (cap is None or cap >= (8, 9)))


def quant_gemm_space(kind: str, base: GemmConfig, dev, late: bool) -> list[GemmConfig]:
    """w8a8 candidates of one kernel with the default's block_m: those that fit registers (block
    scales: a chunk's product beside each accumulator) and shared memory (1-byte operands), with
    BLOCK_K = 128 where the activations carry a scale per 128 columns."""
    n_b, limit = (2 if kind == "up" else 1), runtime.max_shared_bytes(dev) - tiles.HEADROOM
    cands = [GemmConfig(base.block_m, n, k, num_warps=w, num_stages=s, group_m=g)
             for n, k, w, s, g in QUANT_GEMM[kind] if late or k == 128]
    return [c for c in cands if tiles.fits_registers(c, n_b * (1 if late else 2))
            and tiles.shared_bytes(c, n_b, elt=1) <= limit]


def tune_decode_quant(name, T, case, scheme, dev, timer, log, w8a8: bool = False) -> dict:
    """Decode tiles for experts quantized in ``scheme`` (:func:`quant_steps` from the bf16 tiles;
    ``w8a8``: on fp8 activations, from the weight-only entry's tiles, through ``fit_w8a8``)."""
    cfg, w, x_TH, weights_TK, ids_TK = case
    qe = quant.quantize_experts(w.gate_up_E2IH, w.down_EHI, scheme)

    def run(c):
        return moe_decode_quant(x_TH, weights_TK, ids_TK, qe, w8a8=w8a8, config=c)

    def fit(c):
        return tiles.fit_quant(c, label, cfg.H, cfg.I)

    label = scheme + ("+w8a8" if w8a8 else "")
    # the tuner starts where a launcher without an entry for these codes starts: the unquantized decode's tiles
    # (w8a8: the weight-only entry's), fitted to the scale blocks
    base = fit(tiles.resolve("decode", (T, cfg.K, cfg.E, cfg.H, cfg.I), x_TH.dtype, dev,
                             scheme=label if w8a8 else None).config)
    best, best_us, start_us = descend_from(decode_starts(base, T), functools.partial(quant_steps, T=T), run,
                                           moe_decode_quant_torch(x_TH, weights_TK, ids_TK, qe, w8a8=w8a8),
                                           f"{name} T={T} {label}", dev, timer, log, fit=fit)
    log(f"{name} T={T:5d} decode {label} {best_us:9.1f} us (start {start_us:9.1f}) {tiles.as_dict(best)}")
    out = {"decode": tiles.as_dict(best), "decode_us": best_us,
           "decode_w8a16_tiles_us" if w8a8 else "decode_bf16_tiles_us": start_us}
    if T >= GROUPED_MIN_T:  # the grouped GEMM on the same codes: where the scheme's paths cross
        out["grouped_us"] = grouped_us(x_TH, weights_TK, ids_TK, qe, timer, f"{name} T={T} {label}", w8a8)
        log(f"{name} T={T:5d} grouped {label} {out['grouped_us']:9.1f} us")
    return out


def grouped_us(x_TH, weights_TK, ids_TK, qe, timer, what: str, w8a8: bool = False) -> float:
    """µs of the grouped GEMM on ``qe``'s codes (weight-only: the launcher's default tiles; w8a8: the
    table's or the default), checked against its twin first: the other side of an entry's crossover."""
    def grouped():
        return moe_experts_quant(x_TH, weights_TK, ids_TK, qe, w8a8=w8a8)

    err = rel_err(grouped(), moe_experts_quant_torch(x_TH, weights_TK, ids_TK, qe, w8a8=w8a8))
    if not err <= TOLERANCE:
        raise AssertionError(f"{what}: the grouped GEMM is wrong (rel err {err:.3g})")
    return timer(grouped, ("grouped", qe.scheme, w8a8))


def tune_grouped_w8a8(name, T, case, scheme, dev, timer, log) -> dict:
    """(up, down) tiles of the w8a8 grouped GEMM on ``scheme``'s codes, then the whole path against
    the default tiles (the faster kept)."""
    cfg, w, x_TH, weights_TK, ids_TK = case
    qe = quant.quantize_experts(w.gate_up_E2IH, w.down_EHI, scheme)
    late = qe.gate_up.per_row and qe.down.per_row
    base = tiles.resolve("up", (T, cfg.K, cfg.E, cfg.H, cfg.I), x_TH.dtype, dev, scheme=scheme + "+w8a8",
                         table=False).config  # the launcher's default without a table entry
    routes = sort_by_expert(ids_TK, cfg.E, base.block_m)
    slots = routes.slot_of_N.long()
    h_PI = grouped_up_swiglu(x_TH, routes, qe.gate_up, config=base, w8a8=True)
    up, _, _ = _best(quant_gemm_space("up", base, dev, late) or [base],
                     lambda c: grouped_up_swiglu(x_TH, routes, qe.gate_up, config=c, w8a8=True),
                     h_PI[slots], timer, log, "up w8a8", view=lambda h: h[slots])
    down, _, _ = _best(quant_gemm_space("down", base, dev, late) or [base],
                       lambda c: grouped_down(h_PI, routes, qe.down, weights_TK, config=c, w8a8=True,
                                              zero_skipped=False),
                       grouped_down(h_PI, routes, qe.down, weights_TK, config=base, w8a8=True),
                       timer, log, "down w8a8")

    def path(config):
        return moe_experts_quant(x_TH, weights_TK, ids_TK, qe, w8a8=True, config=config)

    n = min(64, x_TH.shape[0])  # a token's output depends on its own routes only: the twin on 64 of them
    err = rel_err(path((up, down))[:n], moe_experts_quant_torch(x_TH[:n], weights_TK[:n], ids_TK[:n], qe, w8a8=True))
    if not err <= TOLERANCE:
        raise AssertionError(f"{name} T={T} {scheme}: the tuned w8a8 grouped GEMM is wrong (rel err {err:.3g})")
    tuned_us = timer(lambda: path((up, down)), ("grouped", up, down))
    default_us = timer(lambda: path(base), ("grouped", base, base))
    if default_us < tuned_us:  # the kernels' own times did not carry over to the whole path
        up, down, tuned_us = base, base, default_us
    log(f"{name} T={T:5d} grouped {scheme}+w8a8 {tuned_us:9.1f} us (default {default_us:9.1f}) "
        f"up {tuple(tiles.as_dict(up).values())} down {tuple(tiles.as_dict(down).values())}")
    return {"up": tiles.as_dict(up), "down": tiles.as_dict(down), "grouped_us": tuned_us,
            "grouped_default_us": default_us}


def tune_w8a8(name, T, case, scheme, dev, timer, log) -> dict:
    """One bucket of a w8a8 entry: the decode tiles (T ≤ QUANT_MAX_T) or the grouped ones."""
    if T <= QUANT_MAX_T:
        return tune_decode_quant(name, T, case, scheme, dev, timer, log, w8a8=True)
    return tune_grouped_w8a8(name, T, case, scheme, dev, timer, log)


def tune_quant(name, tokens, dev, dtype, schemes, timer, log, routing: str = "uniform") -> dict:
    """The entries of one preset's quantized experts: per scheme the decode tiles (T ≤ QUANT_MAX_T),
    and for fp8 schemes the w8a8 entry (decode tiles, grouped tiles from T ≥ QUANT_GROUPED_MIN_T);
    '<scheme>+w8a8': the w8a8 entry alone. ``routing``: a canonical routing name (keys end with it
    unless uniform)."""
    cfg, w, out = PRESETS[name], None, {}
    for requested in schemes:
        scheme = requested.removesuffix("+w8a8")
        w8a8 = bool(w8a8_schemes((scheme,), dev))
        small, large = [t for t in tokens if t <= QUANT_MAX_T], [t for t in tokens if t >= QUANT_GROUPED_MIN_T]
        for suffix, Ts, tune in (("", small if requested == scheme else [], tune_decode_quant),
                                 ("+w8a8", small + large if w8a8 else [], tune_w8a8)):
            buckets = {}
            for T in Ts:
                case = make_case(name, T, dev, dtype, w, routing=routing)
                w = case[1]
                buckets[str(T)] = tune(name, T, case, scheme, dev, timer, log)
            if buckets:
                entry = {"buckets": buckets}
                if any("grouped_us" in b and "decode_us" in b for b in buckets.values()):
                    entry["crossover"] = crossover(buckets)
                    log(f"{name} {scheme}: decode for T ≤ {entry['crossover']}, grouped GEMM above")
                key = tables.shape_key(cfg.E, cfg.H, cfg.I, cfg.K, tiles.quant_key(dtype, scheme + suffix), routing)
                out[key] = entry
    return out
