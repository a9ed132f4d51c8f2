"""One check per exercise: it takes the exercise's module and raises AssertionError on a wrong
answer. The expected values are computed here independently (plain loops or textbook formulas),
never by the solutions. Random inputs are seeded; shapes include the edge cases (no rows, sizes
that are not multiples of the tiles, ties)."""
from __future__ import annotations

import math

import torch


def _gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _close(name: str, got, ref, rtol: float = 1e-5, atol: float = 1e-6) -> None:
    assert isinstance(got, torch.Tensor), f"{name}: expected a tensor, got {type(got).__name__}"
    assert tuple(got.shape) == tuple(ref.shape), f"{name}: shape {tuple(got.shape)}, expected {tuple(ref.shape)}"
    assert torch.allclose(got.double(), ref.double(), rtol=rtol, atol=atol), \
        f"{name}: values differ (max abs diff {(got.double() - ref.double()).abs().max().item():.3g})"


def ch00_swiglu(mod) -> None:
    for M, H, I in ((5, 8, 6), (1, 16, 4), (0, 8, 6)):  # noqa: E741
        g = _gen(M + H)
        x, gu, dn = torch.randn(M, H, generator=g), torch.randn(2 * I, H, generator=g), torch.randn(H, I, generator=g)
        ref = torch.zeros(M, H, dtype=torch.float64)
        for m in range(M):  # row by row, in fp64, straight from the definition
            gate = gu[:I].double() @ x[m].double()
            up = gu[I:].double() @ x[m].double()
            ref[m] = dn.double() @ (gate / (1 + torch.exp(-gate)) * up)
        _close(f"swiglu_expert M={M} H={H} I={I}", mod.swiglu_expert(x, gu, dn), ref)


def ch00_route(mod) -> None:
    g = _gen(1)
    logits = torch.randn(7, 6, generator=g)
    logits[3] = torch.tensor([2.0, 1.0, 2.0, 0.0, -1.0, 1.0])  # a tie at the top: either order is fine
    for k, renorm in ((1, False), (2, True), (3, False)):
        w, ids = mod.route(logits, k, renorm)
        assert ids.shape == (7, k) and w.shape == (7, k), f"route(k={k}): shapes {tuple(w.shape)}, {tuple(ids.shape)}"
        assert w.dtype == torch.float32, f"route: weights must be fp32, got {w.dtype}"
        for t in range(7):
            p = [math.exp(v) for v in logits[t].tolist()]
            p = [v / sum(p) for v in p]
            best = sorted(p, reverse=True)[:k]
            assert sorted(ids[t].tolist()) == sorted(set(ids[t].tolist())), f"route: token {t} repeats an expert"
            got = [p[i] for i in ids[t].tolist()]
            assert all(abs(a - b) < 1e-6 for a, b in zip(got, best, strict=True)), \
                f"route(k={k}): token {t} chose {ids[t].tolist()}, not its {k} most probable experts in order"
            ref = [v / sum(best) for v in best] if renorm else best
            assert all(abs(a - b) < 1e-5 for a, b in zip(w[t].tolist(), ref, strict=True)), \
                f"route(k={k}, renormalize={renorm}): token {t} weights {w[t].tolist()}, expected {ref}"


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
    for T, E in ((9, 8), (5, 13), (1, 3), (0, 8)):
        logits = torch.randn(T, E, generator=_gen(T * E))
        w, ids = mod.top1(logits)
        for t in range(T):
            row = logits[t].tolist()
            best = max(range(E), key=lambda e: row[e])
            assert int(ids[t]) == best, f"top1 T={T} E={E}: token {t} got expert {int(ids[t])}, expected {best}"
            ref = 1 / sum(math.exp(v - row[best]) for v in row)
            assert abs(float(w[t]) - ref) < 1e-5, f"top1 T={T} E={E}: token {t} weight {float(w[t])}, expected {ref}"


def ch02_gather_rows(mod) -> None:
    T, H, K = 5, 4, 2
    x = torch.randn(T, H, generator=_gen(2))
    N = T * K
    rows = torch.tensor([0, 3, 7, N, 1, 2, 9, N, 4, 5, 6, 8, N, N, N, N], dtype=torch.int32)
    ref = torch.stack([x[r // K] if r < N else torch.zeros(H) for r in rows.tolist()])
    _close("gather_rows", mod.gather_rows(x, rows, K), ref, rtol=0, atol=0)


def ch02_tile(mod) -> None:
    for M, H, I in ((20, 24, 18), (16, 16, 16), (3, 40, 5)):  # noqa: E741
        g = _gen(M + I)
        x, gu = torch.randn(M, H, generator=g), torch.randn(2 * I, H, generator=g) / H ** 0.5
        gate, up = (x.double() @ gu.double().T).split(I, dim=1)
        ref = gate * torch.sigmoid(gate) * up
        _close(f"up_swiglu M={M} H={H} I={I}", mod.up_swiglu(x, gu), ref, rtol=1e-4, atol=1e-5)


def ch02_combine(mod) -> None:
    T, K, H = 6, 3, 5
    out = torch.randn(T * K, H, generator=_gen(3)).half()
    ref = torch.empty(T, H, dtype=torch.half)
    for t in range(T):  # k order, fp32, one cast
        acc = torch.zeros(H, dtype=torch.float32)
        for k in range(K):
            acc = acc + out[t * K + k].float()
        ref[t] = acc.half()
    got = mod.combine(out, K)
    assert isinstance(got, torch.Tensor) and got.dtype == torch.half, "combine: the result has the input's dtype"
    assert torch.equal(got, ref), "combine: not bitwise the k-ordered fp32 sum with one cast"
    assert torch.equal(mod.combine(out, K), got), "combine: two calls differ"


def ch03_gemv(mod) -> None:
    for O, I in ((40, 70), (16, 32), (1, 5)):  # noqa: E741
        g = _gen(O + I)
        w, x = torch.randn(O, I, generator=g), torch.randn(I, generator=g)
        ref = torch.tensor([sum(a * b for a, b in zip(w[o].tolist(), x.tolist(), strict=True)) for o in range(O)],
                           dtype=torch.float64)
        _close(f"gemv O={O} I={I}", mod.gemv(w, x), ref, rtol=1e-4, atol=1e-4)


def ch03_experts_touched(mod) -> None:
    # exact small cases: one token touches K experts; K = E touches all of them
    assert abs(mod.experts_touched(64, 8, 1) - 8) < 1e-9, "experts_touched(64, 8, 1) must be 8"
    assert abs(mod.experts_touched(8, 8, 3) - 8) < 1e-9, "experts_touched(8, 8, 3) must be 8"
    assert abs(mod.experts_touched(64, 8, 0)) < 1e-9, "no tokens touch no experts"
    # against a count over random routings (uniform, K distinct of E)
    g = _gen(4)
    E, K, T = 16, 2, 5
    sims = [len(set(torch.stack([torch.randperm(E, generator=g)[:K] for _ in range(T)]).flatten().tolist()))
            for _ in range(4000)]
    mean = sum(sims) / len(sims)
    assert abs(mod.experts_touched(E, K, T) - mean) < 0.1, \
        f"experts_touched({E}, {K}, {T}) = {mod.experts_touched(E, K, T):.3f}, a simulation gives {mean:.3f}"
    got = mod.expert_bytes_read(64, 8, 1, 2048, 1024)
    assert abs(got - 8 * 3 * 2048 * 1024 * 2) < 1, \
        f"expert_bytes_read(OLMoE, T=1) = {got}, expected 8 experts' bf16 weights"


def ch05_aux_loss(mod) -> None:
    T, E, K = 12, 4, 2
    uniform = torch.zeros(T, E)
    ids = torch.tensor([[t % E, (t + 1) % E] for t in range(T)])
    loss = mod.aux_loss(uniform, ids)
    assert isinstance(loss, torch.Tensor) and loss.dim() == 0, "aux_loss returns a 0-d tensor"
    assert abs(float(loss) - K) < 1e-6, f"uniform routing: loss {float(loss)}, expected K = {K}"
    logits = torch.randn(T, E, generator=_gen(5), requires_grad=True)
    ids = torch.topk(logits.detach(), K, dim=-1)[1]
    p = torch.softmax(logits.detach().double(), dim=-1).mean(0)
    f = torch.tensor([(ids == e).sum().item() / T for e in range(E)], dtype=torch.float64)
    ref = E * (f * p).sum()
    loss = mod.aux_loss(logits, ids)
    got = float(loss.detach())
    assert abs(got - float(ref)) < 1e-5, f"aux_loss {got}, expected {float(ref)}"
    loss.backward()
    assert logits.grad is not None and logits.grad.abs().sum() > 0, "no gradient reaches the logits"


def ch05_bias_update(mod) -> None:
    bias = torch.tensor([0.5, 0.0, -0.5])
    new = mod.update_bias(bias, torch.tensor([6, 2, 4]), 0.1)
    _close("update_bias([6, 2, 4], 0.1)", new, torch.tensor([0.4, 0.1, -0.5]), rtol=0, atol=1e-7)
    assert bias.tolist() == [0.5, 0.0, -0.5], "update_bias modified its input"
    new = mod.update_bias(torch.zeros(4), torch.tensor([3, 3, 3, 3]), 0.2)
    _close("update_bias(balanced)", new, torch.zeros(4), rtol=0, atol=0)
