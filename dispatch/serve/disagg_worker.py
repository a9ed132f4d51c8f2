"""The two worker processes of disaggregated serving (started by :mod:`dispatch.serve.disagg`).

Rank 0, prefill: an :class:`LLMEngine` whose requests stop after their first token. When a prompt's
last chunk has run, its blocks are gathered into one payload *before* the engine frees them; the
first token goes to the router, the request's description to the decode worker's inbox, and the
payload to the send thread — the next prefill step starts at once.

Rank 1, decode: a receive thread takes each announced payload into a staging tensor; the loop
admits a request once its blocks have landed and the pool has room (its table allocated, prefix
blocks it already holds shared, the rest scattered in), as a running sequence that has computed
its prompt and holds its first token; then it decodes like chapter 8's engine.

The payloads ride torch.distributed (gloo, NCCL). With "ipc" both workers sit on one GPU (on CPU
without one: the stand-in) and there is no payload: the prefill engine holds the prompt's blocks
instead of gathering them, the description goes over the link, and the decode loop copies the
blocks straight from the prefill pool into its own at admission, then says "done" and the prefill
worker frees them (:mod:`dispatch.serve.handoff_ipc`).

Both report to the router's outbox: ("ready", role, info), ("token", rid, index, token),
("done", rid, reason, n_tokens), ("handoff", rid, bytes, seconds), ("stats", role, info),
("error", role, kind, text) — kind "own" for a fault of this worker, "peer" for a failed transfer or a
channel whose other end closed (the other side's fault shows there). Inboxes take ("add", rid, prompt,
params), ("meta", HandoffMeta), ("abort", rid), ("stats",), ("stop",).
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

from dispatch.serve.blocks import BlockTable
from dispatch.serve.engine import EngineConfig, LLMEngine, _Request
from dispatch.serve.handoff import HandoffMeta, Mover, gather, handoff_plan, scatter
from dispatch.serve.handoff_ipc import LinkTimeout, PoolReceiver, PoolSender
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
    """Gathers a request's prompt blocks the moment its first token is picked (before they are freed),
    or with ``hold`` takes a table holding them (freed when the decode side is done with them)."""

    def __init__(self, *a, hold: bool = False, **kw):
        super().__init__(*a, **kw)
        self.hold = hold
        self.ready: list[tuple[int, torch.Tensor | BlockTable, int, torch.Tensor | None]] = []

    def _check_stop(self, req, tok):
        seq = req.seq
        state = req.generator.get_state() if req.generator is not None else None
        blocks = self.alloc.share(seq.table.blocks) if self.hold else gather(self.runner.kv, seq.table.blocks)
        self.ready.append((seq.id, blocks, tok, state))
        return super()._check_stop(req, tok)


def _stats(role: str, eng: LLMEngine, **extra) -> dict:
    return {"role": role, "free": eng.alloc.num_free, "blocks": eng.alloc.num_blocks,
            "running": len(eng.scheduler.running), "waiting": len(eng.scheduler.waiting), **extra}


def main(role: str, port: int, backend: str, cfg, inbox, peer_inbox, outbox, link=None) -> None:
    """A worker's process: join the group (``link``, two queues, instead for "ipc"), load the model,
    serve until "stop" (or a fault, reported)."""
    rank = 0 if role == "prefill" else 1
    try:
        if backend == "nccl" or (backend == "ipc" and torch.cuda.is_available()):
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
        eng = _PrefillEngine(model, ecfg, hold=link is not None) if role == "prefill" else LLMEngine(model, ecfg)
        eng.warmup()
        if role == "prefill":
            for _, blocks, _, _ in eng.ready:  # the warm-up request's
                if isinstance(blocks, BlockTable):
                    eng.alloc.free(blocks)
            eng.ready.clear()
        info = _stats(role, eng, vocab=int(eng.lean.embed.shape[0]), max_model_len=eng.max_model_len,
                      eos=list(eng.eos), device=device, pid=os.getpid())
        outbox.put(("ready", role, info))
        (_prefill if role == "prefill" else _decode)(eng, cfg, inbox, peer_inbox, outbox, link)
    except BaseException as e:  # noqa: BLE001 - the router must hear why
        # a transfer that failed, or a channel whose other end closed (EOF, a broken pipe): the other side's fault
        peer = isinstance(e, (dist.DistError, LinkTimeout, EOFError, ConnectionError)) or any(
            s in str(e) for s in ("Connection", "Gloo", "gloo", "NCCL"))
        outbox.put(("error", role, "peer" if peer else "own",
                    f"{type(e).__name__}: {e}\n" + "".join(traceback.format_exception(e))))
    outbox.close()
    flush = threading.Thread(target=outbox.join_thread, daemon=True)
    flush.start()
    flush.join(5.0)  # every report written before the process goes (unless the router is gone)
    os._exit(0)


def _take_commands(inbox, mover: Mover | None, idle: bool, handle) -> bool:
    """Hand each command waiting in ``inbox`` to ``handle``, in order (an ``idle`` worker waits up to
    POLL_S for the first). False on "stop": the mover (if any) is told to stop and the worker returns.
    A fault of the mover's thread is raised here."""
    try:
        cmd = inbox.get(timeout=POLL_S) if idle else inbox.get_nowait()
    except queue.Empty:
        cmd = None
    while cmd is not None:
        if cmd[0] == "stop":
            if mover is not None:
                mover.stop()
            return False
        handle(cmd)
        try:
            cmd = inbox.get_nowait()
        except queue.Empty:
            cmd = None
    if mover is not None and mover.error is not None:
        raise mover.error
    return True


def _report(outbox):
    """The on_done that tells the router a handoff's bytes and seconds."""
    return lambda meta, t, seconds: outbox.put(("handoff", meta.rid, t.numel() * t.element_size(), seconds))


def _prefill(eng: _PrefillEngine, cfg, inbox, decode_inbox, outbox, link) -> None:
    ours: dict[int, tuple[int, RequestParams, tuple]] = {}  # engine id → (router id, params, prompt)
    mover = sender = None
    if link is None:
        mover = Mover(1, send=True, on_done=_report(outbox))
    else:  # the decode side reports the whole handoff
        sender = PoolSender(link, eng.runner.kv, eng.alloc.free, max_inflight=cfg.max_inflight,
                            timeout_s=cfg.timeout_s)

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
            held = {"sending": mover.busy} if mover else {"held": len(sender.held)}
            outbox.put(("stats", "prefill", _stats("prefill", eng, **held)))

    while True:
        if sender is not None:
            sender.settle()  # every "done" so far: those blocks are free before the next step
        if not _take_commands(inbox, mover, not eng.has_work(), handle):
            return
        if sender is not None:
            sender.wait_room()  # bound the handoffs held (LinkTimeout when the decode side is silent)
        else:
            _wait_mover(mover, cfg)
        steps = eng.steps
        if eng.has_work():
            eng.step()
            if sender is not None and eng.steps == steps and sender.held:
                sender.settle(POLL_S)  # no room for the next prompt: its blocks come back with a "done"
        for eid, blocks, tok, state in eng.ready:
            rid, params, prompt = ours.pop(eid)
            outbox.put(("token", rid, 0, tok))
            eos = tok in params.stop_token_ids or (tok in eng.eos and not params.ignore_eos)
            if eos or params.max_tokens == 1:
                outbox.put(("done", rid, "stop" if eos else "length", 1))
                if sender is not None:
                    eng.alloc.free(blocks)
                continue
            nb = len(blocks.blocks) if sender is not None else blocks.shape[1]
            meta = HandoffMeta(rid, prompt, tok, params.__dict__.copy(), nb, state)
            if sender is not None:
                sender.send(meta, blocks)
            else:
                decode_inbox.put(("meta", meta))
                mover.put(meta, blocks)
        eng.ready.clear()


def _wait_mover(mover: Mover, cfg) -> None:
    """Until fewer than ``max_inflight`` payloads are queued or in flight (they are held in memory)."""
    deadline = time.monotonic() + cfg.timeout_s
    while mover.busy >= cfg.max_inflight:
        if mover.error is not None or time.monotonic() > deadline:
            raise mover.error or TimeoutError(f"no handoff finished within {cfg.timeout_s:g} s")
        time.sleep(POLL_S)


def _decode(eng: LLMEngine, cfg, inbox, _, outbox, link) -> None:
    landed: deque = deque()  # (meta, payload) or (meta, Arrival), in arrival order
    kv, L = eng.runner.kv, eng.runner.kv.shape
    mover = receiver = None
    if link is None:
        mover = Mover(0, send=False, on_done=lambda meta, t, s: landed.append((meta, t)))
    else:
        receiver = PoolReceiver(link, kv)
    sent: dict[int, int] = {}  # router id → tokens reported

    def handle(cmd):
        if cmd[0] == "meta":
            m = cmd[1]
            mover.put(m, torch.empty(L[0], m.n_blocks, *L[2:], dtype=kv.dtype, device=kv.device))
        elif cmd[0] == "abort":
            if eng.abort(cmd[1]) is not None:
                sent.pop(cmd[1], None)
        elif cmd[0] == "stats":
            busy = {"receiving": mover.busy} if mover else {"copying": len(receiver.copying)}
            outbox.put(("stats", "decode", _stats("decode", eng, landed=len(landed), **busy)))

    while True:
        if receiver is not None:
            for meta, nbytes, seconds in receiver.settle():
                outbox.put(("handoff", meta.rid, nbytes, seconds))
            landed.extend((a.meta, a) for a in receiver.arrivals())
        busy = eng.has_work() or landed or (receiver is not None and receiver.copying)
        if not _take_commands(inbox, mover, not busy, handle):
            return
        while landed:  # arrival order: the head waits for room
            meta, src = landed[0]
            write = (lambda plan, src=src: scatter(kv, src, plan)) if mover else (
                lambda plan, src=src: receiver.copy(src, plan))
            if not _admit(eng, meta, write):
                break
            landed.popleft()
            sent[meta.rid] = 1
        if not eng.has_work():
            continue
        for o in eng.step():
            outbox.put(("token", o.id, sent[o.id], o.new_tokens[0]))
            sent[o.id] += 1
            if o.finished:
                outbox.put(("done", o.id, o.finish_reason, sent.pop(o.id)))


def _admit(eng: LLMEngine, meta: HandoffMeta, write) -> bool:
    """Put a landed request into the running batch: its table over the prompt (prefix blocks this
    pool holds shared), the other blocks written by ``write(plan)`` (see :func:`handoff_plan`).
    False when there is no room yet."""
    sched, alloc, n = eng.scheduler, eng.alloc, len(meta.prompt)
    tokens = list(meta.prompt) + [meta.first]
    if len(sched.running) >= sched.cfg.max_seqs or alloc.free_after(tokens, n) < (1 if sched.running else 0):
        return False
    seq = Sequence(meta.rid, list(meta.prompt), tokens=tokens)
    seq.table, cached = alloc.allocate(tokens, n)
    write(handoff_plan(n, alloc.block_size, seq.table.blocks, min(cached, n - 1)))
    seq.computed = n
    alloc.commit(seq.table, seq.tokens, n)
    req = _Request(seq, RequestParams(**meta.params), eng.dev, time.perf_counter())
    if meta.gen_state is not None:
        req.generator.set_state(meta.gen_state)
    eng.requests[meta.rid] = req
    sched.running.append(seq)
    return True
