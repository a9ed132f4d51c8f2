"""Functions the parallel tests run on every rank (imported by name in the spawned processes)."""
from __future__ import annotations

import os
import signal
import time

import torch
import torch.distributed as dist

from dispatch.config import MoEConfig, random_weights
from dispatch.moe import MoELayer
from dispatch.parallel import Placement, dispatch, parallelize


def rank_behaviour(bad_rank: int, how: str):
    """Rank ``bad_rank`` misbehaves in one way ``how``; the others join an all_reduce it never joins
    (or, for "hang_in_collective", return at once while it waits in one)."""
    rank = dist.get_rank()
    one = torch.ones(1, device="cuda" if dist.get_backend() == "nccl" else "cpu")
    if rank == bad_rank:
        if how == "raise":
            raise ValueError(f"boom from rank {rank}")
        if how == "exit":
            os._exit(3)
        if how == "segfault":
            os.kill(os.getpid(), signal.SIGSEGV)
        if how == "hang":
            time.sleep(600)
        if how == "hang_in_collective":
            dist.all_reduce(one)
        if how == "unpicklable":
            return lambda: None
    if how == "hang_in_collective":
        return "done"
    dist.all_reduce(one)
    return "unreachable"


def big_result(megabytes: int) -> torch.Tensor:
    """A result larger than a pipe's buffer: it must come back whole."""
    return torch.full((megabytes * 2**18,), float(dist.get_rank()))


def bad_routing(cfg: MoEConfig) -> list[str]:
    """The ValueErrors of the layer and of dispatch for bad ids and shapes (nothing sent)."""
    ep = parallelize(MoELayer(cfg, random_weights(cfg, seed=0)))
    x, K, E, msgs = torch.zeros(3, cfg.hidden_size), cfg.top_k, cfg.num_experts, []
    ones = torch.ones(3, K)
    for w_TK, ids_TK in [(ones, torch.full((3, K), E)), (ones, torch.full((3, K), -1)),
                         (torch.ones(3, K + 1), torch.zeros(3, K, dtype=torch.long)),
                         (torch.ones(3, K + 1), torch.zeros(3, K + 1, dtype=torch.long)),
                         (ones, torch.zeros(3, K))]:
        # dispatch alone takes K from ids_TK: a consistent K + 1 is its caller's business, not an error
        same_k = ids_TK.shape[1] == K
        for call in (ep.experts, lambda *a: dispatch(*a, ep.placement)) if same_k else (ep.experts,):
            try:
                call(x, w_TK, ids_TK)
                msgs.append("accepted")
            except ValueError as exc:
                msgs.append(str(exc))
    return msgs


def mismatched_config(cfg: MoEConfig) -> None:
    """Every rank builds a layer, but the last rank asks for one more expert per token."""
    R = dist.get_world_size()
    mine = cfg.replace(top_k=cfg.top_k + 1) if dist.get_rank() == R - 1 else cfg
    parallelize(MoELayer(mine, random_weights(mine, seed=0)), Placement.contiguous(cfg.num_experts, R))


def bad_ids_unchecked(cfg: MoEConfig, capacity: int | None) -> bool:
    """Ids -1 and E with the check off (as on a GPU): those rows are computed nowhere and add
    nothing; the other rows of the token are exact (compared by value: -0.0 == 0.0)."""
    from dispatch.kernels.grouped_gemm import moe_experts
    from dispatch.parallel.layer import pinned_config

    R, rank, E, K = dist.get_world_size(), dist.get_rank(), cfg.num_experts, cfg.top_k
    g = torch.Generator().manual_seed(11)
    x_TH = torch.randn(4 * R, cfg.hidden_size, generator=g)
    ids_TK = torch.rand(4 * R, E, generator=g).argsort(1)[:, :K]
    ids_TK[1, 0], ids_TK[2, K - 1], ids_TK[5, :] = -1, E, E + 3
    weights_TK = torch.rand(4 * R, K, generator=g)
    w = random_weights(cfg, seed=1)
    valid = (ids_TK >= 0) & (ids_TK < E)
    want = moe_experts(x_TH, weights_TK * valid, ids_TK.clamp(0, E - 1), w.gate_up_E2IH, w.down_EHI,
                       config=pinned_config("cpu"))
    ep = parallelize(MoELayer(cfg, w), capacity=capacity)
    mine = slice(4 * rank, 4 * rank + 4)
    got = ep.experts(x_TH[mine], weights_TK[mine], ids_TK[mine], check_ids=False)
    return torch.equal(got, want[mine])


def bench_rows(argv: list[str]) -> list[dict]:
    """The expert-parallel benchmark's rows on this rank (CPU: a smoke test of every code path)."""
    from dispatch_book.bench import parallel

    return parallel.run(parallel.parse(argv), dist.get_rank(), dist.get_world_size())


def graph_replay(cfg: MoEConfig, T: int, transport: str) -> bool:
    """CUDA only: the layer's routed experts with fixed capacity ("collective") or over the p2p path,
    captured once in a CUDA graph and replayed: the same bits as the eager call (no host sync inside)."""
    from dispatch.kernels.grouped_gemm import moe_experts
    from dispatch.parallel.layer import pinned_config
    from dispatch.parallel.p2p import P2PTransport
    from dispatch_book.bench.parallel import graphed
    from dispatch_book.ep_steps import bitwise_equal

    R, rank, dev = dist.get_world_size(), dist.get_rank(), torch.device("cuda", torch.cuda.current_device())
    g = torch.Generator().manual_seed(5)
    x_TH = torch.randn(R * T, cfg.hidden_size, generator=g).to(dev, torch.bfloat16)
    ids_TK = torch.rand(R * T, cfg.num_experts, generator=g).argsort(1)[:, :cfg.top_k].to(dev)
    weights_TK = torch.rand(R * T, cfg.top_k, generator=g).to(dev)
    w = random_weights(cfg, seed=2, dtype=torch.bfloat16, device=dev)
    one = MoELayer(cfg, w, path="triton", tiles=pinned_config(dev))
    want = moe_experts(x_TH, weights_TK, ids_TK, w.gate_up_E2IH, w.down_EHI, config=one.tiles)
    placement = Placement.contiguous(cfg.num_experts, R)
    kw = {"capacity": T} if transport == "collective" else {
        "transport": P2PTransport(cfg, placement, max_tokens=T, dtype=torch.bfloat16, device=dev)}
    ep = parallelize(one, placement, **kw)
    mine = slice(rank * T, (rank + 1) * T)
    graph, y = graphed(lambda: ep.experts(x_TH[mine], weights_TK[mine], ids_TK[mine], check_ids=False))
    first = y.clone()
    graph.replay()
    torch.cuda.synchronize()
    return bitwise_equal(first, want[mine]) and bitwise_equal(y, want[mine])
