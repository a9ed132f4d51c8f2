"""Host cost of one :class:`dispatch.serve.LLMEngine` step on the CPU, the model taken out.

    python -m dispatch_book.bench.engine_host [--vocab 50304] [--steps 40] [--profile 256]

Stubbed: the paged forward (it returns rows of a fixed random logits tensor [R, V], V = OLMoE's
50304 by default, without touching the cache) and the KV pool (an empty tensor: nothing reads it).
Everything else is the engine's own: the scheduler, the block allocator and prefix cache, the
runner's tables and step tensors, the argmax over [R, V], the ``.tolist()``, the stop checks and
the bookkeeping. The geometry is the H100 race's: max_seqs 256, max_step_tokens 2048, context
2048 in blocks of 16 (128 table columns), prompts of 100–1024 tokens. Printed: the median µs of a
decode-only step at 16, 64 and 256 running rows, and of a mixed step (those rows and a prompt chunk
filling the 2048-token budget), then a cProfile top list of decode steps at ``--profile`` rows.
On a GPU the argmax is an asynchronous launch; here it is computed, so ``--vocab 16`` shows the
Python share alone.
"""
from __future__ import annotations

import argparse
import cProfile
import pstats
import random
import statistics
import time

import torch

import dispatch.serve.runner as runner_mod
from dispatch.serve import EngineConfig, LLMEngine, RequestParams


def _stub(vocab: int, rows: int = 2304):
    logits = torch.randn(rows, vocab, generator=torch.Generator().manual_seed(0))

    def forward(lean, batch, kv, kernels=False):
        R = batch.ids_T.shape[0] if batch.logit_rows_R is None else batch.logit_rows_R.shape[0]
        return logits[:R]

    runner_mod.paged_forward = forward
    runner_mod.new_kv_cache = lambda lean, nb, bs: torch.empty(0)


def engine(lean, rows: int, rng: random.Random) -> LLMEngine:
    """An engine whose ``rows`` sequences have finished their prompts and are decoding."""
    eng = LLMEngine(lean, EngineConfig(max_seqs=256, max_step_tokens=2048, max_model_len=2048, block_size=16,
                                       graphs=False, kernels=False), eos_token_ids=())
    V = lean.embed.shape[0]
    for _ in range(rows):
        n = rng.randint(100, 1024)
        eng.add_request([rng.randrange(V) for _ in range(n)], RequestParams(max_tokens=2048 - n, ignore_eos=True))
    while eng.scheduler.waiting or any(s.left > 1 for s in eng.scheduler.running):
        eng.step()
    for _ in range(3):
        eng.step()
    return eng


def decode_us(eng: LLMEngine, steps: int) -> float:
    ts = []
    for _ in range(steps):
        t0 = time.perf_counter()
        eng.step()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts) * 1e6


def mixed_us(eng: LLMEngine, steps: int, rng: random.Random) -> float:
    V, ts = eng.lean.embed.shape[0], []
    for _ in range(steps):
        rid = eng.add_request([rng.randrange(V) for _ in range(2000)], RequestParams(max_tokens=8))
        t0 = time.perf_counter()
        eng.step()
        ts.append(time.perf_counter() - t0)
        eng.abort(rid)
    return statistics.median(ts) * 1e6


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--vocab", type=int, default=50304)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--sizes", default="16,64,256")
    ap.add_argument("--profile", type=int, default=256, help="rows of the profiled decode steps (0: none)")
    a = ap.parse_args(argv)
    from dispatch.engine import LeanModel
    from dispatch.train import load

    torch.set_num_threads(1)
    lean = LeanModel.from_hf(load("cpu").model)
    _stub(a.vocab)
    rng = random.Random(0)
    print(f"vocab {a.vocab}, {a.steps} steps each, median µs per step")
    print(f"{'rows':>5} {'decode':>9} {'mixed':>9}")
    for rows in [int(s) for s in a.sizes.split(",")]:
        eng = engine(lean, rows, rng)
        d = decode_us(eng, a.steps)
        m = mixed_us(eng, a.steps, rng)
        print(f"{rows:>5} {d:>9.0f} {m:>9.0f}", flush=True)
    if a.profile:
        eng = engine(lean, a.profile, rng)
        prof = cProfile.Profile()
        prof.enable()
        decode_us(eng, a.steps)
        prof.disable()
        pstats.Stats(prof).sort_stats("tottime").print_stats(18)


if __name__ == "__main__":
    main()
