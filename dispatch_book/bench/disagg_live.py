"""Live measurements for disaggregation: step-time curves of one engine, and both layouts driven by
the same seeded open-loop arrivals (chapter 10 and ``python -m dispatch_book.bench disagg``).

    pre, dec = step_curves(model, prefill_tokens=(16, 64, 128), decode_rows=(1, 4, 8))
    rows = replica(model, workload, engine_cfg)               # one co-located replica's requests
    rows = disaggregated(d, workload)                          # a running Disaggregated pair

Co-located means two independent replicas, requests dealt round-robin: each replica's half of the
stream is replayed on its own (one after the other on one device measures what two identical
devices would, side by side).
"""
from __future__ import annotations

import statistics
import time

import torch

from dispatch.serve import EngineConfig, LLMEngine, RequestParams
from dispatch.serve.disagg_model import StepCurve, Workload, _pct


def _sync(dev) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def _prompt(n: int, salt: int, V: int) -> list[int]:
    """n distinct-looking tokens (no prefix-cache hits between prompts of different salts)."""
    return [(7 * i + 131 * salt + 11) % (V - 1) + 1 for i in range(n)]


def step_curves(model, *, prefill_tokens, decode_rows, ctx: int = 32, repeats: int = 3,
                engine: dict | None = None) -> tuple[StepCurve, StepCurve]:
    """Median seconds of one engine step carrying T prompt tokens (prompts of at most the context,
    all in one step), and of a decode-only step of B rows at context ``ctx``."""
    kw = dict(block_size=16, prefix_caching=False, **(engine or {}))
    pre = []
    for T in prefill_tokens:
        eng = LLMEngine(model, EngineConfig(max_step_tokens=T, max_seqs=max(64, T), **kw))
        most = eng.max_model_len - 2
        times = []
        for r in range(repeats + 1):
            left, salt = T, 1000 * r
            while left:
                n = min(left, most)
                eng.add_request(_prompt(n, salt, eng.lean.embed.shape[0]), RequestParams(max_tokens=1))
                left, salt = left - n, salt + 1
            _sync(eng.dev)
            t0 = time.perf_counter()
            eng.step()
            _sync(eng.dev)
            times.append(time.perf_counter() - t0)
            while eng.has_work():
                eng.step()
        pre.append(statistics.median(times[1:]))  # the first: warm-up
    dec = []
    for B in decode_rows:
        eng = LLMEngine(model, EngineConfig(max_step_tokens=max(512, B * ctx), max_seqs=max(B, 1), **kw))
        V = eng.lean.embed.shape[0]
        for b in range(B):
            eng.add_request(_prompt(ctx, b, V), RequestParams(max_tokens=repeats + 3, ignore_eos=True))
        eng.step()  # every prompt
        times = []
        for _ in range(repeats + 1):
            _sync(eng.dev)
            t0 = time.perf_counter()
            eng.step()
            _sync(eng.dev)
            times.append(time.perf_counter() - t0)
        dec.append(statistics.median(times[1:]))
    return StepCurve(tuple(prefill_tokens), tuple(pre)), StepCurve(tuple(decode_rows), tuple(dec))


def _requests(w: Workload, V: int) -> tuple[list[float], list[list[int]]]:
    arrivals, lens = w.draw()
    return arrivals, [_prompt(n, i, V) for i, n in enumerate(lens)]


def _summary(ttft: list[float], tpot: list[float]) -> dict:
    return {"ttft_p50": _pct(ttft, 50), "ttft_p99": _pct(ttft, 99), "tpot_p50": _pct(tpot, 50),
            "tpot_p99": _pct(tpot, 99)}


def replica(model, w: Workload, cfg: EngineConfig, *, replicas: int = 2) -> dict:
    """Co-located: each replica's round-robin share of ``w`` replayed in real time through one engine."""
    ttft, tpot = [], []
    params = RequestParams(max_tokens=w.output, ignore_eos=True)
    for r in range(replicas):
        eng = LLMEngine(model, cfg)
        eng.warmup()
        arrivals, prompts = _requests(w, eng.lean.embed.shape[0])
        mine = list(range(r, w.n, replicas))
        t0, k, first, last, seen = time.perf_counter(), 0, {}, {}, {}
        while k < len(mine) or eng.has_work():
            now = time.perf_counter() - t0
            while k < len(mine) and arrivals[mine[k]] <= now:
                rid = eng.add_request(prompts[mine[k]], params, arrival=t0 + arrivals[mine[k]])
                seen[rid] = t0 + arrivals[mine[k]]
                k += 1
            if not eng.has_work():
                time.sleep(min(0.005, max(0.0, arrivals[mine[k]] - now)))
                continue
            eng.step()
            _sync(eng.dev)
            stamp = time.perf_counter()
            for rid, req in list(eng.requests.items()):
                if req.times and rid not in first:
                    first[rid] = req.times[0]
            for rid in [x for x in seen if x not in eng.requests and x not in last]:
                last[rid] = stamp
        for rid, arr in seen.items():
            ttft.append(first.get(rid, last[rid]) - arr)
            if w.output > 1:
                tpot.append((last[rid] - first.get(rid, last[rid])) / (w.output - 1))
    return _summary(ttft, tpot)


def disaggregated(d, w: Workload) -> dict:
    """Disaggregated: ``w`` replayed in real time through a running :class:`Disaggregated` pair; also
    the handoff's bytes and bandwidth (median over requests)."""
    arrivals, prompts = _requests(w, d.info["prefill"]["vocab"])
    params = RequestParams(max_tokens=w.output, ignore_eos=True)
    t0, ids = time.perf_counter(), []
    for a, p in zip(arrivals, prompts, strict=True):
        while time.perf_counter() - t0 < a:
            d.poll(min(0.005, max(0.0, a - (time.perf_counter() - t0))))
        ids.append(d.submit(p, params))
        d.requests[ids[-1]].arrival = t0 + a
    d.wait(ids)
    res = [d.requests.pop(i) for i in ids]
    if d.error is not None:
        raise d.error
    moved = [r for r in res if r.handoff_bytes]
    out = _summary([r.ttft_s for r in res], [r.tpot_s for r in res])
    out["handoff_bytes_p50"] = statistics.median(r.handoff_bytes for r in moved) if moved else 0
    out["handoff_gbps_p50"] = statistics.median(r.handoff_bytes / r.handoff_s / 1e9 for r in moved) if moved else None
    out["handoff_ms_p50"] = statistics.median(r.handoff_s * 1e3 for r in moved) if moved else None
    return out
