"""The one-copy KV handoff through CUDA IPC on one GPU: the decode side, a second process, copies one
request's blocks straight out of the prefill side's pool into its own, against the device's ceiling.

    python -m dispatch_book.bench disagg_ipc --out results      # one GPU, well under 150 s

Writes ``<out>/<gpu>/disagg_ipc.json`` after every row (a run cut short keeps what it measured):

    part "copy"     the ceiling: the same blocks gathered in one process (``index_select`` on the block
                    dimension of the same pool: the same bytes, the same layout)
    part "handoff"  per prompt length, OLMoE-1B-7B's KV shape (16 layers x K,V x 16 heads x 128, bf16,
                    blocks of 16): :class:`~dispatch.serve.handoff_ipc.PoolReceiver`'s copy from this
                    process's pool (shared once) into the spawned decode side's, one request at a time.
                    ``copy_ms_*``: the copy as the decode side runs it (its indices uploaded, the launch,
                    the kernel; synchronized before and after), ``gbps`` its rate and ``of_ceiling`` =
                    ceiling / copy (1.0: as fast as the gather); ``handoff_ms_*``: from the prefill side's
                    send to the decode side's "done", the link's messages included; every copy checked
                    bit for bit
                    ``device_ms_p50``: the same copy timed on the device (CUDA events around it), and
                    ``of_device_copy`` = a plain contiguous copy of the same bytes in this process (the
                    "copy" row's ``device_copy_ms``) / that time: the target's measure of the link
    part "tile"     the copy kernel's launch shapes (elements a program copies, warps), one process
    part "ttft"     OLMoE-1B-7B's prefill of each prompt length (random bf16 weights, the engine's lean
                    forward) beside the handoff: ``adds`` = handoff / prefill, what the handoff adds to
                    the time to first token at most (nothing overlapped with it)
    part "serve"    the shipped model served by a ``backend="ipc"`` pair against the co-located engine
                    (fp32): the requests whose tokens are equal, those that differ only at a near tie

On CPU the same run is a small dry run (the pool in shared memory, no serve row).
"""
from __future__ import annotations

import argparse
import multiprocessing as mp
import queue
import statistics
import time

import torch

from dispatch import runtime
from dispatch.serve.blocks import BlockTable
from dispatch.serve.handoff import HandoffMeta
from dispatch.serve.handoff_ipc import Arrival, PoolReceiver, PoolSender, block_bytes
from dispatch_book.bench import harness, results

GPU = dict(layers=16, kv_heads=16, head_dim=128, block=16, dtype="bfloat16", tokens=(1024, 4096), reps=20)
CPU = dict(layers=2, kv_heads=2, head_dim=16, block=16, dtype="float32", tokens=(64, 256), reps=3)
SEED = 0


def parse(argv):
    ap = argparse.ArgumentParser(prog="python -m dispatch_book.bench disagg_ipc", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", type=results.int_list, default=None, help="prompt lengths (tokens)")
    ap.add_argument("--reps", type=int, default=None, help="one-at-a-time handoffs per prompt length")
    ap.add_argument("--no-serve", action="store_true", help="leave out the shipped model's served row")
    return ap.parse_args(argv)


def settings(a) -> dict:
    s = dict(GPU if runtime.HAS_CUDA else CPU)
    s.update({k: v for k, v in (("tokens", a.tokens), ("reps", a.reps)) if v is not None})
    s["tokens"] = tuple(s["tokens"])
    return s


def pool(s: dict, device: str) -> torch.Tensor:
    """The prefill side's pool [L, NB+1, BS, 2, KV, D], seeded: the decode side rebuilds it to check."""
    nb = -(-max(s["tokens"]) // s["block"]) + 1
    g = torch.Generator(device).manual_seed(SEED)
    shape = (s["layers"], nb, s["block"], 2, s["kv_heads"], s["head_dim"])
    return torch.randn(shape, generator=g, device=device).to(getattr(torch, s["dtype"]))


def blocks_of(rid: int, n_tokens: int, s: dict, nb_pool: int) -> list[int]:
    """A request's blocks, scattered over the pool as a paged cache's are."""
    g = torch.Generator().manual_seed(rid)
    return torch.randperm(nb_pool, generator=g)[: -(-n_tokens // s["block"])].tolist()


def _sync(device: str) -> None:
    if device != "cpu":
        torch.cuda.synchronize(device)


def _decode_side(s: dict, device: str, link, done) -> None:
    """The spawned decode side: copies each request's blocks into its own pool (into other blocks)
    and checks them against the seeded pool it rebuilds."""
    if device != "cpu":
        torch.cuda.set_device(device)
    ref = pool(s, device)
    rx = PoolReceiver(link, torch.zeros_like(ref))
    while True:
        for a in rx.arrivals():
            if a.meta.rid < 0:
                return
            mine = blocks_of(10**6 + a.meta.rid, len(a.blocks) * s["block"], s, ref.shape[1])
            ev = [torch.cuda.Event(enable_timing=True) for _ in range(2)] if device != "cpu" else None
            _sync(device)
            t0 = time.perf_counter()
            ev and ev[0].record()
            rx.copy(a, list(enumerate(mine)))
            ev and ev[1].record()
            _sync(device)
            copy_s = time.perf_counter() - t0
            dev_s = ev[0].elapsed_time(ev[1]) / 1e3 if ev else copy_s
            ((_, _, seconds),) = rx.settle()
            done.put((a.meta.rid, copy_s, seconds, torch.equal(rx.kv[:, mine], ref[:, list(a.blocks)]), dev_s))
        time.sleep(1e-4)


def handoff_rows(s: dict, device: str, save) -> None:
    """The "copy" and "handoff" rows, through a spawned decode side."""
    kv = pool(s, device)
    ctx = mp.get_context("spawn")
    link, done = (ctx.Queue(), ctx.Queue()), ctx.Queue()
    proc = ctx.Process(target=_decode_side, args=(s, device, link, done), daemon=True)
    proc.start()
    tx = PoolSender(link, kv, lambda hold: None, max_inflight=1, timeout_s=60.0)
    rid = 0

    def one(n_tokens: int) -> tuple[int, float, float, bool]:
        nonlocal rid
        rid += 1
        blocks = blocks_of(rid, n_tokens, s, kv.shape[1])
        tx.send(HandoffMeta(rid, (), 0, {}, len(blocks)), BlockTable(blocks))
        try:
            got = done.get(timeout=60.0)
        except queue.Empty:
            raise RuntimeError(f"the decode side answered nothing in 60 s (alive: {proc.is_alive()})") from None
        tx.wait_room()
        return got

    try:
        for n_tokens in s["tokens"]:
            blocks = blocks_of(0, n_tokens, s, kv.shape[1])
            nb, idx = len(blocks), torch.tensor(blocks, device=kv.device)
            nbytes = nb * block_bytes(kv)
            ceiling = harness.time_ms(lambda idx=idx: kv.index_select(1, idx))
            flat = kv.reshape(-1)[: nbytes // kv.element_size()]
            into = torch.empty_like(flat)
            plain = harness.time_ms(lambda flat=flat, into=into: into.copy_(flat))  # the same bytes, contiguous
            save({"part": "copy", "tokens": n_tokens, "bytes": nbytes, **ceiling,
                  "gbps": nbytes / ceiling["median_ms"] / 1e6, "device_copy_ms": plain["median_ms"],
                  "device_copy_gbps": nbytes / plain["median_ms"] / 1e6})
            del into
            for _ in range(2):  # warm: the pool mapped, the kernel compiled
                one(n_tokens)
            got = [one(n_tokens) for _ in range(s["reps"])]
            copy_ms = sorted(x[1] * 1e3 for x in got)
            hand_ms = sorted(x[2] * 1e3 for x in got)
            dev = statistics.median(x[4] * 1e3 for x in got)
            p50 = statistics.median(copy_ms)
            save({"part": "handoff", "tokens": n_tokens, "blocks": nb, "bytes": nbytes, "reps": len(got),
                  "copy_ms_p50": p50, "copy_ms_min": copy_ms[0], "copy_ms_max": copy_ms[-1],
                  "gbps": nbytes / p50 / 1e6, "of_ceiling": ceiling["median_ms"] / p50,
                  "device_ms_p50": dev, "device_gbps": nbytes / dev / 1e6,
                  "of_device_copy": plain["median_ms"] / dev,
                  "handoff_ms_p50": statistics.median(hand_ms), "handoff_ms_max": hand_ms[-1],
                  "exact": all(x[3] for x in got)})
    finally:
        tx.tx.put(("kv", Arrival(HandoffMeta(-1, (), 0, {}, 0), (), None, 0.0)))  # rid -1: stop
        proc.join(10.0)
        if proc.is_alive():
            proc.kill()


TILES = ((2048, 4), (4096, 8), (8192, 8), (16384, 8), (16384, 16), (32768, 16))


def tile_rows(s: dict, device: str, save) -> None:
    """The copy kernel's tile (elements a program copies) and warps, in one process, against the same
    blocks: which launch shape moves the bytes fastest (the handoff uses ``copy_blocks``' default)."""
    from dispatch.kernels.block_copy import copy_blocks

    kv = pool(s, device)
    into = torch.zeros_like(kv)
    for n_tokens in s["tokens"]:
        src = blocks_of(0, n_tokens, s, kv.shape[1])
        dst = blocks_of(10**6, n_tokens, s, kv.shape[1])
        nbytes = len(src) * block_bytes(kv)
        for tile, warps in TILES if device != "cpu" else TILES[:2]:
            t = harness.time_ms(lambda tile=tile, warps=warps, src=src, dst=dst: copy_blocks(
                kv, into, src, dst, tile=tile, num_warps=warps))
            save({"part": "tile", "tokens": n_tokens, "tile": tile, "num_warps": warps, **t,
                  "gbps": nbytes / t["median_ms"] / 1e6})


def ttft_rows(rows: list[dict], save) -> None:
    """What the handoff adds to the time to first token: OLMoE-1B-7B's prefill of each prompt length
    (random bf16 weights, one request, the engine's lean forward) beside the handoff's p50 (GPU only)."""
    from dispatch.engine import LeanModel
    from dispatch_book.bench.e2e import build

    lean = LeanModel.from_hf(build())
    for r in [r for r in rows if r["part"] == "handoff"]:
        n = r["tokens"]
        ids = torch.randint(0, 50000, (1, n), device="cuda", generator=torch.Generator("cuda").manual_seed(SEED))
        pos = torch.arange(n, device="cuda")[None]
        cache = lean.new_cache(1, n)
        with torch.no_grad():
            t = harness.time_ms(lambda ids=ids, pos=pos, cache=cache: lean(ids, pos, cache, prefill=True),
                                warmup=2, rep=20)
        save({"part": "ttft", "tokens": n, "prefill_ms": t["median_ms"], "handoff_ms_p50": r["handoff_ms_p50"],
              "adds": r["handoff_ms_p50"] / t["median_ms"]})


def serve_row(save) -> None:
    """The shipped model through an ipc pair and co-located, fp32: tokens compared request by request."""
    from dispatch.serve import EngineConfig, LLMEngine, RequestParams
    from dispatch.serve.disagg import DisaggConfig, Disaggregated
    from dispatch.train import load

    engine = dict(block_size=16, max_seqs=8, max_step_tokens=64, num_blocks=128)
    prompts = [[5 + i] + list(range(10 + 3 * i, 10 + 3 * i + n)) for i, n in enumerate((0, 7, 30, 63, 90))]
    params = [RequestParams(max_tokens=24, ignore_eos=True)] * len(prompts)
    with Disaggregated(DisaggConfig(**engine, backend="ipc", dtype="float32", timeout_s=120)) as d:
        outs = d.generate(prompts, params)
    model = load("cpu", device="cuda", dtype="float32").model
    ref = LLMEngine(model, EngineConfig(**engine), record_margins=True).generate(prompts, params)
    first = [next((i for i, (a, b) in enumerate(zip(o.tokens, r.tokens, strict=True)) if a != b), None)
             for o, r in zip(outs, ref, strict=True)]
    handed = [o for o in outs if o.handoff_bytes]
    save({"part": "serve", "requests": len(outs), "equal": sum(i is None for i in first),
          "near_tie": sum(i is not None and r.margins[i] < 1e-3 for i, r in zip(first, ref, strict=True)),
          "errors": sum(o.error is not None for o in outs),
          "handoff_ms_p50": statistics.median(o.handoff_s * 1e3 for o in handed),
          "handoff_bytes": [o.handoff_bytes for o in handed]})


def main(argv=None) -> None:
    a = parse(argv)
    s = settings(a)
    device = "cuda" if runtime.HAS_CUDA else "cpu"
    rows: list[dict] = []

    def save(row: dict) -> None:
        rows.append(row)
        path = results.save("disagg_ipc", rows, extra={"settings": {**s, "tokens": list(s["tokens"])}})
        print(row, f"-> {path}", flush=True)

    handoff_rows(s, f"{device}:0" if device == "cuda" else device, save)
    tile_rows(s, f"{device}:0" if device == "cuda" else device, save)
    if runtime.HAS_CUDA:
        ttft_rows(rows, save)
    if runtime.HAS_CUDA and not a.no_serve:
        serve_row(save)
