"""Checks of chapter 5's exercises."""
from __future__ import annotations

import torch

from exercises._check.common import close, gen, no_host_sync  # noqa: F401


def ch05_aux_loss(mod) -> None:
    T, E, K = 12, 4, 2
    uniform = torch.zeros(T, E)
    ids = torch.tensor([[t % E, (t + 1) % E] for t in range(T)])
    loss = mod.aux_loss(uniform, ids)
    assert isinstance(loss, torch.Tensor) and loss.dim() == 0, "aux_loss returns a 0-d tensor"
    assert abs(float(loss) - K) < 1e-6, f"uniform routing: loss {float(loss)}, expected K = {K}"
    logits = torch.randn(T, E, generator=gen(5), requires_grad=True)
    ids = torch.topk(logits.detach(), K, dim=-1)[1]
    p = torch.softmax(logits.detach().double(), dim=-1).mean(0)
    f = torch.tensor([(ids == e).sum().item() / T for e in range(E)], dtype=torch.float64)
    ref = E * (f * p).sum()
    loss = mod.aux_loss(logits, ids)
    got = float(loss.detach())
    assert abs(got - float(ref)) < 1e-5, f"aux_loss {got}, expected {float(ref)}"
    assert loss.requires_grad, "no gradient reaches the logits: the loss is cut off from them"
    loss.backward()
    assert logits.grad is not None and logits.grad.abs().sum() > 0, "no gradient reaches the logits"


def controller_scores(T: int, E: int, seed: int, skew: float) -> torch.Tensor:
    """Sigmoid-like scores in (0, 1) on a grid that keeps every sum with the bias exact in fp32 and
    never tied: multiples of 2^-10, plus e · 2^-20 for expert e; experts with higher ids favoured."""
    g = gen(seed)
    a = torch.randint(0, 700, (T, E), generator=g) + (skew * 1024 * torch.arange(E) / E).long()
    return (a.double() * 2.0 ** -10 + torch.arange(E).double() * 2.0 ** -20).float()


def _controller_ref(s_TE, K, rate, target, max_steps):
    T, E = s_TE.shape
    s = s_TE.double()
    b = torch.zeros(E, dtype=torch.float64)
    history = []
    for _ in range(max_steps):
        ids = (s + b).topk(K, dim=-1).indices
        load = torch.bincount(ids.reshape(-1), minlength=E).double()
        history.append(float(load.max() * E / (T * K)))
        if history[-1] <= target:
            w = s.gather(1, ids)
            return b, history, w / w.sum(-1, keepdim=True), ids
        b = b + rate * torch.sign(load.mean() - load)
    return None


def ch05_bias_controller(mod) -> None:
    for T, E, K, skew, target in ((256, 8, 2, 0.3, 1.1), (200, 16, 4, 0.5, 1.15), (96, 6, 1, 0.2, 1.2)):
        s_TE = controller_scores(T, E, T + E, skew)
        rate = 2.0 ** -7
        ref = _controller_ref(s_TE, K, rate, target, 400)
        assert ref is not None, "the check's own case must balance"
        what = f"balance_by_bias(T={T}, E={E}, K={K}, rate=2^-7, target={target})"
        try:
            bias, hist, w, ids = mod.balance_by_bias(s_TE, K, rate, target, 400)
        except ValueError as e:
            raise AssertionError(f"{what}: raised '{e}', but the loads balance after {len(ref[1])} steps "
                                 f"(imbalance {ref[1][0]:.3f} at step 1, {ref[1][-1]:.3f} at the last)") from e
        hist = [float(v) for v in hist]
        assert len(hist) == len(ref[1]), \
            f"{what}: balanced after {len(hist)} steps, expected {len(ref[1])} (imbalances {hist[:6]}…, " \
            f"expected {[round(v, 4) for v in ref[1][:6]]}…)"
        bad = [i for i in range(len(hist)) if abs(hist[i] - ref[1][i]) > 1e-6]
        assert not bad, f"{what}: imbalance at step {bad[0] + 1} is {hist[bad[0]]}, expected {ref[1][bad[0]]}"
        close(f"{what}: the bias", bias, ref[0], rtol=0, atol=1e-9)
        got = [dict(zip(i.tolist(), v.tolist(), strict=True)) for i, v in zip(ids, w, strict=True)]
        want = [dict(zip(i.tolist(), v.tolist(), strict=True)) for i, v in zip(ref[3], ref[2], strict=True)]
        for t in range(T):
            assert sorted(got[t]) == sorted(want[t]), f"{what}: token {t} chose {sorted(got[t])} at the last " \
                                                      f"step, expected {sorted(want[t])}"
            assert all(abs(got[t][e] - want[t][e]) < 1e-5 for e in want[t]), \
                f"{what}: token {t}'s weights {got[t]}, expected {want[t]} (the scores, not scores + bias, " \
                "renormalised)"
    s_TE = controller_scores(64, 8, 1, 0.6)
    try:
        mod.balance_by_bias(s_TE, 2, 2.0 ** -7, 1.0001, 3)
    except ValueError:
        return
    raise AssertionError("balance_by_bias must raise ValueError when the loads have not balanced in max_steps")
