"""The GPU recording of the ``speculative`` suite (:mod:`dispatch_book.bench.speculative` says what
each row means), saved after every row; the CPU traces it replays: :mod:`dispatch_book.bench.spec_traces`."""
from __future__ import annotations

import time

import torch

from dispatch_book import bench
from dispatch_book.bench.speculative import (
    FULL_LAYERS,
    K_MAX,
    NEW,
    ReplayDrafter,
    build_preset,
    decode_cost,
    hf_generate,
    invariance_profile,
    run_each,
    step_costs,
    tokens_per_s,
    traces_recording,
)


def _best_fixed(runs: list[list[int]], costs: dict[int, float]) -> int:
    from dispatch.serve.spec_cost import simulate

    cost = [costs.get(k, float("inf")) for k in range(max(costs) + 1)]
    rate = {k: sum(simulate(r, cost, k)["tokens"] for r in runs) / sum(simulate(r, cost, k)["time"] for r in runs)
            for k in costs}
    return max(rate, key=rate.get)


def record_gpu(models: list[str], budget_s: float):
    """results/<gpu>/speculative.json: the rows of ``models`` ("shipped" and presets); the file's rows of
    other models stay (each row's ``shape`` is its model: ``save(merge=True)``)."""
    from dispatch.engine import Engine, LeanModel
    from dispatch.train import load

    t_start = time.perf_counter()
    tr = traces_recording()
    prompts = [r["prompt"] for r in tr["rows"]]
    runs = {"lookup": [r["runs_lookup"] for r in tr["rows"]], "draft": [r["runs_draft"] for r in tr["rows"]]}
    conts = [r["continuation"] for r in tr["rows"]]
    rows, extra = [], {"traces_commit": tr["git_commit"], "k_max": K_MAX, "new_tokens": NEW, "prompts": len(prompts)}

    def add(row):
        row = {"shape": row.pop("model"), **row}  # the model: what a later run at other models keeps
        rows.append(row)
        print({k: round(v, 4) if isinstance(v, float) else v for k, v in row.items() if k != "samples"}, flush=True)
        bench.save("speculative", rows, extra=extra, merge=True)

    def left():
        return budget_s - (time.perf_counter() - t_start)

    ck, dr = load("cpu", device="cuda"), load("draft", device="cuda")
    g = torch.Generator().manual_seed(0)
    # ---- invariance cost: the decode step in both modes ----
    olmoe = build_preset("olmoe-1b-7b") if "olmoe-1b-7b" in models else None
    for model_name, model in (("shipped", ck.model), ("olmoe-1b-7b", olmoe)):
        if model_name not in models:
            continue
        V = model.config.vocab_size
        for B in (1, 64):
            batch = [torch.randint(1, V, (64,), generator=g).tolist() for _ in range(B)]
            for mode in ("default", "invariant"):
                eng = Engine(LeanModel.from_hf(model, batch_invariant=mode == "invariant"), max_batch=B, max_seq=160)
                add({"kind": "invariance", "model": model_name, "batch": B, "mode": mode, **decode_cost(eng, batch)})
                if model_name != "shipped":  # where the invariant step's extra time goes: GPU time by kind
                    add({"kind": "invariance_profile", "model": model_name, "batch": B, "mode": mode,
                         **invariance_profile(eng, batch)})
                del eng
    if "shipped" in models:
        _shipped(ck, dr, prompts, runs, add, left)
    for name in (m for m in models if m != "shipped"):
        _preset(name, olmoe, prompts, conts, runs, add, left)
        olmoe = None
        torch.cuda.empty_cache()
    print("wrote", bench.save("speculative", rows, extra=extra, merge=True))


def _shipped(ck, dr, prompts, runs, add, left) -> None:
    """The shipped model: step costs per k, the race at batch 1, transformers' peers."""
    from dispatch.engine import Engine, LeanModel
    from dispatch.serve.drafters import DraftModel, PromptLookup
    from dispatch.serve.spec_cost import AdaptiveK
    from dispatch.serve.speculative import SpeculativeEngine

    costs = {}
    for mode in ("invariant", "default"):
        lean = LeanModel.from_hf(ck.model, batch_invariant=mode == "invariant")
        for name, drafter, ks in (("lookup", PromptLookup(), range(0, K_MAX + 1)),
                                  ("draft", DraftModel(dr.model), range(1, K_MAX + 1))):
            spec = SpeculativeEngine(lean, drafter, k=K_MAX, max_seq=160)
            for k, t in step_costs(spec, prompts[:1], ks).items():
                costs[(mode, name, k)] = t["median_ms"]
                add({"kind": "verify_cost", "model": "shipped", "mode": mode, "drafter": name, "batch": 1, "k": k, **t})
    plain = {}
    for mode in ("default", "invariant"):
        outs = run_each(Engine(LeanModel.from_hf(ck.model, batch_invariant=mode == "invariant"), max_seq=160),
                        prompts, NEW, passes=3)
        plain[mode] = outs
        rate, tokens, secs = tokens_per_s(outs)
        add({"kind": "race", "model": "shipped", "mode": mode, "drafter": "none", "k": 0, "tok_s": rate,
             "generated": tokens, "seconds": secs})
    base = tokens_per_s(plain["default"])[0]
    for mode in ("invariant", "default"):
        ref = [o.tokens[0] for o in plain[mode]]  # greedy speculative output must be this in invariant mode
        lean = LeanModel.from_hf(ck.model, batch_invariant=mode == "invariant")
        for name in ("lookup", "draft"):
            ks = list(range(1, K_MAX + 1))
            best = _best_fixed(runs[name], {k: costs[(mode, name, k)] for k in ks})
            for k in sorted({1, 2, 4, best, K_MAX} if mode == "invariant" else {best}) + ["adaptive"]:
                if left() < 60:
                    add({"kind": "race", "model": "shipped", "mode": mode, "drafter": name, "k": str(k),
                         "skipped": "time budget spent"})
                    continue
                drafter = PromptLookup() if name == "lookup" else DraftModel(dr.model)
                ad = AdaptiveK([costs.get((mode, name, j), costs[(mode, name, 1)]) for j in range(K_MAX + 1)],
                               k_min=drafter.k_min) if k == "adaptive" else None
                spec = SpeculativeEngine(lean, drafter, k=K_MAX if ad else k, adaptive=ad, max_seq=160)
                outs = run_each(spec, prompts, NEW, passes=3)
                rate, tokens, secs = tokens_per_s(outs)
                acc = [a[0] for o in outs for a in o.extra["accepted"]]
                add({"kind": "race", "model": "shipped", "mode": mode, "drafter": name, "k": str(k), "tok_s": rate,
                     "generated": tokens, "seconds": secs, "speedup_vs_default_plain": rate / base,
                     "tokens_per_step": tokens / max(1, sum(len(o.extra["k"]) for o in outs)),
                     "mean_kept": sum(acc) / max(1, len(acc)),
                     "identical_to_plain_greedy": sum(o.tokens[0] == r for o, r in zip(outs, ref, strict=True))})
    _peers(ck, dr, prompts, add)


def _preset(name, olmoe, prompts, conts, runs, add, left) -> None:
    """A preset: verify cost per k, plain decoding in both modes, the recorded sequences replayed."""
    from dispatch.engine import Engine, LeanModel
    from dispatch.serve.drafters import DraftModel, PromptLookup
    from dispatch.serve.spec_cost import AdaptiveK
    from dispatch.serve.speculative import SpeculativeEngine

    if left() < 120:
        add({"kind": "replay", "model": name, "skipped": "time budget spent"})
        return
    model = olmoe if olmoe is not None and name == "olmoe-1b-7b" else build_preset(name)
    layers = {"layers": model.config.num_hidden_layers, "of_layers": FULL_LAYERS[name]}  # on every row

    def add_preset(row):
        add({**row, **layers})

    lean = LeanModel.from_hf(model, batch_invariant=True)
    draft = DraftModel(build_preset(name, layers=1))  # a one-layer model of the preset's shape drafts
    pc = {}
    for dname, inner, ks in (("lookup", PromptLookup(), range(0, K_MAX + 1)), ("draft", draft, range(1, K_MAX + 1))):
        spec = SpeculativeEngine(lean, ReplayDrafter(prompts, conts, runs[dname], inner), k=K_MAX, max_seq=160)
        for k, t in step_costs(spec, prompts[:1], ks).items():
            pc[(dname, k)] = t["median_ms"]
            add_preset({"kind": "verify_cost", "model": name, "mode": "invariant", "drafter": dname, "batch": 1,
                        "k": k, **t})
    base_p = {}
    for mode in ("default", "invariant"):
        rate, tokens, secs = tokens_per_s(run_each(Engine(LeanModel.from_hf(
            model, batch_invariant=mode == "invariant"), max_seq=160), prompts, NEW))
        base_p[mode] = rate
        add_preset({"kind": "replay", "model": name, "mode": mode, "drafter": "none", "k": 0, "tok_s": rate,
                    "generated": tokens, "seconds": secs})
    for dname, inner in (("lookup", PromptLookup()), ("draft", draft)):
        cost = [pc.get((dname, j), pc[(dname, 1)]) for j in range(K_MAX + 1)]  # (a draft model has no k = 0)
        best = _best_fixed(runs[dname], {k: cost[k] for k in range(1, K_MAX + 1)})
        for k in (best, "adaptive"):
            replay = ReplayDrafter(prompts, conts, runs[dname], inner)
            ad = AdaptiveK(cost, k_min=inner.k_min) if k == "adaptive" else None
            spec = SpeculativeEngine(lean, replay, k=K_MAX if ad else k, adaptive=ad, max_seq=160)
            outs = [spec.generate([p], NEW) for p in prompts[:1] + prompts]
            rate, tokens, secs = tokens_per_s(outs[1:])
            add_preset({"kind": "replay", "model": name, "mode": "invariant", "drafter": dname, "k": str(k),
                        "tok_s": rate, "generated": tokens, "seconds": secs,
                        "speedup_vs_default_plain": rate / base_p["default"],
                        "speedup_vs_invariant_plain": rate / base_p["invariant"],
                        "replayed": "drafts and acceptances from the CPU recording; verify, rollback and drafting "
                                    "ran"})


def _peers(ck, dr, prompts, add) -> None:
    """transformers' generate on the shipped model: plain, prompt lookup, assisted by the draft model."""
    plain = None
    for name, kw in (("plain", {}), ("prompt_lookup_4", {"prompt_lookup_num_tokens": 4}),
                     ("prompt_lookup_10", {"prompt_lookup_num_tokens": 10}),
                     ("assistant_model", {"assistant_model": dr.model})):
        rate, outs = hf_generate(ck.model, prompts, NEW, **kw)
        plain = outs if plain is None else plain
        add({"kind": "peer", "model": "shipped", "contestant": name, "tok_s": rate,
             "identical_to_its_plain_greedy": sum(a == b for a, b in zip(outs, plain, strict=True))})
