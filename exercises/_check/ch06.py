"""Checks of chapter 6's exercises."""
from __future__ import annotations

import math

import torch

from exercises._check.common import close, gen, no_host_sync  # noqa: F401


def ch06_kv_cache(mod) -> None:
    g = gen(9)
    for Bc, B, S, D, pos in ((2, 2, 4, 3, [2, 0]), (8, 5, 6, 4, [5, 0, 3, 3, 1]), (4, 1, 1, 2, [0]), (3, 0, 5, 2, [])):
        cache = torch.randn(Bc, S, D, generator=g)
        before, ptr = cache.clone(), cache.data_ptr()
        new = torch.randn(B, D, generator=g)
        ref = before.clone()
        for b in range(B):
            ref[b, pos[b]] = new[b]
        pos_B = torch.tensor(pos, dtype=torch.int64)
        with no_host_sync("cache_write"):
            mod.cache_write(cache, new, pos_B)
        assert cache.data_ptr() == ptr, "cache_write: the cache moved"
        assert torch.equal(cache, ref), \
            f"cache_write(B={B} of {Bc} rows, pos={pos}): not new_BD[b] at [b, pos[b]] with the rest untouched"
        mask = [[s <= pos[b] for s in range(S)] for b in range(B)]
        with no_host_sync("decode_mask"):
            got = mod.decode_mask(pos_B, S)
        assert isinstance(got, torch.Tensor) and got.dtype == torch.bool and tuple(got.shape) == (B, S), \
            f"decode_mask(pos={pos}, S={S}): expected a bool [{B}, {S}] tensor, got {got!r}"
        assert got.tolist() == mask, f"decode_mask(pos={pos}, S={S}) = {got.tolist()}, expected {mask}"


def ch06_bucket(mod) -> None:
    powers = (1, 2, 4, 8, 16, 32, 64, 128, 256)
    for buckets in ((1, 2, 4, 8), powers, (1, 3, 8), (4,), (1,), (2, 3, 64)):
        worst = 0.0
        for batch in range(1, buckets[-1] + 1):
            want = min(b for b in buckets if b >= batch)
            got = mod.bucket(batch, buckets)
            assert got == want, f"bucket({batch}, {buckets}) = {got}, expected {want}"
            worst = max(worst, (want - batch) / want)
        got = mod.worst_padding(buckets)
        assert abs(float(got) - worst) < 1e-12, f"worst_padding({buckets}) = {got}, expected {worst}"
        for batch in (0, -1, buckets[-1] + 1):
            try:
                mod.bucket(batch, buckets)
            except ValueError:
                continue
            raise AssertionError(f"bucket({batch}, {buckets}) must raise ValueError")
    assert mod.bucket(5) == 8 and abs(mod.worst_padding() - 127 / 256) < 1e-12, "the defaults are the powers of two"


def _nucleus_ref(row: list[float], temperature: float, top_p: float) -> list[float]:
    m = max(row)
    p = [math.exp((v - m) / temperature) for v in row]
    p = [v / sum(p) for v in p]
    kept, before = [0.0] * len(p), 0.0
    for i in sorted(range(len(p)), key=lambda i: (-p[i], i)):  # most likely first, lower id on a tie
        if before < top_p:
            kept[i] = p[i]
        before += p[i]
    return [v / sum(kept) for v in kept]


def ch06_sampling(mod) -> None:
    def draw(logits, temperature, top_p, seed):
        with no_host_sync("sample"):
            return mod.sample(logits, temperature, top_p, gen(seed))

    g = gen(10)
    hand = torch.tensor([[math.log(0.5), math.log(0.3), math.log(0.2)]])
    cases = [(hand, 1.0, 0.7), (hand, 1.0, 1.0), (hand, 1.0, 0.2),
             (torch.tensor([[1.0, 2.0, 2.0, 0.0]]), 1.0, 0.3),  # a tie: the lower id stays
             (torch.tensor([[1.0, 2.0, 2.0, 0.0]]), 1.0, 0.5),
             (torch.tensor([[3.0]]), 0.7, 0.9),  # one token
             (torch.randn(6, 11, generator=g) * 2, 0.6, 0.8), (torch.randn(5, 7, generator=g), 2.0, 0.95)]
    for logits, temp, top_p in cases:
        ref = torch.tensor([_nucleus_ref(r, temp, top_p) for r in logits.tolist()], dtype=torch.float64)
        got = mod.nucleus(logits, temp, top_p)
        assert isinstance(got, torch.Tensor) and got.dtype == torch.float32, "nucleus: an fp32 tensor"
        close(f"nucleus(temperature={temp}, top_p={top_p}) of {logits.tolist()[0][:4]}…", got, ref)
    ties = torch.tensor([[0.0, 1.0, 1.0], [2.0, 2.0, -1.0], [0.5, 0.0, 0.5]])
    got = draw(ties, 0.0, 1.0, 0)
    assert isinstance(got, torch.Tensor) and got.tolist() == [1, 0, 0], \
        f"sample(temperature=0) = {got!r}, expected the argmax, lower id on a tie: [1, 0, 0]"
    V, n = 6, 20000
    logits = torch.randn(V, generator=g).expand(n, V).contiguous()
    draws = draw(logits, 0.7, 0.9, 11)
    assert isinstance(draws, torch.Tensor) and tuple(draws.shape) == (n,), "sample: one token per row, [B]"
    again = draw(logits, 0.7, 0.9, 11)
    assert torch.equal(draws, again), "sample: two generators seeded alike gave different tokens"
    assert not torch.equal(draws, draw(logits, 0.7, 0.9, 12)), "sample: another seed, the same tokens"
    ref = _nucleus_ref(logits[0].tolist(), 0.7, 0.9)
    freq = [(draws == i).sum().item() / n for i in range(V)]
    for i in range(V):
        assert ref[i] > 0 or freq[i] == 0, f"sample drew token {i}, outside the top-p set"
        assert abs(freq[i] - ref[i]) < 0.02, \
            f"sample: token {i} drawn {freq[i]:.3f} of the time, its top-p probability is {ref[i]:.3f}"
    rows = torch.randn(4, 9, generator=g)
    top = [max(range(9), key=lambda v: r[v]) for r in rows.tolist()] * 50
    got = draw(rows.repeat(50, 1), 1.0, 1e-6, 13)
    assert got.tolist() == top, "sample: with a tiny top_p only the most likely token can be drawn"
    assert tuple(draw(torch.zeros(0, 5), 1.0, 1.0, 14).shape) == (0,), "sample: no rows, no tokens"
