"""Prefill/decode disaggregation: prompts on one worker, decoding on another, KV blocks between them.

    with Disaggregated(DisaggConfig(model="cpu")) as d:      # two processes: prefill, decode
        outs = d.generate([ids_a, ids_b], RequestParams(max_tokens=16))
        d.stats()                                             # each pool's free blocks

    client ─▶ router ─("add")─▶ prefill worker ─ first token ──────────────────────────▶ client
                                     │ request's description ─▶ decode worker inbox
                                     └ KV blocks (isend, one payload) ─▶ decode worker ─ tokens ─▶ client

The router (this process) numbers requests, checks them, sends each prompt to the prefill worker
(:mod:`dispatch.serve.disagg_worker`) and collects every token: the first from the prefill worker,
the rest from the decode worker, each with its index so their order never depends on which process
spoke first. The KV handoff (:mod:`dispatch.serve.handoff`) rides torch.distributed between the two
workers — gloo on CPU, NCCL when two GPUs are there (prefill on cuda:0, decode on cuda:1) — or,
with ``backend="ipc"``, two processes on one GPU, the decode worker copying the blocks straight out
of the prefill worker's pool, shared through CUDA IPC (:mod:`dispatch.serve.handoff_ipc`).

Faults: a worker that raises, exits or is killed is named with its cause (a failed transfer on the
other side is the symptom, reported only when nothing else is known); every request in flight is
answered with finish_reason "error" and the message, and the workers are stopped. No wait is
unbounded: start-up within ``start_timeout_s``, any silence of ``timeout_s`` while requests are in
flight is a fault, and every transfer is bounded by the process group's timeout.
"""
from __future__ import annotations

import itertools
import multiprocessing as mp
import os
import queue
import time
from contextlib import suppress
from dataclasses import asdict

import torch

from dispatch.parallel.launch import free_port
from dispatch.serve.disagg_config import DisaggConfig, Result, WorkerError, _death
from dispatch.serve.request import DEFAULT, RequestParams

__all__ = ["DisaggConfig", "Disaggregated", "Result", "WorkerError"]

ROLES = ("prefill", "decode")
GRACE_S = 0.5  # after a first fault: time for the other worker's report to land


class Disaggregated:
    """The router and its two workers (see the module docstring)."""

    def __init__(self, cfg: DisaggConfig | None = None):
        cfg = cfg if cfg is not None else DisaggConfig()
        self.cfg, self.backend = cfg, cfg.resolved_backend
        cfg.check_devices()  # before any process starts
        self.requests: dict[int, Result] = {}
        self.error: WorkerError | None = None
        self.info: dict[str, dict] = {}
        self._ids = itertools.count()
        self._stats: dict[str, dict] = {}
        self._reports: list[tuple[bool, float, str, str]] = []  # (a symptom?, when, worker, what)
        self._closed = False
        self._heard = time.monotonic()  # the last report from either worker
        self._start()

    # ---- processes ----
    def _start(self) -> None:
        from dispatch.serve import disagg_worker

        if self.backend == "nccl" or (self.backend == "ipc" and torch.cuda.is_available()):  # no CUDA in a fork
            ctx = mp.get_context("spawn")
        else:
            ctx = mp.get_context("forkserver")
            ctx.set_forkserver_preload(["dispatch.serve.disagg_worker"])
        self.outbox = ctx.Queue()
        self.inbox = {r: ctx.Queue() for r in ROLES}
        self.link = (ctx.Queue(), ctx.Queue()) if self.backend == "ipc" else ()  # (to decode, to prefill)
        port = free_port()
        env = {"CUDA_VISIBLE_DEVICES": "", "TRITON_INTERPRET": "1"} if self.backend == "gloo" else {}
        saved = {k: os.environ.get(k) for k in env}
        os.environ.update(env)  # gloo workers are CPU workers, also on a machine with GPUs
        try:
            self.procs = {r: ctx.Process(target=disagg_worker.main, name=f"dispatch-{r}", daemon=True,
                                         args=(r, port, self.backend, self.cfg, self.inbox[r],
                                               self.inbox["decode"], self.outbox, self.link or None)) for r in ROLES}
            for p in self.procs.values():
                p.start()
        finally:
            for k, v in saved.items():
                os.environ.pop(k, None) if v is None else os.environ.__setitem__(k, v)
        deadline = time.monotonic() + self.cfg.start_timeout_s
        while len(self.info) < 2:
            self._pump(deadline - time.monotonic(), starting=True)
            if self.error is not None:
                raise self.error
            if time.monotonic() > deadline:
                late = [r for r in ROLES if r not in self.info]
                self._fail(f"{' and '.join(late)} worker(s) not ready within start_timeout_s="
                           f"{self.cfg.start_timeout_s:g} s", late[0])
                raise self.error

    def pid(self, role: str) -> int:
        return self.procs[role].pid

    def close(self) -> None:
        """Stop both workers (within about a second) and forget them."""
        self._closed = True
        for q in self.inbox.values():
            with suppress(Exception):
                q.put(("stop",))
        end = time.monotonic() + 2.0
        for p in self.procs.values():
            p.join(max(0.0, end - time.monotonic()))
        for p in self.procs.values():
            if p.is_alive():
                p.kill()
                p.join(1.0)
        for q in (*self.inbox.values(), self.outbox, *self.link):
            q.cancel_join_thread()  # a message to a dead worker never holds this process at exit

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # ---- requests ----
    def check(self, prompt, params: RequestParams) -> None:
        """ValueError unless ``prompt`` with ``params`` can be served here."""
        if not isinstance(params, RequestParams):
            raise ValueError(f"params must be a RequestParams, got {type(params).__name__}")
        if params.stop or params.logprobs is not None:
            raise ValueError("stop strings and logprobs are not served by the disaggregated workers (no tokenizer, "
                             "no logits kept); use stop_token_ids")
        V, ctx = self.info["prefill"]["vocab"], self.info["prefill"]["max_model_len"]
        if not isinstance(prompt, (list, tuple)) or not prompt:
            raise ValueError("the prompt must hold at least one token")
        if not all(isinstance(t, int) and not isinstance(t, bool) and 0 <= t < V for t in prompt):
            raise ValueError(f"prompt tokens must be ints in [0, {V})")
        if len(prompt) + params.max_tokens > ctx:
            raise ValueError(f"prompt ({len(prompt)} tokens) + max_tokens ({params.max_tokens}) exceeds the "
                             f"context of {ctx} tokens")

    def submit(self, prompt: list[int], params: RequestParams = DEFAULT) -> int:
        """Queue a request; returns its id. ValueError for a bad one, WorkerError after a fault."""
        if self.error is not None:
            raise self.error
        self.check(prompt, params)
        rid = next(self._ids)
        self.requests[rid] = Result([], arrival=time.perf_counter())
        self.inbox["prefill"].put(("add", rid, tuple(prompt), asdict(params)))
        return rid

    def abort(self, rid: int) -> None:
        """Drop a request wherever it is (its blocks return on both sides)."""
        r = self.requests.get(rid)
        if r is not None and not r.finished:
            r.finish_reason, r.error = "abort", "aborted"
            for q in self.inbox.values():
                q.put(("abort", rid))

    def poll(self, timeout: float = 0.0) -> None:
        """Take the reports that arrive within ``timeout`` s (a driver submitting at chosen times)."""
        end = time.monotonic() + timeout
        while True:
            self._pump(max(0.0, end - time.monotonic()))
            if self.error is not None or time.monotonic() >= end:
                return

    def in_flight(self) -> list[int]:
        return [rid for rid, r in self.requests.items() if not r.finished]

    def generate(self, prompts: list[list[int]], params: RequestParams | list[RequestParams] = DEFAULT
                 ) -> list[Result]:
        """Every prompt to completion; one :class:`Result` per prompt, in order (errors in the results
        after a fault, with ``self.error`` set)."""
        many = params if isinstance(params, list) else [params] * len(prompts)
        if len(many) != len(prompts):
            raise ValueError(f"{len(prompts)} prompts but {len(many)} RequestParams")
        for p, q in zip(prompts, many, strict=True):
            self.check(p, q)  # every prompt checked before any is sent
        ids = [self.submit(p, q) for p, q in zip(prompts, many, strict=True)]
        self.wait(ids)
        return [self.requests.pop(i) for i in ids]

    def wait(self, ids: list[int]) -> None:
        """Until every request of ``ids`` is answered (tokens or an error); a silence of timeout_s is a fault."""
        while any(not self.requests[i].finished for i in ids):
            self._pump(0.1)

    def stats(self) -> dict[str, dict]:
        """Each worker's pool: {"prefill": {"free", "blocks", "running", ...}, "decode": {...}}."""
        if self.error is not None:
            raise self.error
        self._stats = {}
        for q in self.inbox.values():
            q.put(("stats",))
        end = time.monotonic() + self.cfg.timeout_s
        while len(self._stats) < 2:
            self._pump(0.1)
            if self.error is None and time.monotonic() > end:
                self._fail(f"no stats within timeout_s={self.cfg.timeout_s:g} s", "decode" if "prefill" in self._stats
                           else "prefill")
            if self.error is not None:
                raise self.error
        return self._stats

    # ---- events ----
    def _pump(self, timeout: float, starting: bool = False) -> None:
        """Take the workers' reports for up to ``timeout`` s (returns after the first); a fault when a
        worker is dead, or when requests wait and neither worker has said anything for timeout_s."""
        end = time.monotonic() + max(timeout, 0.0)
        while True:
            try:
                msg = self.outbox.get(timeout=0.02)
            except queue.Empty:
                msg = None
            if msg is not None:
                self._heard = time.monotonic()
                self._take(msg)
            for r, p in self.procs.items():  # a death is noticed at once, even while the other one talks
                if not p.is_alive() and self.error is None and not self._closed:
                    self._fail(_death(p.exitcode), r, symptom=p.exitcode == 0)
            if self.error is not None or (msg is not None and msg[0] != "error"):
                return
            silent = time.monotonic() - self._heard
            if not starting and self.in_flight() and silent > self.cfg.timeout_s:
                self._fail(f"sent no report for {silent:.0f} s (timeout_s={self.cfg.timeout_s:g}) with "
                           f"{len(self.in_flight())} requests in flight", "prefill")
            if self.error is not None or time.monotonic() > end:
                return

    def _take(self, msg) -> None:
        kind = msg[0]
        if kind == "ready":
            self.info[msg[1]] = msg[2]
        elif kind == "stats":
            self._stats[msg[1]] = msg[2]
        elif kind == "token":
            _, rid, i, tok = msg
            r = self.requests.get(rid)
            if r is not None and r.error is None:
                r.tokens.extend([-1] * (i + 1 - len(r.tokens)))
                r.tokens[i] = tok
                r.times.extend([float("nan")] * (i + 1 - len(r.times)))
                r.times[i] = time.perf_counter()
        elif kind == "done":
            r = self.requests.get(msg[1])
            if r is not None and r.error is None:
                r.finish_reason, r.n_expected = msg[2], msg[3]
        elif kind == "handoff":
            r = self.requests.get(msg[1])
            if r is not None:
                r.handoff_bytes, r.handoff_s = msg[2], msg[3]
        elif kind == "error":
            _, role, how, text = msg
            self._reports.append((how != "own", time.monotonic(), role, "raised " + text))
            self._fail(None, role)

    def _fail(self, reason: str | None, role: str, symptom: bool = False) -> None:
        """The first fault: wait GRACE_S for the other worker's word, name the cause, answer every
        request in flight with it, stop both workers. A worker's own fault (it raised, or died) is the
        cause; a failed transfer, or an exit after a report, only a symptom."""
        if self.error is not None or self._closed:
            return
        if reason is not None:
            self._reports.append((symptom, time.monotonic(), role, reason))
        end = time.monotonic() + GRACE_S
        while time.monotonic() < end:
            with suppress(queue.Empty):
                m = self.outbox.get(timeout=0.02)
                if m[0] == "error":
                    self._reports.append((m[2] != "own", time.monotonic(), m[1], "raised " + m[3]))
        for r, p in self.procs.items():
            if not p.is_alive() and not any(x[2] == r for x in self._reports):  # exit 0: it reported first
                self._reports.append((p.exitcode == 0, time.monotonic(), r, _death(p.exitcode)))
        self._reports.sort(key=lambda x: (x[0], x[1]))
        symptom, _, who, text = self._reports[0]
        others = "".join(f"\n  also the {w} worker: {t.splitlines()[0][:200]}" for _, _, w, t in self._reports[1:])
        self.error = WorkerError(f"the {who} worker {text.rstrip()}{others}")
        for r in self.requests.values():
            if not r.finished:
                r.finish_reason, r.error = "error", str(self.error).splitlines()[0]
        self.close()

