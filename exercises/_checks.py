"""One check per exercise: it takes the exercise's module and raises AssertionError on a wrong
answer. The expected values are computed here independently (plain loops or textbook formulas),
never by the solutions. Random inputs are seeded; shapes include the edge cases (no rows, sizes
that are not multiples of the tiles, ties)."""
from __future__ import annotations

import contextlib
import math

import torch


def _gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _close(name: str, got, ref, rtol: float = 1e-5, atol: float = 1e-6) -> None:
    assert isinstance(got, torch.Tensor), f"{name}: expected a tensor, got {type(got).__name__}"
    assert tuple(got.shape) == tuple(ref.shape), f"{name}: shape {tuple(got.shape)}, expected {tuple(ref.shape)}"
    assert torch.allclose(got.double(), ref.double(), rtol=rtol, atol=atol), \
        f"{name}: values differ (max abs diff {(got.double() - ref.double()).abs().max().item():.3g})"


_HOST_READS = [(torch.Tensor, n) for n in ("item", "tolist", "__bool__", "__int__", "__float__", "__index__",
                                            "nonzero", "multinomial")] + [(torch, "nonzero"), (torch, "multinomial")]


@contextlib.contextmanager
def _no_host_sync(what: str):
    """Inside, anything that reads a tensor's value on the host (``.item()``, ``.tolist()``, a Python
    ``if`` on a tensor, ``nonzero``, ``multinomial``) raises AssertionError, as capture into a CUDA
    graph refuses it."""
    def refuse(name):
        def read(*args, **kwargs):
            raise AssertionError(f"{what} reads a value on the host ({name}): a CUDA graph cannot hold that")
        return read

    saved = [(owner, name, owner.__dict__.get(name)) for owner, name in _HOST_READS]
    for owner, name, _ in saved:
        setattr(owner, name, refuse(name))
    try:
        yield
    finally:
        for owner, name, old in saved:
            if old is None:
                delattr(owner, name)
            else:
                setattr(owner, name, old)


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


def _replicas(slots_RS, e: int) -> list[int]:
    return [r for r, row in enumerate(slots_RS) if e in row]


def ch04_send_plan(mod) -> None:
    g = _gen(6)

    def routing(T, E, K):  # K distinct experts per token
        return torch.stack([torch.randperm(E, generator=g)[:K] for _ in range(T)]) if T else torch.zeros(0, K).long()

    cases = [(((0, 1), (2, 3)), torch.tensor([[0, 2], [1, 0], [3, 2]]), 0),  # the docstring's example
             (((0, 1, 2), (0, 3)), routing(7, 4, 2), 1),  # expert 0 on both ranks
             (((0, 1, 4), (2, 3, 4), (4, 5), (4, 6, 7)), routing(9, 8, 3), 2),  # a hot expert everywhere
             (((2, 0, 1), (1, 3), (3, 0)), routing(6, 4, 2), 2),  # slot order is not rank order
             (((0, 1, 2, 3), ()), routing(5, 4, 4), 1),  # a rank holding nothing; K = E
             (((0,), (1,)), torch.tensor([[1]]), 0),  # one token, one expert
             (((0, 1), (2, 3)), routing(0, 4, 2), 1)]  # no tokens
    for slots_RS, ids, origin in cases:
        T, K = ids.shape
        R = len(slots_RS)
        ref = [[_replicas(slots_RS, e)[(origin + t) % len(_replicas(slots_RS, e))] for e in ids[t].tolist()]
               for t in range(T)]
        what = f"slots_RS={slots_RS}, origin_rank={origin}, T={T}"
        got = mod.dest_ranks(ids, slots_RS, origin)
        assert isinstance(got, torch.Tensor) and tuple(got.shape) == (T, K), \
            f"dest_ranks({what}): expected a [T, K] = [{T}, {K}] tensor, got {got!r}"
        assert got.tolist() == ref, f"dest_ranks({what}) = {got.tolist()}, expected {ref}"
        counts = [sum(r in row for row in ref) for r in range(R)]  # each token once per destination
        got = mod.send_counts(torch.tensor(ref, dtype=torch.int64).view(T, K), R)
        assert isinstance(got, torch.Tensor) and got.tolist() == counts, \
            f"send_counts(dest_TK={ref}, R={R}) = {got!r}, expected {counts}"


def ch04_home_rows(mod) -> None:
    g = _gen(7)
    cases = [[1, 0, 1, 0], [], [0], [2, 2, 2, 2, 2], [3, 2, 1, 0],
             torch.tensor([0, 2, 3])[torch.randint(0, 3, (23,), generator=g)].tolist()]  # rank 1 gets none
    for dest in cases:
        order = [n for r in sorted(set(dest)) for n in range(len(dest)) if dest[n] == r]  # stable: n order
        home = [0] * len(dest)
        for j, n in enumerate(order):
            home[n] = j
        dest_N = torch.tensor(dest, dtype=torch.int64)
        got = mod.send_order(dest_N)
        assert isinstance(got, torch.Tensor) and got.tolist() == order, \
            f"send_order({dest}) = {got!r}, expected {order} (by destination, n order within one)"
        got = mod.home_rows(dest_N)
        assert isinstance(got, torch.Tensor) and got.tolist() == home, f"home_rows({dest}) = {got!r}, expected {home}"
        x_N = torch.randn(len(dest), generator=g)
        assert torch.equal(x_N[torch.tensor(order, dtype=torch.long)][got], x_N), \
            f"home_rows({dest}): the returned rows do not come back in n order"


def ch04_capacity(mod) -> None:
    g = _gen(8)
    cases = [([[1, 1], [0, 1], [1, 0]], 3), ([[0, 0, 0]], 1), ([[1, 0, 1]] * 4, 4), ([[1]], 1),
             ((torch.rand(9, 3, generator=g) < 0.5).tolist(), 9), ((torch.rand(12, 4, generator=g) < 0.4).tolist(), 6)]
    for sends, C in cases:
        T, R = len(sends), len(sends[0])
        ref, used = [[-1] * R for _ in range(T)], [0] * R
        for t in range(T):
            for d in range(R):
                if sends[t][d]:
                    ref[t][d] = d * C + used[d]
                    used[d] += 1
        if max(used) > C:
            continue  # a random case that would overflow; the overflow cases are below
        sends_TR = torch.tensor(sends, dtype=torch.bool)
        got = mod.capacity_rows(sends_TR, C)
        assert isinstance(got, torch.Tensor) and got.tolist() == ref, \
            f"capacity_rows({sends}, C={C}) = {got!r}, expected {ref}"
        frac = 1 - sum(used) / (R * C)
        got = mod.padded_fraction(sends_TR, C)
        assert abs(float(got) - frac) < 1e-9, f"padded_fraction({sends}, C={C}) = {got}, expected {frac}"
    empty = torch.zeros(0, 3, dtype=torch.bool)
    assert mod.capacity_rows(empty, 2).shape == (0, 3), "capacity_rows: no tokens give a [0, R] tensor"
    assert abs(float(mod.padded_fraction(empty, 2)) - 1) < 1e-9, "padded_fraction: no tokens, all padding"
    for sends, C in (([[1, 1], [0, 1], [1, 0]], 1), ([[1, 0]] * 5, 4), ([[0, 0]], 0)):
        try:
            mod.capacity_rows(torch.tensor(sends, dtype=torch.bool), C)
        except ValueError:
            continue
        raise AssertionError(f"capacity_rows({sends}, C={C}) must raise ValueError: a destination overflows")


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


def ch06_kv_cache(mod) -> None:
    g = _gen(9)
    for Bc, B, S, D, pos in ((2, 2, 4, 3, [2, 0]), (8, 5, 6, 4, [5, 0, 3, 3, 1]), (4, 1, 1, 2, [0]), (3, 0, 5, 2, [])):
        cache = torch.randn(Bc, S, D, generator=g)
        before, ptr = cache.clone(), cache.data_ptr()
        new = torch.randn(B, D, generator=g)
        ref = before.clone()
        for b in range(B):
            ref[b, pos[b]] = new[b]
        pos_B = torch.tensor(pos, dtype=torch.int64)
        with _no_host_sync("cache_write"):
            mod.cache_write(cache, new, pos_B)
        assert cache.data_ptr() == ptr, "cache_write: the cache moved"
        assert torch.equal(cache, ref), \
            f"cache_write(B={B} of {Bc} rows, pos={pos}): not new_BD[b] at [b, pos[b]] with the rest untouched"
        mask = [[s <= pos[b] for s in range(S)] for b in range(B)]
        with _no_host_sync("decode_mask"):
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
        with _no_host_sync("sample"):
            return mod.sample(logits, temperature, top_p, _gen(seed))

    g = _gen(10)
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
        _close(f"nucleus(temperature={temp}, top_p={top_p}) of {logits.tolist()[0][:4]}…", got, ref)
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
    g = _gen(12)
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
    with _no_host_sync("greedy_accept"):
        out, n = mod.greedy_accept(torch.tensor([[5, 7, 2]]), logits)
    assert out.tolist() == [[5, 7, 9, 4]] and n.tolist() == [2], \
        f"greedy_accept (the example): out {out.tolist()}, n {n.tolist()}; expected [[5, 7, 9, 4]], [2]"
    g = _gen(13)
    for B, k, V in ((6, 3, 4), (5, 1, 3), (4, 0, 5), (7, 6, 2)):
        logits = torch.randn(B, k + 1, V, generator=g)
        t = logits.argmax(-1)
        drafts = torch.where(torch.rand(B, k, generator=g) < 0.6, t[:, :k], torch.randint(0, V, (B, k), generator=g))
        if k >= 2:  # a row whose first draft is refused but a later one agrees: nothing is kept
            drafts[0, 0], drafts[0, 1] = (t[0, 0] + 1) % V, t[0, 1]
        with _no_host_sync("greedy_accept"):
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
        with _no_host_sync("advance"):
            mod.advance(hist, pos, out, n)
        assert pos.data_ptr() == ptr and pos.tolist() == (pos0 + n + 1).tolist(), \
            f"advance: pos must move in place by n + 1: {pos0.tolist()} + {n.tolist()} + 1, got {pos.tolist()}"
        assert torch.equal(hist, ref), "advance: out[b, :n+1] at pos+1 .. pos+n+1, every other position untouched"
