"""A small live run of chapter 8's measurements, for a machine without a recording (a CPU): the
offline race of ours against the static engine and transformers' continuous batching, and our
server under Poisson arrivals at a few rates, in-process on 127.0.0.1. Rows in the shape of
``python -m dispatch_book.bench serve``'s.

    rows = live(loaded, n=24, rates=(2, 8, 32))   # loaded: dispatch.train.load(...)

The run is bounded: transformers' run and each rate get what is left of ``budget_s``; one that
overruns (or fails) becomes a row with ``did_not_run`` (and ``stacks``: where every thread was),
so a notebook cell ends with what it measured instead of hanging.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import sys
import threading
import time
import traceback

from dispatch_book.bench import serve_load, serve_peers


def live(loaded, *, n: int = 24, prompt=(4, 40), output=(4, 40), rates=(2.0, 8.0, 32.0), max_seqs: int = 8,
         max_step_tokens: int = 64, static_batch: int = 8, num_blocks: int = 512, seed: int = 0,
         slo_ttft_s: float = 1.0, slo_tpot_s: float = 0.05, budget_s: float = 300.0) -> list[dict]:
    from dispatch.engine import LeanModel
    from dispatch.serve import EngineConfig, LLMEngine
    from dispatch.serve.server import Server, ServerThread

    deadline = time.perf_counter() + budget_s
    model, V = loaded.model, loaded.model.config.vocab_size
    lean = LeanModel.from_hf(model)
    reqs = serve_load.workload(n, prompt, output, V, seed)
    rows = [{"part": "offline", "contestant": "ours",
             **serve_peers.ours(lean, reqs, max_seqs=max_seqs, max_step_tokens=max_step_tokens,
                                num_blocks=num_blocks)},
            {"part": "offline", "contestant": "static", **serve_peers.static(lean, reqs, batch=static_batch)}]
    try:
        # the same budgets as ours, tokens per step and KV-cache slots (left to itself, transformers
        # sizes its cache from free memory: on a CPU, most of the host's RAM)
        hf = serve_peers.hf_cb(model, reqs, warmup=False, timeout_s=_left(deadline, 0.0),
                               max_batch_tokens=max_step_tokens, cache_tokens=num_blocks * EngineConfig.block_size)
    except serve_peers.Unfinished as e:  # cut off mid-run: a bound on its throughput
        hf = {**e.bound(), "stacks": stacks()}
    except (TimeoutError, RuntimeError) as e:
        hf = {"did_not_run": f"{type(e).__name__}: {e}", "stacks": stacks()}
    rows.append({"part": "offline", "contestant": "hf_cb", **hf})
    engine = LLMEngine(lean, EngineConfig(max_seqs=max_seqs, max_step_tokens=max_step_tokens, num_blocks=num_blocks),
                       tokenizer=loaded.tokenizer)
    engine.warmup()
    st = ServerThread(Server(engine, loaded.tokenizer, "model", drain_s=5.0))
    url = f"http://127.0.0.1:{st.start()}"
    try:
        for rate in rates:
            row = {"part": "online", "contestant": "ours", "rate": rate}
            left = _left(deadline)
            try:
                recs, wall = _run(serve_load.run_load(url, "model", reqs, rate, seed=seed, timeout=left), left + 5)
            except concurrent.futures.TimeoutError:
                rows.append({**row, "did_not_run": f"over the {budget_s:.0f} s budget", "stacks": stacks()})
                continue
            rows.append({**row, **serve_load.summary(recs, wall, slo_ttft_s=slo_ttft_s, slo_tpot_s=slo_tpot_s)})
    finally:
        st.stop()
    return rows


def _left(deadline: float, floor: float = 1.0) -> float:
    """Seconds to the deadline, at least ``floor`` (a late request still gets sent, and fails fast)."""
    return max(floor, deadline - time.perf_counter())


def _run(coro, timeout: float):
    """``asyncio.run`` on a thread of its own (a notebook's kernel already runs an event loop), waited
    for up to ``timeout`` s (concurrent.futures.TimeoutError past it; the thread is left to end)."""
    pool = concurrent.futures.ThreadPoolExecutor(1)
    try:
        return pool.submit(asyncio.run, coro).result(timeout)
    finally:
        pool.shutdown(wait=False)


def stacks() -> dict[str, str]:
    """Where every thread of this process is (name → stack): what a run that overran was waiting on."""
    names = {t.ident: t.name for t in threading.enumerate()}
    return {names.get(ident, str(ident)): "".join(traceback.format_stack(frame))
            for ident, frame in sys._current_frames().items()}
