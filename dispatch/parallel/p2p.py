"""The peer-to-peer path: Triton kernels store rows straight into the destination GPU's memory.

Every rank allocates, through torch's symmetric memory (CUDA backend, no multicast), a receive
buffer with one region per source rank, a return buffer with one region per destination, row
metadata and 2R int32 flags, all mapped into every peer. Then, with no NCCL and no host sync:

    dispatch  _dispatch_rows: routed row n of rank s goes to recv[s·N + pos] of rank d = dest(n),
              pos = its place among s's rows for d (n order), with (expert id, weight) and the
              count; each program then makes one *release* add to d's flag[s].
              _wait: spin (*acquire*) until every source's flag holds ``programs``, then take
              them off again (so the next round starts from 0 and nothing depends on the host).
    combine   _return_rows: each valid received slot goes back to its source's ret[d·N + pos];
              the same flags dance; then y_TH[t] = Σ_k ret[home(t, k)] in k order (one launch).

Static shapes and grids everywhere, so a round trip can be captured in a CUDA graph. Row order
is the collective path's (source-major, then n): the output is the same bits. One rank per GPU,
GPUs with peer access (NVLink), at most 8 ranks. A round's dispatch must be followed by its combine.
"""
from __future__ import annotations

import torch
import torch.distributed as dist
import triton
import triton.language as tl

from dispatch.parallel.dispatch import gather_combine
from dispatch.parallel.placement import Placement

MAX_RANKS = 8
ROWS = 4  # rows per block
MAX_PROGRAMS = 264  # 2 per SM of an H200: enough to fill NVLink, few system-scope signals


@triton.jit
def _signal(flags, slot, R: tl.constexpr):
    tl.debug_barrier()  # every thread of the program has issued its stores ...
    for d in tl.static_range(R):  # ... before one release add per destination publishes them
        tl.atomic_add(flags[d].to(tl.pointer_type(tl.int32)) + slot, 1, sem="release", scope="sys")


@triton.jit
def _dispatch_rows(x, ids, weights, dest, pos, counts, N_rows, H, rank, N, recvs, metas, flags,
                   R: tl.constexpr, K: tl.constexpr, BLOCK_H: tl.constexpr, ROWS: tl.constexpr):
    # Routed row n (< N_rows) → rank dest[n], row rank·N + pos[n]; peers' buffers are int addresses.
    # A fixed number of programs loops over blocks of ROWS rows: fewer system-scope signals.
    pid = tl.program_id(0)
    for blk in range(pid, tl.cdiv(N_rows, ROWS), tl.num_programs(0)):
        n = blk * ROWS + tl.arange(0, ROWS)
        live = n < N_rows
        d_n = tl.load(dest + n, mask=live, other=-1)
        at = rank * N + tl.load(pos + n, mask=live, other=0).to(tl.int64)
        t = (n // K).to(tl.int64)
        for h0 in range(0, H, BLOCK_H):
            cols = h0 + tl.arange(0, BLOCK_H)
            cm = cols[None, :] < H
            vals = tl.load(x + t[:, None] * H + cols[None, :], mask=live[:, None] & cm)
            for d in tl.static_range(R):
                recv = tl.multiple_of(recvs[d].to(tl.pointer_type(x.dtype.element_ty)), 16)  # 16 B: wide stores
                tl.store(recv + at[:, None] * H + cols[None, :], vals, mask=(d_n[:, None] == d) & cm)
        e_n = tl.load(ids + n, mask=live, other=0).to(tl.int32)
        w_n = tl.load(weights + n, mask=live, other=0.0).to(tl.int32, bitcast=True)
        for d in tl.static_range(R):
            meta = metas[d].to(tl.pointer_type(tl.int32))
            tl.store(meta + at * 2, e_n, mask=d_n == d)
            tl.store(meta + at * 2 + 1, w_n, mask=d_n == d)
    if pid == 0:  # how many rows this rank sends to each d, after d's row metadata
        for d in tl.static_range(R):
            meta = metas[d].to(tl.pointer_type(tl.int32))
            tl.store(meta + 2 * R * N + rank, tl.load(counts + d).to(tl.int32))
    _signal(flags, rank, R)


@triton.jit
def _return_rows(src, meta, H, rank, N, rets, flags, R: tl.constexpr, BLOCK_H: tl.constexpr, ROWS: tl.constexpr):
    # Received slot j = s·N + p (valid while p < count from s) → rank s's ret row rank·N + p.
    pid = tl.program_id(0)
    for blk in range(pid, tl.cdiv(R * N, ROWS), tl.num_programs(0)):
        j = blk * ROWS + tl.arange(0, ROWS)
        s_j = j // N
        p_j = (j % N).to(tl.int64)
        ok = (j < R * N) & (p_j < tl.load(meta + 2 * R * N + s_j, mask=j < R * N, other=0))
        for h0 in range(0, H, BLOCK_H):
            cols = h0 + tl.arange(0, BLOCK_H)
            cm = cols[None, :] < H
            vals = tl.load(src + j[:, None].to(tl.int64) * H + cols[None, :], mask=ok[:, None] & cm)
            for d in tl.static_range(R):
                ret = tl.multiple_of(rets[d].to(tl.pointer_type(src.dtype.element_ty)), 16)
                tl.store(ret + (rank * N + p_j[:, None]) * H + cols[None, :], vals,
                         mask=ok[:, None] & (s_j[:, None] == d) & cm)
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


class P2PTransport:
    """Dispatch/combine through symmetric memory for ``placement`` on the ranks of ``group``.

    ``max_tokens``: the most tokens any rank passes (buffers hold R × max_tokens·K rows, the same
    on every rank). Use as ``ExpertParallelMoE(..., transport=P2PTransport(...))``.
    """

    def __init__(self, cfg, placement: Placement, *, max_tokens: int, dtype, device, group=None):
        import torch.distributed._symmetric_memory as symm_mem

        group = group or dist.group.WORLD
        rank, R = dist.get_rank(group), dist.get_world_size(group)
        N, H = max_tokens * cfg.top_k, cfg.hidden_size
        keep = []  # the allocations and handles must outlive every view of them (else: unmapped)

        def symmetric(shape, dt):
            buf = symm_mem.empty(shape, dtype=dt, device=device)
            handle = symm_mem.rendezvous(buf, group.group_name)
            keep.append((buf, handle))
            return tuple(buf if p == rank else handle.get_buffer(p, shape, dt) for p in range(R)), handle

        peers = {"recv": symmetric((R * N, H), dtype)[0], "ret": symmetric((R * N, H), dtype)[0],
                 "meta": symmetric((R * N * 2 + R,), torch.int32)[0]}
        peers["flags"], handle = symmetric((2 * R,), torch.int32)
        peers["flags"][rank].zero_()
        torch.cuda.synchronize(device)
        handle.barrier()  # flags are zero everywhere before anyone signals
        self._keep = keep
        self._setup(cfg, placement, rank, R, max_tokens, peers)

    @classmethod
    def simulated(cls, cfg, placement: Placement, *, max_tokens: int, dtype, device="cpu"):
        """All R ranks in one process over ordinary tensors (tests under Triton's interpreter):
        one transport per rank; call ``send(..., wait=False)`` on each, then ``wait_in()`` on each."""
        R, N, H = placement.num_ranks, max_tokens * cfg.top_k, cfg.hidden_size
        peers = {"recv": [torch.zeros(R * N, H, dtype=dtype, device=device) for _ in range(R)],
                 "ret": [torch.zeros(R * N, H, dtype=dtype, device=device) for _ in range(R)],
                 "meta": [torch.zeros(R * N * 2 + R, dtype=torch.int32, device=device) for _ in range(R)],
                 "flags": [torch.zeros(2 * R, dtype=torch.int32, device=device) for _ in range(R)]}
        out = []
        for rank in range(R):
            t = cls.__new__(cls)
            t._setup(cfg, placement, rank, R, max_tokens, peers)
            out.append(t)
        return out

    def _setup(self, cfg, placement, rank, R, max_tokens, peers):
        if R > MAX_RANKS:
            raise ValueError(f"the peer-to-peer path supports at most {MAX_RANKS} ranks, got {R}")
        if placement.num_ranks != R:
            raise ValueError(f"placement is for {placement.num_ranks} ranks, the group has {R}")
        self.placement, self.rank, self.R, self.K, self.H = placement, rank, R, cfg.top_k, cfg.hidden_size
        self.N = max_tokens * cfg.top_k  # rows per source region
        self.recv, self.ret, self.meta, self.flags = (peers[k][rank] for k in ("recv", "ret", "meta", "flags"))
        # Peers' buffers go to the kernels as integer addresses (Triton refuses a tensor argument
        # that lives on another GPU) and become pointers again inside them.
        self.recv_at, self.ret_at, self.meta_at, self.flags_at = (
            tuple(t.data_ptr() for t in peers[k]) for k in ("recv", "ret", "meta", "flags"))
        self.slot_E = placement.tables(self.recv.device)[2][rank]  # local slot of each expert here
        self.L = len(placement.slots_RS[rank])
        self.programs_out = min(triton.cdiv(self.N, ROWS), MAX_PROGRAMS)
        self.programs_back = min(triton.cdiv(R * self.N, ROWS), MAX_PROGRAMS)
        self.block_h = min(1024, triton.next_power_of_2(self.H))
        self.arange_R = torch.arange(R, device=self.recv.device)
        self._f32 = torch.zeros(1, dtype=torch.float32, device=self.recv.device)  # stands in when T = 0

    def wait_in(self) -> None:
        """Hold this rank's stream until every source's rows of this round have arrived."""
        _wait[(1,)](self.flags, 0, self.programs_out, R=self.R)

    def wait_back(self) -> None:
        _wait[(1,)](self.flags, self.R, self.programs_back, R=self.R)

    def send(self, x_TH, weights_TK, ids_TK, wait: bool = True) -> torch.Tensor:
        """Rows out to their ranks (and, with ``wait``, everyone's rows in). No host sync.
        Returns home_N: where each routed row's result will land in this rank's return buffer."""
        T, K = ids_TK.shape
        if K != self.K or tuple(x_TH.shape) != (T, self.H) or tuple(weights_TK.shape) != (T, K):
            raise ValueError(f"expected x [T, H={self.H}], weights_TK and ids_TK [T, K={self.K}], got "
                             f"{tuple(x_TH.shape)}, {tuple(weights_TK.shape)} and {tuple(ids_TK.shape)}")
        if x_TH.dtype != self.recv.dtype:
            raise ValueError(f"x has dtype {x_TH.dtype} but this transport was built for {self.recv.dtype}")
        if T * K > self.N:
            raise ValueError(f"{T} tokens exceed max_tokens={self.N // K} this transport was built for")
        dest_N = self.placement.dest_rank_N(ids_TK, self.rank)
        onehot_NR = dest_N[:, None] == self.arange_R
        before_NR = onehot_NR.cumsum(0)  # rows for each rank up to and including n
        pos_N = before_NR.gather(1, dest_N[:, None]).squeeze(1) - 1
        counts_R = before_NR[-1] if T else self.arange_R * 0
        _dispatch_rows[(self.programs_out,)](
            x_TH if T else self.recv, ids_TK if T else self.arange_R, weights_TK.float() if T else self._f32,
            dest_N if T else self.arange_R, pos_N if T else self.arange_R, counts_R, T * K, self.H, self.rank,
            self.N, self.recv_at, self.meta_at, self.flags_at, R=self.R, K=K, BLOCK_H=self.block_h, ROWS=ROWS)
        if wait:
            self.wait_in()
        return dest_N * self.N + pos_N

    def send_back(self, stage_PH: torch.Tensor) -> None:
        """Rows in receive layout [R·N, H] back to their sources' return buffers (no wait)."""
        _return_rows[(self.programs_back,)](stage_PH, self.meta, self.H, self.rank, self.N, self.ret_at,
                                            self.flags_at, R=self.R, BLOCK_H=self.block_h, ROWS=ROWS)

    def gather_home(self, home_N: torch.Tensor) -> torch.Tensor:
        """y_TH from the return buffer: Σ_k in k order (one launch on CUDA)."""
        return gather_combine(self.ret, home_N, self.K)

    def local_rows(self):
        """Received rows grouped by local expert slot (stable), as the collective dispatch returns
        them: (x_MH, weight_M, counts_L, recv_order_M). One host sync (counts_L)."""
        R, N = self.R, self.N
        meta_P2 = self.meta[: R * N * 2].view(R * N, 2)
        valid_P = (torch.arange(N, device=self.meta.device)[None, :] < self.meta[R * N * 2:, None]).reshape(-1)
        key_P = torch.where(valid_P, self.slot_E[meta_P2[:, 0].long().clamp(min=0)], self.L)
        order_P = torch.argsort(key_P, stable=True)
        counts_L = tuple(torch.zeros(self.L + 1, dtype=torch.int64, device=key_P.device)
                         .scatter_add_(0, key_P, torch.ones_like(key_P))[: self.L].tolist())
        recv_order_M = order_P[: sum(counts_L)]
        weight_M = meta_P2[:, 1].contiguous().view(torch.float32)[recv_order_M]
        return self.recv[recv_order_M], weight_M, counts_L, recv_order_M

    def dispatch(self, x_TH, weights_TK, ids_TK):
        """Same contract as :func:`dispatch.parallel.dispatch.dispatch`."""
        home_N = self.send(x_TH, weights_TK, ids_TK)
        x_MH, weight_M, counts_L, recv_order_M = self.local_rows()
        return x_MH, weight_M, counts_L, (home_N, recv_order_M)

    def combine(self, out_MH, meta) -> torch.Tensor:
        home_N, recv_order_M = meta
        stage_PH = torch.zeros_like(self.recv)
        stage_PH[recv_order_M] = out_MH
        self.send_back(stage_PH)
        self.wait_back()
        return self.gather_home(home_N)

    def round_trip(self, x_TH, weights_TK, ids_TK) -> torch.Tensor:
        """Dispatch + combine with identity experts (the benchmark's unit): rows go out and come
        straight back from the receive buffer. No host sync: CUDA-graph capturable."""
        home_N = self.send(x_TH, weights_TK, ids_TK)
        self.send_back(self.recv)
        self.wait_back()
        return self.gather_home(home_N)
