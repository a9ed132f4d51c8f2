"""Chapter 4's steps, run on every rank by ``dispatch.parallel.launch`` (module-level: picklable).

Each builds the *global* inputs from a seed (identical on every rank), runs one design of the
expert-parallel layer on its own slice of tokens and compares its rows with the one-device layer
built from the same kernels (``MoELayer(path="triton", config=<pinned tiles>)``), bit for bit.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

from dispatch.config import MoEConfig, random_weights
from dispatch.kernels.combine import combine as combine_k
from dispatch.kernels.gemv import moe_decode
from dispatch.kernels.grouped_gemm import moe_experts
from dispatch.moe import MoELayer
from dispatch.parallel import Placement, dispatch, parallelize
from dispatch.parallel.dispatch import _a2a, plan
from dispatch.parallel.layer import local_decode, local_experts, pinned_config, pinned_decode_config


@dataclass(frozen=True)
class Case:
    """One equality check. tokens_R: tokens on each rank (uneven and zero allowed).
    routing: "random" (random ids and weights), "skewed" (every row to rank 0's experts), "one"
    (every token to the same K experts) or "router" (the whole layer: router + experts + shared).
    capacity: static splits sized for the largest rank (no host sync) instead of exact ones.
    path: the experts' kernels, "grouped" (grouped GEMM) or "decode" (the decode kernels)."""

    name: str
    cfg: MoEConfig
    tokens_R: tuple[int, ...]
    routing: str = "random"
    placement: Placement | None = None
    seed: int = 0
    dtype: str = "float32"
    capacity: bool = False
    path: str = "grouped"


def bitwise_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Same shape, dtype and bits (so -0.0 != 0.0, and NaN == NaN of the same payload)."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    ints = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[a.element_size()]
    return torch.equal(a.contiguous().view(ints), b.contiguous().view(ints))


def case_inputs(case: Case, device="cpu"):
    """Global x_TH, routing (weights_TK, ids_TK) and weights, from the seed."""
    cfg, dtype = case.cfg, getattr(torch, case.dtype)
    g = torch.Generator().manual_seed(case.seed)
    T, K = sum(case.tokens_R), cfg.top_k
    x_TH = torch.randn(T, cfg.hidden_size, generator=g).to(dtype)
    w = random_weights(cfg, seed=case.seed + 1, dtype=dtype)
    pool = list(range(cfg.num_experts))
    if case.routing == "skewed":
        pool = list((case.placement or Placement.contiguous(cfg.num_experts, len(case.tokens_R))).slots_RS[0])
        if len(pool) < K:
            raise ValueError(f"skewed routing needs rank 0 to hold >= K={K} experts, it holds {pool}")
    pick_TK = torch.rand(T, len(pool), generator=g).argsort(dim=1)[:, :K]
    if case.routing == "one":
        pick_TK = torch.arange(K).expand(T, K)
    ids_TK = torch.tensor(pool)[pick_TK]
    weights_TK = torch.rand(T, K, generator=g)
    return x_TH.to(device), weights_TK.to(device), ids_TK.to(device), w.to(device)


def _mine(case: Case) -> slice:
    rank = dist.get_rank()
    start = sum(case.tokens_R[:rank])
    return slice(start, start + case.tokens_R[rank])


def check_case(case: Case, device="cpu", transport="collective") -> dict:
    """This rank's rows of the expert-parallel layer vs the one-device layer's, bit for bit."""
    R = dist.get_world_size()
    if len(case.tokens_R) != R:
        raise ValueError(f"case {case.name!r} has token counts for {len(case.tokens_R)} ranks, world has {R}")
    x_TH, weights_TK, ids_TK, w = case_inputs(case, device)
    config, mine = pinned_config(x_TH.device), _mine(case)
    one = MoELayer(case.cfg, w, path="triton", config=config)
    placement = case.placement or Placement.contiguous(case.cfg.num_experts, R)
    capacity = max(max(case.tokens_R), 1) if case.capacity else None
    if transport == "p2p":
        from dispatch.parallel.p2p import P2PTransport

        transport = P2PTransport(case.cfg, placement, max_tokens=max(max(case.tokens_R), 1), dtype=x_TH.dtype,
                                 device=x_TH.device, rows_dtype=torch.float32 if case.path == "decode" else None)
    ep = parallelize(one, placement, capacity=capacity, transport=transport, path=case.path)
    if case.routing == "router":  # the whole layer: the one-device layer on the same tokens
        got, want = ep(x_TH[mine]), one(x_TH[mine])
    else:  # the routed experts: the one-device grouped GEMM on the global batch
        got = ep.experts(x_TH[mine], weights_TK[mine], ids_TK[mine])
        want = one_device(x_TH, weights_TK, ids_TK, w, case.path)[mine]
    diff = (got.float() - want.float()).abs()
    return {"case": case.name, "rank": dist.get_rank(), "tokens": case.tokens_R[dist.get_rank()],
            "equal": bitwise_equal(got, want), "max_abs_diff": float(diff.max()) if diff.numel() else 0.0}


def one_device(x_TH, weights_TK, ids_TK, w, path: str = "grouped") -> torch.Tensor:
    """The routed experts on one device, the global batch, pinned tiles: the bits to match."""
    if path == "decode":
        return moe_decode(x_TH, weights_TK, ids_TK, w.gate_up_E2IH, w.down_EHI,
                          config=pinned_decode_config(x_TH.device))
    return moe_experts(x_TH, weights_TK, ids_TK, w.gate_up_E2IH, w.down_EHI, config=pinned_config(x_TH.device))


def check_cases(cases, device="cpu", transport="collective") -> list[dict]:
    """Several cases in one job (process start-up is the slow part on CPU)."""
    if device == "cuda":
        device = f"cuda:{torch.cuda.current_device()}"
    return [check_case(c, device, transport) for c in cases]


def _report(got, want, **extra) -> dict:
    diff = (got.float() - want.float()).abs()
    return {"rank": dist.get_rank(), "equal": bitwise_equal(got, want),
            "max_abs_diff": float(diff.max()) if diff.numel() else 0.0, **extra}


def _want(case: Case, x_TH, weights_TK, ids_TK, w):
    return moe_experts(x_TH, weights_TK, ids_TK, w.gate_up_E2IH, w.down_EHI, config=pinned_config("cpu"))


def step_plain_allgather(case: Case) -> dict:
    """Plain: every rank gathers every token and its routing, computes its own experts' rows of the
    whole batch, and an all-reduce adds the (disjoint) rows. Exact, but each rank receives all tokens."""
    R, rank, K = dist.get_world_size(), dist.get_rank(), case.cfg.top_k
    x_TH, weights_TK, ids_TK, w = case_inputs(case)
    mine, Tmax = _mine(case), max(case.tokens_R)  # all_gather wants equal sizes: pad to the largest

    def gather(t):
        part = torch.cat([t[mine], t.new_zeros((Tmax - t[mine].shape[0],) + t.shape[1:])])
        parts = [torch.empty_like(part) for _ in range(R)]
        dist.all_gather(parts, part)
        keep = torch.cat([torch.arange(r * Tmax, r * Tmax + n) for r, n in enumerate(case.tokens_R)])
        return torch.cat(parts)[keep]

    gx, gw, gids = gather(x_TH), gather(weights_TK), gather(ids_TK)
    slots = Placement.contiguous(case.cfg.num_experts, R).slots_RS[rank]
    slot_E = torch.full((case.cfg.num_experts,), len(slots), dtype=torch.long)
    slot_E[list(slots)] = torch.arange(len(slots))
    out_NH = local_experts(gx, gw.float(), slot_E[gids], w.gate_up_E2IH[list(slots)], w.down_EHI[list(slots)],
                           pinned_config("cpu"))
    out_NH = torch.where((slot_E[gids] < len(slots)).reshape(-1, 1), out_NH, 0.0)  # others' rows: 0
    dist.all_reduce(out_NH)  # x + 0 = x: exact
    got = combine_k(out_NH, K)[mine]
    return _report(got, _want(case, x_TH, weights_TK, ids_TK, w)[mine], tokens_in=int(gx.shape[0]))


def step_rows_arrival_order(case: Case) -> dict:
    """Better: tokens only to the ranks that need them, but each token's results summed in the
    order they come home (by rank, then k) rather than k = 0, 1, ...: right to rounding, not to the bit."""
    x_TH, weights_TK, ids_TK, w = case_inputs(case)
    mine, R = _mine(case), dist.get_world_size()
    ep = parallelize(MoELayer(case.cfg, w), Placement.contiguous(case.cfg.num_experts, R), config=pinned_config("cpu"))
    x_MH, weights_MK, slots_MK, meta = dispatch(x_TH[mine], weights_TK[mine], ids_TK[mine], ep.placement)
    out_VH = local_experts(x_MH, weights_MK, slots_MK, ep.gate_up_L2IH, ep.down_LHI, ep.config)
    home_VH = _a2a(out_VH.index_select(0, meta.keep_V), meta.send, meta.recv, None)
    order_V = torch.argsort(meta.home_N)  # arrival position → routed row n
    acc_TH = torch.zeros(meta.num_tokens, x_TH.shape[1])
    acc_TH.index_add_(0, order_V // meta.top_k, home_VH.float())  # in arrival order
    want = _want(case, x_TH, weights_TK, ids_TK, w)[mine]
    return _report(acc_TH.to(x_TH.dtype), want, scale=float(want.abs().max()) if want.numel() else 0.0)


def step_final(case: Case) -> dict:
    """Final: each token once per rank, k-order combine (``ExpertParallelMoE``); with the traffic."""
    res = check_case(case)
    x_TH, _, ids_TK, _ = case_inputs(case)
    R, rank = dist.get_world_size(), dist.get_rank()
    dest_TK, sends_TR, _ = plan(ids_TK[_mine(case)], Placement.contiguous(case.cfg.num_experts, R), rank)
    others = [d for d in range(R) if d != rank]
    res.update(tokens_sent=int(sends_TR[:, others].sum()), pairs_sent=int((dest_TK != rank).sum()))
    return res


def p2p_simulated(case: Case, placement: Placement, rounds: int = 2, identity: bool = False, config=None):
    """The peer-to-peer kernels with all R ranks in one process (Triton's interpreter on CPU):
    every rank sends, every rank waits, computes its experts (or, ``identity``, returns each routed
    row as its token: the benchmark's round trip), sends back; ``rounds`` times (the second checks
    that the flags were reset). Returns (y per rank, the one-device result, slices, transports)."""
    from dispatch.parallel.p2p import P2PTransport

    x, wt, ids, w = case_inputs(case)
    R, toks, K = placement.num_ranks, case.tokens_R, case.cfg.top_k
    sl = [slice(sum(toks[:r]), sum(toks[:r + 1])) for r in range(R)]
    kw = {"config": config} if config is not None else {}
    rows_dtype = torch.float32 if case.path == "decode" else None
    ts = P2PTransport.simulated(case.cfg, placement, max_tokens=max(max(toks), 1), dtype=x.dtype,
                                rows_dtype=rows_dtype, **kw)
    tiles = pinned_config("cpu")
    for _ in range(rounds):
        for r, t in enumerate(ts):
            t.send(x[sl[r]], wt[sl[r]], ids[sl[r]], wait=False)
        for t in ts:
            t.wait_in()
        for r, t in enumerate(ts):
            x_MH, weights_MK, slots_MK = t.local()
            if identity:
                t.send_back(t.recv, div=K)
                continue
            mine = list(placement.slots_RS[r])
            gu, dn = w.gate_up_E2IH[mine].contiguous(), w.down_EHI[mine].contiguous()
            t.send_back(local_decode(x_MH, weights_MK, slots_MK, gu, dn, pinned_decode_config("cpu"))
                        if case.path == "decode" else local_experts(x_MH, weights_MK, slots_MK, gu, dn, tiles))
        for t in ts:
            t.wait_back()
        ys = [combine_k(t.ret[: toks[r] * K], K).to(x.dtype) for r, t in enumerate(ts)]
    if identity:
        want = combine_k(x.repeat_interleave(K, dim=0), K)
    else:
        want = one_device(x, wt, ids, w, case.path)
    return ys, want, sl, ts


def step_fault(bad_rank: int, message: str) -> str:
    """Rank ``bad_rank`` raises; the others wait in a collective it never joins."""
    if dist.get_rank() == bad_rank:
        raise RuntimeError(message)
    dist.all_reduce(torch.ones(1))
    return "unreachable"
