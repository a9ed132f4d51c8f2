"""The peer-to-peer path: Triton kernels store tokens straight into the destination GPU's memory.

Every rank allocates, through torch's symmetric memory (CUDA backend, no multicast), buffers mapped
into every peer: ``recv`` [R·C, H] (one region of C token rows per source), ``meta`` [R·C, 2K]
int32 (K expert ids, -1 where this rank does not compute the row; K fp32 weights as bits),
``home`` [R·C] int32 (each row's token index at its home rank), ``counts`` [R] (tokens from each
source), ``ret`` [C·K, H] (the home's routed rows n = t·K + k) and 2R int32 flags. Then, with no NCCL and no host sync:

    dispatch  _send_tokens: token t goes once to each rank d computing one of its rows, into
              d's recv[rank·C + pos], with its meta; each program then makes one *release* add
              to every d's flag[rank]. _wait: acquire-spin until every source's flag holds the
              number of programs, then take it off again (the next round starts from 0).
    experts   the grouped GEMM on recv (rows of other ranks and stale slots are not computed)
    combine   _return_rows: computed row (j, k) goes to its source's ret[t·K + k]; the same flags
              dance; then combine(ret[:T·K], K) in k order — the one-device combine, same bits.

Static shapes and grids everywhere, so a round trip can be captured in a CUDA graph. One rank per
GPU, GPUs with peer access (NVLink), at most 8 ranks. Each dispatch must be followed by its combine.
The kernels are :mod:`dispatch.kernels.p2p`; :class:`P2PTransport` is their launcher (it owns the
buffers they address), and the collective path (:mod:`dispatch.parallel.dispatch`) their twin.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
import triton

from dispatch import runtime
from dispatch.kernels.combine import combine as combine_k
from dispatch.kernels.p2p import _return_rows, _send_tokens, _wait
from dispatch.parallel.dispatch import check_routing, plan
from dispatch.placement import Placement

MAX_RANKS = 8


@dataclass(frozen=True)
class P2PConfig:
    """Copy-kernel launch: rows per block, programs per SM (a grid-stride loop), warps."""

    rows: int = 8
    programs_per_sm: int = 2
    num_warps: int = 8
    block_h: int = 2048  # most elements of a row per store; H up to this in one go

    def programs(self, blocks: int, device) -> int:
        return max(1, min(blocks, self.programs_per_sm * runtime.num_sms(device)))


class P2PTransport:
    """Dispatch/combine through symmetric memory for ``placement`` on the ranks of ``group``.

    ``max_tokens`` (C): the most tokens any rank passes, the same on every rank. ``rows_dtype``:
    the returned rows' dtype (default x's; fp32 for the layer's decode path). Use as
    ``parallelize(layer, placement, transport=P2PTransport(...))``.
    """

    def __init__(self, cfg, placement: Placement, *, max_tokens: int, dtype, device, group=None,
                 config: P2PConfig = P2PConfig(), rows_dtype=None):
        import torch.distributed._symmetric_memory as symm_mem

        group = group or dist.group.WORLD
        rank, R = dist.get_rank(group), dist.get_world_size(group)
        keep = []  # the allocations and handles must outlive every view of them (else: unmapped)

        def symmetric(shape, dt):
            buf = symm_mem.empty(shape, dtype=dt, device=device)
            handle = symm_mem.rendezvous(buf, group.group_name)
            keep.append((buf, handle))
            return tuple(buf if p == rank else handle.get_buffer(p, shape, dt) for p in range(R)), handle

        peers = {name: symmetric(shape, dt)[0]
                 for name, shape, dt in _buffers(cfg, R, max_tokens, dtype, rows_dtype)[:-1]}
        peers["flags"], handle = symmetric((2 * R,), torch.int32)
        peers["flags"][rank].zero_()
        torch.cuda.synchronize(device)
        handle.barrier()  # flags are zero everywhere before anyone signals
        self._keep = keep
        self._setup(cfg, placement, rank, R, max_tokens, peers, config)

    @classmethod
    def simulated(cls, cfg, placement: Placement, *, max_tokens: int, dtype, device="cpu",
                  config: P2PConfig = P2PConfig(rows=4, programs_per_sm=1), rows_dtype=None):
        """All R ranks in one process over ordinary tensors (tests under Triton's interpreter):
        one transport per rank; ``send(..., wait=False)`` on each, then ``wait_in()`` on each."""
        R = placement.num_ranks
        peers = {name: [torch.zeros(shape, dtype=dt, device=device) for _ in range(R)]
                 for name, shape, dt in _buffers(cfg, R, max_tokens, dtype, rows_dtype)}
        out = []
        for rank in range(R):
            t = cls.__new__(cls)
            t._setup(cfg, placement, rank, R, max_tokens, peers, config)
            out.append(t)
        return out

    def _setup(self, cfg, placement, rank, R, max_tokens, peers, config):
        if R > MAX_RANKS:
            raise ValueError(f"the peer-to-peer path supports at most {MAX_RANKS} ranks, got {R}")
        if placement.num_ranks != R:
            raise ValueError(f"placement is for {placement.num_ranks} ranks, the group has {R}")
        self.cfg, self.placement, self.rank, self.R, self.C = cfg, placement, rank, R, max_tokens
        self.K, self.H, self.config = cfg.top_k, cfg.hidden_size, config
        for name in ("recv", "meta", "home", "counts", "ret", "flags"):
            setattr(self, name, peers[name][rank])
        # Peers' buffers go to the kernels as integer addresses (Triton refuses a tensor argument
        # that lives on another GPU) and become pointers again inside them.
        self.at = {name: tuple(t.data_ptr() for t in peers[name]) for name in ("recv", "meta", "home", "counts", "ret",
                                                                                 "flags")}
        dev = self.recv.device
        self.slot_E = placement.tables(dev)[2][rank]  # local slot of each expert here, -1 if none
        self.L = len(placement.slots_RS[rank])
        self.programs_out = config.programs(triton.cdiv(max_tokens, config.rows), dev)
        self.programs_back = config.programs(triton.cdiv(R * max_tokens * self.K, config.rows), dev)
        self.block_h = min(config.block_h, triton.next_power_of_2(self.H))
        j_M = torch.arange(R * max_tokens, device=dev)
        self.source_M, self.p_M, self.k_K = j_M // max_tokens, j_M % max_tokens, torch.arange(self.K, device=dev)
        self._f32 = torch.zeros(1, device=dev)  # stands in for the weights when T = 0

    def wait_in(self) -> None:
        """Hold this rank's stream until every source's tokens of this round have arrived."""
        _wait[(1,)](self.flags, 0, self.programs_out, R=self.R)

    def wait_back(self) -> None:
        _wait[(1,)](self.flags, self.R, self.programs_back, R=self.R)

    def send(self, x_TH, weights_TK, ids_TK, wait: bool = True) -> None:
        """Tokens out to the ranks computing their rows (and, with ``wait``, everyone's in). No host sync."""
        check_routing(x_TH, weights_TK, ids_TK, self.placement.num_experts, self.H, self.K)
        if x_TH.dtype != self.recv.dtype:
            raise ValueError(f"x has dtype {x_TH.dtype} but this transport was built for {self.recv.dtype}")
        T = x_TH.shape[0]
        if T > self.C:
            raise ValueError(f"{T} tokens exceed max_tokens={self.C} this transport was built for")
        dest_TK, sends_TR, pos_TR = plan(ids_TK, self.placement, self.rank)
        self._valid_N = (dest_TK < self.R).reshape(-1, 1)  # a row computed nowhere adds nothing
        pos_TR = torch.where(sends_TR, pos_TR, -1).contiguous()
        cfg = self.config
        if T == 0:  # Triton wants real pointers: stand-ins that are never read (every row is masked)
            x_TH, ids_TK, weights_TK, dest_TK, pos_TR = self.recv, self.p_M, self._f32, self.p_M, self.p_M
        _send_tokens[(self.programs_out,)](
            x_TH.contiguous(), ids_TK.contiguous(), weights_TK.float().contiguous(), dest_TK.contiguous(), pos_TR,
            sends_TR.sum(0), T, self.H, self.rank, self.C, self.at["recv"], self.at["meta"], self.at["home"],
            self.at["counts"], self.at["flags"], R=self.R, K=self.K, KP=triton.next_power_of_2(self.K),
            BLOCK_H=self.block_h, ROWS=cfg.rows, num_warps=cfg.num_warps)
        if wait:
            self.wait_in()

    def local(self):
        """The received tokens as the layer's experts take them: (x_MH, weights_MK, slots_MK),
        M = R·C; rows not computed here (other ranks', stale slots) get slot L. No host sync."""
        K = self.K
        ids_MK = self.meta[:, :K]
        ok_MK = (self.p_M < self.counts[self.source_M])[:, None] & (ids_MK >= 0)
        slots_MK = torch.where(ok_MK, self.slot_E[ids_MK.clamp(min=0).long()], self.L)
        self._to_rank_V = torch.where(ok_MK, self.source_M[:, None], -1).reshape(-1).contiguous()
        self._to_row_V = (self.home.long()[:, None] * K + self.k_K).reshape(-1).contiguous()
        weights_MK = self.meta[:, K:].contiguous().view(torch.float32)
        return self.recv, weights_MK, torch.where(slots_MK < 0, self.L, slots_MK)

    def send_back(self, src: torch.Tensor, div: int = 1) -> None:
        """Computed rows (``local``'s order, rows j·K + k of src, or tokens j with div=K) home. No wait."""
        V = self._to_rank_V.shape[0]
        _return_rows[(self.programs_back,)](src, self._to_rank_V, self._to_row_V, V, self.H, self.rank,
                                            self.at["ret"], self.at["flags"], R=self.R, DIV=div,
                                            BLOCK_H=self.block_h, ROWS=self.config.rows,
                                            num_warps=self.config.num_warps)

    def dispatch(self, x_TH, weights_TK, ids_TK):
        """Same contract as :func:`dispatch.parallel.dispatch` (without the meta: kept here)."""
        self.send(x_TH, weights_TK, ids_TK)
        return self.local()

    def combine(self, out_VH: torch.Tensor, num_tokens: int) -> torch.Tensor:
        self.send_back(out_VH)
        self.wait_back()
        return combine_k(self.ret[: num_tokens * self.K].masked_fill_(~self._valid_N, 0), self.K)

    def round_trip(self, x_TH, weights_TK, ids_TK) -> torch.Tensor:
        """Dispatch + combine with identity experts (the benchmark's unit): each routed row comes
        straight back from the received token. No host sync: CUDA-graph capturable."""
        self.send(x_TH, weights_TK, ids_TK)
        self.local()
        self.send_back(self.recv, div=self.K)
        self.wait_back()
        return combine_k(self.ret[: x_TH.shape[0] * self.K], self.K)


def _buffers(cfg, R: int, C: int, dtype, rows_dtype=None):
    """(name, shape, dtype) of every buffer a rank exposes to its peers; returned rows are
    ``rows_dtype`` (default x's dtype; fp32 for the decode path's rows)."""
    K, H = cfg.top_k, cfg.hidden_size
    return [("recv", (R * C, H), dtype), ("meta", (R * C, 2 * K), torch.int32), ("home", (R * C,), torch.int32),
            ("counts", (R,), torch.int32), ("ret", (C * K, H), rows_dtype or dtype), ("flags", (2 * R,), torch.int32)]
