"""The serving engine driven in-process as the online sweep drives the server, with a check after every step.

    python -m dispatch_book.gpu.serve_stress --seconds 200 [--rates 8,16,32,64] [--check-every 1]

OLMoE-1B-7B's config with random bf16 weights (as ``bench serve``), the engine configured as
``python -m dispatch.serve`` configures it on a GPU, and the online workload (64 requests, prompts of
100-1024 tokens, 64-256 new tokens) sent round after round at the given rates by Poisson arrivals
(the same prompts every round: later rounds hit the prefix cache and compute only short tails). After
every step: the counters of the one-launch decode kernels (``decode_fused.workspace``) must be back to
zero. A step that raises prints what it held; a step that hangs for 60 s dumps the stacks and exits.
Every Triton compile after the warm-up is printed with the step that caused it
(:mod:`dispatch.compiles`): a kind of step the warm-up missed. Run with ``DISPATCH_PDL=0`` or
``DISPATCH_PDL_SKIP=...`` beside a plain run to see what the overlap of
launches changes. Prints one line per round; exit status 1 on a failure."""
from __future__ import annotations

import argparse
import faulthandler
import sys
import time

import torch


def _nonzero_counters() -> list[tuple[int, list[int]]]:
    """(device, nonzero entries) of every one-launch workspace that is not all zero."""
    from dispatch.kernels import decode_fused

    bad = []
    for dev, ws in list(decode_fused._workspaces.items()):
        nz = ws.nonzero().flatten()
        if nz.numel():
            bad.append((str(dev), [(int(i), int(ws[i])) for i in nz[:8]]))
    return bad


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=200)
    ap.add_argument("--rates", default="8,16,32,64")
    ap.add_argument("--check-every", type=int, default=1, help="steps between workspace checks")
    ap.add_argument("--tiny", action="store_true", help="a tiny random OLMoE and a small workload (a CPU smoke run)")
    a = ap.parse_args(argv)
    from dispatch.serve import EngineConfig, LLMEngine, RequestParams
    from dispatch_book.bench import serve_load
    from dispatch_book.bench.e2e import build

    t_end = time.perf_counter() + a.seconds
    if a.tiny:
        from dispatch.hf import tiny_model

        model = tiny_model("olmoe")[1]
        eng = LLMEngine(model, EngineConfig(max_seqs=16, max_step_tokens=64))
        reqs = serve_load.workload(8, (4, 40), (4, 24), model.config.vocab_size, seed=0)
    else:
        model = build()
        eng = LLMEngine(model, EngineConfig(max_seqs=256, max_step_tokens=2048))
        reqs = serve_load.workload(64, (100, 1024), (64, 256), model.config.vocab_size, seed=0)
    eng.warmup()  # on a GPU it watches Triton's compiles: one after it is a kind of step it missed
    print(f"warm-up done; {eng.compiled_mark} compiles during it", flush=True)
    rates = [float(r) for r in a.rates.split(",")]
    rnd = 0
    while time.perf_counter() < t_end:
        rate = rates[rnd % len(rates)]
        offs = serve_load.arrivals(len(reqs), rate, seed=rnd)
        t0, i, steps, top = time.perf_counter(), 0, 0, 0
        while i < len(reqs) or eng.has_work():
            now = time.perf_counter() - t0
            while i < len(reqs) and offs[i] <= now:
                eng.add_request(reqs[i].prompt, RequestParams(max_tokens=reqs[i].max_tokens, ignore_eos=True))
                i += 1
            if not eng.has_work():
                time.sleep(min(0.002, max(0.0, offs[i] - now)))
                continue
            faulthandler.dump_traceback_later(60, exit=True)
            try:
                eng.step()
            except Exception as e:  # noqa: BLE001 - the report is the point
                print(f"round {rnd} rate {rate}: step failed: {e!r}", *getattr(e, "__notes__", []), sep="\n")
                return 1
            faulthandler.cancel_dump_traceback_later()
            steps += 1
            last = eng.step_log[-1]
            top = max(top, last.decode_rows + last.prefill_tokens)
            for line in eng.fresh_compiles():
                print(f"round {rnd} rate {rate} step {eng.steps} ({last.seconds:.2f} s, {last.decode_rows} "
                      f"decode rows, {last.prefill_tokens} prompt tokens, {last.kv_tokens} cached tokens read) "
                      f"compiled {line}", flush=True)
            if steps % a.check_every == 0 and (bad := _nonzero_counters()):
                print(f"round {rnd} rate {rate} step {eng.steps}: counters left nonzero {bad} after a step of "
                      f"{last.decode_rows} decode rows, {last.prefill_tokens} prompt tokens")
                return 1
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        print(f"round {rnd} rate {rate}: {steps} steps in {time.perf_counter() - t0:.1f} s, largest step {top} "
              f"tokens, counters zero", flush=True)
        rnd += 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
