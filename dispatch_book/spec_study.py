"""Chapter 9's experiments, shared by the chapter, the ``speculative`` benchmark suite and the tests.

    invariance(model, Ts)          a row's logits alone and inside steps of T rows: bitwise equal?
    held_out_prompts(tok, n, ...)  prompts cut from the standard-library files the model never saw
"""
from __future__ import annotations

import torch


def _prefill_alone(model, prompt: list[int], cache_len: int):
    """A one-row cache holding ``prompt`` (prefilled alone: the same bits for every experiment)."""
    cache = model.new_cache(1, cache_len)
    ids = torch.tensor([prompt], device=model.device)
    with torch.no_grad():
        model(ids, torch.arange(len(prompt), device=model.device)[None], cache, prefill=True)
    return cache


def invariance(model, Ts, *, tokens_per_row: int = 1, seed: int = 0, cache_len: int = 48,
               prompt_lens: tuple[int, int] = (3, 20)) -> list[dict]:
    """For each T of ``Ts``: one step of T rows (each with ``tokens_per_row`` new tokens at its own
    position after a random prompt of its own length), every row's logits compared bit for bit with
    the same row stepped alone, one token at a time (the steps plain greedy decoding takes).

    Each row is prefilled alone and its cache row copied into the batch, so the prefills are the same
    bits; the claim under test is the decode/verify step's. Returns [{"T", "rows", "equal"}]: ``equal``
    counts the rows whose logits (all ``tokens_per_row`` of them) are bitwise the alone ones."""
    S, T_max = tokens_per_row, max(Ts)
    g = torch.Generator().manual_seed(seed)
    V, dev = model.cfg.vocab_size, model.device
    lens = torch.randint(prompt_lens[0], prompt_lens[1] + 1, (T_max,), generator=g).tolist()
    prompts = [torch.randint(0, V, (n,), generator=g).tolist() for n in lens]
    new = torch.randint(0, V, (T_max, S), generator=g).to(dev)
    alone_caches = [_prefill_alone(model, p, cache_len) for p in prompts]
    alone = []
    with torch.no_grad():
        for r, (p, cache) in enumerate(zip(prompts, alone_caches, strict=True)):
            cache = [c.clone() for c in cache]
            alone.append(torch.cat([model(new[r:r + 1, s:s + 1], torch.tensor([[len(p) + s]], device=dev), cache,
                                          prefill=False)[0] for s in range(S)]))
    rows = []
    for T in Ts:
        k_cache, v_cache = model.new_cache(T, cache_len)
        for r in range(T):
            k_cache[:, r], v_cache[:, r] = alone_caches[r][0][:, 0], alone_caches[r][1][:, 0]
        pos = torch.tensor(lens[:T], device=dev)[:, None] + torch.arange(S, device=dev)
        with torch.no_grad():
            out = model(new[:T], pos, (k_cache, v_cache), prefill=False)
        rows.append({"T": T, "tokens_per_row": S, "rows": T,
                     "equal": sum(bool(torch.equal(out[r], alone[r])) for r in range(T))})
    return rows


# ---- held-out text, greedy continuations and acceptance traces ----

def held_out_prompts(tokenizer, n: int = 12, prompt_tokens: int = 64, new_tokens: int = 64, seed: int = 0,
                     checkpoint: str = "cpu") -> list[dict]:
    """Prompts from the validation files of a shipped checkpoint's manifest — standard-library files
    its model never trained on — read from this Python's standard library where a file's SHA-256 is
    the manifest's (another Python's file of that name is other text). One prompt per file, the first
    ``n`` files, at a seeded offset with room for ``new_tokens`` after it: [{"file", "offset", "ids"}]."""
    import hashlib
    import json
    import random

    from dispatch import data
    from dispatch.train import ASSETS

    manifest = json.loads((ASSETS / checkpoint / "manifest.json").read_text())
    root, out = data.stdlib_dir(), []
    for f in manifest["files"]:
        path = root / f["name"]
        if f["split"] != "val" or not path.is_file() or hashlib.sha256(path.read_bytes()).hexdigest() != f["sha256"]:
            continue
        ids = tokenizer(path.read_text(encoding="utf-8", errors="replace"))["input_ids"]
        if len(ids) < prompt_tokens + new_tokens:
            continue
        off = random.Random(f"{seed}:{f['name']}").randrange(prompt_tokens, len(ids) - new_tokens + 1)
        out.append({"file": f["name"], "offset": off, "ids": ids[off - prompt_tokens:off]})
        if len(out) == n:
            return out
    raise ValueError(f"only {len(out)} of {n} held-out files of the {checkpoint!r} manifest are on this Python "
                     f"({root}); the traces are recorded where they are (results/cpu/speculative_traces.json)")


def lookup_runs(prompt: list[int], cont: list[int], k_max: int, n_max: int = 3, n_min: int = 1) -> list[int]:
    """runs[p] (:mod:`dispatch.serve.spec_cost`): the drafts prompt lookup keeps when the continuation's
    p-th token is the last one, capped at ``k_max``; exactly what :func:`dispatch.serve.drafters.lookup`
    proposes in the engine."""
    from dispatch.serve.acceptance import leading
    from dispatch.serve.drafters import lookup

    full = torch.tensor(prompt + cont)
    P, N = len(prompt), len(cont)
    last = torch.arange(P, P + N)
    drafts = lookup(full.expand(N, -1), last, k_max, n_max, n_min)
    nxt = torch.cat([full, torch.full((k_max,), -1)])  # past the end: never a match
    truth = nxt[(last[:, None] + 1 + torch.arange(k_max))]
    return leading(drafts == truth).tolist()


def draft_runs(draft_model, prompt: list[int], cont: list[int], k_max: int) -> list[int]:
    """runs[p] for a greedy draft model: its guesses, given the true text so far (one forward over
    prompt + continuation), kept while they equal the continuation — the k greedy steps it takes in
    the engine, up to round-off between one forward and step-by-step decoding."""
    full = torch.tensor([prompt + cont], device=draft_model.device)
    S = full.shape[1]
    with torch.no_grad():
        logits = draft_model(full, torch.arange(S, device=full.device)[None], draft_model.new_cache(1, S),
                             prefill=True)[0]
    ok = torch.cat([(logits[:-1].argmax(-1) == full[0, 1:]).cpu(), torch.zeros(k_max, dtype=torch.bool)])
    P, N = len(prompt), len(cont)
    idx = torch.arange(P, P + N)[:, None] + torch.arange(k_max)  # guesses at positions q, q+1, ...
    return ok[idx].long().cumprod(dim=1).sum(dim=1).tolist()


def distinct_experts(model, sequences: list[list[int]], windows=range(1, 10)) -> dict:
    """Routing of a transformers MoE model on real text: the mean number of distinct experts a layer
    uses for w consecutive tokens (a verify step of w = k+1 tokens), for w in ``windows``, and each
    expert's share of tokens per layer (``inclusion_LE``, for the skew-aware formula)."""
    from dispatch.routertap import RouterTap

    E = model.config.num_experts
    L = model.config.num_hidden_layers
    totals = {w: 0.0 for w in windows}
    counts = {w: 0 for w in windows}
    chosen_LE, tokens = torch.zeros(L, E, dtype=torch.float64), 0
    for seq in sequences:
        with torch.no_grad(), RouterTap(model) as tap:
            model(input_ids=torch.tensor([seq], device=model.device))
        for layer, ids_TK in enumerate(tap.ids_L):
            onehot_TE = torch.zeros(ids_TK.shape[0], E, dtype=torch.float64).scatter_(1, ids_TK.cpu().long(), 1.0)
            chosen_LE[layer] += onehot_TE.sum(0)
            csum = torch.cat([torch.zeros(1, E, dtype=torch.float64), onehot_TE.cumsum(0)])
            for w in windows:
                if w <= ids_TK.shape[0]:
                    present = (csum[w:] - csum[:-w]) > 0  # [T - w + 1, E]: experts used in each window
                    totals[w] += present.sum().item()
                    counts[w] += present.shape[0]
        tokens += len(seq)
    return {"windows": list(windows), "measured": [totals[w] / counts[w] for w in windows],
            "inclusion_LE": (chosen_LE / tokens).tolist(), "E": E, "K": model.config.num_experts_per_tok}


def acceptance(runs: list[list[int]], ks=range(1, 9)) -> list[dict]:
    """What a set of traces says at each fixed k: the acceptance rate α (kept / tried over every
    position: a draft is tried when all before it were kept) and the tokens a step emits on average
    when replayed (:func:`dispatch.serve.spec_cost.simulate`)."""
    from dispatch.serve.spec_cost import simulate

    out = []
    for k in ks:
        kept = sum(min(r, k) for t in runs for r in t)
        tried = sum(min(r, k) + (r < k) for t in runs for r in t)
        parts = [simulate(t, [1.0] * (k + 1), k) for t in runs]
        out.append({"k": k, "alpha": kept / tried, "tokens_per_step": sum(p["tokens"] for p in parts)
                    / sum(p["steps"] for p in parts)})
    return out


def race(target, draft, prompts: list[list[int]], new: int, *, k_lookup: int, k_draft: int,
         costs: dict[str, list[float]], peers: bool = True) -> list[dict]:
    """Batch 1, each prompt alone, greedy: tokens/s of the plain engine, speculative decoding (prompt
    lookup at ``k_lookup`` and adaptive; the draft model at ``k_draft``) and, with ``peers``,
    transformers' ``generate`` (plain, ``prompt_lookup_num_tokens``, ``assistant_model``); and how many
    outputs are the plain engine's (``identical``). ``costs``: step times per k for the adaptive k."""
    from dispatch.engine import Engine, LeanModel
    from dispatch.serve.drafters import DraftModel, PromptLookup
    from dispatch.serve.spec_cost import AdaptiveK
    from dispatch.serve.speculative import SpeculativeEngine
    from dispatch_book.bench.speculative import hf_generate, run_each, tokens_per_s

    lean, S = LeanModel.from_hf(target), max(len(p) for p in prompts) + new
    plain = run_each(Engine(lean, max_seq=S), prompts, new)
    ref = [o.tokens[0] for o in plain]
    rows = [{"contestant": "plain", "tok_s": tokens_per_s(plain)[0], "identical": len(prompts)}]
    for name, drafter, k, ad in (
            (f"lookup, k={k_lookup}", PromptLookup(), k_lookup, None),
            ("lookup, adaptive k", PromptLookup(), 8, AdaptiveK(costs["lookup"])),
            (f"draft model, k={k_draft}", DraftModel(draft), k_draft, None)):
        outs = run_each(SpeculativeEngine(lean, drafter, k=k, adaptive=ad, max_seq=S), prompts, new)
        rows.append({"contestant": name, "tok_s": tokens_per_s(outs)[0],
                     "identical": sum(o.tokens[0] == r for o, r in zip(outs, ref, strict=True))})
    if peers:
        for name, kw in (("transformers", {}), (f"transformers, prompt lookup {k_lookup}",
                                                 {"prompt_lookup_num_tokens": k_lookup}),
                         ("transformers, assistant model", {"assistant_model": draft})):
            rate, outs = hf_generate(target, prompts, new, **kw)
            rows.append({"contestant": name, "tok_s": rate,
                         "identical": sum(o == r for o, r in zip(outs, ref, strict=True))})
    return rows


def gpu_summary(doc: dict) -> dict[str, list[dict]]:
    """A GPU recording of the ``speculative`` suite as the chapter's tables: the invariance cost
    (invariant / default decode step), the race on the shipped model (with transformers' peers),
    and the presets' replays (speed-up over plain greedy decoding in the default mode, ``x``, and in the
    batch-invariant mode, ``x invariant``)."""
    rows = [r for r in doc["rows"] if "skipped" not in r]
    inv = {}
    for r in rows:
        if r["kind"] == "invariance":
            inv.setdefault((r["shape"], r["batch"]), {})[r["mode"]] = r["median_ms"]
    cost = [{"model": m, "batch": b, "default ms": v["default"], "invariant ms": v["invariant"],
             "x": v["invariant"] / v["default"]} for (m, b), v in inv.items() if len(v) == 2]
    base = next((r["tok_s"] for r in rows if r["kind"] == "race" and r["drafter"] == "none"
                 and r["mode"] == "default"), None)

    def x(rate):  # over plain greedy decoding in the default mode
        return rate / base if base else None

    race = [{"contestant": f"{r['drafter']}, k={r['k']}, {r['mode']}" if r["drafter"] != "none"
             else f"plain, {r['mode']}", "tok/s": r["tok_s"], "x": x(r["tok_s"]),
             "identical": r.get("identical_to_plain_greedy", "")} for r in rows if r["kind"] == "race"]
    race += [{"contestant": f"transformers {r['contestant']}", "tok/s": r["tok_s"], "x": x(r["tok_s"]),
              "identical": r["identical_to_its_plain_greedy"]} for r in rows if r["kind"] == "peer"]
    def own(r, mode):  # a plain row is 1.0 over its own mode's plain decode
        return 1.0 if (r["drafter"], r["mode"]) == ("none", mode) else None

    replay = [{"model": r["shape"], "mode": r["mode"], "drafter": r["drafter"], "k": r["k"], "tok/s": r["tok_s"],
               "x": r.get("speedup_vs_default_plain", own(r, "default")),
               "x invariant": r.get("speedup_vs_invariant_plain", own(r, "invariant"))}
              for r in rows if r["kind"] == "replay"]
    return {"invariance": cost, "race": race, "replay": replay}


def gpu_sentences(doc: dict) -> list[str]:
    """What a GPU recording of the ``speculative`` suite says, computed from its rows: the shipped model's
    plain step against its speculative step (the race), transformers' prompt lookup against its own plain
    ``generate``, the verify step's price at k = 0 over a decode step, and each preset's replay."""
    rows = [r for r in doc["rows"] if "skipped" not in r]
    out = []
    race = {(r["mode"], r["drafter"], str(r["k"])): r for r in rows if r["kind"] == "race"}
    plain = race.get(("default", "none", "0"))
    spec = [r for r in race.values() if r["drafter"] == "lookup" and r["mode"] == "invariant"]
    if plain and spec:
        best = max(spec, key=lambda r: r["tok_s"])
        step_us = 1e6 / best["tok_s"] * best["tokens_per_step"]
        out.append(f"shipped model, batch 1: plain decoding {1e6 / plain['tok_s']:.0f} µs a token; prompt lookup "
                   f"(k={best['k']}) keeps {best['tokens_per_step']:.2f} tokens a step at {step_us:.0f} µs a step: "
                   f"{best['tok_s'] / plain['tok_s']:.2f}x plain")
    peer = {r["contestant"]: r["tok_s"] for r in rows if r["kind"] == "peer"}
    looks = {c: v for c, v in peer.items() if c.startswith("prompt_lookup")}
    if "plain" in peer and looks:
        c = max(looks, key=looks.get)
        out.append(f"transformers' generate: {c} {looks[c] / peer['plain']:.2f}x its plain generate "
                   f"({peer['plain']:,.0f} tok/s)")
    from dispatch_book.bench.results import commit_of

    cost = {(r["shape"], r["mode"], r["drafter"], r["k"]): (r["median_ms"], commit_of(doc, r))
            for r in rows if r["kind"] == "verify_cost"}
    inv = {(r["shape"], r["batch"], r["mode"]): (r["median_ms"], commit_of(doc, r))
           for r in rows if r["kind"] == "invariance"}
    for shape in dict.fromkeys(s for s, *_ in cost):
        k0, step = cost.get((shape, "invariant", "lookup", 0)), inv.get((shape, 1, "invariant"))
        if k0 and step and k0[1] == step[1]:  # one run's rows: a ratio across runs would mix two codes
            out.append(f"{shape}: a speculative step at k=0 costs {k0[0]:.3f} ms, {k0[0] / step[0]:.2f}x the "
                       f"invariant decode step ({step[0]:.3f} ms)")
    for r in (r for r in rows if r["kind"] == "replay" and r["drafter"] != "none"):
        out.append(f"{r['shape']} replay, {r['drafter']} k={r['k']}: {r['speedup_vs_invariant_plain']:.2f}x the "
                   f"invariant plain decode, {r['speedup_vs_default_plain']:.2f}x the default one")
    return out
