"""Refine a table's decode entries with the last steps of the descent, without tuning them again from the start.

    python -m dispatch.tune --preset all --refine [--quant int8-channel,fp8-block128,fp8-channel] [--tokens 1,8]

For every decode bucket of the table (the bf16 entry and the shared-expert entry where one rides along;
with ``--quant``, instead, those schemes' entries; with ``--tokens``, those buckets only), the bucket's
config is the start and the last steps of the descent (:func:`dispatch.tune.search.decode_steps`) run
from it: the down tiles (``DECODE_DOWN``, which grew 128-row tiles after the H200 table was tuned;
a candidate must agree with the start's output within ``TOLERANCE``: another I chunk rounds
differently; for quantized entries then the whole tiles of ``quant_search.QUANT_TILES``, the same
way), then the same tiles in one launch (:mod:`dispatch.kernels.decode_fused`, over lags and
grid sizes; a candidate must give *bitwise* the chain's output with those tiles), and at up to
``SPLIT_MAX_T`` tokens split items (:mod:`dispatch.kernels.decode_split`: another summation order, so
within ``TOLERANCE`` of the chain). A candidate replaces the best only when measured faster. The
bucket's ``decode_us`` stays in the tuning run's frame, scaled by the ratio measured here
(``refined_us`` / ``refined_from_us``, both kept), so that the recomputed crossover compares it with
the same run's grouped time (decode may now win at larger T).
A quantized entry has no grouped time from its tuning run: from ``GROUPED_MIN_T`` tokens the
weight-only grouped GEMM on the same codes is timed here (default tiles, checked against its twin),
beside this run's decode time, and the entry gets its crossover from them.
"""
from __future__ import annotations

import functools
from dataclasses import replace

import torch

from dispatch import quant, runtime, tables
from dispatch.config import PRESETS
from dispatch.kernels import tiles
from dispatch.kernels.gemv import moe_decode
from dispatch.kernels.quant_gemv import moe_decode_quant
from dispatch.moe import shared_rides_along
from dispatch.tune.compile import split_kernels
from dispatch.tune.quant_search import grouped_us, whole_tiles
from dispatch.tune.search import (
    GROUPED_MIN_T,
    ONE_LAUNCH_STEP,
    SPLIT_STEP,
    _best,
    crossover,
    decode_steps,
    graph_us,
    make_case,
)


def variants(name: str, dtype, schemes=()) -> list[tuple[str, str, str]]:
    """(table key, compile kind, scheme) of a preset's decode entries: bf16 and shared; with ``schemes``,
    instead, each scheme's (as ``--quant`` means for a full tune)."""
    c = PRESETS[name]
    if schemes:
        return [(tables.shape_key(c.E, c.H, c.I, c.K, tiles.quant_key(dtype, s)), "decode", s) for s in schemes]
    n = shared_rides_along(c)
    out = [(tables.shape_key(c.E, c.H, c.I, c.K, dtype), "decode", "")]
    if n:
        out.append((tables.shape_key(c.E + n, c.H, c.I, c.K + n, dtype), "decode_shared", ""))
    return out


def compile_jobs(presets, doc: dict, dtype, schemes=(), tokens=None) -> list[tuple]:
    """The kernels of every bucket to refine (``tokens``: those buckets only): the down step's tiles,
    the one-launch kernel of the start and the split items' tiles (the grid and lag are not compiled in)."""
    jobs = []
    for name in presets:
        for key, kind, scheme in variants(name, dtype, schemes):
            for T, b in doc["entries"].get(key, {}).get("buckets", {}).items():
                if "decode" in b and (tokens is None or int(T) in tokens):
                    start = tiles.DecodeConfig(**b["decode"])
                    cands = [replace(start, fused=1, split=0), *decode_steps(start, 1)[1](start),
                             *split_kernels(start, int(T)), *(whole_tiles(start) if scheme else ())]
                    jobs.append((name, int(T), f"{kind}:{scheme}" if scheme else kind, list(dict.fromkeys(cands))))
    return jobs


def _runner(kind, qe, case, w8a8=False):
    """run(config=...) → y_TH on the tuner's ``case`` (``make_case``'s): quantized (``qe``; ``w8a8``:
    fp8 activations), shared or routed."""
    _, w, x_TH, weights_TK, ids_TK = case
    if qe is not None:
        return functools.partial(moe_decode_quant, x_TH, weights_TK, ids_TK, qe, w8a8=w8a8)
    shared = (w.shared_gate_up_2SH, w.shared_down_HS) if kind == "decode_shared" else None
    return functools.partial(moe_decode, x_TH, weights_TK, ids_TK, w.gate_up_E2IH, w.down_EHI, shared=shared)


def refine_bucket(run, start, sms: int, timer, what: str, fit=lambda c: c, log=print, T: int | None = None,
                  quantized: bool = False):
    """From ``start``: the down step (each candidate through ``fit``; one that fails or strays beyond
    TOLERANCE of the start's output is dropped, as in a full descent; ``quantized``: then the whole
    tiles of ``quant_search.QUANT_TILES``, the same way), then the one-launch step from the
    best (bitwise the chain with its tiles, else AssertionError), then at T ≤ ``SPLIT_MAX_T`` the split
    steps (within TOLERANCE of the chain) → (best config, its µs, the start's µs)."""
    ref = run(config=start)
    best, best_us = start, timer(functools.partial(run, config=start), start)
    start_us = best_us
    steps = decode_steps(start, sms, T)
    for step, label in ((steps[1], "down"), *(((whole_tiles, "whole tiles"),) if quantized else ())):
        cands = [c for c in dict.fromkeys(fit(c) for c in step(best)) if c != best]
        try:
            cand, cand_us, _ = _best(cands, lambda c: run(config=c), ref, timer, log, f"{what} {label}") \
                if cands else (best, best_us, None)
        except RuntimeError:  # no candidate compiled and agreed: the tiles so far stay
            continue
        if cand_us < best_us:
            best, best_us = cand, cand_us
    chain = ref if best is start and not (start.fused or start.split) else run(config=replace(best, fused=0, split=0))
    # w8a8: no one-launch candidate (fit_w8a8 keeps three launches)
    for cand in dict.fromkeys(fit(c) for c in steps[ONE_LAUNCH_STEP](best)):
        if cand == best:
            continue
        try:
            y = run(config=cand)
        except Exception as e:  # noqa: BLE001 - a one launch that does not compile or fit is skipped, loudly
            log(f"  {what} {cand}: failed ({str(e).splitlines()[0][:100] if str(e) else type(e).__name__})")
            continue
        if not torch.equal(y, chain):
            raise AssertionError(f"{what}: one launch {cand} is not bitwise the chain's output")
        us = timer(functools.partial(run, config=cand), cand)
        if us < best_us:
            best, best_us = cand, us
    for step in steps[SPLIT_STEP:]:  # split items: another summation order, so within TOLERANCE of the chain
        cands = [c for c in dict.fromkeys(fit(c) for c in step(best)) if c != best]
        try:
            cand, us, _ = _best(cands, lambda c: run(config=c), chain, timer, log, f"{what} split")
        except RuntimeError:  # none (not split, or w8a8), or none compiled and agreed
            continue
        if us < best_us:
            best, best_us = cand, us
    return best, best_us, start_us


def refine_preset(name: str, doc: dict, dev, dtype, schemes=(), timer=graph_us, log=print, tokens=None) -> dict:
    """{key: refined entry} for a preset's decode entries in ``doc`` (a table); buckets without a decode
    config (or not in ``tokens``), and entries the table lacks, are left as they are."""
    c, n = PRESETS[name], shared_rides_along(PRESETS[name])
    sms = runtime.num_sms(dev) if dev.type == "cuda" else 4
    out, w = {}, make_case(name, 1, dev, dtype)[1]  # the preset's weights, the same for every T
    for key, kind, scheme in variants(name, dtype, schemes):
        old = doc["entries"].get(key)
        if not old:
            continue
        w8a8 = scheme.endswith("+w8a8")
        qe = quant.quantize_experts(w.gate_up_E2IH, w.down_EHI, scheme.removesuffix("+w8a8")) if scheme else None
        fit = functools.partial(tiles.fit_quant, scheme=scheme, H=c.H, I=c.I) if qe else (lambda c: c)
        entry = {**old, "buckets": {T: dict(b) for T, b in old["buckets"].items()}}
        for T, b in entry["buckets"].items():
            if "decode" not in b or (tokens is not None and int(T) not in tokens):
                continue
            case = make_case(name, int(T), dev, dtype, w)
            run = _runner(kind, qe, case, w8a8)
            start = tiles.DecodeConfig(**b["decode"])
            best, best_us, start_us = refine_bucket(run, start, sms, timer, f"{key} T={T}", log=log, fit=fit,
                                                    T=int(T), quantized=qe is not None)
            # decode_us stays in the tuning run's frame (the crossover compares it with that run's grouped_us):
            # the tuned time scaled by this run's same-inputs ratio; the raw times are kept beside it
            b.update(decode=tiles.as_dict(best), decode_us=b.get("decode_us", start_us) * best_us / start_us,
                     refined_from_us=start_us, refined_us=best_us)
            if qe is not None and int(T) >= GROUPED_MIN_T:  # both paths timed here: this run's frame
                b.update(decode_us=best_us, grouped_us=grouped_us(*case[2:], qe, timer, f"{key} T={T}", w8a8))
            log(f"{key} T={int(T):4d} {start_us:8.1f} -> {best_us:8.1f} us  fused={best.fused} split={best.split} "
                f"programs={best.programs} down {best.block_ho}x{best.block_id}"
                + (f"  grouped {b['grouped_us']:8.1f} us" if "grouped_us" in b and qe is not None else ""))
        if qe is not None and any("grouped_us" in b for b in entry["buckets"].values()):
            entry["crossover"] = crossover(entry["buckets"])
            log(f"{key}: decode for T ≤ {entry['crossover']}, grouped GEMM above")
        out[key] = entry
    shared_key = tables.shape_key(c.E + n, c.H, c.I, c.K + n, dtype)
    main = out.get(tables.shape_key(c.E, c.H, c.I, c.K, dtype))
    if main and shared_key in out:  # the crossover compares decode with the shared expert inside
        for T, b in out[shared_key]["buckets"].items():
            if T in main["buckets"] and "decode_shared_us" in main["buckets"][T]:
                main["buckets"][T]["decode_shared_us"] = b["decode_us"]
    if main and "crossover" in main:
        main["crossover"] = crossover(main["buckets"])
    return out
