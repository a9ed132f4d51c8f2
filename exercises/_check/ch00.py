"""Checks of chapter 0's exercises."""
from __future__ import annotations

import math

import torch

from exercises._check.common import gen


def _route_v3_ref(logits: list[float], bias: list[float], K: int, G: int, TG: int, scale: float) -> dict:
    """{expert: weight} of one token, straight from the definition (plain Python)."""
    E = len(logits)
    s = [1 / (1 + math.exp(-v)) for v in logits]
    c = [a + b for a, b in zip(s, bias, strict=True)]
    size = E // G
    group_score = [sum(sorted(c[g * size:(g + 1) * size], reverse=True)[:2]) for g in range(G)]
    kept = sorted(range(G), key=lambda g: -group_score[g])[:TG]
    allowed = [e for e in range(E) if e // size in kept]
    ids = sorted(allowed, key=lambda e: -c[e])[:K]
    total = sum(s[e] for e in ids)
    return {e: s[e] / total * scale for e in ids}


def ch00_route_v3(mod) -> None:
    g = gen(0)
    # token 0: group 0 has the best expert (3.0) but group 1 the best top-2 sum; token 1: the bias
    # moves the choice from expert 4 to expert 6 (the weight is still sigmoid(0.1), unbiased)
    hand = torch.tensor([[3.0, -3.0, 1.0, 0.9, 0.5, 0.4, -2.0, -2.1],
                         [0.0, -1.0, 0.2, -0.5, 1.5, -1.0, 0.1, -0.3]])
    hand_bias = torch.tensor([0.0, 0.0, 0.0, 0.0, -0.6, 0.0, 0.4, 0.0])
    cases = [(hand, hand_bias, 2, 4, 1, 1.0),
             (hand, hand_bias, 2, 4, 2, 2.5),
             (torch.randn(9, 16, generator=g) * 2, 0.3 * torch.randn(16, generator=g), 4, 4, 2, 2.5),
             (torch.randn(7, 8, generator=g), 0.5 * torch.randn(8, generator=g), 3, 8, 4, 1.0),  # a group each
             (torch.randn(5, 12, generator=g), 0.2 * torch.randn(12, generator=g), 2, 1, 1, 1.0),  # no groups
             (torch.randn(0, 8, generator=g), torch.zeros(8), 2, 4, 2, 1.0)]
    for logits, bias, K, G, TG, scale in cases:
        T = logits.shape[0]
        what = f"route_v3(T={T}, E={logits.shape[1]}, K={K}, n_group={G}, topk_group={TG}, scaling={scale})"
        w, ids = mod.route_v3(logits, bias, K, G, TG, scale)
        assert isinstance(w, torch.Tensor) and isinstance(ids, torch.Tensor), f"{what}: return two tensors"
        assert tuple(w.shape) == tuple(ids.shape) == (T, K), f"{what}: shapes {tuple(w.shape)}, {tuple(ids.shape)}"
        assert w.dtype == torch.float32, f"{what}: weights must be fp32, got {w.dtype}"
        for t in range(T):
            ref = _route_v3_ref(logits[t].tolist(), bias.tolist(), K, G, TG, scale)
            got = dict(zip(ids[t].tolist(), w[t].tolist(), strict=True))
            assert sorted(got) == sorted(ref), \
                f"{what}: token {t} chose experts {sorted(got)}, expected {sorted(ref)}"
            bad = [e for e in ref if abs(got[e] - ref[e]) > 1e-5 * max(1.0, scale)]
            assert not bad, f"{what}: token {t}'s weights {got} differ from {ref} at experts {bad}"


def _touched(E: int, K: int, T: int) -> float:
    return E * (1 - (1 - K / E) ** T)


def _cost(T, E, K, H, I, b):  # noqa: E741
    return 2.0 * T * K * 3 * H * I, (_touched(E, K, T) * 3 * H * I + 2 * T * H) * b


def _crossover(E, K, H, I, b, ridge):  # noqa: E741
    """The smallest T with FLOPs / bytes >= ridge, by doubling then bisection (the intensity grows
    with T towards 3·K·I / b, which it never reaches)."""
    def ok(T):
        fl, by = _cost(T, E, K, H, I, b)
        return fl / by >= ridge

    if ridge >= 3 * K * I / b:
        return None
    hi = 1
    while not ok(hi):
        hi *= 2
    lo = hi // 2  # not ok (or 0)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if ok(mid) else (mid, hi)
    return hi


def ch00_crossover(mod) -> None:
    # (E, K, H, I, bytes a weight): OLMoE-1B-7B, Mixtral-8x7B, Qwen3-30B-A3B, a tiny layer
    layers = [(64, 8, 2048, 1024, 2), (8, 2, 4096, 14336, 2), (128, 8, 2048, 768, 2), (16, 2, 64, 32, 1)]
    for E, K, H, I, b in layers:  # noqa: E741
        for T in (1, 7, 64, 1000, 20000):
            fl, by = mod.flops_and_bytes(T, E, K, H, I, b)
            rf, rb = _cost(T, E, K, H, I, b)
            assert abs(fl - rf) <= 1e-9 * rf, f"flops_and_bytes(T={T}, E={E}, K={K}, H={H}, I={I}): {fl:.6g} " \
                                              f"FLOPs, expected {rf:.6g}"
            assert abs(by - rb) <= 1e-9 * rb, f"flops_and_bytes(T={T}, E={E}, K={K}, H={H}, I={I}, b={b}): " \
                                              f"{by:.6g} bytes, expected {rb:.6g}"
        for ridge in (3.0, 37.5, 295.0, 612.3):
            ref = _crossover(E, K, H, I, b, ridge)
            got = mod.crossover(E, K, H, I, b, ridge)
            assert got == ref, f"crossover(E={E}, K={K}, H={H}, I={I}, b={b}, ridge={ridge}) = {got}, " \
                               f"expected {ref} (the smallest T whose FLOPs per byte reach the ridge)"
            approx = mod.large_batch_crossover(E, K, b, ridge)
            assert abs(approx - ridge * E * b / (2 * K)) < 1e-9 * approx, \
                f"large_batch_crossover(E={E}, K={K}, b={b}, ridge={ridge}) = {approx}: not the limit of " \
                "the intensity once every expert is read (activations neglected)"
    assert mod.crossover(8, 2, 64, 32, 2, 1e6) is None, "a ridge the layer never reaches: crossover is None"
