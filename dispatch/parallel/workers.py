"""Functions that run on every rank (module-level, so :func:`launch` can pickle them).

Each builds the *global* inputs from a seed (identical on every rank), computes the single-device
layer on the global batch, runs the expert-parallel layer on its own slice of tokens and reports
whether its rows match bit for bit.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

from dispatch.config import MoEConfig, random_weights
from dispatch.parallel.experts import experts_grouped, experts_loop, experts_rowwise
from dispatch.parallel.layer import ExpertParallelMoE, experts_single, moe_single
from dispatch.parallel.placement import Placement

EXPERT_FNS = {"rowwise": experts_rowwise, "loop": experts_loop, "grouped": experts_grouped}


@dataclass(frozen=True)
class Case:
    """One equality check. tokens_R: tokens on each rank (uneven and zero allowed).
    routing: "random" (random ids/weights), "skewed" (every row to rank 0's experts) or "router"
    (the whole layer: router + experts + shared expert)."""

    name: str
    cfg: MoEConfig
    tokens_R: tuple[int, ...]
    routing: str = "random"
    placement: Placement | None = None
    seed: int = 0
    dtype: str = "float32"
    expert_fn: str = "rowwise"


def bitwise_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Same shape, dtype and bits (so -0.0 != 0.0 and NaN == NaN of the same payload)."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    ints = {2: torch.int16, 4: torch.int32, 8: torch.int64}[a.element_size()]
    return torch.equal(a.contiguous().view(ints), b.contiguous().view(ints))


def case_inputs(case: Case, device="cpu"):
    """Global x_TH, routing (weights_TK, ids_TK or None for "router") and weights, from the seed."""
    cfg, dtype = case.cfg, getattr(torch, case.dtype)
    g = torch.Generator().manual_seed(case.seed)
    T = sum(case.tokens_R)
    x_TH = torch.randn(T, cfg.hidden_size, generator=g).to(dtype)
    w = random_weights(cfg, seed=case.seed + 1, dtype=dtype)
    if case.routing == "router":
        return x_TH.to(device), None, None, w.to(device)
    pool = list(range(cfg.num_experts))
    if case.routing == "skewed":
        placement = case.placement or Placement.contiguous(cfg.num_experts, len(case.tokens_R))
        pool = list(placement.slots_RS[0])
        if len(pool) < cfg.top_k:
            raise ValueError(f"skewed routing needs rank 0 to hold >= K={cfg.top_k} experts, it holds {pool}")
    pick_TK = torch.rand(T, len(pool), generator=g).argsort(dim=1)[:, : cfg.top_k]
    ids_TK = torch.tensor(pool)[pick_TK]
    weights_TK = torch.rand(T, cfg.top_k, generator=g)
    return x_TH.to(device), weights_TK.to(device), ids_TK.to(device), w.to(device)


def check_case(case: Case, device="cpu", transport="collective") -> dict:
    """On this rank: expert-parallel rows vs the single-device layer's rows for this rank's tokens."""
    rank, R = dist.get_rank(), dist.get_world_size()
    if len(case.tokens_R) != R:
        raise ValueError(f"case {case.name!r} has token counts for {len(case.tokens_R)} ranks, world has {R}")
    x_TH, weights_TK, ids_TK, w = case_inputs(case, device)
    fn = EXPERT_FNS[case.expert_fn]
    if case.routing == "router":
        want_TH = moe_single(x_TH, case.cfg, w, fn)
    else:
        want_TH = experts_single(x_TH, weights_TK, ids_TK, w.gate_up_E2IH, w.down_EHI, fn)
    start = sum(case.tokens_R[:rank])
    mine = slice(start, start + case.tokens_R[rank])
    if transport == "p2p":
        from dispatch.parallel.p2p import P2PTransport

        transport = P2PTransport(case.cfg, case.placement or Placement.contiguous(case.cfg.num_experts, R),
                                 max_tokens=max(case.tokens_R), dtype=x_TH.dtype, device=x_TH.device)
    layer = ExpertParallelMoE(case.cfg, w, case.placement, expert_fn=fn, transport=transport)
    if case.routing == "router":
        got_TH = layer(x_TH[mine])
    else:
        got_TH = layer.experts(x_TH[mine], weights_TK[mine], ids_TK[mine])
    diff = (got_TH.float() - want_TH[mine].float()).abs()
    return {"case": case.name, "rank": rank, "tokens": case.tokens_R[rank],
            "equal": bitwise_equal(got_TH, want_TH[mine]),
            "max_abs_diff": float(diff.max()) if diff.numel() else 0.0}


def check_cases(cases, device="cpu", transport="collective") -> list[dict]:
    """Run several cases in one job (process start-up is the slow part on CPU)."""
    if device == "cuda":
        device = f"cuda:{torch.cuda.current_device()}"
    return [check_case(c, device, transport) for c in cases]


def fail_on_rank(bad_rank: int, message: str) -> str:
    """Rank ``bad_rank`` raises; the others wait in a collective that can never complete."""
    if dist.get_rank() == bad_rank:
        raise RuntimeError(message)
    dist.all_reduce(torch.ones(1, device="cuda" if dist.get_backend() == "nccl" else "cpu"))
    return "unreachable"


def bad_routing(cfg: MoEConfig) -> list[str]:
    """The layer's ValueErrors for an expert id out of range and for mismatched routing shapes."""
    layer = ExpertParallelMoE(cfg, random_weights(cfg, seed=0))
    x, msgs = torch.zeros(3, cfg.hidden_size), []
    for w_TK, ids_TK in [(torch.ones(3, cfg.top_k), torch.full((3, cfg.top_k), cfg.num_experts)),
                         (torch.ones(3, cfg.top_k + 1), torch.zeros(3, cfg.top_k, dtype=torch.long)),
                         (torch.ones(3, cfg.top_k + 1), torch.zeros(3, cfg.top_k + 1, dtype=torch.long))]:
        try:
            layer.experts(x, w_TK, ids_TK)
        except ValueError as exc:
            msgs.append(str(exc))
    return msgs


def mismatched_config(cfg: MoEConfig) -> None:
    """Every rank builds a layer, but the last rank asks for one more expert per token."""
    R = dist.get_world_size()
    mine = cfg.replace(top_k=cfg.top_k + 1) if dist.get_rank() == R - 1 else cfg
    ExpertParallelMoE(mine, random_weights(mine, seed=0), Placement.contiguous(cfg.num_experts, R))


# --- The chapter's three steps (plain → better → final), each run on every rank ------------------

def _my_slice(case: Case):
    rank = dist.get_rank()
    start = sum(case.tokens_R[:rank])
    return slice(start, start + case.tokens_R[rank])


def _report(case, got_TH, want_TH, sent_rows, extra=None) -> dict:
    return {"rank": dist.get_rank(), "equal": bitwise_equal(got_TH, want_TH),
            "max_abs_diff": float((got_TH.float() - want_TH.float()).abs().max()) if got_TH.numel() else 0.0,
            "rows_sent": int(sent_rows), **(extra or {})}


def step_plain_allgather(case: Case) -> dict:
    """Plain: every rank gathers every token and its routing, computes its own experts' rows of
    the whole batch, and an all-reduce adds the (disjoint) contributions. Correct, but each rank
    receives all R·T tokens whatever the routing."""
    R, rank = dist.get_world_size(), dist.get_rank()
    x_TH, weights_TK, ids_TK, w = case_inputs(case)
    mine = _my_slice(case)
    fn = EXPERT_FNS[case.expert_fn]
    # all_gather needs equal sizes: pad every rank's tokens to the largest count.
    Tmax = max(case.tokens_R)
    pad = lambda t: torch.cat([t[mine], t.new_zeros((Tmax - t[mine].shape[0],) + t.shape[1:])])  # noqa: E731
    parts = {name: [torch.empty_like(pad(t)) for _ in range(R)] for name, t in
             (("x", x_TH), ("w", weights_TK), ("ids", ids_TK))}
    for name, t in (("x", x_TH), ("w", weights_TK), ("ids", ids_TK)):
        dist.all_gather(parts[name], pad(t))
    keep = torch.cat([torch.arange(r * Tmax, r * Tmax + n) for r, n in enumerate(case.tokens_R)])
    gx, gw, gids = (torch.cat(parts[n])[keep] for n in ("x", "w", "ids"))
    # My experts' rows of the whole batch; other rows stay 0 (x + 0 == x: the all-reduce is exact).
    slots = Placement.contiguous(case.cfg.num_experts, R).slots_RS[rank]
    K = case.cfg.top_k
    ids_N = gids.reshape(-1)
    order_N = torch.argsort(ids_N, stable=True)
    order_N = order_N[torch.isin(ids_N[order_N], torch.tensor(slots))]  # my experts' rows, by expert
    counts = [int((ids_N == e).sum()) if e in slots else 0 for e in range(case.cfg.num_experts)]
    out_mine = fn(gx[order_N // K], gw.float().reshape(-1)[order_N], counts, w.gate_up_E2IH, w.down_EHI)
    out_NH = x_TH.new_zeros(ids_N.shape[0], x_TH.shape[1])
    out_NH[order_N] = out_mine
    dist.all_reduce(out_NH)
    from dispatch.parallel.dispatch import combine_topk

    got_TH = combine_topk(out_NH, K)[mine]
    want = experts_single(x_TH, weights_TK, ids_TK, w.gate_up_E2IH, w.down_EHI, fn)[mine]
    return _report(case, got_TH, want, Tmax * (R - 1) + out_NH.shape[0])


def step_rows_arrival_order(case: Case) -> dict:
    """Better: all_to_all of routed rows only, but results summed in the order they come home
    (by destination rank, then expert) rather than in k order: right to rounding, not to the bit."""
    from dispatch.parallel.dispatch import dispatch as _dispatch

    x_TH, weights_TK, ids_TK, w = case_inputs(case)
    mine, fn = _my_slice(case), EXPERT_FNS[case.expert_fn]
    layer = ExpertParallelMoE(case.cfg, w, expert_fn=fn)
    x_MH, weight_M, counts_L, meta = _dispatch(x_TH[mine], weights_TK[mine], ids_TK[mine], layer.placement)
    out_MH = fn(x_MH, weight_M, counts_L, layer.gate_up_L2IH, layer.down_LHI)
    # Home-coming rows in arrival order; add each into its token's fp32 accumulator as it lands.
    back = torch.empty_like(out_MH)
    back[meta.recv_order_M] = out_MH
    from dispatch.parallel.dispatch import _a2a

    home_NH = _a2a(back, meta.recv_counts, meta.send_counts, None)
    acc_TH = torch.zeros(meta.num_tokens, x_TH.shape[1], dtype=torch.float32)
    acc_TH.index_add_(0, meta.order_N // meta.top_k, home_NH.float())
    want = experts_single(x_TH, weights_TK, ids_TK, w.gate_up_E2IH, w.down_EHI, fn)[mine]
    return _report(case, acc_TH.to(x_TH.dtype), want, sum(meta.send_counts) - meta.send_counts[dist.get_rank()])


def step_final(case: Case) -> dict:
    """Final: dispatch → metadata → local experts → combine in k order (``ExpertParallelMoE``)."""
    from dispatch.parallel.dispatch import dispatch as _dispatch

    res = check_case(case)
    x_TH, weights_TK, ids_TK, _ = case_inputs(case)
    mine = _my_slice(case)
    _, _, counts_L, meta = _dispatch(x_TH[mine], weights_TK[mine], ids_TK[mine],
                                     case.placement or Placement.contiguous(case.cfg.num_experts, dist.get_world_size()))
    res.update(send_counts=meta.send_counts, recv_counts=meta.recv_counts, counts_L=counts_L,
               rows_sent=sum(meta.send_counts) - meta.send_counts[dist.get_rank()])
    return res


def p2p_simulated(case: Case, placement: Placement, rounds: int = 2):
    """The peer-to-peer kernels with all R ranks in one process (Triton's interpreter on CPU):
    every rank sends, every rank waits, computes its experts, sends back; ``rounds`` times (the
    second checks the flags' epoch counting). Returns (ys per rank, single-device y, slices, transports)."""
    from dispatch.parallel.p2p import P2PTransport

    x, wt, ids, w = case_inputs(case)
    R, toks, fn = placement.num_ranks, case.tokens_R, EXPERT_FNS[case.expert_fn]
    sl = [slice(sum(toks[:r]), sum(toks[:r + 1])) for r in range(R)]
    ts = P2PTransport.simulated(case.cfg, placement, max_tokens=max(max(toks), 1), dtype=x.dtype)
    for _ in range(rounds):
        homes = [ts[r].send(x[sl[r]], wt[sl[r]], ids[sl[r]], wait=False) for r in range(R)]
        for t in ts:
            t.wait_in()
        for r, t in enumerate(ts):
            x_MH, weight_M, counts_L, recv_order_M = t.local_rows()
            slots = list(placement.slots_RS[r])
            stage = torch.zeros_like(t.recv)
            stage[recv_order_M] = fn(x_MH, weight_M, counts_L, w.gate_up_E2IH[slots], w.down_EHI[slots])
            t.send_back(stage)
        for t in ts:
            t.wait_back()
        ys = [t.gather_home(h) for t, h in zip(ts, homes)]
    return ys, experts_single(x, wt, ids, w.gate_up_E2IH, w.down_EHI, fn), sl, ts
