"""Checks of chapter 3's exercises."""
from __future__ import annotations

import itertools
from fractions import Fraction

import torch

from exercises._check.common import close, gen


def ch03_gemv(mod) -> None:
    for O, I in ((40, 70), (16, 32), (1, 5)):  # noqa: E741
        g = gen(O + I)
        w, x = torch.randn(O, I, generator=g), torch.randn(I, generator=g)
        ref = torch.tensor([sum(a * b for a, b in zip(w[o].tolist(), x.tolist(), strict=True)) for o in range(O)],
                           dtype=torch.float64)
        close(f"gemv O={O} I={I}", mod.gemv(w, x), ref, rtol=1e-4, atol=1e-4)


def _touched_exact(E: int, K: int, T: int) -> Fraction:
    """The mean number of distinct experts over every routing of T tokens (each K distinct of E)."""
    choices = list(itertools.combinations(range(E), K))
    total = sum(len(set().union(*picks)) for picks in itertools.product(choices, repeat=T)) if T else 0
    return Fraction(total, len(choices) ** T)


def ch03_experts_touched(mod) -> None:
    # exact: the mean over every routing, enumerated
    for E, K, T in ((4, 2, 2), (5, 2, 3), (6, 3, 2), (4, 1, 3), (3, 3, 2), (5, 2, 0)):
        ref = float(_touched_exact(E, K, T))
        got = mod.experts_touched(E, K, T)
        assert abs(got - ref) < 1e-9, f"experts_touched(E={E}, K={K}, T={T}) = {got}, expected {ref:.6f} (the " \
                                      f"mean over all {len(list(itertools.combinations(range(E), K))) ** T} routings)"
    # against a count over random routings of a larger layer
    g = gen(4)
    E, K, T = 16, 2, 5
    sims = [len(set(torch.stack([torch.randperm(E, generator=g)[:K] for _ in range(T)]).flatten().tolist()))
            for _ in range(4000)]
    mean = sum(sims) / len(sims)
    assert abs(mod.experts_touched(E, K, T) - mean) < 0.1, \
        f"experts_touched({E}, {K}, {T}) = {mod.experts_touched(E, K, T):.3f}, a simulation gives {mean:.3f}"
    got = mod.expert_bytes_read(64, 8, 1, 2048, 1024)
    assert abs(got - 8 * 3 * 2048 * 1024 * 2) < 1, \
        f"expert_bytes_read(OLMoE, T=1) = {got}, expected 8 experts' bf16 weights"
    got, ref = mod.expert_bytes_read(8, 2, 3, 64, 32, 1), mod.experts_touched(8, 2, 3) * 3 * 64 * 32
    assert abs(got - ref) < 1e-6, f"expert_bytes_read(E=8, K=2, T=3, H=64, I=32, 1 byte) = {got}, expected {ref}"


def _deal_ref(ids: list[list[int]], E: int, tiles: int, G: int) -> list[list[tuple[int, int]]]:
    used = sorted({e for row in ids for e in row if 0 <= e < E})
    items = [(e, j) for e in used for j in range(tiles)]  # slot-major
    return [items[p::G] for p in range(G)]


def ch03_round_robin(mod) -> None:
    g = gen(5)
    cases = [([[3, 0], [3, 1]], 5, 2, 3),  # the docstring's example
             (torch.randint(0, 16, (6, 2), generator=g).tolist(), 16, 3, 8),
             ([[7, 7, 7]], 8, 4, 5),  # one expert, chosen thrice
             ([[2, -1], [9, 2], [0, 2]], 4, 2, 2),  # ids outside [0, E) are no expert
             (torch.randint(0, 64, (12, 4), generator=g).tolist(), 64, 2, 7),
             ([[0, 1]], 2, 3, 16),  # more programs than items
             ([], 4, 2, 3)]  # no tokens: nothing to do
    for ids, E, tiles, G in cases:
        ids_TK = torch.tensor(ids, dtype=torch.int64).reshape(len(ids), -1 if ids else 2)
        ref = _deal_ref(ids, E, tiles, G)
        got = mod.deal(ids_TK, E, tiles, G)
        what = f"deal(ids_TK={ids if len(ids) < 4 else '…'}, E={E}, tiles={tiles}, programs={G})"
        assert isinstance(got, list) and len(got) == G, f"{what}: expected a list of {G} lists, got {got!r}"
        got = [[tuple(int(v) for v in item) for item in items] for items in got]
        for p in range(G):
            assert got[p] == ref[p], f"{what}: program {p} streams {got[p]}, expected {ref[p]}"
        counts = [len(items) for items in got]
        assert max(counts) - min(counts) <= 1, f"{what}: programs stream {counts} tiles: not balanced"
