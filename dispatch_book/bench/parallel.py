"""Expert-parallel benchmark: ``torchrun --nproc_per_node N -m dispatch_book.bench.parallel [--tokens ...]``.

Runs unchanged at any world size (gloo on CPU for a smoke test, NCCL + peer-to-peer on GPUs).
Per tokens-per-GPU T, all ranks in lockstep (same iteration counts, barrier before each sample,
the slowest rank's median is reported):
  exchange  nccl_all_to_all (one all_to_all_single of T·K rows, the shared/gpu.md baseline),
            nccl_dispatch_combine and p2p_dispatch_combine (rows out and back, k-order sum)
  layer     ep_nccl / ep_p2p (router → dispatch → experts → combine) vs single_gpu (the whole
            global batch R·T on one GPU), with a bit-for-bit check of every output
  memory    expert weights and peak allocated per GPU
Writes results/<gpu>/expert_parallel.json (rank 0) through ``dispatch_book.bench.save``.
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.distributed as dist

from dispatch import runtime
from dispatch_book.bench import save
from dispatch.config import PRESETS, random_weights
from dispatch.parallel.dispatch import _a2a, combine, dispatch
from dispatch.parallel.experts import experts_loop, experts_rowwise
from dispatch.parallel.launch import check_same_everywhere, init_from_env, run_guarded
from dispatch.parallel.layer import ExpertParallelMoE, moe_single, route_rows
from dispatch.parallel.placement import Placement
from dispatch.parallel.workers import bitwise_equal


def lockstep_us(fn, iters: int, reps: int, cuda: bool, collective: bool = True) -> dict:
    """Microseconds per call of ``fn``. A collective ``fn`` runs in lockstep (a barrier before each
    sample) and reports the max over ranks; ``collective=False`` times one rank's own work alone."""
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    for _ in range(3):
        fn()
    samples = []
    for _ in range(reps):
        sync()
        if collective:
            dist.barrier()
        t0 = time.perf_counter()
        for _ in range(iters):
            fn()
        sync()
        samples.append((time.perf_counter() - t0) / iters * 1e6)
    stats = torch.tensor([statistics.median(samples), min(samples), max(samples)], dtype=torch.float64)
    if collective:
        stats = stats.cuda() if cuda else stats
        dist.all_reduce(stats, op=dist.ReduceOp.MAX)
    med, lo, hi = stats.tolist()
    return {"median_us": med, "min_us": lo, "max_us": hi, "samples": reps, "iters": iters}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", default="olmoe-1b-7b" if runtime.HAS_CUDA else "tiny")
    ap.add_argument("--tokens", default="1,16,64,256,1024,4096" if runtime.HAS_CUDA else "1,16")
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--no-save", action="store_true")
    ap.add_argument("--out-dir", default=None, help="results root (default: the repo's results/)")
    args = ap.parse_args(argv)
    rank, R = init_from_env()
    run_guarded(run, args, rank, R)
    dist.barrier()
    dist.destroy_process_group()


def run(args, rank, R):
    cuda = runtime.HAS_CUDA
    device = torch.device(f"cuda:{torch.cuda.current_device()}") if cuda else torch.device("cpu")
    cfg, dtype = PRESETS[args.preset], runtime.compute_dtype(device)
    tokens = [int(t) for t in args.tokens.split(",")]
    check_same_everywhere(cfg=cfg, tokens=tokens, dtype=dtype, reps=args.reps)
    placement = Placement.contiguous(cfg.num_experts, R)
    w = random_weights(cfg, seed=0, dtype=dtype, device=device)
    rows, H, K, esize = [], cfg.hidden_size, cfg.top_k, torch.finfo(dtype).bits // 8
    say = print if rank == 0 else (lambda *a, **k: None)

    def record(kind, contestant, T, timing, nbytes=None, **extra):
        row = {"kind": kind, "contestant": contestant, "tokens_per_gpu": T, "world_size": R, **timing, **extra}
        if nbytes is not None:
            row["gbps"] = nbytes / (timing["median_us"] * 1e-6) / 1e9
        rows.append(row)
        say(f"{kind:8s} {contestant:22s} T={T:5d} {timing['median_us']:9.1f} us"
            + (f" {row['gbps']:7.1f} GB/s" if nbytes is not None else "")
            + "".join(f" {k}={v}" for k, v in extra.items()), flush=True)

    fn = experts_loop if cuda else experts_rowwise
    coll = dist.get_backend()  # "nccl" on GPUs, "gloo" on CPU ranks: names the collective contestants
    layer = ExpertParallelMoE(cfg, w, placement, expert_fn=fn)
    for T in tokens:
        iters = 20 if T <= 256 else 5
        g = torch.Generator().manual_seed(1234)
        x_all = torch.randn(R * T, H, generator=g).to(dtype=dtype, device=device)
        x_TH = x_all[rank * T:(rank + 1) * T]
        weights_TK, ids_TK = route_rows(x_TH, cfg, w)
        flat = torch.randn(T * K, H, generator=g).to(dtype=dtype, device=device)
        even = (T * K // R,) * R if T * K % R == 0 else None
        if even:
            record("exchange", f"{coll}_all_to_all", T, lockstep_us(lambda: _a2a(flat, even, even, None), iters,
                                                                  args.reps, cuda), T * K * H * esize)

        def nccl_round():
            x_MH, _, _, meta = dispatch(x_TH, weights_TK, ids_TK, placement)
            return combine(x_MH, meta)

        record("exchange", f"{coll}_dispatch_combine", T, lockstep_us(nccl_round, iters, args.reps, cuda),
               2 * T * K * H * esize)
        p2p = None
        if cuda:
            from dispatch.parallel.p2p import P2PTransport

            p2p = P2PTransport(cfg, placement, max_tokens=T, dtype=dtype, device=device)
            same = bitwise_equal(p2p.round_trip(x_TH, weights_TK, ids_TK), nccl_round())
            record("exchange", "p2p_dispatch_combine", T,
                   lockstep_us(lambda: p2p.round_trip(x_TH, weights_TK, ids_TK), iters, args.reps, cuda),
                   2 * T * K * H * esize, bitwise_equal_to_nccl=same)
            # No host sync anywhere in the round trip, so it can be one CUDA graph: one launch.
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                y_graph = p2p.round_trip(x_TH, weights_TK, ids_TK)
            graph.replay()
            same = bitwise_equal(y_graph, nccl_round())
            record("exchange", "p2p_dispatch_combine_graph", T, lockstep_us(graph.replay, iters, args.reps, cuda),
                   2 * T * K * H * esize, bitwise_equal_to_nccl=same)

        # The whole layer: expert parallel (NCCL, p2p) vs the global batch on one GPU, bit for bit.
        want = moe_single(x_all, cfg, w, fn)[rank * T:(rank + 1) * T]
        for name, transport in [(f"ep_{coll}", "collective"), ("ep_p2p", p2p)]:
            if transport is None:
                continue
            layer.transport = transport
            ok = torch.tensor([bitwise_equal(layer(x_TH), want)], device=device, dtype=torch.int32)
            dist.all_reduce(ok, op=dist.ReduceOp.MIN)
            record("layer", name, T, lockstep_us(lambda: layer(x_TH), iters, args.reps, cuda),
                   bitwise_equal=bool(ok.item()))
        if rank == 0:
            solo = lockstep_us(lambda: moe_single(x_all, cfg, w, fn), iters, args.reps, cuda, collective=False)
            record("layer", "single_gpu", T, solo, global_tokens=R * T)
        dist.barrier()
        del p2p
        if rank == 0 and not args.no_save:  # after every T, so a cut-short run still leaves its rows
            save_rows(args, rows, R, dtype)
    if cuda:
        local = sum(t.numel() * t.element_size() for t in (layer.gate_up_L2IH, layer.down_LHI))
        full = sum(t.numel() * t.element_size() for t in (w.gate_up_E2IH, w.down_EHI))
        peak = torch.tensor([torch.cuda.max_memory_allocated(device)], device=device, dtype=torch.float64)
        dist.all_reduce(peak, op=dist.ReduceOp.MAX)
        rows.append({"kind": "memory", "world_size": R, "expert_weights_gib_per_gpu_ep": local / 2**30,
                     "expert_weights_gib_single_gpu": full / 2**30, "peak_allocated_gib_max_rank": peak.item() / 2**30,
                     "note": "peak includes the full weight copy every rank keeps for the single-GPU check"})
        say(rows[-1])
    if rank == 0 and not args.no_save:
        say(f"wrote {save_rows(args, rows, R, dtype)}")


def save_rows(args, rows, R, dtype):
    import pathlib

    import sys

    argv, skip = [], False  # the command as a user would type it (where the file went is no part of it)
    for a in sys.argv[1:]:
        if skip or a.startswith("--out-dir"):
            skip = a == "--out-dir"
            continue
        argv.append(a)
    cmd = " ".join([f"torchrun --nproc_per_node {R} -m dispatch_book.bench.parallel"] + argv)
    extra = {"preset": args.preset, "world_size": R, "dtype": str(dtype).replace("torch.", "")}
    return save("expert_parallel", rows, out=args.out_dir, command=cmd,
                extra=extra)


if __name__ == "__main__":
    main()
