"""The CPU recording of the ``speculative`` suite: the shipped model's acceptance traces on held-out
standard-library text (:mod:`dispatch_book.bench.speculative` says what it holds)."""
from __future__ import annotations

import torch

from dispatch_book import bench
from dispatch_book.bench.speculative import K_MAX, NEW, decode_cost, step_costs


def record_traces(n_prompts: int):
    """results/cpu/speculative_traces.json (see the suite's docstring)."""
    from dispatch.engine import Engine, LeanModel
    from dispatch.serve.drafters import DraftModel, PromptLookup
    from dispatch.serve.speculative import SpeculativeEngine
    from dispatch.train import load
    from dispatch_book.spec_study import distinct_experts, draft_runs, held_out_prompts, lookup_runs

    torch.set_num_threads(1)
    ck, dr = load("cpu"), load("draft")
    prompts = held_out_prompts(ck.tokenizer, n_prompts)
    ids = [p["ids"] for p in prompts]
    conts = Engine(ck.model, max_batch=len(ids), max_seq=128).generate(ids, NEW).tokens
    draft = LeanModel.from_hf(dr.model)
    rows = [{"file": p["file"], "offset": p["offset"], "prompt": p["ids"], "continuation": c,
             "runs_lookup": lookup_runs(p["ids"], c, K_MAX), "runs_draft": draft_runs(draft, p["ids"], c, K_MAX)}
            for p, c in zip(prompts, conts, strict=True)]
    cpu_ms = {}
    for name, drafter, ks in (("lookup", PromptLookup(), range(0, K_MAX + 1)),
                              ("draft", DraftModel(dr.model), range(1, K_MAX + 1))):
        spec = SpeculativeEngine(ck.model, drafter, k=K_MAX, max_seq=128)
        cpu_ms[name] = {str(k): t["min_ms"] for k, t in step_costs(spec, ids[:1], ks, rounds=3).items()}
    cpu_ms["plain"] = decode_cost(Engine(ck.model, max_seq=128), ids[:1], rounds=3)["min_ms"]
    extra = {"k_max": K_MAX, "new_tokens": NEW, "lookup_n": [3, 1], "cpu_step_ms": cpu_ms,
             "routing": distinct_experts(ck.model, [p + c for p, c in zip(ids, conts, strict=True)]),
             "target": {"val_ppl": ck.log["final"]["val_ppl"], "params": ck.log["params"]},
             "draft": {"val_ppl": dr.log["final"]["val_ppl"], "params": dr.log["params"]},
             "manifest_hash": ck.log["manifest_hash"],
             "note": "greedy continuations of the fp32 CPU model; runs[p]: drafts kept when token p is the last; "
                     "cpu_step_ms: one thread, the fastest call of 3 interleaved rounds (a shared machine)"}
    return bench.save("speculative_traces", rows, extra=extra)
