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
