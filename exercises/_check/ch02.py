"""Checks of chapter 2's exercises."""
from __future__ import annotations

import torch

from exercises._check.common import close, gen


def ch02_gather_rows(mod) -> None:
    T, H, K = 5, 4, 2
    x = torch.randn(T, H, generator=gen(2))
    N = T * K
    rows = torch.tensor([0, 3, 7, N, 1, 2, 9, N, 4, 5, 6, 8, N, N, N, N], dtype=torch.int32)
    ref = torch.stack([x[r // K] if r < N else torch.zeros(H) for r in rows.tolist()])
    close("gather_rows", mod.gather_rows(x, rows, K), ref, rtol=0, atol=0)


def sorted_routes(ids_TK: torch.Tensor, E: int, block_m: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(sorted_rows_P, block_expert_B) as chapter 1's sort lays them out, by plain loops: each
    expert's routed rows in n order, padded with N to a multiple of block_m; the static sizes
    B = cdiv(N, block_m) + min(E, N), P = B·block_m; blocks past the used ones have expert -1."""
    ids = ids_TK.reshape(-1).tolist()
    N = len(ids)
    B = -(-N // block_m) + min(E, N)
    rows, experts = [], []
    for e in range(E):
        mine = [n for n in range(N) if ids[n] == e]
        if mine:
            mine += [N] * (-len(mine) % block_m)
            rows += mine
            experts += [e] * (len(mine) // block_m)
    rows += [N] * (B * block_m - len(rows))
    experts += [-1] * (B - len(experts))
    return torch.tensor(rows, dtype=torch.int32), torch.tensor(experts, dtype=torch.int32)


def ch02_tile(mod) -> None:
    bm = 16
    #        T   E  K   H   I   routing
    cases = [(20, 5, 2, 40, 16, "skewed"),  # expert 0 gets every token: two blocks, so blocks are not experts
             (5, 4, 2, 24, 20, "random"),
             (7, 5, 1, 16, 40, "random"),
             (1, 6, 2, 32, 16, "random"),
             (0, 4, 2, 16, 16, "random")]
    for T, E, K, H, I, routing in cases:  # noqa: E741
        g = gen(T * 7 + E)
        if routing == "skewed":
            ids = torch.stack([torch.tensor([0, *torch.randperm(E - 1, generator=g)[:K - 1].add(1).tolist()])
                               for _ in range(T)])
        else:
            ids = torch.stack([torch.randperm(E, generator=g)[:K] for _ in range(T)]) if T else \
                torch.zeros(0, K, dtype=torch.long)
        N = T * K
        rows_P, bexp_B = sorted_routes(ids, E, bm)
        B = bexp_B.numel()
        # x and the weights sit inside larger buffers of NaN: a row read for a padding slot, a
        # token index taken as the row index, or an expert read for a block of -1 turns into NaN
        x_buf = torch.full((T + N + 1, H), float("nan"))
        x_buf[:T] = torch.randn(T, H, generator=g)
        w_buf = torch.full((B + E + 2, 2 * I, H), float("nan"))
        w_buf[1:E + 1] = torch.randn(E, 2 * I, H, generator=g) / H ** 0.5
        x, gu = x_buf[:T], w_buf[1:E + 1]
        ref = torch.zeros(B * bm, I, dtype=torch.float64)
        for p, n in enumerate(rows_P.tolist()):
            e = int(bexp_B[p // bm])
            if n < N:
                gate = gu[e, :I].double() @ x[n // K].double()
                up = gu[e, I:].double() @ x[n // K].double()
                ref[p] = gate * torch.sigmoid(gate) * up
        what = f"up_tile(T={T}, E={E}, K={K}, H={H}, I={I}, block_m={bm}; block_expert_B={bexp_B.tolist()})"
        h = mod.up_tile(x, gu, rows_P, bexp_B, K, block_m=bm)
        assert isinstance(h, torch.Tensor) and tuple(h.shape) == (B * bm, I), \
            f"{what}: expected a [P, I] = [{B * bm}, {I}] tensor, got {getattr(h, 'shape', h)!r}"
        real = [p for p in range(B * bm) if rows_P[p] < N]
        pad = [p for p in range(B * bm) if rows_P[p] >= N]
        close(what, h[real], ref[real], rtol=1e-4, atol=1e-5)
        if pad:
            assert torch.equal(h[pad], torch.zeros(len(pad), I)), \
                f"{what}: padding slots and unused blocks must hold 0 (zeros loaded, or nothing stored); " \
                f"slot {pad[int((h[pad] != 0).any(1).float().argmax())]} does not"


def ch02_combine(mod) -> None:
    """K = 5 rows a token. fp32 rows of mixed magnitudes that cancel: their fp32 sum depends on
    the order (the check makes sure of it). fp16 rows whose running sum in fp16 rounds away what an
    fp32 sum keeps."""
    T, K, H = 6, 5, 7
    g = gen(3)
    scale = 10.0 ** torch.randint(0, 8, (T * K, H), generator=g)
    big = (torch.randn(T * K, H, generator=g) * scale).float()
    small = torch.tensor([[2048.0, 1.0, 1.0, -2048.0, 0.5]] * T, dtype=torch.half).reshape(T * K, 1).expand(-1, H)
    small = (small + torch.randint(-2, 3, (T * K, H), generator=g).half() * (small.abs() > 1)).contiguous()
    for out in (big, small):
        ref = torch.empty(T, H, dtype=out.dtype)
        backwards = torch.empty(T, H, dtype=out.dtype)
        for t in range(T):
            acc = torch.zeros(H, dtype=torch.float32)
            rev = torch.zeros(H, dtype=torch.float32)
            for k in range(K):  # k order, fp32, one cast
                acc = acc + out[t * K + k].float()
                rev = rev + out[t * K + K - 1 - k].float()
            ref[t], backwards[t] = acc.to(out.dtype), rev.to(out.dtype)
        if out.dtype == torch.float32:
            assert not torch.equal(ref, backwards), "the check's own inputs must make the order matter"
        got = mod.combine(out, K)
        what = f"combine({out.dtype}, K={K})"
        assert isinstance(got, torch.Tensor) and got.dtype == out.dtype, f"{what}: the result has the input's dtype"
        assert tuple(got.shape) == (T, H), f"{what}: shape {tuple(got.shape)}, expected {(T, H)}"
        assert torch.equal(got, ref), f"{what}: not bitwise the fp32 sum in k order (k = 0 first) with one cast"
        assert torch.equal(mod.combine(out, K), got), f"{what}: two calls differ"
