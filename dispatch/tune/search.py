"""The search: candidate spaces and tuning one preset (see ``dispatch.tune``); timed by
:func:`dispatch.timing.graph_us`, the one CUDA-graph timer."""
from __future__ import annotations

import functools
from dataclasses import replace

import torch

from dispatch import runtime, tables
from dispatch.config import PRESETS, random_weights
from dispatch.kernels import grouped_gemm as gg
from dispatch.kernels import tiles
from dispatch.kernels.decode_split import SPLIT_MAX_T
from dispatch.kernels.gemv import moe_decode
from dispatch.kernels.sort import sort_by_expert
from dispatch.kernels.tiles import DecodeConfig, GemmConfig
from dispatch.moe import shared_rides_along
from dispatch.reference import experts_reference, rel_err, shared_reference
from dispatch.timing import graph_us
from dispatch.tune import routing_dist

BENCH_PRESETS = ("olmoe-1b-7b", "qwen3-30b-a3b", "deepseek-moe-16b", "mixtral-8x7b")
DECODE_MAX_T, GROUPED_MIN_T = 256, 8
TOLERANCE = 2e-2  # ‖candidate − base‖ / ‖base‖ (bf16: tile orders round differently)
_THIN = ((64, 128, 4, 3), (128, 128, 8, 3), (64, 64, 4, 4), (32, 128, 4, 4), (128, 64, 4, 4))
SPACE = {  # (kind, block_m) → (BLOCK_N, BLOCK_K, warps, stages)
    ("up", 16): _THIN + ((32, 256, 4, 3),), ("down", 16): _THIN + ((64, 256, 4, 3),),
    ("up", 64): ((128, 64, 8, 3), (128, 64, 8, 4), (64, 128, 4, 3), (64, 64, 4, 4), (128, 128, 8, 3)),
    ("down", 64): ((128, 64, 8, 3), (256, 64, 8, 3), (128, 64, 4, 4), (64, 128, 4, 3), (128, 128, 8, 3)),
    ("up", 128): ((128, 64, 8, 3), (128, 64, 8, 4), (64, 64, 4, 4), (64, 128, 4, 3), (128, 32, 8, 4)),
    ("down", 128): ((256, 64, 8, 3), (128, 64, 8, 3), (128, 64, 8, 4), (256, 64, 8, 4), (128, 128, 8, 3)),
}
DECODE_UP = ((32, 256, 3), (16, 256, 3), (32, 128, 4), (64, 128, 3))  # (block_i, block_h, stages)
# (block_ho, block_id); 128 down rows a tile too: for 1-byte codes a longer item amortises its start
DECODE_DOWN = ((32, 128), (32, 256), (64, 128), (16, 256), (128, 128), (128, 256))
PROGRAMS_PER_SM = (1, 2, 3, 4, 8, 16)
LAGS = (1, 64)  # one launch: down items one slot behind their up items, or after all of them
# split items (block_i, block_ho): a down chunk of block_i × block_ho = 4096 weights, as the chain's 32 × 128
SPLIT_TILES = ((16, 256), (32, 128), (64, 64))
SPLIT_HO = (64, 128, 256, 512)
ONE_LAUNCH_STEP, SPLIT_STEP = 3, 4  # where decode_steps has them (SPLIT_STEP: at T ≤ SPLIT_MAX_T only)


def block_ms(T: int, K: int, E: int) -> tuple[int, ...]:
    r = T * K / E
    return (16,) if r < 12 else (16, 32) if r < 24 else (32, 64) if r < 48 else (64, 128) if r < 160 else (128,)


def gemm_space(kind: str, block_m: int, dev) -> list[GemmConfig]:
    """Candidates of one kernel for block_m rows, those that fit registers and shared memory."""
    n_b, limit = (2 if kind == "up" else 1), runtime.max_shared_bytes(dev) - tiles.HEADROOM
    groups = (1, 8, 16) if block_m >= 64 else (1,)
    cands = [GemmConfig(block_m, *t, group_m=g) for t in SPACE[kind, 16 if block_m <= 32 else min(block_m, 128)]
             for g in groups]
    return [c for c in cands if tiles.fits_registers(c, n_b) and tiles.shared_bytes(c, n_b) <= limit]


def decode_steps(base: DecodeConfig, sms: int, T: int | None = None):
    """The coordinate-descent steps, each a function of the current best → candidates: up tiles, down
    tiles, the grid, then the same tiles in one launch (``fused``: :mod:`dispatch.kernels.decode_fused`)
    over the grid sizes again; at T ≤ ``SPLIT_MAX_T`` then split items (:mod:`dispatch.kernels.decode_split`:
    ``SPLIT_TILES`` × the grid sizes), then, if they won, their down chunk."""
    steps = (lambda b: [replace(b, block_i=i, block_h=h, num_stages=s) for i, h, s in DECODE_UP],
             lambda b: [replace(b, block_ho=o, block_id=d) for o, d in DECODE_DOWN],
             lambda b: [replace(b, programs=p * sms) for p in PROGRAMS_PER_SM],
             lambda b: [replace(b, fused=n, split=0, programs=p * sms) for n in LAGS for p in PROGRAMS_PER_SM])
    if T is None or T > SPLIT_MAX_T:
        return steps
    return (*steps,
            lambda b: [replace(b, fused=0, split=1, block_i=i, block_ho=o, programs=p * sms)
                       for i, o in SPLIT_TILES for p in PROGRAMS_PER_SM],
            lambda b: [replace(b, block_ho=o) for o in SPLIT_HO] if b.split else [])


ONE_ROW = dict(block_m=1, block_i=16, block_h=256, block_ho=16, block_id=256)  # FMA tiles: a first guess


def decode_starts(base: DecodeConfig, T: int) -> list[DecodeConfig]:
    """Where the decode descents start: the tile policy's config, and at one token (one row per expert)
    also a one-row config (``block_m = 1``: FMAs on the CUDA cores instead of 16-row ``tl.dot`` tiles)."""
    return [base] + ([replace(base, **ONE_ROW)] if T == 1 else [])


def make_case(name: str, T: int, dev, dtype, w=None, seed: int = 0, routing: str = "uniform"):
    """(cfg, weights, x_TH, weights_TK, ids_TK), seeded by T: the routing drawn from ``routing``
    (:mod:`dispatch.tune.routing_dist`; uniform: softmax top-K of random logits)."""
    cfg = PRESETS[name]
    w = w or random_weights(cfg, seed=seed, dtype=dtype, device=dev)
    g = torch.Generator(device=dev).manual_seed(seed + T)
    x_TH = torch.randn(T, cfg.H, generator=g, device=dev).to(dtype)
    weights_TK, ids_TK = routing_dist.draw(routing, cfg, T, g)
    return cfg, w, x_TH, weights_TK, ids_TK


def _best(cands, run, base_out, timer, log, what, view=lambda y: y):
    """Check every candidate (``view`` of its output) against base_out, time the good ones' ``run``:
    → (best candidate, its µs, {candidate: µs})."""
    timed = {}
    for c in cands:
        try:
            err = rel_err(view(run(c)), base_out)
            if not err <= TOLERANCE:
                log(f"  {what} {c}: wrong (rel err {err:.2g}), dropped")
                continue
            timed[c] = timer(lambda c=c: run(c), c)
        except Exception as e:  # noqa: BLE001 - a config that does not compile or fit is skipped, loudly
            log(f"  {what} {c}: failed ({str(e).splitlines()[0][:100] if str(e) else type(e).__name__})")
    if not timed:
        raise RuntimeError(f"no {what} candidate ran correctly: {cands}")
    best = min(timed, key=timed.get)
    return best, timed[best], timed


def _tune_block_m(bm, case, dev, timer, log) -> tuple:
    """(best up, best down, their µs, heuristic up, heuristic down) for rows sorted in blocks of bm."""
    cfg, w, x_TH, weights_TK, ids_TK = case
    routes = sort_by_expert(ids_TK, cfg.E, bm)
    shape = (x_TH.shape[0], ids_TK.shape[1], cfg.E, cfg.H, cfg.I)  # the heuristic's tiles for this block_m
    base_u, base_d = (tiles.resolve(k, shape, x_TH.dtype, dev, block_m=bm, table=False).config for k in ("up", "down"))
    slots = routes.slot_of_N.long()
    h_PI = gg.grouped_up_swiglu(x_TH, routes, w.gate_up_E2IH, config=base_u)
    up, up_us, _ = _best(gemm_space("up", bm, dev) or [base_u],
                         lambda c: gg.grouped_up_swiglu(x_TH, routes, w.gate_up_E2IH, config=c),
                         h_PI[slots], timer, log, "up", view=lambda h: h[slots])
    down, down_us, _ = _best(gemm_space("down", bm, dev) or [base_d],
                             lambda c: gg.grouped_down(h_PI, routes, w.down_EHI, weights_TK, config=c,
                                                       zero_skipped=False),
                             gg.grouped_down(h_PI, routes, w.down_EHI, weights_TK, config=base_d),
                             timer, log, "down")
    return up, down, up_us + down_us, base_u, base_d


def tune_grouped(name, T, case, dev, timer, log) -> dict:
    """Best (up, down) over the block_m candidates (by the two kernels' time), then the whole path
    (sort, up, down, combine) timed with them and with the heuristic tiles."""
    cfg, w, x_TH, weights_TK, ids_TK = case
    K = ids_TK.shape[1]
    ref = experts_reference(x_TH[:64], weights_TK[:64].to(x_TH.dtype), ids_TK[:64], w.gate_up_E2IH, w.down_EHI)
    best = None
    for bm in block_ms(T, K, cfg.E):
        r = _tune_block_m(bm, case, dev, timer, log)
        best = r if best is None or r[2] < best[2] else best
    up, down, _, base_u, base_d = best

    def path(configs):
        return gg.moe_experts(x_TH, weights_TK, ids_TK, w.gate_up_E2IH, w.down_EHI, configs=configs)

    err = rel_err(path((up, down))[:64], ref)
    if not err <= TOLERANCE:
        raise AssertionError(f"{name} T={T}: the tuned grouped GEMM is wrong (rel err {err:.3g})")
    tuned_us = timer(lambda: path((up, down)), ("grouped", up, down))
    heuristic_us = timer(lambda: path((base_u, base_d)), ("grouped", base_u, base_d))
    if heuristic_us < tuned_us:  # the kernels' own times did not carry over to the whole path: keep the heuristic
        up, down, tuned_us = base_u, base_d, heuristic_us
    out = {"up": tiles.as_dict(up), "down": tiles.as_dict(down), "grouped_us": tuned_us,
           "grouped_heuristic_us": heuristic_us}
    log(f"{name} T={T:5d} grouped {out['grouped_us']:9.1f} us (heuristic {out['grouped_heuristic_us']:9.1f})"
        f" up {tuple(out['up'].values())} down {tuple(out['down'].values())}")
    return out


def _descend(base, steps, run, ref, what, dev, timer, log, fit=lambda c: c):
    """Coordinate descent over decode configs: ``run(base)`` checked against ``ref``, then each step
    of ``steps(base, sms)`` (its candidates through ``fit``, duplicates merged) moves only to a config
    measured faster than the current one → (best, its µs, the base's µs)."""
    y = run(base)
    err = rel_err(y, ref)
    if not err <= TOLERANCE:
        raise AssertionError(f"{what}: the decode kernels are wrong (rel err {err:.3g})")
    best, base_us = base, timer(lambda: run(base), base)
    best_us = base_us
    sms = runtime.num_sms(dev) if dev.type == "cuda" else 4
    for step in steps(base, sms):
        cands = list(dict.fromkeys(fit(c) for c in step(best)))
        try:
            cand, cand_us, _ = _best(cands, run, y, timer, log, "decode") if cands else (best, best_us, None)
        except RuntimeError:  # no candidate of this step ran correctly (each was logged): the next step
            continue
        if cand_us < best_us:
            best, best_us = cand, cand_us
    return best, best_us, base_us


def descend_from(starts, steps, run, ref, what, dev, timer, log, fit=lambda c: c):
    """:func:`_descend` from each of ``starts`` (``decode_starts``) → (fastest config, its µs, the first
    start's µs: what the launcher runs without a table entry)."""
    runs = [_descend(fit(b), steps, run, ref, what, dev, timer, log, fit=fit) for b in starts]
    best, best_us, _ = min(runs, key=lambda r: r[1])
    return best, best_us, runs[0][2]


def tune_decode(name, T, case, dev, timer, log, *, shared: bool = False) -> dict:
    """The decode tiles; ``shared``: with the layer's shared expert riding along (``moe.shared_rides_along``:
    n = S / I more experts every token chooses), which the launcher looks up as K + n choices among E + n."""
    cfg, w, x_TH, weights_TK, ids_TK = case
    args = (x_TH, weights_TK, ids_TK, w.gate_up_E2IH, w.down_EHI)
    ref = experts_reference(x_TH, weights_TK.to(x_TH.dtype), *args[2:])
    n, kw = 0, {}
    if shared:
        n, kw = shared_rides_along(cfg), {"shared": (w.shared_gate_up_2SH, w.shared_down_HS)}
        ref = ref + shared_reference(x_TH, cfg, w)
    base = tiles.resolve("decode", (T, cfg.K, cfg.E, cfg.H, cfg.I), x_TH.dtype, dev, routing=n, table=False).config
    best, best_us, heuristic_us = descend_from(decode_starts(base, T), functools.partial(decode_steps, T=T),
                                               lambda c: moe_decode(*args, config=c, **kw), ref,
                                               f"{name} T={T}{' +shared' if shared else ''}", dev, timer, log)
    log(f"{name} T={T:5d} {'decode+shared' if shared else 'decode '} {best_us:9.1f} us "
        f"(heuristic {heuristic_us:9.1f}) {tiles.as_dict(best)}")
    return {"decode": tiles.as_dict(best), "decode_us": best_us, "decode_heuristic_us": heuristic_us}


def crossover(buckets: dict) -> int:
    """The last bucket before the grouped path first beats decode (decode only where it was tuned).

    A layer whose shared expert rides along on the decode path compares the paths as ``moe()`` runs
    them: decode with the shared expert inside (``decode_shared_us``) against the grouped path plus
    the shared MLP in torch (``shared_us``)."""
    last = 0
    for T in sorted(buckets, key=int):
        b = buckets[T]
        if "decode_us" not in b:
            break
        decode = b.get("decode_shared_us", b["decode_us"])
        if "grouped_us" in b and b["grouped_us"] + b.get("shared_us", 0.0) < decode:
            break
        last = int(T)
    return last


def tune_preset(name, tokens, dev, dtype, timer=graph_us, log=print, schemes=(), routing: str = "uniform") -> dict:
    """The table entry of one preset: its buckets and crossover. With ``schemes``: instead, the
    quantized experts' entries (:func:`dispatch.tune.quant_search.tune_quant`). ``routing``: the
    routing the cases draw (:mod:`dispatch.tune.routing_dist`); other than uniform, the entries' keys
    end with its name (``tables.shape_key``)."""
    routing = routing_dist.parse(routing).name
    if schemes:
        from dispatch.tune.quant_search import tune_quant  # it builds on this module's search

        return tune_quant(name, tokens, dev, dtype, schemes, timer, log, routing=routing)
    w, buckets, shared = None, {}, {}
    cfg = PRESETS[name]
    n = shared_rides_along(cfg)
    for T in tokens:
        case = make_case(name, T, dev, dtype, w, routing=routing)
        w = case[1]
        b = {}
        if T <= DECODE_MAX_T:
            b.update(tune_decode(name, T, case, dev, timer, log))
            if n:  # the crossover compares the paths with the shared expert where each runs it
                shared[str(T)] = tune_decode(name, T, case, dev, timer, log, shared=True)
                b["decode_shared_us"] = shared[str(T)]["decode_us"]
                b["shared_us"] = timer(lambda c=case: shared_reference(c[2], c[0], c[1]), None)
        if T >= GROUPED_MIN_T:
            b.update(tune_grouped(name, T, case, dev, timer, log))
        buckets[str(T)] = b
        del case
        if dev.type == "cuda":
            torch.cuda.empty_cache()
    cross = crossover(buckets)
    log(f"{name}{'' if routing == 'uniform' else ' (' + routing + ')'}: decode for T ≤ {cross}, grouped GEMM above")
    out = {tables.shape_key(cfg.E, cfg.H, cfg.I, cfg.K, dtype, routing): {"crossover": cross, "buckets": buckets}}
    if shared:  # the layer's decode with its shared expert inside, at the key the launcher reads (E + n, K + n);
        # no crossover of its own (moe() reads the layer's, computed with it)
        out[tables.shape_key(cfg.E + n, cfg.H, cfg.I, cfg.K + n, dtype, routing)] = {"buckets": shared}
    return out


def merge_entry(old: dict | None, new: dict) -> dict:
    """A shape's tuned entry merged into the table's: buckets tuned now replace theirs, the others
    stay (tuning ``--tokens 1,8`` keeps the grouped tiles of 4096), and a crossover is recomputed
    over the merged buckets."""
    if not old:
        return new
    merged = {**old, **new, "buckets": {**old.get("buckets", {}), **new["buckets"]}}
    if "crossover" in new:
        merged["crossover"] = crossover(merged["buckets"])
    return merged
