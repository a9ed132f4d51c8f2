"""Checks of chapter 1's exercises."""
from __future__ import annotations

import math

import torch

from exercises._check.common import close, gen, no_host_sync  # noqa: F401


def ch01_offsets(mod) -> None:
    cases = (([3, 0, 5], 4), ([0, 0], 8), ([16, 1, 15, 0, 17], 16), ([1], 1))
    for counts, bm in cases:
        ref, pos = [0], 0
        for c in counts:
            pos += -(-c // bm) * bm
            ref.append(pos)
        got = mod.padded_offsets(torch.tensor(counts, dtype=torch.int32), bm)
        assert isinstance(got, torch.Tensor) and got.tolist() == ref, \
            f"padded_offsets({counts}, block_m={bm}) = {got!r}, expected {ref}"


def ch01_top1(mod) -> None:
    g = gen(1)
    hand = torch.tensor([[-3.0, -1.0, -2.0, -1.0, -5.0, -4.0, -2.5, -1.5, -3.5, -6.0, -2.0, -7.0, -1.2],
                         [90.0, 95.0, 95.0, 10.0, 94.0, 0.0, -1.0, 3.0, 95.0, 2.0, 1.0, 0.0, 0.0]])
    # row 0: every logit negative (a padding lane read as 0 would win) with a tie at the top;
    # row 1: logits whose exp overflows fp32 unless the max is subtracted first, a three-way tie
    cases = [torch.randn(9, 8, generator=g), torch.randn(5, 13, generator=g), hand, -torch.rand(6, 5, generator=g),
             torch.randn(1, 3, generator=g), torch.randn(0, 8, generator=g)]
    for logits in cases:
        T, E = logits.shape
        w, ids = mod.top1(logits)
        for t in range(T):
            row = logits[t].tolist()
            best = max(range(E), key=lambda e: (row[e], -e))  # the lowest id among equal logits
            assert int(ids[t]) == best, f"top1 T={T} E={E}: token {t} got expert {int(ids[t])}, expected {best} " \
                                        "(the largest logit, the lowest id on a tie)"
            ref = 1 / sum(math.exp(v - row[best]) for v in row)
            assert abs(float(w[t]) - ref) < 1e-5, f"top1 T={T} E={E}: token {t} weight {float(w[t])}, expected {ref}"
