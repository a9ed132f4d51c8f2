"""The peer's tile search: vLLM's own tuned tables first, then its tuner's grid, per size, on the race's inputs.

vLLM picks a fused-MoE config from a tuned table (``fused_moe/configs/E=…,N=…,device_name=….json``:
tokens M → config, the entry at the M nearest the batch) written by ``benchmarks/kernels/benchmark_moe.py``,
which times every config of its grid (:data:`GRID`, 1920 of them) per M. Here the peer gets the same
chance, per race size and on the race's own routing (so a skewed race has a peer tuned for skew):

1. **Shipped**: the configs of the vLLM-format tables for this shape (``data/vllm_moe_configs.json``,
   with their sources), this GPU's table first — the entries at the two M keys nearest T — then the
   other GPU's, then the 14 seeds of ``peers.CONFIGS``.
2. **Grid region**: :data:`GRID` pruned to where an H100/H200 fused-MoE GEMM wins (:func:`region`):
   BLOCK_M from a quarter to twice the busiest expert's rows; thin blocks (16–32 rows) with every
   BLOCK_N and BLOCK_K of the grid, 4 warps (8 beside BLOCK_N = 256); fat blocks with BLOCK_N ≥ 64,
   BLOCK_K ≤ 128, GROUP_M 1 or 16; stages matched to BLOCK_K; candidates whose fp32 accumulators
   exceed 128 registers a thread, or whose pipeline exceeds shared memory, are dropped.
3. **Refine**: from the best so far, one grid axis at a time (GROUP_M, stages, warps: every value).

Every candidate is checked against the reference, then timed (a short CUDA-graph timing); the search
stops at ``budget_s`` seconds (compiling on demand counts), and records what it tried.
"""
from __future__ import annotations

import functools
import json
import math
import pathlib
import time

import triton

from dispatch_book.bench import peers

# benchmark_moe.py's get_configs_compute_bound (CUDA): the grid vLLM's tuner sweeps per batch size
GRID = {"BLOCK_SIZE_M": (16, 32, 64, 128, 256), "BLOCK_SIZE_N": (32, 64, 128, 256), "BLOCK_SIZE_K": (64, 128, 256),
        "GROUP_SIZE_M": (1, 16, 32, 64), "num_warps": (4, 8), "num_stages": (2, 3, 4, 5)}
TABLES = pathlib.Path(__file__).with_name("data") / "vllm_moe_configs.json"
SHARED_LIMIT = 227 * 1024 - 8 * 1024  # H100/H200 shared memory a block, less Triton's own scratch
STAGES = {64: (4, 5), 128: (3, 4), 256: (2, 3)}  # thin blocks: deeper pipelines for short K steps


def grid() -> list[tuple]:
    """Every config of :data:`GRID` (BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, warps, stages)."""
    import itertools

    return list(itertools.product(*GRID.values()))


def fits(c, limit: int = SHARED_LIMIT) -> bool:
    """Accumulators ≤ 128 fp32 registers a thread, and the pipeline's A and B tiles in shared memory."""
    bm, bn, bk, _, warps, stages = c
    return bm * bn <= 128 * 32 * warps and stages * (bm * bk + bk * bn) * 2 <= limit


@functools.lru_cache(maxsize=1)
def _tables() -> tuple:
    return tuple(json.loads(TABLES.read_text())["tables"])


def device_key(name: str) -> str:
    """vLLM's device part of a table name: 'NVIDIA H100 80GB HBM3' → 'NVIDIA_H100_80GB_HBM3'."""
    return name.replace(" ", "_")


def shipped(E: int, I: int, T: int, device: str) -> list[tuple[tuple, str]]:  # noqa: E741
    """(config, source) from the vLLM-format tables of shape (E, N=I): per table the entries at the two
    M keys nearest T (vLLM reads the nearest), this device's tables first."""
    out = []
    mine = [t for t in _tables() if (t["E"], t["N"]) == (E, I)]
    mine.sort(key=lambda t: t["device"] != device_key(device))
    for t in mine:
        keys = sorted(t["configs"], key=lambda m: (abs(int(m) - T), int(m)))[:2]
        out += [(tuple(t["configs"][m]), f"{t['origin']} {t['device']} M={m}") for m in keys]
    return out


def block_ms(T: int, K: int, E: int, busiest: float) -> tuple[int, ...]:
    """BLOCK_M values worth trying: from a quarter of the mean rows of an expert (T·K/E) to twice the
    busiest expert's (× busiest/mean), within the grid; 16 where an expert gets fewer than 8 rows."""
    mean = max(1.0, T * K / E)
    lo = min(128, 2 ** math.floor(math.log2(max(1.0, mean / 4))))
    hi = triton.next_power_of_2(math.ceil(2 * busiest * mean))
    return tuple(bm for bm in GRID["BLOCK_SIZE_M"] if lo <= bm <= max(16, hi))


def _ideal_bm(T: int, K: int, E: int) -> int:
    """The BLOCK_M nearest an expert's mean rows (16 … 128): the region is tried nearest it first."""
    return min(128, max(16, 2 ** math.floor(math.log2(max(1.0, T * K / E)))))


def region(T: int, K: int, E: int, busiest: float = 1.0) -> list[tuple]:
    """The grid's promising region at this size (see the module docstring), resource-checked."""
    out = []
    for bm in block_ms(T, K, E, busiest):
        if bm <= 32:
            for bn in GRID["BLOCK_SIZE_N"]:
                for bk in GRID["BLOCK_SIZE_K"]:
                    out += [(bm, bn, bk, 1, w, s) for w in ((4, 8) if bn == 256 else (4,)) for s in STAGES[bk]]
        else:
            for bn in (64, 128, 256):
                for bk in (64, 128):
                    w = 4 if bm * bn <= 8192 else 8
                    out += [(bm, bn, bk, g, w, s) for g in (1, 16) for s in (3, 4)]
    return [c for c in out if fits(c)]


def neighbours(c: tuple) -> list[tuple]:
    """The grid's other values of GROUP_M, stages and warps around ``c``, one axis at a time."""
    bm, bn, bk, g, w, s = c
    out = [(bm, bn, bk, g2, w, s) for g2 in GRID["GROUP_SIZE_M"] if g2 != g]
    out += [(bm, bn, bk, g, w, s2) for s2 in GRID["num_stages"] if s2 != s]
    out += [(bm, bn, bk, g, w2, s) for w2 in GRID["num_warps"] if w2 != w]
    return [n for n in out if fits(n)]


def candidates(T: int, K: int, E: int, I: int, device: str, busiest: float = 1.0) -> list[tuple[tuple, str]]:  # noqa: E741
    """(config, source) in the order the search tries them: shipped, seeds, grid region (no duplicates)."""
    out = shipped(E, I, T, device)
    out += [(c, "seed") for c in peers.CONFIGS if c[0] in block_ms(T, K, E, busiest)]
    ideal = math.log2(_ideal_bm(T, K, E))
    out += [(c, "grid") for c in sorted(region(T, K, E, busiest), key=lambda c: abs(math.log2(c[0]) - ideal))]
    seen, uniq = set(), []
    for c, src in out:
        if c not in seen and fits(c):
            seen.add(c)
            uniq.append((c, src))
    return uniq


def search(run, check, timer, cands, budget_s: float, log=None, prepare=None) -> dict:
    """Check (``check(y) → bool``) and time (``timer(fn) → µs``) each of ``cands`` = [(config, source)]
    with ``run(config) → y``, then the neighbours of the best (``prepare(neighbours)`` first: compile them
    at once); stop after ``budget_s`` seconds.
    → {"config", "source", "us", "tried", "timed", "seconds", "stopped"} (config None if none ran)."""
    t0, best, tried, timed, stopped = time.perf_counter(), None, set(), 0, "done"

    def one(c, src):
        nonlocal best, timed
        tried.add(c)
        try:
            if not check(run(c)):
                return
            us = timer(lambda: run(c))
        except Exception as e:  # noqa: BLE001 - a config this GPU cannot compile or hold is not a contestant
            if log:
                log(f"  peer {c}: failed ({str(e).splitlines()[0][:80] if str(e) else type(e).__name__})")
            return
        timed += 1
        if best is None or us < best[2]:
            best = (c, src, us)

    queue = list(cands)
    refined = False
    while queue:
        if time.perf_counter() - t0 > budget_s:
            stopped = "budget"
            break
        c, src = queue.pop(0)
        if c not in tried:
            one(c, src)
        if not queue and not refined and best is not None:
            refined = True
            queue = [(n, "refine") for n in neighbours(best[0]) if n not in tried]
            if prepare is not None and queue:
                prepare([c for c, _ in queue])
    out = {"config": None, "source": None, "us": None, "tried": len(tried), "timed": timed,
           "seconds": round(time.perf_counter() - t0, 2), "stopped": stopped, "budget_s": budget_s}
    if best is not None:
        out.update(config=list(best[0]), source=best[1], us=best[2])
    return out


def tuned_peer(cfg, w, x_TH, weights_TK, ids_TK, ref_TH, dev, tolerance: float, budget_s: float, log=None):
    """The peer tuned for this size and routing: (fn, the search's record). Candidates are checked
    against ``ref_TH`` (‖y − ref‖ / ‖ref‖ ≤ ``tolerance``) and ranked by a short graph timing
    (``dispatch.tune.search.graph_us``); the alignment runs outside the timed call."""
    from dispatch.reference import rel_err
    from dispatch.tune import routing_dist
    from dispatch.tune.search import graph_us
    from dispatch_book.bench import skew

    T, K = ids_TK.shape
    aligned = {}

    def run(c):
        if c[0] not in aligned:
            aligned[c[0]] = peers.align(ids_TK, cfg.E, c[0])
        return peers.fused_moe(x_TH, weights_TK, ids_TK, w.gate_up_E2IH, w.down_EHI, aligned[c[0]], c)

    busiest = routing_dist.busiest_over_mean(ids_TK, cfg.E)
    cands = candidates(T, K, cfg.E, cfg.I, skew.device_name(dev), busiest)
    timer = (lambda fn: graph_us(fn, reps=3)) if dev.type == "cuda" else (lambda fn: (fn(), 0.0)[1])
    prepare = (lambda cs: peers.precompile(cs, workers=len(cs))) if dev.type == "cuda" else None
    found = search(run, lambda y: rel_err(y, ref_TH) <= tolerance, timer, cands, budget_s, log, prepare)
    if found["config"] is None:
        raise AssertionError(f"no peer config ran correctly at T={T}: {found}")
    c = tuple(found["config"])
    return (lambda: run(c)), found


def race_configs(shapes, tokens, dev, routing: str) -> list[tuple]:
    """Every candidate the race tries first, over its shapes and sizes: what to compile ahead, in
    parallel (the routing's nominal skew from 256 tokens; below, one expert's rows are mostly noise)."""
    from dispatch.config import PRESETS
    from dispatch_book.bench import skew

    out = {}
    for name in shapes:
        cfg = PRESETS[name]
        for T in tokens:
            busiest = skew.nominal_busiest(routing) if T >= 256 else cfg.E / cfg.K
            out.update((c, None) for c, _ in candidates(T, cfg.K, cfg.E, cfg.I, skew.device_name(dev), busiest))
    return list(out)
