"""Checks of chapter 4's exercises."""
from __future__ import annotations

import torch

from exercises._check.common import close, gen, no_host_sync  # noqa: F401


def _replicas(slots_RS, e: int) -> list[int]:
    return [r for r, row in enumerate(slots_RS) if e in row]


def ch04_send_plan(mod) -> None:
    g = gen(6)

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
    g = gen(7)
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
    g = gen(8)
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


# --- ch04_all_to_all: run on gloo ranks ------------------------------------------------------------

_ROWS_MOVERS = ("all_gather", "all_gather_into_tensor", "broadcast", "send", "recv", "isend", "irecv",
                "all_to_all", "scatter", "gather", "all_reduce", "reduce_scatter_tensor")


def expert(rank: int, rows: torch.Tensor) -> torch.Tensor:
    """The stand-in for rank ``rank``'s experts: exact in fp32 on the small integers of the check."""
    return rows * (rank + 1) + rank


def _a2a_cases(R: int) -> list[tuple[list[torch.Tensor], list[torch.Tensor]]]:
    """[(x_TH of each rank, dest_TK of each rank)]: integer-valued x, so every result is exact."""
    g = gen(12)

    def case(tokens, K, H, dest):
        xs = [torch.randint(-8, 9, (T, H), generator=g).float() for T in tokens]
        return xs, [dest(T, K) for T in tokens]

    return [case([5, 0, 3][:R], 2, 4, lambda T, K: torch.randint(0, R, (T, K), generator=g)),
            case([4] * R, 3, 2, lambda T, K: torch.full((T, K), R - 1)),  # every row to the last rank
            case([2, 6, 1][:R], 3, 3, lambda T, K: torch.randint(0, R, (T, K), generator=g)),
            case([0] * R, 2, 4, lambda T, K: torch.zeros(T, K, dtype=torch.long))]


def _a2a_rank(module: str):
    """On one rank: run the reader's round trip on every case; return what it got wrong and the rows
    of x (2-D payloads) it moved to each rank through all_to_all_single, per case."""
    import importlib

    import torch.distributed as dist

    rank, R = dist.get_rank(), dist.get_world_size()
    moved = [0] * R
    misuse: list[str] = []
    real = dist.all_to_all_single

    def counting(output, input, output_split_sizes=None, input_split_sizes=None, *args, **kwargs):
        if input.dim() >= 2:
            sizes = input_split_sizes or [input.shape[0] // R] * R
            for d, n in enumerate(sizes):
                moved[d] += int(n)
        return real(output, input, output_split_sizes, input_split_sizes, *args, **kwargs)

    def refusing(name, fn):
        def call(*args, **kwargs):
            if any(isinstance(a, torch.Tensor) and a.dim() >= 2 for a in [*args, *kwargs.values()]) or any(
                    isinstance(a, (list, tuple)) and any(isinstance(b, torch.Tensor) and b.dim() >= 2 for b in a)
                    for a in args):
                misuse.append(name)
            return fn(*args, **kwargs)
        return call

    dist.all_to_all_single = counting
    for name in _ROWS_MOVERS:
        if hasattr(dist, name):
            setattr(dist, name, refusing(name, getattr(dist, name)))
    mod = importlib.import_module(module)
    report = []
    for xs, dests in _a2a_cases(R):
        moved[:] = [0] * R
        x_TH, dest_TK = xs[rank], dests[rank]
        out = mod.round_trip(x_TH, dest_TK, expert)
        T, K = dest_TK.shape
        ref = torch.stack([torch.stack([expert(int(dest_TK[t, k]), x_TH[t]) for k in range(K)]) for t in range(T)]) \
            if T else torch.zeros(0, K, x_TH.shape[1])
        ok = isinstance(out, torch.Tensor) and tuple(out.shape) == tuple(ref.shape) and torch.equal(out, ref)
        report.append(dict(ok=ok, got=out.tolist() if isinstance(out, torch.Tensor) else repr(out),
                           want=ref.tolist(), moved=list(moved), misuse=list(misuse)))
    return report


def ch04_all_to_all(mod) -> None:
    from dispatch.parallel.launch import RankError, launch

    R = 3
    try:
        reports = launch(_a2a_rank, R, mod.__name__, timeout_s=90)
    except RankError as e:
        text = str(e)
        if "NotImplementedError" in text:
            raise NotImplementedError(f"complete round_trip in exercises/{mod.__name__.rsplit('.', 1)[1]}.py") from e
        raise AssertionError(f"round_trip failed on a rank: {text.splitlines()[0][:300]}") from e
    for c, (xs, dests) in enumerate(_a2a_cases(R)):
        # each token once per distinct destination, there; its result once, back
        tokens = [[sum(d in set(dests[s][t].tolist()) for t in range(dests[s].shape[0])) for d in range(R)]
                  for s in range(R)]
        for s in range(R):
            rep = reports[s][c]
            what = f"round_trip, case {c}, rank {s} (tokens per rank {[x.shape[0] for x in xs]})"
            assert not rep["misuse"], f"{what}: rows moved through {sorted(set(rep['misuse']))}, not " \
                                      "all_to_all_single"
            assert rep["ok"], f"{what}: out_TKH = {rep['got']}, expected {rep['want']}"
            want = [tokens[s][d] + tokens[d][s] for d in range(R)]
            bad = [d for d in range(R) if d != s and rep["moved"][d] != want[d]]
            assert not bad, f"{what}: sent {[rep['moved'][d] for d in bad]} rows to ranks {bad} over the round " \
                            f"trip, expected {[want[d] for d in bad]}: each token once per destination rank, " \
                            "its result once back"
