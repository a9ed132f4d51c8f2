"""Compile every kernel variant the tuner will time, first and in parallel.

Compiling (seconds per variant) dominates a cold tuning run; timing a variant takes milliseconds. Worker
processes launch each variant once on inputs that specialise the kernels the same way (same dtypes,
same integer divisibilities: T = 16 for the grouped GEMM), which fills Triton's disk cache; the
timing process then loads every kernel from it.
"""
from __future__ import annotations

import concurrent.futures as cf
import multiprocessing as mp
from dataclasses import replace

import torch

from dispatch import quant, runtime
from dispatch import schemes as registry
from dispatch.config import PRESETS
from dispatch.kernels import grouped_gemm as gg
from dispatch.kernels import tiles
from dispatch.kernels.gemv import moe_decode
from dispatch.kernels.quant_gemv import moe_decode_quant
from dispatch.kernels.sort import sort_by_expert
from dispatch.moe import shared_rides_along
from dispatch.tune import quant_search as qs
from dispatch.tune import search


def split_kernels(base: tiles.DecodeConfig, T: int) -> list[tiles.DecodeConfig]:
    """The split step's distinct kernels from ``base`` at T tokens (its grid sizes compile to one each);
    none above ``SPLIT_MAX_T``. What the tuner compiles ahead of timing them."""
    steps = search.decode_steps(base, 1, T)
    return list(dict.fromkeys(replace(c, programs=base.programs) for c in steps[search.SPLIT_STEP](base))) \
        if len(steps) > search.SPLIT_STEP else []


def compile_jobs(presets, tokens, dev, schemes=()) -> list[tuple]:
    """(preset, T, kind, configs): the variants timing will launch, with inputs that specialise the same.
    With ``schemes``: the quantized decode's (kind ``decode:<scheme>``, w8a8 ``decode:<scheme>+w8a8``;
    the job fits them to the scales) and the w8a8 grouped GEMM's (kinds ``up:<scheme>`` /
    ``down:<scheme>``, fp8 schemes)."""
    jobs, seen = [], set()
    bases = tuple(dict.fromkeys(s.removesuffix("+w8a8") for s in schemes))
    fp8 = qs.w8a8_schemes(bases, dev)
    decodes = [s for s in schemes if s in bases] + [s + "+w8a8" for s in fp8]
    for name in presets:
        cfg = PRESETS[name]
        for scheme, T in ((s, T) for s in decodes for T in tokens if T <= qs.QUANT_MAX_T):
            base = tiles.resolve("decode", (T, cfg.K, cfg.E, cfg.H, cfg.I), runtime.compute_dtype(dev), dev).config
            jobs.append((name, T, f"decode:{scheme}", [c for b in search.decode_starts(base, T)
                                                       for step in qs.quant_steps(b, 1, T) for c in step(b)]))
        for scheme, T in ((s, T) for s in fp8 for T in tokens if T >= qs.QUANT_GROUPED_MIN_T):
            late = registry.get(scheme).per_row(cfg.H) and registry.get(scheme).per_row(cfg.I)
            base = tiles.resolve("up", (T, cfg.K, cfg.E, cfg.H, cfg.I), runtime.compute_dtype(dev), dev,
                                 scheme=scheme + "+w8a8", table=False).config
            for kind in ("up", "down"):
                key = (scheme, kind, base.block_m, cfg.K if kind == "up" else 0)
                if key not in seen:
                    jobs.append((name, 16, f"{kind}:{scheme}", qs.quant_gemm_space(kind, base, dev, late) or [base]))
                seen.add(key)
        for T in tokens if not schemes else ():
            n = shared_rides_along(cfg)  # NS = S / I more experts: kernel variants of their own
            variants = [("decode", 0)] + ([("decode_shared", n)] if n else [])
            for kind, ns in variants if T <= search.DECODE_MAX_T else ():
                base = tiles.resolve("decode", (T, cfg.K, cfg.E, cfg.H, cfg.I), runtime.compute_dtype(dev), dev,
                                     routing=ns, table=False).config
                for b in search.decode_starts(base, T):
                    up, down = search.decode_steps(b, 1)[:2]  # then grid sizes, one launch (no new tiles), split
                    jobs.append((name, T, kind, up(b) + down(b) + split_kernels(b, T)))
            for bm in search.block_ms(T, cfg.K, cfg.E) if T >= search.GROUPED_MIN_T else ():
                for kind in ("up", "down"):  # down kernels do not depend on K: one preset compiles them
                    key = (kind, bm, cfg.K if kind == "up" else 0)  # N = 16·K specialises like any T ≥ 8
                    cands = search.gemm_space(kind, bm, dev)
                    for i in range(0, len(cands), 5) if key not in seen else ():
                        jobs.append((name, 16, kind, cands[i:i + 5]))
                    seen.add(key)
    return jobs


_CASES: dict = {}


def _compile_job(job) -> list[str]:
    name, T, kind, cands = job
    dev = runtime.device()  # CUDA; the CPU (under the interpreter) only in tests
    dtype = runtime.compute_dtype(dev)
    if name not in _CASES:  # one preset's weights at a time (jobs come preset by preset)
        _CASES.clear()
        c, S = PRESETS[name], PRESETS[name].shared_intermediate_size
        _CASES[name] = type("W", (), dict(gate_up_E2IH=torch.zeros(c.E, 2 * c.I, c.H, device=dev, dtype=dtype),
                                          down_EHI=torch.zeros(c.E, c.H, c.I, device=dev, dtype=dtype),
                                          shared_gate_up_2SH=torch.zeros(2 * S, c.H, device=dev, dtype=dtype),
                                          shared_down_HS=torch.zeros(c.H, S, device=dev, dtype=dtype)))()
    cfg, w, x_TH, weights_TK, ids_TK = search.make_case(name, T, dev, dtype, _CASES[name])
    failed = []
    kind, _, scheme = kind.partition(":")
    w8a8 = scheme.endswith("+w8a8")
    qe = quant.quantize_experts(w.gate_up_E2IH, w.down_EHI, scheme.removesuffix("+w8a8")) if scheme else None
    for c in cands:
        try:
            if qe is not None and kind == "decode":
                fitted = tiles.fit_quant(c, scheme, cfg.H, cfg.I)
                moe_decode_quant(x_TH, weights_TK, ids_TK, qe, w8a8=w8a8, config=fitted)
            elif qe is not None:  # w8a8 grouped: one kernel with c (the down kernel reads any h)
                routes = sort_by_expert(ids_TK, cfg.E, c.block_m)
                if kind == "up":
                    gg.grouped_up_swiglu(x_TH, routes, qe.gate_up, config=c, w8a8=True)
                else:
                    h_PI = x_TH.new_zeros(routes.sorted_rows_P.numel(), cfg.I)
                    gg.grouped_down(h_PI, routes, qe.down, weights_TK, config=c, w8a8=True)
            elif kind in ("decode", "decode_shared"):
                shared = (w.shared_gate_up_2SH, w.shared_down_HS) if kind == "decode_shared" else None
                moe_decode(x_TH, weights_TK, ids_TK, w.gate_up_E2IH, w.down_EHI, shared=shared, config=c)
            else:
                routes = sort_by_expert(ids_TK, cfg.E, c.block_m)
                up = c if kind == "up" else tiles.resolve("up", (T, cfg.K, cfg.E, cfg.H, cfg.I), dtype, dev,
                                                          block_m=c.block_m, table=False).config
                h_PI = gg.grouped_up_swiglu(x_TH, routes, w.gate_up_E2IH, config=up)
                if kind == "down":
                    gg.grouped_down(h_PI, routes, w.down_EHI, weights_TK, config=c)
            if dev.type == "cuda":
                torch.cuda.synchronize()
        except Exception as e:  # noqa: BLE001 - reported; the timing step skips it too
            failed.append(f"{name} T={T} {c}: {str(e).splitlines()[0][:100] if str(e) else type(e).__name__}")
    return failed


def workers_that_fit(jobs, wanted: int, free_bytes: int) -> int:
    """How many of ``wanted`` workers fit in ``free_bytes`` of device memory: each holds one preset's
    expert weights at a time (plus, for quantized jobs, their codes, the quantizer's fp32 temporaries
    and the caching allocator's slack: up to ~7x the bf16 bytes), and a CUDA context (~1 GiB):
    sized for the largest job, so that a worker never runs out of memory mid-search."""
    need = 1 << 30
    for name, _, kind, _ in jobs:
        c = PRESETS[name]
        weights = 3 * c.E * c.H * c.I * 2  # bf16/fp16: the dtype the workers run in on a GPU
        need = max(need, (1 << 30) + weights * (7 if ":" in kind else 1))
    return max(0, min(wanted, int(0.8 * free_bytes) // need))


def precompile(jobs, workers: int, log=print) -> list[str]:
    """Run the jobs in ``workers`` spawned processes; → the variants that failed (also logged)."""
    failures = []
    with cf.ProcessPoolExecutor(workers, mp_context=mp.get_context("spawn")) as pool:
        for failed in pool.map(_compile_job, jobs):
            for f in failed:
                log(f"  compile failed: {f}")
            failures += failed
    return failures
