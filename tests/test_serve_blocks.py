"""The block allocator and the scheduler over it: random operations (hypothesis) never leak or
double-count a block, shared prefixes are stored once, and the scheduler's steps respect the budget,
preempt instead of failing, and return every block when the sequences end."""
import pytest
from hypothesis import given
from hypothesis import strategies as st

from dispatch.serve.blocks import BlockAllocator, NoFreeBlocks
from dispatch.serve.scheduler import QueueFull, Scheduler, SchedulerConfig, Sequence


def holders(alloc, tables):
    counts = [0] * alloc.num_blocks
    for t in tables:
        for b in t.blocks:
            counts[b] += 1
    return counts


def test_worked_example():
    """4 blocks of 2: a 5-token prompt takes 3 blocks; the same prompt again shares its 2 full
    blocks (never the block of its last token) once they are committed."""
    a = BlockAllocator(6, 2)
    t1, cached = a.allocate([1, 2, 3, 4, 5])
    assert (len(t1.blocks), cached, a.num_free) == (3, 0, 3)
    a.commit(t1, [1, 2, 3, 4, 5], 5)
    t2, cached = a.allocate([1, 2, 3, 4, 9])
    assert cached == 4 and t2.blocks[:2] == t1.blocks[:2] and t2.blocks[2] != t1.blocks[2]
    assert a.refs[t1.blocks[0]] == 2 and a.num_free == 2
    a.free(t1)
    a.free(t2)
    assert a.num_free == 6
    t3, cached = a.allocate([1, 2, 3, 4, 7, 7])  # freed blocks keep their hash until reused
    assert cached == 4
    a.free(t3)
    a.check()


def test_full_and_grow():
    a = BlockAllocator(3, 4)
    t, _ = a.allocate(list(range(9)))  # 3 blocks
    assert a.num_free == 0 and not a.grow(t, 13) and len(t.blocks) == 3  # nothing taken on failure
    with pytest.raises(NoFreeBlocks):
        a.allocate([1])
    a.free(t)
    assert not a.grow(t, 13) and a.grow(t, 12) and len(t.blocks) == 3  # an emptied table grows again
    a.free(t)
    a.check()


def test_bad_arguments():
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="num_blocks"):
            BlockAllocator(bad, 4)
        with pytest.raises(ValueError, match="block_size"):
            BlockAllocator(4, bad)
    with pytest.raises(ValueError, match="n_tokens"):
        BlockAllocator(4, 4).allocate([1, 2], 3)
    a = BlockAllocator(2, 2)
    t, _ = a.allocate([1])
    a.free(t)
    a.free(t)  # an emptied table frees nothing
    a.check()


ops = st.lists(st.tuples(st.sampled_from(["new", "grow", "commit", "free"]), st.integers(0, 7),
                         st.lists(st.integers(0, 2), min_size=1, max_size=12)), max_size=60)


@given(ops, st.integers(1, 4), st.booleans())
def test_random_operations_never_leak(program, block_size, caching):
    """Random allocate / grow / commit / free over a small pool: counts always equal the holders,
    the free list is exactly the unheld blocks, and after freeing everything all blocks are free."""
    a = BlockAllocator(10, block_size, prefix_caching=caching)
    live = {}  # slot → (table, tokens)
    for op, slot, tokens in program:
        if op == "new" and slot not in live:
            if a.can_allocate(tokens):
                free_before = a.num_free
                t, cached = a.allocate(tokens)
                assert cached % block_size == 0 and cached < len(tokens)
                assert len(t.blocks) == a.blocks_for(len(tokens)) and free_before - a.num_free <= len(t.blocks)
                live[slot] = (t, list(tokens))
            else:
                with pytest.raises(NoFreeBlocks):
                    a.allocate(tokens)
        elif op == "grow" and slot in live:
            t, toks = live[slot]
            toks.extend(tokens)
            if not a.grow(t, len(toks)):
                del toks[-len(tokens):]
        elif op == "commit" and slot in live:
            t, toks = live[slot]
            a.commit(t, toks, len(toks))
        elif op == "free" and slot in live:
            a.free(live.pop(slot)[0])
        a.check()
        assert holders(a, [t for t, _ in live.values()]) == a.refs
        for t, toks in live.values():  # a shared block holds the same tokens for every holder
            for i, h in enumerate(t.hashes):
                b = t.blocks[i]
                if a.hash_of[b] == h:
                    assert a.tokens_of[b] == tuple(toks[i * block_size:(i + 1) * block_size])
    for t, _ in live.values():
        a.free(t)
    assert a.num_free == a.num_blocks and a.refs == [0] * a.num_blocks
    a.check()


def drive(sched, seqs, steps, finish_after):
    """Run the scheduler with a fake model: each step's chunks and decode rows advance; a sequence that
    catches up gets a token, and finishes after ``finish_after[id]`` tokens."""
    budget, n_done = sched.cfg.max_step_tokens, 0
    for _ in range(steps):
        step = sched.schedule()
        alone = len(step.chunks) == 1 and not step.decode  # unchunked, a long prompt runs alone
        assert step.num_tokens <= budget or (alone and not sched.cfg.chunked_prefill)
        assert len(sched.running) <= sched.cfg.max_seqs
        for seq in step.decode:
            assert len(seq.table.blocks) * sched.alloc.block_size >= len(seq.tokens)
        for seq in sched.after_step(step):
            seq.tokens.append(7)
            if len(seq.output) >= finish_after[seq.id]:
                sched.finish(seq)
                n_done += 1
        sched.alloc.check()
        if not sched.has_work():
            break
    return n_done


@given(st.lists(st.tuples(st.integers(1, 20), st.integers(1, 12)), min_size=1, max_size=12),
       st.integers(2, 16), st.integers(1, 4), st.booleans())
def test_scheduler_finishes_everything_and_frees_every_block(reqs, budget, max_seqs, chunked):
    block_size = 4
    per_seq = -(-32 // block_size)  # the longest sequence: 20 prompt + 12 new tokens
    alloc = BlockAllocator(per_seq + 3, block_size)  # tight: preemption happens
    sched = Scheduler(SchedulerConfig(max_seqs=max_seqs, max_step_tokens=budget, chunked_prefill=chunked), alloc)
    seqs = [Sequence(i, [1 + (i + j) % 3 for j in range(p)]) for i, (p, _) in enumerate(reqs)]
    for s in seqs:
        sched.add(s)
    assert drive(sched, seqs, 2000, {i: n for i, (_, n) in enumerate(reqs)}) == len(seqs)
    assert all(len(s.output) == n for s, (_, n) in zip(seqs, reqs, strict=True))
    assert alloc.num_free == alloc.num_blocks


def test_chunked_prefill_rides_along_with_decode():
    alloc = BlockAllocator(64, 4)
    sched = Scheduler(SchedulerConfig(max_seqs=4, max_step_tokens=8), alloc)
    a = Sequence(0, [1, 2, 3])
    sched.add(a)
    sched.after_step(sched.schedule())
    a.tokens.append(5)  # a decodes from now on
    b = Sequence(1, list(range(20)))
    sched.add(b)
    step = sched.schedule()
    assert step.decode == [a] and step.chunks == [(b, 7)]  # 1 decode row + 7 prompt tokens = the budget
    sched.after_step(step)
    a.tokens.append(5)
    step = sched.schedule()
    assert step.decode == [a] and step.chunks == [(b, 7)] and b.computed == 7


def test_preemption_frees_and_requeues_the_newest():
    alloc = BlockAllocator(5, 2)  # 2 + 2 for the prompts, 1 left: the admission watermark
    sched = Scheduler(SchedulerConfig(max_seqs=4, max_step_tokens=16), alloc)
    old, new = Sequence(0, [1, 2, 3]), Sequence(1, [4, 5, 6])
    sched.add(old)
    sched.add(new)
    sched.after_step(sched.schedule())
    for s in (old, new):
        s.tokens += [9, 9]
        s.computed += 1  # as if a decode step ran: both now need a third block for position 4
    step = sched.schedule()
    assert step.preempted == [new] and sched.waiting[0] is new and new.computed == 0 and new.table.blocks == []
    assert step.decode == [old]
    alloc.check()


def test_bounded_queue():
    sched = Scheduler(SchedulerConfig(max_waiting=2), BlockAllocator(4, 4))
    sched.add(Sequence(0, [1]))
    sched.add(Sequence(1, [1]))
    with pytest.raises(QueueFull):
        sched.add(Sequence(2, [1]))
    for bad in (0, -3, 2.0, True):
        with pytest.raises(ValueError, match="max_seqs"):
            SchedulerConfig(max_seqs=bad)
