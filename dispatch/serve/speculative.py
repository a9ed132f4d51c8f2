"""Speculative decoding over the static-cache engine: draft k tokens, verify them in one pass, keep
what the target agrees with, rewind the rest.

    spec = SpeculativeEngine(model, PromptLookup(), k=4, batch_invariant=True)
    out = spec.generate(prompts, max_new_tokens=64)          # greedy: the tokens plain greedy gives
    out.extra["accepted"]                                    # drafts kept, per step and row

One step (``_spec_step``; on CUDA one graph per (bucket, k, greedy)), all on the device:

    drafts_BK      = drafter.propose(...)                   prompt lookup, or a draft model's k steps
    logits_BK1V    = model([t, d_1..d_k] at pos .. pos+k)   one forward of k+1 tokens per row; their
                                                            K/V land in the cache at those positions
    out_BK1, n_B   = greedy acceptance / speculative_sample  :mod:`dispatch.serve.acceptance`
    adv_B          = min(n_B + 1, tokens the row may still emit)
    hist[pos+1 ..], pos += adv, t = hist[pos]               :func:`advance`: the rollback

Greedy, the last three lines are one call: :func:`dispatch.kernels.spec_step.accept_advance` (one
launch; with ``step_kernels`` off, its torch twin).

Rollback: the cache positions pos+adv .. pos+k hold the K/V of rejected drafts. They are never
read: attention reads keys up to each query's own position, and the next step writes its k+1 K/V
entries, starting at the new pos, before its attention runs. So on the static cache rolling back is
moving ``pos`` — nothing is copied or cleared. A paged cache does the same and also frees (or
keeps for the next step) the blocks that hold only positions past the new pos.

``batch_invariant=True`` (:mod:`dispatch.engine.invariant`): the verify step gives each of its k+1
positions the bits a one-token step would, so greedy speculative output is token-identical to
plain greedy output. The host reads each step's emitted tokens one step late (while the next step
runs), as the plain engine does, and picks k per step (``adaptive``: :mod:`dispatch.serve.spec_cost`).
"""
from __future__ import annotations

import time
from typing import Iterator

import torch

from dispatch.engine.engine import GREEDY, Engine, Generation, bucket
from dispatch.engine.model import LeanModel
from dispatch.engine.sampling import SamplingParams, load_sampling
from dispatch.kernels.spec_step import accept_advance, accept_advance_torch, advance
from dispatch.serve.acceptance import speculative_sample


class SpeculativeEngine(Engine):
    """:class:`dispatch.engine.Engine` with a drafter: k drafts per step (at most ``k``), verified in one
    forward. ``adaptive``: an :class:`dispatch.serve.spec_cost.AdaptiveK` that picks k per step.
    ``step_kernels``: prompt lookup and greedy acceptance + rollback as the two launches of
    :mod:`dispatch.kernels.spec_step` (default: on CUDA when the model runs its decode kernels), else
    the torch ops of :func:`dispatch.serve.drafters.lookup`, :mod:`dispatch.serve.acceptance` and :func:`advance`."""

    def __init__(self, model, drafter, *, k: int = 4, adaptive=None, max_batch: int = 1, max_seq: int = 512,
                 graphs: bool | None = None, batch_invariant: bool = False, step_kernels: bool | None = None):
        if isinstance(k, bool) or not isinstance(k, int) or not max(1, drafter.k_min) <= k <= 16:
            raise ValueError(f"k (the most drafts a step) must be an int in [{max(1, drafter.k_min)}, 16], got {k!r}")
        if adaptive is not None and not (adaptive.k_min >= drafter.k_min and adaptive.k_max <= k):
            raise ValueError(f"the adaptive range [{adaptive.k_min}, {adaptive.k_max}] must lie in the drafter's "
                             f"[{drafter.k_min}, k={k}]")
        # room past max_seq: a verify step writes k positions beyond the last token it may emit
        super().__init__(model, max_batch=max_batch, max_seq=max_seq + k + 1, graphs=graphs,
                         batch_invariant=batch_invariant)
        if not isinstance(self.model, LeanModel):
            raise ValueError("speculative decoding verifies on the lean forward (OLMoE, Mixtral, Qwen2/3-MoE)")
        self.limit, self.k, self.drafter, self.adaptive = max_seq, k, drafter, adaptive
        if step_kernels is None:  # as the verify forward: its own decode kernels on CUDA
            step_kernels = self.dev.type == "cuda" and (self.model.decode_kernels or self.model.batch_invariant)
        self.step_kernels = bool(step_kernels)
        z = dict(device=self.dev, dtype=torch.long)
        self.hist_BS = torch.zeros(self.max_batch, self.max_seq, **z)
        self.cap_B = torch.zeros(self.max_batch, **z)
        self.offsets = torch.arange(k + 1, **z)  # 0 … k: a verify step's positions past pos
        # what the host reads of a step, in one copy: [adv, out_0 .. out_k] per row
        self.res_BK2 = torch.zeros(self.max_batch, k + 2, **z)
        # a verify step's ids: each row's token, then its drafts (tok_B is the first column, so the
        # acceptance kernel that sets the next token and the lookup that writes drafts fill it in place)
        self.ids_BK1 = torch.zeros(self.max_batch, k + 1, **z)
        self.tok_B = self.ids_BK1[:, 0]
        drafter.bind(self)

    # ---- one speculative step over fixed buffers (what a graph captures) ----
    def _spec_step(self, B: int, k: int, greedy: bool) -> None:
        with torch.no_grad():
            drafts_BK, q_BKV = self.drafter.propose(self, B, k, greedy)
            ids_BK1 = self.ids_BK1[:B, :k + 1]
            if k and drafts_BK.data_ptr() != ids_BK1[:, 1:].data_ptr():  # a drafter that wrote elsewhere
                ids_BK1[:, 1:].copy_(drafts_BK)
            pos_BK1 = self.pos_B[:B, None] + self.offsets[:k + 1]
            logits = self.model(ids_BK1, pos_BK1, self.cache, prefill=False)
            forced = getattr(self.drafter, "forced", None)  # a replay: the recorded outcome, same work
            if greedy:  # acceptance and rollback: one launch with the step kernels, its twin's ops without
                out_BK1 = logits.argmax(dim=-1)
                if forced is not None:  # the recorded tokens stand for the target's; the replayed drafts
                    out_BK1 = forced(self, B, k)[0]  # match them on exactly the recorded run: n as recorded
                accept = accept_advance if self.step_kernels else accept_advance_torch
                accept(self.hist_BS[:B], self.pos_B[:B], drafts_BK, out_BK1, self.cap_B[:B], self.tok_B[:B],
                       self.res_BK2[:B])  # the host's row [adv, out_0 .. out_k] written by the same launch
                return
            out_BK1, n_B = speculative_sample(drafts_BK, q_BKV, logits, self.temperature, self.top_p,
                                              generator=self.generator)
            if forced is not None:
                out_BK1, n_B = forced(self, B, k)
            adv_B = advance(self.hist_BS[:B], self.pos_B[:B], out_BK1, n_B, self.cap_B[:B], self.offsets)
            self.tok_B[:B].copy_(self.hist_BS[:B].gather(1, self.pos_B[:B, None])[:, 0])
            self.res_BK2[:B, 0].copy_(adv_B)
            self.res_BK2[:B, 1:k + 2].copy_(out_BK1)

    def capture_spec(self, B: int, k: int, greedy: bool) -> None:
        """Record the step of bucket B with k drafts as a CUDA graph (before prefill: scratch state)."""
        key = ("spec", B, k, greedy)
        if key in self._graphs:
            return
        for t in (self.tok_B, self.pos_B, self.hist_BS):
            t.zero_()
        self.pos_B.fill_(1)
        self.cap_B.fill_(1 << 30)
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(2):
                self.pos_B.fill_(1)
                self._spec_step(B, k, greedy)
        torch.cuda.current_stream().wait_stream(s)
        self.pos_B.fill_(1)
        self._pool = self._pool or torch.cuda.graph_pool_handle()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, pool=self._pool):
            self._spec_step(B, k, greedy)
        self._graphs[key] = g

    def _run_spec(self, B: int, k: int, greedy: bool) -> None:
        if self.graphs:
            self._graphs[("spec", B, k, greedy)].replay()
        else:
            self._spec_step(B, k, greedy)

    def _ks(self) -> range:
        return range(self.adaptive.k_min, self.adaptive.k_max + 1) if self.adaptive else range(self.k, self.k + 1)

    def check_request(self, prompts: list[list[int]], max_new_tokens: int) -> int:
        """The bucket of a valid request; ValueError naming what is wrong otherwise."""
        n = len(prompts)
        if not 1 <= n <= self.max_batch or any(len(p) == 0 for p in prompts) or max_new_tokens < 1:
            raise ValueError(f"need 1..{self.max_batch} non-empty prompts and max_new_tokens >= 1, got {n} "
                             f"prompts, max_new_tokens={max_new_tokens}")
        longest = max(len(p) for p in prompts)
        if longest + max_new_tokens > self.limit:
            raise ValueError(f"prompt ({longest}) + max_new_tokens ({max_new_tokens}) exceeds max_seq={self.limit}")
        return bucket(n)

    def prepare(self, prompts: list[list[int]], max_new_tokens: int, params: SamplingParams = GREEDY) -> int:
        """Prefill, fill the token history and each row's cap, start the drafter (graphs are captured
        before: :meth:`capture_spec`). Returns the bucket B. (:meth:`stream` calls it.)"""
        n, B = len(prompts), self.check_request(prompts, max_new_tokens)
        if self.adaptive is not None:
            self.adaptive.reset()
        load_sampling(params, self.temperature, self.top_p, self.generator)
        self._prefill(prompts, B, params)
        self.hist_BS[:B].zero_()
        for b, p in enumerate(prompts):
            self.hist_BS[b, :len(p)] = torch.tensor(p, device=self.dev)
        self.hist_BS[:B].scatter_(1, self.pos_B[:B, None], self.tok_B[:B, None])
        self.cap_B[:B].copy_(self.pos_B[:B])  # dummy rows of the bucket never advance
        self.cap_B[:n] += max_new_tokens - 1
        self.drafter.start(self, prompts, B)
        return B

    def stream(self, prompts: list[list[int]], max_new_tokens: int, params: SamplingParams = GREEDY, *,
               stop_tokens: tuple[int, ...] = (), stats: Generation | None = None) -> Iterator[list[list[int]]]:
        """Yield, per step, each row's new tokens (0 to k+1 of them; none once a row has stopped)."""
        n, B = len(prompts), self.check_request(prompts, max_new_tokens)
        if self.graphs:
            for k in self._ks():
                self.capture_spec(B, k, params.greedy)
        stats = stats if stats is not None else Generation([])
        stats.batch, stats.prompt_tokens = n, sum(len(p) for p in prompts)
        sync = torch.cuda.synchronize if self.dev.type == "cuda" else (lambda: None)
        sync()
        t0 = time.perf_counter()
        self.prepare(prompts, max_new_tokens, params)
        sync()
        stats.prefill_s = time.perf_counter() - t0
        stop, done, emitted = set(stop_tokens), [False] * n, [0] * n
        first = self.tok_B[:n].tolist()
        for b in range(n):
            emitted[b], done[b] = 1, first[b] in stop or max_new_tokens == 1
        yield [[t] for t in first]
        stats.ttft_s = time.perf_counter() - t0
        t1 = time.perf_counter()
        accepted, ks = [], []
        # two host slots, filled in turn: a step's copy lands in one while the other is read
        host = [torch.empty(n, self.k + 2, dtype=torch.long, pin_memory=self.dev.type == "cuda") for _ in range(2)]
        events = [torch.cuda.Event() if self.dev.type == "cuda" else None for _ in range(2)]
        pending, i = None, 0
        while not all(done):
            k = self.adaptive.choose() if self.adaptive else self.k
            self._run_spec(B, k, params.greedy)
            host[i].copy_(self.res_BK2[:n], non_blocking=True)
            if events[i] is not None:
                events[i].record()
            if pending is not None:  # the step before this one: read while this one runs
                yield self._emit(pending, host, events, done, emitted, stop, max_new_tokens, accepted, ks)
            pending, i = (k, i), 1 - i
        sync()  # the last step ran while the one before it was read, and is not needed
        stats.decode_s, stats.decode_steps = time.perf_counter() - t1, len(ks)  # steps whose tokens were read
        stats.extra.update(accepted=accepted, k=ks)

    def _emit(self, pending, host, events, done, emitted, stop, max_new, accepted, ks) -> list[list[int]]:
        k, i = pending
        if events[i] is not None:
            events[i].synchronize()  # the one wait of a step
        rows = host[i].tolist()
        adv, out = [r[0] for r in rows], [r[1:k + 2] for r in rows]
        ks.append(k)
        accepted.append([max(a - 1, 0) for a in adv])
        if self.adaptive is not None:
            self.adaptive.update(k, [a - 1 for a, d in zip(adv, done, strict=True) if not d and a > 0])
        new = []
        for b, (row, a) in enumerate(zip(out, adv, strict=True)):
            toks = [] if done[b] else row[:a]
            for i, t in enumerate(toks):
                if t in stop or emitted[b] + i + 1 >= max_new:
                    toks = toks[:i + 1]
                    break
            emitted[b] += len(toks)
            done[b] = done[b] or emitted[b] >= max_new or (bool(toks) and toks[-1] in stop)
            new.append(toks)
        return new

    def generate(self, prompts: list[list[int]], max_new_tokens: int, params: SamplingParams = GREEDY, *,
                 stop_tokens: tuple[int, ...] = ()) -> Generation:
        """All new tokens per row (up to and including a stop token), the timings, and in ``extra`` the
        drafts each step kept per row (``accepted``) and the k of each step (``k``). ``decode_steps``
        counts verify steps (each emits 1 to k+1 tokens a row): tokens/s is (tokens − 1) / ``decode_s``."""
        result = Generation([[] for _ in prompts])
        for new in self.stream(prompts, max_new_tokens, params, stop_tokens=stop_tokens, stats=result):
            for b, toks in enumerate(new):
                result.tokens[b].extend(toks)
        return result
