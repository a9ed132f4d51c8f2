"""The decode engine: static KV cache, prefill, one CUDA graph per batch bucket, streaming.

    eng = Engine(model, max_batch=8, max_seq=256)        # a transformers *ForCausalLM or a LeanModel
    out = eng.generate(prompts, max_new_tokens=64)       # prompts: lists of token ids
    for new in eng.stream(prompts, 64, SamplingParams(temperature=0.8, top_p=0.9, seed=1)): ...

A step of B rows runs in the smallest bucket of :data:`BUCKETS` that holds B (the extra rows
compute on dummy tokens and are dropped). On CUDA each (bucket, greedy or sampling) decode step is
captured once as a CUDA graph over fixed buffers — token ids in, positions in, K/V cache, token
ids out — and then replayed: one launch per token instead of hundreds. On CPU the same step runs
eagerly. While step i+1 runs on the GPU, the host streams the tokens of step i (one copy, no stall).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Iterator

import torch

from dispatch.engine.hfmodel import HFModel
from dispatch.engine.model import LeanModel
from dispatch.engine.sampling import SamplingParams, load_sampling, sample

BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
GREEDY = SamplingParams()


def as_engine_model(model, batch_invariant: bool = False):
    """The lean forward for the families it covers; transformers' own forward (DeepSeek-V3).
    ``batch_invariant``: the lean forward in batch-invariant mode (:mod:`dispatch.engine.invariant`)."""
    if isinstance(model, HFModel) or getattr(getattr(model, "config", None), "model_type", None) == "deepseek_v3":
        if batch_invariant:
            raise ValueError("batch_invariant=True needs the lean forward (OLMoE, Mixtral, Qwen2/3-MoE), "
                             "not transformers' own (DeepSeek-V3)")
        return model if isinstance(model, HFModel) else HFModel(model)
    if isinstance(model, LeanModel):
        return model.with_batch_invariance(True) if batch_invariant else model
    return LeanModel.from_hf(model, batch_invariant=batch_invariant)


def bucket(batch: int) -> int:
    """The smallest bucket holding ``batch`` rows."""
    for b in BUCKETS:
        if batch <= b:
            return b
    raise ValueError(f"batch must be 1..{BUCKETS[-1]}, got {batch}")


@dataclass
class Generation:
    """Tokens per row (prompt excluded, stop token included) and the timings of one call."""

    tokens: list[list[int]]
    prefill_s: float = 0.0
    decode_s: float = 0.0
    ttft_s: float = 0.0
    decode_steps: int = 0
    batch: int = 0
    prompt_tokens: int = 0
    extra: dict = field(default_factory=dict)

    @property
    def prefill_tok_s(self) -> float:
        return self.prompt_tokens / self.prefill_s if self.prefill_s else float("nan")

    @property
    def decode_tok_s(self) -> float:
        """Rows × decode steps per second (every row advances each step)."""
        return self.batch * self.decode_steps / self.decode_s if self.decode_s else float("nan")


class Engine:
    """Batch 1–256 generation over a :class:`LeanModel` (built from a transformers model if given one;
    DeepSeek-V3 runs transformers' own forward: :class:`dispatch.engine.hfmodel.HFModel`).
    ``batch_invariant``: every decode step in batch-invariant mode (a row's tokens do not depend on
    the other rows or the bucket; chapter 9)."""

    def __init__(self, model, *, max_batch: int = 1, max_seq: int = 512, graphs: bool | None = None,
                 batch_invariant: bool = False):
        if not isinstance(max_batch, int) or not 1 <= max_batch <= BUCKETS[-1]:
            raise ValueError(f"max_batch must be an int in 1..{BUCKETS[-1]} (rows at once), got {max_batch!r}")
        if not isinstance(max_seq, int) or max_seq < 2:
            raise ValueError(f"max_seq must be an int >= 2 (prompt + new tokens), got {max_seq!r}")
        self.model = as_engine_model(model, batch_invariant)
        self.dev = self.model.device
        window = self.model.cfg.sliding_window
        if window is not None and max_seq > window:
            raise ValueError(f"max_seq={max_seq} exceeds the model's sliding window ({window}): the lean "
                             "forward attends to the whole cache")
        self.max_batch, self.max_seq = bucket(max_batch), max_seq
        self.graphs = self.dev.type == "cuda" if graphs is None else graphs
        if self.graphs and self.dev.type != "cuda":
            raise ValueError("CUDA graphs need the model on a CUDA device")
        self.cache = self.model.new_cache(self.max_batch, max_seq)
        z = dict(device=self.dev, dtype=torch.long)
        self.tok_B, self.pos_B = torch.zeros(self.max_batch, **z), torch.zeros(self.max_batch, **z)
        self.temperature, self.top_p = torch.ones((), device=self.dev), torch.ones((), device=self.dev)
        self.generator = None if self.dev.type == "cuda" else torch.Generator(self.dev)
        self._graphs: dict[tuple[int, bool], torch.cuda.CUDAGraph] = {}
        self._pool = None

    # ---- one decode step over fixed buffers (what a graph captures) ----
    def _step(self, B: int, greedy: bool) -> None:
        with torch.no_grad():
            logits = self.model(self.tok_B[:B, None], self.pos_B[:B, None], self.cache, prefill=False)[:, -1]
            nxt = sample(logits, None if greedy else self.temperature, self.top_p, generator=self.generator)
            self.tok_B[:B].copy_(nxt)
            self.pos_B[:B].add_(1)

    def capture(self, B: int, greedy: bool) -> None:
        """Record the decode step of bucket ``B`` as a CUDA graph (the cache contents are scratch
        afterwards: call before prefill). Warm-up runs first: kernel compilation and tile choices
        must happen outside the capture."""
        key = (B, greedy)
        if key in self._graphs:
            return
        self.tok_B.zero_()
        self.pos_B.zero_()
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(2):
                self._step(B, greedy)
        torch.cuda.current_stream().wait_stream(s)
        self.pos_B.zero_()
        self._pool = self._pool or torch.cuda.graph_pool_handle()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, pool=self._pool):
            self._step(B, greedy)
        self._graphs[key] = g

    def _run_step(self, B: int, greedy: bool) -> None:
        if self.graphs:
            self._graphs[(B, greedy)].replay()
        else:
            self._step(B, greedy)

    def _prefill(self, prompts: list[list[int]], B: int, params: SamplingParams) -> torch.Tensor:
        """Right-padded prefill of all prompts at once; first tokens land in tok_B, positions in pos_B."""
        lens = [len(p) for p in prompts]
        S = max(lens)
        ids = torch.zeros(B, S, dtype=torch.long)
        for b, p in enumerate(prompts):
            ids[b, :len(p)] = torch.tensor(p, dtype=torch.long)
        ids = ids.to(self.dev)
        pos = torch.arange(S, device=self.dev).expand(B, S)
        last = torch.tensor(lens + [1] * (B - len(prompts)), device=self.dev) - 1
        with torch.no_grad():
            logits = self.model(ids, pos, self.cache, prefill=True)
            logits = logits[torch.arange(B, device=self.dev), last]
            self.tok_B[:B].copy_(sample(logits, None if params.greedy else self.temperature, self.top_p,
                                        generator=self.generator))
        self.pos_B[:B].copy_(last + 1)
        return logits

    def stream(self, prompts: list[list[int]], max_new_tokens: int, params: SamplingParams = GREEDY,
               *, stop_tokens: tuple[int, ...] = (), stats: Generation | None = None) -> Iterator[list[int | None]]:
        """Yield, per step, each row's new token (None once a row has stopped)."""
        n = len(prompts)
        if not 1 <= n <= self.max_batch:
            raise ValueError(f"need 1..{self.max_batch} prompts (max_batch), got {n}")
        if any(len(p) == 0 for p in prompts):
            raise ValueError("every prompt needs at least one token")
        if max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
        longest = max(len(p) for p in prompts)
        if longest + max_new_tokens > self.max_seq:
            raise ValueError(f"prompt ({longest}) + max_new_tokens ({max_new_tokens}) exceeds max_seq={self.max_seq}")
        B = bucket(n)
        if self.graphs:
            self.capture(B, params.greedy)
        load_sampling(params, self.temperature, self.top_p, self.generator)
        stats = stats if stats is not None else Generation([])
        stats.batch, stats.prompt_tokens = n, sum(len(p) for p in prompts)
        sync = torch.cuda.synchronize if self.dev.type == "cuda" else (lambda: None)
        sync()
        t0 = time.perf_counter()
        self._prefill(prompts, B, params)
        sync()
        stats.prefill_s = time.perf_counter() - t0
        stop, done = set(stop_tokens), [False] * n

        def emit(row_tokens) -> list[int | None]:
            out = []
            for b in range(n):
                t = None if done[b] else int(row_tokens[b])
                done[b] = done[b] or t in stop
                out.append(t)
            return out

        yield emit(self.tok_B[:n].tolist())
        stats.ttft_s = time.perf_counter() - t0
        t1 = time.perf_counter()
        host = [torch.empty(n, dtype=torch.long, pin_memory=self.dev.type == "cuda") for _ in range(2)]
        events = [torch.cuda.Event() if self.dev.type == "cuda" else None for _ in range(2)]
        pending, steps = None, 0
        for i in range(max_new_tokens - 1):
            if all(done):
                break
            self._run_step(B, params.greedy)
            steps += 1
            host[i % 2].copy_(self.tok_B[:n], non_blocking=True)
            if events[i % 2] is not None:
                events[i % 2].record()
            if pending is not None:
                yield emit(self._wait(pending, host, events))
            pending = i % 2
        if pending is not None and not all(done):
            yield emit(self._wait(pending, host, events))
        sync()
        stats.decode_s, stats.decode_steps = time.perf_counter() - t1, steps

    @staticmethod
    def _wait(slot: int, host, events) -> list[int]:
        if events[slot] is not None:
            events[slot].synchronize()
        return host[slot].tolist()

    def generate(self, prompts: list[list[int]], max_new_tokens: int, params: SamplingParams = GREEDY,
                 *, stop_tokens: tuple[int, ...] = (), on_token: Callable[[list[int | None]], None] | None = None
                 ) -> Generation:
        """All new tokens per row (up to and including a stop token) and the timings."""
        result = Generation([[] for _ in prompts])
        for new in self.stream(prompts, max_new_tokens, params, stop_tokens=stop_tokens, stats=result):
            for b, t in enumerate(new):
                if t is not None:
                    result.tokens[b].append(t)
            if on_token is not None:
                on_token(new)
        return result
