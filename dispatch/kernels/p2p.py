"""The peer-to-peer path's kernels: tokens stored straight into the destination GPU's memory.

Launched by :class:`dispatch.parallel.p2p.P2PTransport`, which owns the symmetric-memory buffers they
address (and says what each holds); their twin is the collective path (``dispatch.parallel.dispatch``:
the same rows over ``all_to_all_single``), which the tests compare with, bitwise.

    _send_tokens   token t → each rank d computing one of its rows: recv, meta (ids, weights), home
    _return_rows   computed row v → its home rank's ret[t·K + k]
    _signal        one release add per destination after a program's stores (the flags' protocol)
    _wait          acquire-spin until every source has signalled, then take the count off again

A peer's buffer arrives as an integer address (Triton refuses a tensor on another GPU) and becomes a
pointer again inside the kernel.
"""
import triton
import triton.language as tl


@triton.jit
def _signal(flags, slot, R: tl.constexpr):
    tl.debug_barrier()  # every thread of the program has issued its stores ...
    for d in tl.static_range(R):  # ... before one release add per destination publishes them
        tl.atomic_add(flags[d].to(tl.pointer_type(tl.int32)) + slot, 1, sem="release", scope="sys")


@triton.jit
def _send_tokens(x, ids, weights, dest, pos, counts, T, H, rank, C, recvs, metas, homes, cnts, flags,
                 R: tl.constexpr, K: tl.constexpr, KP: tl.constexpr, BLOCK_H: tl.constexpr, ROWS: tl.constexpr):
    # Token t → rank d (where pos[t, d] >= 0) at row rank·C + pos[t, d]; peers' buffers are addresses.
    pid = tl.program_id(0)
    ks = tl.arange(0, KP)
    for blk in range(pid, tl.cdiv(T, ROWS), tl.num_programs(0)):
        t = (blk * ROWS + tl.arange(0, ROWS)).to(tl.int64)
        live = t < T
        tk = t[:, None] * K + ks[None, :]
        lk = live[:, None] & (ks[None, :] < K)
        id_tk = tl.load(ids + tk, mask=lk, other=-1).to(tl.int32)
        dest_tk = tl.load(dest + tk, mask=lk, other=-1)
        w_tk = tl.load(weights + tk, mask=lk, other=0.0).to(tl.int32, bitcast=True)
        for d in tl.static_range(R):
            p_t = tl.load(pos + t * R + d, mask=live, other=-1)
            go = p_t >= 0
            at = rank * C + p_t
            recv = tl.multiple_of(recvs[d].to(tl.pointer_type(x.dtype.element_ty)), 16)  # 16 B: wide stores
            for h0 in range(0, H, BLOCK_H):
                cols = h0 + tl.arange(0, BLOCK_H)
                m = go[:, None] & (cols[None, :] < H)
                row = tl.load(x + t[:, None] * H + cols[None, :], mask=m)
                tl.store(recv + at[:, None] * H + cols[None, :], row, mask=m)
            meta = metas[d].to(tl.pointer_type(tl.int32)) + at[:, None] * (2 * K) + ks[None, :]
            km = go[:, None] & (ks[None, :] < K)
            tl.store(meta, tl.where(dest_tk == d, id_tk, -1), mask=km)
            tl.store(meta + K, w_tk, mask=km)
            tl.store(homes[d].to(tl.pointer_type(tl.int32)) + at, t.to(tl.int32), mask=go)
    if pid == 0:  # how many tokens this rank sends to each d
        for d in tl.static_range(R):
            tl.store(cnts[d].to(tl.pointer_type(tl.int32)) + rank, tl.load(counts + d).to(tl.int32))
    _signal(flags, rank, R)


@triton.jit
def _return_rows(src, to_rank, to_row, V, H, rank, rets, flags, R: tl.constexpr, DIV: tl.constexpr,
                 BLOCK_H: tl.constexpr, ROWS: tl.constexpr):
    # Computed row v (to_rank[v] = its home rank s, or -1) → s's ret[to_row[v]]; it reads src row
    # v // DIV (DIV = K: straight from the received tokens, the benchmark's identity experts).
    pid = tl.program_id(0)
    for blk in range(pid, tl.cdiv(V, ROWS), tl.num_programs(0)):
        v = (blk * ROWS + tl.arange(0, ROWS)).to(tl.int64)
        s_v = tl.load(to_rank + v, mask=v < V, other=-1)
        r_v = tl.load(to_row + v, mask=v < V, other=0).to(tl.int64)
        for d in tl.static_range(R):
            go = s_v == d
            ret = tl.multiple_of(rets[d].to(tl.pointer_type(src.dtype.element_ty)), 16)
            for h0 in range(0, H, BLOCK_H):
                cols = h0 + tl.arange(0, BLOCK_H)
                m = go[:, None] & (cols[None, :] < H)
                vals = tl.load(src + (v // DIV)[:, None] * H + cols[None, :], mask=m)
                tl.store(ret + r_v[:, None] * H + cols[None, :], vals, mask=m)
    _signal(flags, R + rank, R)


@triton.jit
def _wait(flags, first, programs, R: tl.constexpr):
    # Acquire-spin until flag[first + s] == programs for every source s, then reset it by
    # subtraction (a source cannot signal the next round before this rank has answered this one).
    for s in tl.static_range(R):
        v = tl.atomic_add(flags + first + s, 0, sem="acquire", scope="sys")
        while v < programs:
            v = tl.atomic_add(flags + first + s, 0, sem="acquire", scope="sys")
        tl.atomic_add(flags + first + s, -programs, sem="relaxed", scope="sys")
