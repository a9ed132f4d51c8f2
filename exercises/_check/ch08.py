"""Chapter 8's exercise checks (``exercises._checks`` re-exports them). Expected values come from
plain reference code written here, never from the solutions; each check also runs the cases where
the usual mistakes show (a leak, a non-atomic failure, a shared block freed early, a double free;
prefill before decode, no chunking, too many sequences, out-of-order admission, empty entries)."""
from __future__ import annotations

import random


def _raises(fn, what: str, *args) -> None:
    try:
        fn(*args)
    except ValueError:
        return
    raise AssertionError(f"{what} must raise ValueError")


def _ok(fn, what: str, *args):
    """``fn(*args)``; a ValueError here is a wrong answer (the call was legal)."""
    try:
        return fn(*args)
    except ValueError as e:
        raise AssertionError(f"{what} raised ValueError({e}) although it was legal") from None


def ch08_block_allocator(mod) -> None:
    a = mod.Allocator(4)
    assert a.num_free() == 4, f"a new Allocator(4) has {a.num_free()} free blocks, expected 4"
    x = a.allocate(3)
    assert sorted(set(x)) == sorted(x) and len(x) == 3 and all(0 <= b < 4 for b in x), \
        f"allocate(3) gave {x}: expected 3 distinct blocks of 0..3"
    a.share(x[:2])
    a.free(x)
    assert a.num_free() == 2, f"after share(x[:2]) and free(x): {a.num_free()} free, expected 2 (x[0], x[1] held)"
    _raises(lambda: a.allocate(3), "allocate(3) with 2 free blocks")
    assert a.num_free() == 2, "a failed allocate must take nothing"
    _ok(lambda: a.free(x[:2]), "free(x[:2]) after share(x[:2]) and free(x)")
    assert a.num_free() == 4, f"after the last holders let go: {a.num_free()} free, expected 4"
    _raises(lambda: a.free(x[:1]), "freeing a block nobody holds (a double free)")
    _raises(lambda: a.share([x[0]]), "sharing a free block")
    rng = random.Random(0)  # random operations against a plain count of holders
    for n_blocks in (1, 5, 12):
        a, holders, live = mod.Allocator(n_blocks), [0] * n_blocks, []
        for _ in range(400):
            op = rng.random()
            if op < 0.4:
                n = rng.randint(0, n_blocks)
                free = holders.count(0)
                if n > free:
                    _raises(a.allocate, f"allocate({n}) with {free} free", n)
                else:
                    got = _ok(a.allocate, f"allocate({n}) with {free} free", n)
                    assert len(got) == n and all(holders[b] == 0 for b in got) and len(set(got)) == n, \
                        f"allocate({n}) gave {got}: a block already held (holders {holders})"
                    for b in got:
                        holders[b] = 1
                    live.append(got)
            elif op < 0.6 and live:
                seq = rng.choice(live)
                _ok(a.share, f"share({seq}) of held blocks", seq)
                for b in seq:
                    holders[b] += 1
                live.append(list(seq))
            elif live:
                seq = live.pop(rng.randrange(len(live)))
                _ok(a.free, f"free({seq}) of held blocks", seq)
                for b in seq:
                    holders[b] -= 1
            assert a.num_free() == holders.count(0), \
                f"{a.num_free()} free blocks, but {holders.count(0)} have no holder: a block leaked or freed early"
        for seq in live:
            _ok(a.free, f"free({seq}) of held blocks", seq)
        assert a.num_free() == n_blocks, f"every holder let go, yet {a.num_free()} of {n_blocks} blocks are free"


def _reference_step(running, waiting, budget, max_seqs):
    out, left_budget = [], budget
    decode = [sid for sid, left in running if left == 0]
    for sid in decode[:left_budget]:
        out.append((sid, 1))
    left_budget -= min(len(decode), left_budget)
    for sid, left in running:
        if left > 0 and left_budget > 0:
            out.append((sid, min(left, left_budget)))
            left_budget -= out[-1][1]
    room = max_seqs - len(running)
    for sid, n in waiting:
        if left_budget <= 0 or room <= 0:
            break
        out.append((sid, min(n, left_budget)))
        left_budget -= out[-1][1]
        room -= 1
    return out


def ch08_scheduler_step(mod) -> None:
    cases = [
        ([(1, 0), (2, 0), (3, 10)], [(4, 50)], 8, 4),  # the docstring's example
        ([(1, 0), (2, 0)], [(3, 5), (4, 2)], 16, 4),  # both admitted whole
        ([(1, 0), (2, 0)], [(3, 30), (4, 2)], 16, 4),  # the head is chunked, nobody overtakes it
        ([(1, 0), (2, 0), (3, 0)], [(4, 5)], 2, 8),  # more decode rows than budget
        ([(1, 4)], [(2, 3), (3, 3), (4, 3)], 100, 3),  # max_seqs stops admissions
        ([], [(1, 100)], 7, 1),  # a long prompt alone: its first chunk
        ([(1, 0)], [(2, 5)], 1, 4),  # the budget is spent on decode: nothing admitted
        ([], [], 8, 4),
    ]
    rng = random.Random(1)
    for _ in range(300):
        running = [(i, rng.choice([0, 0, rng.randint(1, 40)])) for i in range(rng.randint(0, 6))]
        waiting = [(100 + i, rng.randint(1, 40)) for i in range(rng.randint(0, 6))]
        cases.append((running, waiting, rng.randint(1, 64), rng.randint(1, 8)))
    for running, waiting, budget, max_seqs in cases:
        got = mod.schedule_step(list(running), list(waiting), budget, max_seqs)
        want = _reference_step(running, waiting, budget, max_seqs)
        got = [tuple(x) for x in got]
        where = f"schedule_step(running={running}, waiting={waiting}, budget={budget}, max_seqs={max_seqs})"
        assert all(n > 0 for _, n in got), f"{where} = {got}: an entry with no tokens"
        assert sum(n for _, n in got) <= budget, f"{where} = {got}: more than the budget"
        assert got == want, f"{where} = {got}, expected {want}"
