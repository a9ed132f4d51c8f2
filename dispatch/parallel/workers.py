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
from dispatch.parallel.experts import experts_loop, experts_rowwise
from dispatch.parallel.layer import ExpertParallelMoE, experts_single, moe_single
from dispatch.parallel.placement import Placement

EXPERT_FNS = {"rowwise": experts_rowwise, "loop": experts_loop}


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


def mismatched_config(cfg: MoEConfig) -> None:
    """Every rank builds a layer, but the last rank asks for one more expert per token."""
    R = dist.get_world_size()
    mine = cfg.replace(top_k=cfg.top_k + 1) if dist.get_rank() == R - 1 else cfg
    ExpertParallelMoE(mine, random_weights(mine, seed=0), Placement.contiguous(cfg.num_experts, R))
