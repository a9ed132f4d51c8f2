"""A small live run of chapter 8's measurements, for a machine without a recording (a CPU): the
offline race of ours against the static engine and transformers' continuous batching, and our
server under Poisson arrivals at a few rates, in-process on 127.0.0.1. Rows in the shape of
``python -m dispatch_book.bench serve``'s.

    rows = live(loaded, n=24, rates=(2, 8, 32))   # loaded: dispatch.train.load(...)
"""
from __future__ import annotations

import asyncio
import concurrent.futures

from dispatch_book.bench import serve_load, serve_peers


def live(loaded, *, n: int = 24, prompt=(4, 40), output=(4, 40), rates=(2.0, 8.0, 32.0), max_seqs: int = 8,
         max_step_tokens: int = 64, static_batch: int = 8, num_blocks: int = 512, seed: int = 0,
         slo_ttft_s: float = 1.0, slo_tpot_s: float = 0.05) -> list[dict]:
    from dispatch.engine import LeanModel
    from dispatch.serve import EngineConfig, LLMEngine
    from dispatch.serve.server import Server, ServerThread

    model, V = loaded.model, loaded.model.config.vocab_size
    lean = LeanModel.from_hf(model)
    reqs = serve_load.workload(n, prompt, output, V, seed)
    rows = [{"part": "offline", "contestant": "ours",
             **serve_peers.ours(lean, reqs, max_seqs=max_seqs, max_step_tokens=max_step_tokens,
                                num_blocks=num_blocks)},
            {"part": "offline", "contestant": "static", **serve_peers.static(lean, reqs, batch=static_batch)},
            {"part": "offline", "contestant": "hf_cb", **serve_peers.hf_cb(model, reqs, warmup=False)}]
    engine = LLMEngine(lean, EngineConfig(max_seqs=max_seqs, max_step_tokens=max_step_tokens, num_blocks=num_blocks),
                       tokenizer=loaded.tokenizer)
    engine.warmup()
    st = ServerThread(Server(engine, loaded.tokenizer, "model"))
    url = f"http://127.0.0.1:{st.start()}"
    try:
        for rate in rates:
            recs, wall = _run(serve_load.run_load(url, "model", reqs, rate, seed=seed))
            rows.append({"part": "online", "contestant": "ours", "rate": rate,
                         **serve_load.summary(recs, wall, slo_ttft_s=slo_ttft_s, slo_tpot_s=slo_tpot_s)})
    finally:
        st.stop()
    return rows


def _run(coro):
    """``asyncio.run`` on a thread of its own: a notebook's kernel already runs an event loop."""
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, coro).result()
