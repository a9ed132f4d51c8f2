"""Where a decode step's time goes: GPU kernel time by kind, and the gaps between kernels.

``step_profile(fn, steps)`` runs ``fn`` (one decode step: eager, or a graph replay) under
``torch.profiler`` and sums the GPU time of its kernels into :data:`KINDS` by kernel name;
"launch gaps" is the wall time per step minus all kernel time (the GPU idle while the host
launches). Names are matched in order, first hit wins (lower case). Under programmatic dependent
launch (:mod:`dispatch.kernels.pdl`) a kernel starts while the one ahead drains and waits for it,
and that wait counts as its own time: profile a step captured without PDL to split its time by kind.
"""
from __future__ import annotations

import time

import torch

KINDS = (
    ("experts", ("_up_swiglu", "_down_kernel", "_combine", "_fused_decode", "grouped", "_scatter", "histogram",
                 "scan_blocks", "persistent")),
    ("router", ("_route_kernel", "topk", "_router_logits", "_rank_kernel")),
    ("attention", ("attention", "fmha", "flash", "sdpa", "attn")),
    ("sampling", ("argmax", "sort", "exponential", "cumsum", "radix", "gather")),
    ("projections (GEMV/GEMM)", ("gemm", "gemv", "cutlass", "nvjet", "sm90", "matmul", "splitk", "cublas")),
)


def kind_of(name: str) -> str:
    n = name.lower()
    for kind, keys in KINDS:
        if any(k in n for k in keys):
            return kind
    return "norms, rope, elementwise"


def step_profile(fn, steps: int = 20) -> dict:
    """{kind: µs per step, ..., 'launch gaps': µs, 'step': µs, 'kernels per step': n} on CUDA."""
    from torch.profiler import ProfilerActivity, profile

    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()  # wall time without the profiler's own overhead
    for _ in range(steps):
        fn()
    torch.cuda.synchronize()
    wall_us = (time.perf_counter() - t0) * 1e6 / steps
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            fn()
        torch.cuda.synchronize()
    out: dict = {k: 0.0 for k, _ in KINDS} | {"norms, rope, elementwise": 0.0}
    n = 0
    for ev in prof.events():
        if ev.device_type == torch.autograd.DeviceType.CUDA and getattr(ev, "device_time", 0) > 0 \
                and "memcpy" not in ev.name.lower() and "memset" not in ev.name.lower():
            out[kind_of(ev.name)] += ev.device_time / steps
            n += 1
    busy = sum(out.values())
    out["launch gaps"] = max(0.0, wall_us - busy)
    out["step"] = wall_us
    out["kernels per step"] = n / steps
    return out
