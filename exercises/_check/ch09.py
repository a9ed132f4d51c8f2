"""Checks of chapter 9's exercises."""
from __future__ import annotations

import torch

from exercises._check.common import close, gen, no_host_sync  # noqa: F401


def _ngram_ref(tokens: list[int], k: int, n: int) -> list[int]:
    """The latest earlier window equal to the suffix; the text after it, read periodically."""
    L = len(tokens)
    starts = [i for i in range(L - n) if tokens[i:i + n] == tokens[L - n:]] if L > n else []
    if not starts:
        return []
    src = starts[-1] + n
    period = L - src  # tokens[src:] repeats
    return [tokens[src + j % period] for j in range(k)]


def ch09_ngram(mod) -> None:
    cases = [([7, 1, 2, 3, 1, 2], 4, 2), ([1, 2, 3], 3, 1), ([5], 2, 1), ([4, 4], 3, 1), ([1, 2, 1, 2], 0, 2),
             ([9, 1, 2, 8, 1, 2, 5, 1, 2], 3, 2),  # two earlier matches: the latest wins (5, 1, 2)
             ([3, 1, 3, 1], 5, 2), ([6, 6, 6, 6], 4, 3), ([1, 2, 3, 4], 2, 4), ([2, 3, 2, 3, 2], 6, 1)]
    g = gen(12)
    for _ in range(40):  # small vocabularies: many matches
        L, V = int(torch.randint(2, 25, (1,), generator=g)), int(torch.randint(2, 5, (1,), generator=g))
        tokens = torch.randint(0, V, (L,), generator=g).tolist()
        cases.append((tokens, int(torch.randint(0, 9, (1,), generator=g)), int(torch.randint(1, 4, (1,), generator=g))))
    for tokens, k, n in cases:
        before = list(tokens)
        got = mod.ngram_draft(tokens, k, n)
        assert tokens == before, "ngram_draft changed its input"
        want = _ngram_ref(tokens, k, n)
        assert isinstance(got, list) and [int(t) for t in got] == want, \
            f"ngram_draft({tokens}, k={k}, n={n}) = {got!r}, expected {want}"


def ch09_accept(mod) -> None:
    logits = torch.full((1, 4, 10), -1.0)
    for j, t in enumerate([5, 7, 9, 4]):
        logits[0, j, t] = 1.0
    with no_host_sync("greedy_accept"):
        out, n = mod.greedy_accept(torch.tensor([[5, 7, 2]]), logits)
    assert out.tolist() == [[5, 7, 9, 4]] and n.tolist() == [2], \
        f"greedy_accept (the example): out {out.tolist()}, n {n.tolist()}; expected [[5, 7, 9, 4]], [2]"
    g = gen(13)
    for B, k, V in ((6, 3, 4), (5, 1, 3), (4, 0, 5), (7, 6, 2)):
        logits = torch.randn(B, k + 1, V, generator=g)
        t = logits.argmax(-1)
        drafts = torch.where(torch.rand(B, k, generator=g) < 0.6, t[:, :k], torch.randint(0, V, (B, k), generator=g))
        if k >= 2:  # a row whose first draft is refused but a later one agrees: nothing is kept
            drafts[0, 0], drafts[0, 1] = (t[0, 0] + 1) % V, t[0, 1]
        with no_host_sync("greedy_accept"):
            out, n = mod.greedy_accept(drafts, logits)
        want = [next((j for j in range(k) if drafts[b, j] != t[b, j]), k) for b in range(B)]
        assert out.dtype == torch.int64 and n.dtype == torch.int64, "greedy_accept: int64 tensors"
        assert out.tolist() == t.tolist(), "greedy_accept: out must be every position's argmax"
        assert n.tolist() == want, f"greedy_accept: n {n.tolist()}, expected {want} (leading matches only)"
        S = 20
        hist = torch.arange(B * S).view(B, S) + 1000  # what must stay where nothing is written
        pos = torch.randint(0, S - k - 1, (B,), generator=g)
        ref, ptr, pos0 = hist.clone(), pos.data_ptr(), pos.clone()
        for b in range(B):
            for j in range(want[b] + 1):
                ref[b, pos0[b] + 1 + j] = out[b, j]
        with no_host_sync("advance"):
            mod.advance(hist, pos, out, n)
        assert pos.data_ptr() == ptr and pos.tolist() == (pos0 + n + 1).tolist(), \
            f"advance: pos must move in place by n + 1: {pos0.tolist()} + {n.tolist()} + 1, got {pos.tolist()}"
        assert torch.equal(hist, ref), "advance: out[b, :n+1] at pos+1 .. pos+n+1, every other position untouched"
