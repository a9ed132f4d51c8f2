"""The two worker processes of disaggregated serving (started by :mod:`dispatch.serve.disagg`).

Rank 0, prefill: an :class:`LLMEngine` whose requests stop after their first token. When a prompt's
last chunk has run, its blocks are gathered into one payload *before* the engine frees them; the
first token goes to the router, the request's description to the decode worker's inbox, and the
payload to the send thread — the next prefill step starts at once.

Rank 1, decode: a receive thread takes each announced payload into a staging tensor; the loop
admits a request once its blocks have landed and the pool has room (its table allocated, prefix
blocks it already holds shared, the rest scattered in), as a running sequence that has computed
its prompt and holds its first token; then it decodes like chapter 8's engine.

The payloads ride torch.distributed (gloo, NCCL), or with "ipc" both workers sit on cuda:0 and a
ring of staging slots shared through CUDA IPC carries them (:mod:`dispatch.serve.handoff_ipc`).

Both report to the router's outbox: ("ready", role, info), ("token", rid, index, token),
("done", rid, reason, n_tokens), ("handoff", rid, bytes, seconds), ("stats", role, info),
("error", role, kind, text) — kind "own" for a fault of this worker, "peer" for a failed transfer
(the other side's fault shows there). Inboxes take ("add", rid, prompt, params), ("meta", HandoffMeta),
("abort", rid), ("stats",), ("stop",).
"""
from __future__ import annotations

import datetime
import os
import queue
import threading
import time
import traceback
from collections import deque

import torch
import torch.distributed as dist

from dispatch.serve.blocks import cdiv
from dispatch.serve.engine import EngineConfig, LLMEngine, _Request
from dispatch.serve.handoff import HandoffMeta, Mover, gather, handoff_plan, scatter
from dispatch.serve.handoff_ipc import IpcMover, LinkTimeout, make_ring
from dispatch.serve.request import RequestParams
from dispatch.serve.scheduler import Sequence

POLL_S = 0.005


def _model(spec: str, device: str, dtype: str):
    """"cpu" (or another checkpoint name): :func:`dispatch.train.load`; "module:function": its call
    with no arguments on the worker's current device (a model built in the same seeded way on both)."""
    if ":" in spec:
        import importlib

        mod, fn = spec.split(":", 1)
        return getattr(importlib.import_module(mod), fn)()
    from dispatch.train import load

    return load(spec, device=device, dtype=dtype).model


class _PrefillEngine(LLMEngine):
    """Gathers a request's prompt blocks the moment its first token is picked (before they are freed)."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.ready: list[tuple[int, torch.Tensor, int, torch.Tensor | None]] = []

    def _check_stop(self, req, tok):
        seq = req.seq
        state = req.generator.get_state() if req.generator is not None else None
        self.ready.append((seq.id, gather(self.runner.kv, seq.table.blocks), tok, state))
        return super()._check_stop(req, tok)


def _stats(role: str, eng: LLMEngine, **extra) -> dict:
    return {"role": role, "free": eng.alloc.num_free, "blocks": eng.alloc.num_blocks,
            "running": len(eng.scheduler.running), "waiting": len(eng.scheduler.waiting), **extra}


def main(role: str, port: int, backend: str, cfg, inbox, peer_inbox, outbox, link=None) -> None:
    """A worker's process: join the group (``link``, two queues, instead for "ipc"), load the model,
    serve until "stop" (or a fault, reported)."""
    rank = 0 if role == "prefill" else 1
    try:
        if backend in ("nccl", "ipc"):
            device = f"cuda:{rank if backend == 'nccl' else 0}"
            torch.cuda.set_device(device)
        else:
            torch.set_num_threads(1)  # two workers share the CPU cores
            device = "cpu"
        if backend != "ipc":
            os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
            dist.init_process_group(backend, rank=rank, world_size=2,
                                    timeout=datetime.timedelta(seconds=cfg.timeout_s))
        model = _model(cfg.model, device, cfg.dtype)
        ecfg = EngineConfig(block_size=cfg.block_size, num_blocks=cfg.num_blocks, max_seqs=cfg.max_seqs,
                            max_step_tokens=cfg.max_step_tokens, prefix_caching=cfg.prefix_caching)
        eng = (_PrefillEngine if role == "prefill" else LLMEngine)(model, ecfg)
        eng.warmup()
        if role == "prefill":
            eng.ready.clear()  # the warm-up request's blocks
        info = _stats(role, eng, vocab=int(eng.lean.embed.shape[0]), max_model_len=eng.max_model_len,
                      eos=list(eng.eos), device=device, pid=os.getpid())
        outbox.put(("ready", role, info))
        (_prefill if role == "prefill" else _decode)(eng, cfg, inbox, peer_inbox, outbox, link)
    except BaseException as e:  # noqa: BLE001 - the router must hear why
        peer = isinstance(e, (dist.DistError, LinkTimeout)) or any(
            s in str(e) for s in ("Connection", "Gloo", "gloo", "NCCL"))
        outbox.put(("error", role, "peer" if peer else "own",
                    f"{type(e).__name__}: {e}\n" + "".join(traceback.format_exception(e))))
    outbox.close()
    flush = threading.Thread(target=outbox.join_thread, daemon=True)
    flush.start()
    flush.join(5.0)  # every report written before the process goes (unless the router is gone)
    os._exit(0)


def _take_commands(inbox, mover: Mover, idle: bool, handle) -> bool:
    """Hand each command waiting in ``inbox`` to ``handle``, in order (an ``idle`` worker waits up to
    POLL_S for the first). False on "stop": the mover is told to stop and the worker returns. A fault
    of the mover's thread is raised here."""
    try:
        cmd = inbox.get(timeout=POLL_S) if idle else inbox.get_nowait()
    except queue.Empty:
        cmd = None
    while cmd is not None:
        if cmd[0] == "stop":
            mover.stop()
            return False
        handle(cmd)
        try:
            cmd = inbox.get_nowait()
        except queue.Empty:
            cmd = None
    if mover.error is not None:
        raise mover.error
    return True


def _report(outbox):
    """The on_done that tells the router a handoff's bytes and seconds."""
    return lambda meta, t, seconds: outbox.put(("handoff", meta.rid, t.numel() * t.element_size(), seconds))


def _prefill(eng: _PrefillEngine, cfg, inbox, decode_inbox, outbox, link) -> None:
    ours: dict[int, tuple[int, RequestParams, tuple]] = {}  # engine id → (router id, params, prompt)
    if link is None:
        mover = Mover(1, send=True, on_done=_report(outbox))
    else:  # the decode side reports the whole handoff
        ring = make_ring(eng.runner.kv, cfg.max_inflight, cdiv(eng.max_model_len, eng.alloc.block_size))
        mover = IpcMover(link, send=True, on_done=lambda *_: None, timeout_s=cfg.timeout_s, ring=ring)

    def handle(cmd):
        if cmd[0] == "add":
            _, rid, prompt, params = cmd
            p = RequestParams(**{**params, "max_tokens": 1, "ignore_eos": True})
            ours[eng.add_request(list(prompt), p)] = (rid, RequestParams(**params), tuple(prompt))
        elif cmd[0] == "abort":
            for eid, (rid, _, _) in list(ours.items()):
                if rid == cmd[1]:
                    eng.abort(eid)
                    del ours[eid]
        elif cmd[0] == "stats":
            outbox.put(("stats", "prefill", _stats("prefill", eng, sending=mover.busy)))

    while True:
        if not _take_commands(inbox, mover, not eng.has_work(), handle):
            return
        deadline = time.monotonic() + cfg.timeout_s
        while mover.busy >= cfg.max_inflight:  # bound the payloads held in memory
            if mover.error is not None or time.monotonic() > deadline:
                raise mover.error or TimeoutError(f"no handoff finished within {cfg.timeout_s:g} s")
            time.sleep(POLL_S)
        if eng.has_work():
            eng.step()
        for eid, payload, tok, state in eng.ready:
            rid, params, prompt = ours.pop(eid)
            outbox.put(("token", rid, 0, tok))
            eos = tok in params.stop_token_ids or (tok in eng.eos and not params.ignore_eos)
            if eos or params.max_tokens == 1:
                outbox.put(("done", rid, "stop" if eos else "length", 1))
                continue
            meta = HandoffMeta(rid, prompt, tok, params.__dict__.copy(), payload.shape[1], state)
            decode_inbox.put(("meta", meta))
            mover.put(meta, payload)
        eng.ready.clear()


def _decode(eng: LLMEngine, cfg, inbox, _, outbox, link) -> None:
    landed: deque[tuple[HandoffMeta, torch.Tensor]] = deque()
    if link is None:
        mover = Mover(0, send=False, on_done=lambda meta, t, s: landed.append((meta, t)))
    else:
        report = _report(outbox)
        mover = IpcMover(link, send=False, timeout_s=cfg.timeout_s,
                         on_done=lambda meta, t, s: (landed.append((meta, t)), report(meta, t, s)))
    kv, L = eng.runner.kv, eng.runner.kv.shape
    sent: dict[int, int] = {}  # router id → tokens reported

    def handle(cmd):
        if cmd[0] == "meta":
            m = cmd[1]
            mover.put(m, torch.empty(L[0], m.n_blocks, *L[2:], dtype=kv.dtype, device=kv.device))
        elif cmd[0] == "abort":
            if eng.abort(cmd[1]) is not None:
                sent.pop(cmd[1], None)
        elif cmd[0] == "stats":
            outbox.put(("stats", "decode", _stats("decode", eng, landed=len(landed), receiving=mover.busy)))

    while True:
        if not _take_commands(inbox, mover, not (eng.has_work() or landed), handle):
            return
        while landed and _admit(eng, *landed[0]):  # arrival order: the head waits for room
            meta, _ = landed.popleft()
            sent[meta.rid] = 1
        if not eng.has_work():
            continue
        for o in eng.step():
            outbox.put(("token", o.id, sent[o.id], o.new_tokens[0]))
            sent[o.id] += 1
            if o.finished:
                outbox.put(("done", o.id, o.finish_reason, sent.pop(o.id)))


def _admit(eng: LLMEngine, meta: HandoffMeta, payload: torch.Tensor) -> bool:
    """Put a landed request into the running batch: its table over the prompt (prefix blocks this
    pool holds shared), the other blocks written from the payload. False when there is no room yet."""
    sched, alloc, n = eng.scheduler, eng.alloc, len(meta.prompt)
    tokens = list(meta.prompt) + [meta.first]
    if len(sched.running) >= sched.cfg.max_seqs or alloc.free_after(tokens, n) < (1 if sched.running else 0):
        return False
    seq = Sequence(meta.rid, list(meta.prompt), tokens=tokens)
    seq.table, cached = alloc.allocate(tokens, n)
    scatter(eng.runner.kv, payload, handoff_plan(n, alloc.block_size, seq.table.blocks, min(cached, n - 1)))
    seq.computed = n
    alloc.commit(seq.table, seq.tokens, n)
    req = _Request(seq, RequestParams(**meta.params), eng.dev, time.perf_counter())
    if meta.gen_state is not None:
        req.generator.set_state(meta.gen_state)
    eng.requests[meta.rid] = req
    sched.running.append(seq)
    return True
