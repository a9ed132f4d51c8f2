"""The host side of a speculative step on CPU: what the loop around the verify forward costs.

    python -m dispatch_book.bench.spec_host [--prompts 4] [--repeats 5] [--profile]

The shipped model at batch 1 (default mode, fp32, one thread) on the recorded prompts
(results/cpu/speculative_traces.json), 64 new tokens each. For plain greedy decoding and for
speculative decoding with prompt lookup at k = 1, 4, 8: µs per decode step (the median of
``--repeats`` runs of ``decode_s / decode_steps``), with the real forward and with the forward
stubbed (a precomputed all-zero logits tensor: every step then keeps all k drafts, and what is left
is the step's own work — drafting, acceptance, rollback — and the Python loop that reads it).
Per speculative step (stubbed), counted as aten ops that are not views: those of the step (each
one a kernel in the step's CUDA graph on a GPU), those of the decode loop around it (its
device-to-host copies: ``_to_copy``/``copy_``), and implicit syncs (``.item()``, ``nonzero``, … of a
device tensor). The loop's Event wait (one per step on a GPU) has no CPU counterpart: read the code.
``--profile``: cProfile's top functions of the stubbed k=8 run.
"""
from __future__ import annotations

import argparse
import cProfile
import pstats
import statistics
from collections import Counter

import torch
from torch.utils._python_dispatch import TorchDispatchMode

NEW, KS = 64, (1, 4, 8)


class OpCount(TorchDispatchMode):
    """Counts non-view aten ops of a speculative engine's decode: in its step and in the loop."""

    SYNC = {"_local_scalar_dense", "nonzero", "masked_select", "unique"}

    def __init__(self, spec):
        super().__init__()
        self.step, self.loop, self.where = Counter(), Counter(), None
        run, prepare = spec._run_spec, spec.prepare

        def counted_run(*a):
            self.where = self.step
            run(*a)
            self.where = self.loop

        def counted_prepare(*a):
            out = prepare(*a)
            self.where = self.loop
            return out
        spec._run_spec, spec.prepare = counted_run, counted_prepare

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if self.where is not None and not func.is_view:
            self.where[func.__name__.split(".")[0]] += 1
        return func(*args, **(kwargs or {}))

    @property
    def syncs(self) -> int:
        return sum(v for c in (self.step, self.loop) for k, v in c.items() if k in self.SYNC)


def stub(model, vocab: int, seq: int) -> None:
    """The model's forward returns a slice of one precomputed logits tensor (argmax 0 everywhere)."""
    logits = torch.zeros(16, seq, vocab)
    logits[..., 0] = 1.0
    model.forward = lambda ids, pos, cache, prefill=False: logits[:ids.shape[0], :ids.shape[1]]


def step_us(engine, prompts, repeats: int) -> float:
    engine.generate(prompts[:1], 8)
    runs = []
    for _ in range(repeats):
        outs = [engine.generate([p], NEW) for p in prompts]
        runs.append(sum(o.decode_s for o in outs) / sum(o.decode_steps for o in outs) * 1e6)
    return statistics.median(runs)


def main(argv=None) -> None:
    from dispatch.engine import Engine, LeanModel
    from dispatch.serve.drafters import PromptLookup
    from dispatch.serve.speculative import SpeculativeEngine
    from dispatch.train import load
    from dispatch_book import bench

    ap = argparse.ArgumentParser(prog="python -m dispatch_book.bench.spec_host")
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--profile", action="store_true")
    a = ap.parse_args(argv)
    torch.set_num_threads(1)
    prompts = [r["prompt"] for r in bench.load("speculative_traces", gpu="cpu")["rows"][:a.prompts]]
    ck = load("cpu")
    vocab = ck.model.config.vocab_size
    for stubbed in (False, True):
        model = LeanModel.from_hf(ck.model)
        if stubbed:
            stub(model, vocab, 160)
        label = "stubbed forward" if stubbed else "real forward"
        print(f"{label:>16}  plain      {step_us(Engine(model, max_seq=160), prompts, a.repeats):8.1f} µs/step")
        for k in KS:
            spec = SpeculativeEngine(model, PromptLookup(), k=k, max_seq=160)
            print(f"{label:>16}  lookup k={k}  {step_us(spec, prompts, a.repeats):8.1f} µs/step")
            if stubbed:
                with OpCount(spec) as c:
                    out = spec.generate(prompts[:1], NEW)
                steps = len(out.extra["k"]) + 1  # the last step runs but is not read
                print(f"{'':>16}    per step: {sum(c.step.values()) / steps:.1f} ops in the step, "
                      f"{sum(c.loop.values()) / steps:.1f} in the loop {dict(c.loop)}, {c.syncs / steps:.2f} "
                      f"implicit syncs")
                if a.profile and k == max(KS):
                    prof = cProfile.Profile()
                    prof.runcall(lambda s=spec: [s.generate([p], NEW) for p in prompts])
                    pstats.Stats(prof).sort_stats("tottime").print_stats(14)


if __name__ == "__main__":
    main()
