"""Expert-parallel benchmark: ``torchrun --nproc_per_node 2 -m dispatch_book.bench.parallel --out DIR``.

Runs at any world size (gloo on CPU for a smoke test; NCCL + peer-to-peer on GPUs). Per tokens-per-GPU
T, all ranks in lockstep (a barrier before each sample; the slowest rank's median is reported):

  exchange  {coll}_all_to_all: one raw all_to_all_single of T·K rows (what sending every (token,
            expert) pair costs); {coll}_dispatch_combine: our tokens out and rows back (exact
            splits, identity experts); {coll}_dispatch_combine_graph: fixed capacity, one CUDA
            graph; p2p_round_trip(_graph): the peer-to-peer path, eager and as one CUDA graph
  layer     ep_{coll} (exact splits), ep_{coll}_graph (fixed capacity, CUDA graph), ep_p2p_graph
            vs one_gpu: MoELayer(path="triton", same pinned tiles) on the global batch R·T, and
            one_gpu_auto (the library's default path); up to 64 tokens per GPU also the decode
            kernels (ep_*_decode vs one_gpu_decode); every EP output checked bit for bit
  memory    expert weights and peak allocated per GPU
Rank 0 writes the rows through ``dispatch_book.bench.save``: into ``--out DIR`` (``--out results``
replaces the recording the book reads), else into the scratch folder.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch
import torch.distributed as dist

from dispatch import runtime
from dispatch.config import PRESETS, random_weights
from dispatch.kernels.grouped_gemm import moe_experts
from dispatch.moe import MoELayer
from dispatch.parallel import Placement, combine, dispatch, parallelize
from dispatch.parallel.dispatch import _a2a
from dispatch.parallel.launch import check_same_everywhere, init_from_env
from dispatch.parallel.layer import pinned_config
from dispatch.parallel.p2p import P2PTransport
from dispatch.reference import route_reference, router_logits
from dispatch_book.bench import add_output_args, int_list, save
from dispatch_book.bench.harness import capture_graph
from dispatch_book.ep_steps import bitwise_equal, one_device

DECODE_MAX_TOKENS_PER_GPU = 64  # the decode kernels' contestants run up to this size


def lockstep_ms(fn, iters: int, reps: int, cuda: bool, collective: bool = True) -> dict:
    """Milliseconds per call of ``fn``: a collective ``fn`` runs in lockstep (a barrier before each
    sample) and reports the max over ranks; ``collective=False`` times this rank's own work."""
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    for _ in range(3 if cuda else 1):
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
        samples.append((time.perf_counter() - t0) / iters * 1e3)
    stats = torch.tensor([statistics.median(samples), min(samples), max(samples)], dtype=torch.float64)
    if collective:
        stats = stats.cuda() if cuda else stats
        dist.all_reduce(stats, op=dist.ReduceOp.MAX)
    med, lo, hi = stats.tolist()
    return {"median_ms": med, "min_ms": lo, "max_ms": hi, "samples": reps, "iters": iters}


def graphed(fn):
    """(graph, output) of ``fn`` captured once in a CUDA graph (the harness's capture; the output
    tensor is the captured call's, refreshed by every replay)."""
    held = {}
    graph = capture_graph(lambda: held.__setitem__("out", fn()), warmup=2)
    graph.replay()
    return graph, held["out"]


def parse(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m dispatch_book.bench parallel", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", default="olmoe-1b-7b" if runtime.HAS_CUDA else "tiny", choices=sorted(PRESETS))
    ap.add_argument("--tokens", default="1,4,16,64,256,1024,4096" if runtime.HAS_CUDA else "1,16", type=int_list)
    ap.add_argument("--reps", type=int, default=10)
    add_output_args(ap)
    ap.add_argument("--p2p-sweep", action="store_true",
                    help="GPUs: also time the p2p round trip (CUDA graph) at the largest T for a grid of "
                         "P2PConfig (rows per block x programs per SM x warps): kind 'p2p_config' rows")
    return ap.parse_args(argv)


def main(argv=None):
    args = parse(argv)
    rank, R = init_from_env()
    run(args, rank, R)
    dist.barrier()
    dist.destroy_process_group()


def run(args, rank, R) -> list[dict]:
    cuda = runtime.HAS_CUDA
    device = torch.device(f"cuda:{torch.cuda.current_device()}") if cuda else torch.device("cpu")
    cfg, dtype = PRESETS[args.preset], runtime.compute_dtype(device)
    tokens = list(args.tokens)
    check_same_everywhere(cfg=cfg, tokens=tokens, dtype=dtype, reps=args.reps)
    placement, config = Placement.contiguous(cfg.num_experts, R), pinned_config(device)
    w = random_weights(cfg, seed=0, dtype=dtype, device=device)
    one = MoELayer(cfg, w, path="triton", tiles=config)
    rows, H, K, esize = [], cfg.hidden_size, cfg.top_k, torch.finfo(dtype).bits // 8
    coll = dist.get_backend()  # "nccl" on GPUs, "gloo" on CPU ranks: names the collective contestants
    say = print if rank == 0 else (lambda *a, **k: None)

    def record(kind, contestant, T, timing, nbytes=None, **extra):
        row = {"kind": kind, "contestant": contestant, "tokens_per_gpu": T, "world_size": R, **timing, **extra}
        if nbytes is not None:
            row["gbps"] = nbytes / (timing["median_ms"] * 1e-3) / 1e9
        rows.append(row)
        say(f"{kind:8s} {contestant:30s} T={T:5d} {timing['median_ms'] * 1e3:9.1f} us"
            + (f" {row['gbps']:7.1f} GB/s" if nbytes is not None else "")
            + "".join(f" {k}={v}" for k, v in extra.items()), flush=True)

    def agree(ok: bool) -> bool:
        flag = torch.tensor([int(ok)], device=device, dtype=torch.int32)
        dist.all_reduce(flag, op=dist.ReduceOp.MIN)
        return bool(flag.item())

    ep = parallelize(one, placement)

    def measure(T):  # one tokens-per-GPU size (a function: its lambdas bind this T's tensors)
        iters = (20 if T <= 256 else 5) if cuda else 1  # CPU: a smoke test of the code path
        g = torch.Generator().manual_seed(1234)
        x_all = torch.randn(R * T, H, generator=g).to(dtype=dtype, device=device)
        mine = slice(rank * T, (rank + 1) * T)
        weights_all, ids_all = route_reference(router_logits(x_all, cfg, w), cfg, w.bias_E)
        x_TH, weights_TK, ids_TK = x_all[mine], weights_all[mine].float(), ids_all[mine]
        pair_bytes = T * K * H * esize  # one way, every (token, expert) pair
        flat = torch.randn(T * K, H, generator=g).to(dtype=dtype, device=device)
        if T * K % R == 0:
            record("exchange", f"{coll}_all_to_all", T,
                   lockstep_ms(lambda: _a2a(flat, None, None, None), iters, args.reps, cuda), pair_bytes)

        def round_trip(capacity=None):
            x_MH, _, _, meta = dispatch(x_TH, weights_TK, ids_TK, placement, capacity=capacity, check_ids=False)
            return combine(x_MH.repeat_interleave(K, dim=0), meta)

        want_rt = round_trip()
        record("exchange", f"{coll}_dispatch_combine", T, lockstep_ms(round_trip, iters, args.reps, cuda),
               2 * pair_bytes)
        p2p = None
        if cuda:
            graph, y = graphed(lambda: round_trip(T))
            record("exchange", f"{coll}_dispatch_combine_graph", T, lockstep_ms(graph.replay, iters, args.reps, cuda),
                   2 * pair_bytes, bitwise_equal=agree(bitwise_equal(y, want_rt)))
            p2p = P2PTransport(cfg, placement, max_tokens=T, dtype=dtype, device=device)
            rt = lambda: p2p.round_trip(x_TH, weights_TK, ids_TK)  # noqa: E731
            record("exchange", "p2p_round_trip", T, lockstep_ms(rt, iters, args.reps, cuda), 2 * pair_bytes,
                   bitwise_equal=agree(bitwise_equal(rt(), want_rt)))
            graph, y = graphed(rt)
            record("exchange", "p2p_round_trip_graph", T, lockstep_ms(graph.replay, iters, args.reps, cuda),
                   2 * pair_bytes, bitwise_equal=agree(bitwise_equal(y, want_rt)))

        # The layer: expert parallel vs the global batch on one GPU, the same kernels and tiles.
        want = one_device(x_all, weights_all, ids_all, w)[mine]
        layers = [(f"ep_{coll}", parallelize(one, placement), False, want)]
        if cuda:
            layers += [(f"ep_{coll}_graph", parallelize(one, placement, capacity=T), True, want),
                       ("ep_p2p_graph", parallelize(one, placement, transport=p2p), True, want)]
        decode = cuda and T <= DECODE_MAX_TOKENS_PER_GPU
        if decode:  # few rows: the decode kernels, rows back in fp32
            want_d = one_device(x_all, weights_all, ids_all, w, "decode")[mine]
            p2p32 = P2PTransport(cfg, placement, max_tokens=T, dtype=dtype, device=device, rows_dtype=torch.float32)
            layers += [(f"ep_{coll}_graph_decode", parallelize(one, placement, capacity=T, path="decode"), True,
                        want_d), ("ep_p2p_graph_decode", parallelize(one, placement, transport=p2p32, path="decode"),
                                  True, want_d)]
        for name, layer, as_graph, expect in layers:
            fn = lambda layer=layer: layer.experts(x_TH, weights_TK, ids_TK, check_ids=False)  # noqa: E731
            y = fn()
            if as_graph:
                graph, y = graphed(fn)
                fn = graph.replay
            same = agree(bitwise_equal(y, expect))
            full = lockstep_ms(lambda layer=layer: layer(x_TH), iters, args.reps, cuda) if not as_graph else None
            record("layer", name, T, lockstep_ms(fn, iters, args.reps, cuda), bitwise_equal=same,
                   **({"whole_layer_median_ms": full["median_ms"]} if full else {}))
        if rank == 0:
            solo = [("one_gpu", lambda: one_device(x_all, weights_all, ids_all, w), one),
                    ("one_gpu_auto", lambda: moe_experts(x_all, weights_all, ids_all, w.gate_up_E2IH, w.down_EHI),
                     MoELayer(cfg, w))]
            if decode:
                solo.append(("one_gpu_decode", lambda: one_device(x_all, weights_all, ids_all, w, "decode"), None))
            for name, experts, layer in solo:
                whole = {} if layer is None else {"whole_layer_median_ms": lockstep_ms(
                    lambda layer=layer: layer(x_all), iters, args.reps, cuda, collective=False)["median_ms"]}
                record("layer", name, T, lockstep_ms(experts, iters, args.reps, cuda, collective=False),
                       global_tokens=R * T, **whole)
        dist.barrier()

    if cuda and args.p2p_sweep:
        sweep_p2p(max(tokens), cfg, placement, dtype, device, args, record)
    for T in tokens:
        measure(T)  # (its buffers, p2p's symmetric memory included, go when it returns)
    local = sum(t.numel() * t.element_size() for t in (ep.gate_up_L2IH, ep.down_LHI))
    full_w = sum(t.numel() * t.element_size() for t in (w.gate_up_E2IH, w.down_EHI))
    peak = torch.tensor([torch.cuda.max_memory_allocated(device) if cuda else 0], device=device, dtype=torch.float64)
    dist.all_reduce(peak, op=dist.ReduceOp.MAX)
    rows.append({"kind": "memory", "world_size": R, "expert_weights_gib_per_gpu_ep": local / 2**30,
                 "expert_weights_gib_one_gpu": full_w / 2**30, "peak_allocated_gib_max_rank": peak.item() / 2**30,
                 "note": "peak includes the full weight copy every rank keeps for the one-GPU comparison"})
    say(rows[-1])
    if rank == 0:
        say(f"wrote {save_rows(args, rows, R, dtype)}")
    return rows


def sweep_p2p(T, cfg, placement, dtype, device, args, record) -> None:
    """The copy kernels' launch shape at T tokens per GPU: which P2PConfig moves the most bytes."""
    from dispatch.parallel.p2p import P2PConfig, P2PTransport

    g = torch.Generator().manual_seed(99)
    x_TH = torch.randn(T, cfg.hidden_size, generator=g).to(dtype=dtype, device=device)
    ids_TK = torch.rand(T, cfg.num_experts, generator=g).argsort(1)[:, :cfg.top_k].to(device)
    weights_TK = torch.rand(T, cfg.top_k, generator=g).to(device)
    nbytes = 2 * T * cfg.top_k * cfg.hidden_size * x_TH.element_size()
    for rows in (4, 8, 16):
        for per_sm in (1, 2, 4):
            for warps in (4, 8):
                conf = P2PConfig(rows=rows, programs_per_sm=per_sm, num_warps=warps)
                p2p = P2PTransport(cfg, placement, max_tokens=T, dtype=dtype, device=device, config=conf)
                graph, _ = graphed(lambda p2p=p2p: p2p.round_trip(x_TH, weights_TK, ids_TK))
                record("p2p_config", f"rows{rows}_sm{per_sm}_w{warps}", T,
                       lockstep_ms(graph.replay, 10, args.reps, True), nbytes, rows=rows,
                       programs_per_sm=per_sm, num_warps=warps)
                del graph, p2p


def layer_recording(root=None) -> dict | None:
    """The newest recording of this chapter's layer on two or more GPUs — a ``results/<gpu>/expert_parallel.json``
    whose rows hold the one-GPU reference (``one_gpu``) — or None: chapter 4 shows no timing without one."""
    from dispatch_book.bench import results, sets

    docs = []
    for slug in sets.slugs(root):
        doc = results.load("expert_parallel", gpu=slug, root=root)
        if doc and (doc.get("gpu_count") or 1) >= 2 and any(r.get("contestant") == "one_gpu" for r in doc["rows"]):
            docs.append(doc)
    return max(docs, key=lambda d: d["date"]) if docs else None


def save_rows(args, rows, R, dtype):
    argv, skip = [], False  # the command as a user would type it (where the file went is no part of it)
    for a in sys.argv[1:]:
        if skip or a == "--out" or a.startswith("--out="):
            skip = a == "--out"
            continue
        argv.append(a)
    cmd = " ".join([f"torchrun --nproc_per_node {R} -m dispatch_book.bench.parallel"] + argv)
    extra = {"preset": args.preset, "world_size": R, "dtype": str(dtype).replace("torch.", "")}
    return save("expert_parallel", rows, out=args.out, command=cmd, extra=extra, allow_dirty=args.allow_dirty)


if __name__ == "__main__":
    main()
