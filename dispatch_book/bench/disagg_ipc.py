"""The KV handoff through CUDA IPC on one GPU: two processes, one request's blocks from the prefill
side's pool to the decode side's staging tensor, against the device's copy ceiling.

    python -m dispatch_book.bench disagg_ipc --out results      # one GPU, well under 150 s

Writes ``<out>/<gpu>/disagg_ipc.json`` after every row (a run cut short keeps what it measured):

    part "copy"     the ceiling: one device-to-device copy of a request's KV bytes in one process
    part "handoff"  per prompt length, OLMoE-1B-7B's KV shape (16 layers x K,V x 16 heads x 128, bf16,
                    blocks of 16): the handoff of :class:`~dispatch.serve.handoff_ipc.IpcMover` from this
                    process to a spawned one — one request at a time (``handoff_ms_*``: the time per
                    request, from the slot held to the decode side's copy done) and ``stream`` requests
                    back to back through two slots (``stream_gbps``); every payload checked bit for bit
    part "serve"    the shipped model served by a ``backend="ipc"`` pair against the co-located engine
                    (fp32): the requests whose tokens are equal, those that differ only at a near tie

The handoff is two copies (into the ring, out of it), so its rate is at most half the ceiling's
(``of_ceiling`` <= 0.5). On CPU the same run is a small dry run (shared memory, no serve row).
"""
from __future__ import annotations

import argparse
import multiprocessing as mp
import queue
import statistics
import time

import torch

from dispatch import runtime
from dispatch.serve.handoff import HandoffMeta, gather
from dispatch.serve.handoff_ipc import IpcMover, make_ring
from dispatch_book.bench import harness, results

GPU = dict(layers=16, kv_heads=16, head_dim=128, block=16, dtype="bfloat16", tokens=(1024, 4096), reps=20, stream=8)
CPU = dict(layers=2, kv_heads=2, head_dim=16, block=16, dtype="float32", tokens=(64, 256), reps=3, stream=4)
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


def _decode_side(s: dict, device: str, link, todo, done) -> None:
    """The spawned decode side: receives each announced request and checks it against its own pool."""
    if device != "cpu":
        torch.cuda.set_device(device)
    kv = pool(s, device)

    def landed(meta, t, seconds):
        done.put((meta.rid, seconds, torch.equal(t, gather(kv, meta.params["blocks"]))))

    mover = IpcMover(link, send=False, on_done=landed, timeout_s=60.0)
    while (m := todo.get()) is not None:
        mover.put(m, torch.empty(kv.shape[0], m.n_blocks, *kv.shape[2:], dtype=kv.dtype, device=device))
        if mover.error is not None:
            raise mover.error
    mover.stop()
    mover.thread.join()


def handoff_rows(s: dict, device: str, save) -> None:
    """The "copy" and "handoff" rows, through a spawned decode side."""
    kv = pool(s, device)
    ctx = mp.get_context("spawn")
    link, todo, done = (ctx.Queue(), ctx.Queue()), ctx.Queue(), ctx.Queue()
    proc = ctx.Process(target=_decode_side, args=(s, device, link, todo, done), daemon=True)
    proc.start()
    tx = IpcMover(link, send=True, on_done=lambda *_: None, timeout_s=60.0, ring=make_ring(kv, 2, kv.shape[1] - 1))
    rid = 0

    def one(n_tokens: int) -> HandoffMeta:
        nonlocal rid
        rid += 1
        blocks = blocks_of(rid, n_tokens, s, kv.shape[1])
        meta = HandoffMeta(rid, (), 0, {"blocks": blocks}, len(blocks))
        todo.put(meta)
        tx.put(meta, gather(kv, blocks))
        return meta

    def results_of(n: int) -> list[tuple[int, float, bool]]:
        out = []
        for _ in range(n):
            try:
                out.append(done.get(timeout=60.0))
            except queue.Empty:
                raise RuntimeError(f"the decode side answered nothing in 60 s (alive: {proc.is_alive()}, "
                                   f"sender: {tx.error!r})") from None
        return out

    try:
        for n_tokens in s["tokens"]:
            nb = -(-n_tokens // s["block"])
            nbytes = kv[:, :nb].numel() * kv.element_size()
            src = kv[:, :nb].contiguous()
            dst = torch.empty_like(src)
            ceiling = harness.time_ms(lambda dst=dst, src=src: dst.copy_(src))
            save({"part": "copy", "tokens": n_tokens, "bytes": nbytes, **ceiling,
                  "gbps": nbytes / ceiling["median_ms"] / 1e6})
            for _ in range(2):  # warm: both slots used, the ring mapped
                one(n_tokens)
            results_of(2)
            got = []
            for _ in range(s["reps"]):
                one(n_tokens)
                got += results_of(1)
            ms = sorted(x[1] * 1e3 for x in got)
            t0 = time.perf_counter()
            for _ in range(s["stream"]):
                one(n_tokens)
            streamed = results_of(s["stream"])
            wall = time.perf_counter() - t0
            p50 = statistics.median(ms)
            save({"part": "handoff", "tokens": n_tokens, "blocks": nb, "bytes": nbytes, "reps": len(ms),
                  "handoff_ms_p50": p50, "handoff_ms_min": ms[0], "handoff_ms_max": ms[-1],
                  "gbps": nbytes / p50 / 1e6, "of_ceiling": ceiling["median_ms"] / p50,
                  "stream": s["stream"], "stream_gbps": s["stream"] * nbytes / wall / 1e9,
                  "exact": all(x[2] for x in got + streamed)})
    finally:
        todo.put(None)
        tx.stop()
        proc.join(10.0)
        if proc.is_alive():
            proc.kill()


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
    if runtime.HAS_CUDA and not a.no_serve:
        serve_row(save)
