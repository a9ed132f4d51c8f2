"""The peer-to-peer path: a Triton kernel stores rows straight into the destination GPU's memory.

Every rank allocates, through torch's symmetric memory (CUDA backend, no multicast), a receive
buffer with one region per source rank, a return buffer with one region per destination, and
a few int32 flags. Then, with no NCCL and no host synchronisation on the data path:

    dispatch: _put_rows writes row n of rank s into rank d's recv[s, pos] (pos = its place among
              s's rows for d, n order), plus (slot, weight) and the count; each program then does
              a release add on d's flag[s]  →  _wait spins (acquire) until every source's flag
              reaches epoch × programs
    combine:  the same kernel writes each result row back into its source's ret[d, pos]; wait;
              out_NH[n] = ret[dest(n), pos(n)]; Σ_k in k order (as the collective path)

Row order is the collective path's (source-major, then n), so the output is the same bits.
Needs GPUs with peer access (NVLink); one rank per GPU; at most 8 ranks.
"""
from __future__ import annotations

import torch
import torch.distributed as dist
import triton
import triton.language as tl

from dispatch.parallel.dispatch import combine_topk
from dispatch.parallel.placement import Placement

MAX_RANKS = 8
ROWS = 4  # rows per program


@triton.jit(do_not_specialize=["flag_slot"])
def _put_rows(src, src_row, dest, dst_row, n_items, H, dsts, meta_src, metas, counts, count_at, flags, flag_slot,
              R: tl.constexpr, HAS_META: tl.constexpr, BLOCK_H: tl.constexpr, ROWS: tl.constexpr):
    # Item i: copy src[src_row[i], :] to rank dest[i]'s buffer row dst_row[i] (dest < 0: skip).
    pid = tl.program_id(0)
    i = pid * ROWS + tl.arange(0, ROWS)
    live = i < n_items
    d_i = tl.load(dest + i, mask=live, other=-1)
    s_i = tl.load(src_row + i, mask=live, other=0).to(tl.int64)
    r_i = tl.load(dst_row + i, mask=live, other=0).to(tl.int64)
    for h0 in range(0, H, BLOCK_H):
        cols = h0 + tl.arange(0, BLOCK_H)
        cmask = cols[None, :] < H
        vals = tl.load(src + s_i[:, None] * H + cols[None, :], mask=(d_i[:, None] >= 0) & cmask)
        for d in tl.static_range(R):
            dst = dsts[d].to(tl.pointer_type(src.dtype.element_ty))  # a peer's address, as an int
            tl.store(dst + r_i[:, None] * H + cols[None, :], vals, mask=(d_i[:, None] == d) & cmask)
    if HAS_META:  # (slot, weight bits) per row, and program 0 writes the row counts
        j = tl.arange(0, 2)
        m = tl.load(meta_src + i[:, None] * 2 + j[None, :], mask=live[:, None], other=0)
        for d in tl.static_range(R):
            meta_d = metas[d].to(tl.pointer_type(tl.int32))
            tl.store(meta_d + r_i[:, None] * 2 + j[None, :], m, mask=(d_i[:, None] == d))
            if pid == 0:
                tl.store(meta_d + count_at + flag_slot, tl.load(counts + d))
    tl.debug_barrier()  # every thread of the program has issued its stores ...
    for d in tl.static_range(R):  # ... before one release add per destination makes them visible
        tl.atomic_add(flags[d].to(tl.pointer_type(tl.int32)) + flag_slot, 1, sem="release", scope="sys")


@triton.jit
def _wait(flag, first, expected, R: tl.constexpr):
    # Spin until each of the R flags flag[first + s] has reached ``expected`` (acquire: the rows
    # written before the writer's release add are visible after this).
    for s in tl.static_range(R):
        v = tl.atomic_add(flag + first + s, 0, sem="acquire", scope="sys")
        while v < expected:
            v = tl.atomic_add(flag + first + s, 0, sem="acquire", scope="sys")


class P2PTransport:
    """Dispatch/combine through symmetric memory for ``placement`` on the ranks of ``group``.

    ``max_tokens``: the most tokens any rank will pass (buffers are sized R × max_tokens·K rows,
    the same on every rank). Use as ``ExpertParallelMoE(..., transport=P2PTransport(...))``.
    """

    def __init__(self, cfg, placement: Placement, *, max_tokens: int, dtype, device, group=None):
        import torch.distributed._symmetric_memory as symm_mem

        group = group or dist.group.WORLD
        rank, R = dist.get_rank(group), dist.get_world_size(group)
        N, H = max_tokens * cfg.top_k, cfg.hidden_size

        def symmetric(shape, dt):
            buf = symm_mem.empty(shape, dtype=dt, device=device)
            handle = symm_mem.rendezvous(buf, group.group_name)
            return tuple(handle.get_buffer(p, shape, dt) for p in range(R)), handle

        bufs = {"recv": symmetric((R * N, H), dtype)[0], "ret": symmetric((R * N, H), dtype)[0],
                "meta": symmetric((R * N * 2 + R,), torch.int32)[0]}
        bufs["flags"], handle = symmetric((2 * R,), torch.int32)
        bufs["flags"][rank].zero_()
        torch.cuda.synchronize(device)
        handle.barrier()  # flags are zero everywhere before anyone signals
        self._setup(cfg, placement, rank, R, max_tokens, bufs)

    @classmethod
    def simulated(cls, cfg, placement: Placement, *, max_tokens: int, dtype, device="cpu"):
        """All R ranks in one process over ordinary tensors (tests under Triton's interpreter):
        returns one transport per rank; call ``send(..., wait=False)`` on each, then ``wait_in()``."""
        R, N, H = placement.num_ranks, max_tokens * cfg.top_k, cfg.hidden_size
        peers = {"recv": tuple(torch.zeros(R * N, H, dtype=dtype, device=device) for _ in range(R)),
                 "ret": tuple(torch.zeros(R * N, H, dtype=dtype, device=device) for _ in range(R)),
                 "meta": tuple(torch.zeros(R * N * 2 + R, dtype=torch.int32, device=device) for _ in range(R)),
                 "flags": tuple(torch.zeros(2 * R, dtype=torch.int32, device=device) for _ in range(R))}
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
        self.recv_peers, self.ret_peers, self.meta_peers, self.flag_peers = (
            peers["recv"], peers["ret"], peers["meta"], peers["flags"])
        self.recv, self.ret, self.meta, self.flags = (p[rank] for p in (self.recv_peers, self.ret_peers,
                                                                        self.meta_peers, self.flag_peers))
        # Peers' buffers are passed to the kernel as integer addresses (Triton refuses a tensor
        # argument that lives on another GPU) and cast back to pointers inside it.
        self.recv_addrs, self.ret_addrs, self.meta_addrs, self.flag_addrs = (
            tuple(t.data_ptr() for t in p) for p in (self.recv_peers, self.ret_peers, self.meta_peers, self.flag_peers))
        _, _, self.slot_RE = placement.tables(self.recv.device)
        self.L = len(placement.slots_RS[rank])
        self.epoch = 0
        self._one = torch.full((2,), -1, dtype=torch.int32, device=self.recv.device)
        # Static grids, the same on every rank: a flag is complete at epoch × programs adds.
        self.programs_out, self.programs_back = triton.cdiv(self.N, ROWS), triton.cdiv(R * self.N, ROWS)

    def _put(self, src, src_row, dest, dst_row, n_items, programs, flags_first, meta_src=None, counts_R=None):
        has_meta = meta_src is not None
        if n_items == 0:  # nothing to send (the programs still signal); no empty tensors to Triton
            src, src_row, dest, dst_row = self.recv, self._one, self._one, self._one
            meta_src = self._one if has_meta else None
        _put_rows[(programs,)](
            src, src_row, dest, dst_row, n_items, self.H, self.recv_addrs if has_meta else self.ret_addrs,
            meta_src if has_meta else dest, self.meta_addrs, counts_R if has_meta else dest, self.R * self.N * 2,
            self.flag_addrs, flags_first + self.rank,
            R=self.R, HAS_META=has_meta, BLOCK_H=min(1024, triton.next_power_of_2(self.H)), ROWS=ROWS)

    def wait_in(self) -> None:
        """Block this rank's stream until every source's rows of this epoch have arrived."""
        _wait[(1,)](self.flags, 0, self.epoch * self.programs_out, R=self.R)

    def wait_back(self) -> None:
        _wait[(1,)](self.flags, self.R, self.epoch * self.programs_back, R=self.R)

    def send(self, x_TH, weights_TK, ids_TK, wait: bool = True):
        """Rows out to their ranks and wait for everyone's rows in: no host sync. Returns the
        per-row routing (dest_N, pos_N) that :meth:`combine_rows` needs."""
        T, K = ids_TK.shape
        if T * K > self.N:
            raise ValueError(f"{T} tokens exceed max_tokens={self.N // K} this transport was built for")
        R, N = self.R, self.N
        dest_N = self.placement.dest_rank_N(ids_TK, self.rank)
        order_N = torch.argsort(dest_N, stable=True)
        send_R = torch.zeros(R, dtype=torch.int64, device=dest_N.device).scatter_add_(0, dest_N, torch.ones_like(dest_N))
        start_R = torch.cumsum(send_R, 0) - send_R
        dest_sorted = dest_N[order_N]
        pos_sorted = torch.arange(T * K, device=dest_N.device) - start_R[dest_sorted]
        pos_N = torch.empty_like(pos_sorted)
        pos_N[order_N] = pos_sorted
        slot_N = self.slot_RE[dest_N, ids_TK.reshape(-1).long()]
        meta_N2 = torch.stack([slot_N[order_N].to(torch.int32),
                               weights_TK.float().reshape(-1)[order_N].view(torch.int32)], dim=1).contiguous()
        self.epoch += 1
        self._put(x_TH.contiguous(), (order_N // K).contiguous(), dest_sorted.to(torch.int32).contiguous(),
                  (self.rank * N + pos_sorted).contiguous(), T * K, self.programs_out, 0, meta_N2,
                  send_R.to(torch.int32))
        if wait:
            self.wait_in()
        return dest_N, pos_N

    def dispatch(self, x_TH, weights_TK, ids_TK):
        """Same contract as :func:`dispatch.parallel.dispatch.dispatch` (one host sync for counts_L)."""
        R, N = self.R, self.N
        dest_N, pos_N = self.send(x_TH, weights_TK, ids_TK)
        return self.local_rows(x_TH.shape[0], dest_N, pos_N)

    def local_rows(self, T, dest_N, pos_N):
        """Received rows grouped by local expert slot (stable), as the collective dispatch returns."""
        R, N = self.R, self.N
        _, valid_P = self.received()
        meta_P2 = self.meta[: R * N * 2].view(R * N, 2)
        key_P = torch.where(valid_P.reshape(-1), meta_P2[:, 0].long(), self.L)
        order_P = torch.argsort(key_P, stable=True)
        counts_L = tuple(torch.zeros(self.L + 1, dtype=torch.int64, device=key_P.device)
                         .scatter_add_(0, key_P, torch.ones_like(key_P))[: self.L].tolist())
        recv_order_M = order_P[: sum(counts_L)]
        x_MH = self.recv[recv_order_M]
        weight_M = meta_P2[:, 1].contiguous().view(torch.float32)[recv_order_M]
        return x_MH, weight_M, counts_L, (T, dest_N, pos_N, recv_order_M, valid_P)

    def received(self):
        """(counts_R, valid_P): rows each source sent here, and which receive slots hold a row."""
        counts_R = self.meta[self.R * self.N * 2:].long()
        return counts_R, torch.arange(self.N, device=counts_R.device)[None, :] < counts_R[:, None]

    def send_back(self, stage_PH, valid_P) -> None:
        """Rows in receive layout [R·N, H] back into their sources' return buffers (no wait)."""
        R, N = self.R, self.N
        j = torch.arange(R * N, device=stage_PH.device)
        back_dest = torch.where(valid_P.reshape(-1), j // N, -1).to(torch.int32)
        self._put(stage_PH, j, back_dest, self.rank * N + j % N, R * N, self.programs_back, R)

    def gather_home(self, dest_N, pos_N, T) -> torch.Tensor:
        out_NH = self.ret[dest_N * self.N + pos_N]
        return combine_topk(out_NH, self.K) if T else out_NH.new_zeros(0, self.H)

    def combine_rows(self, stage_PH, valid_P, dest_N, pos_N, T) -> torch.Tensor:
        """Send rows in receive layout [R·N, H] back to their sources; gather and k-sum. No host sync."""
        self.send_back(stage_PH, valid_P)
        self.wait_back()
        return self.gather_home(dest_N, pos_N, T)

    def combine(self, out_MH, meta) -> torch.Tensor:
        T, dest_N, pos_N, recv_order_M, valid_P = meta
        stage_PH = torch.zeros_like(self.recv)
        stage_PH[recv_order_M] = out_MH
        return self.combine_rows(stage_PH, valid_P, dest_N, pos_N, T)

    def round_trip(self, x_TH, weights_TK, ids_TK) -> torch.Tensor:
        """Dispatch + combine with identity experts (the benchmark's unit): rows go out and straight
        back from the receive buffer. No host sync anywhere."""
        dest_N, pos_N = self.send(x_TH, weights_TK, ids_TK)
        return self.combine_rows(self.recv, self.received()[1], dest_N, pos_N, x_TH.shape[0])
