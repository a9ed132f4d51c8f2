"""The serving engine without HTTP: requests in, tokens out, one scheduled step at a time.

    eng = LLMEngine(model, EngineConfig(max_seqs=32), tokenizer=tok)  # transformers model or LeanModel
    rid = eng.add_request(prompt_ids, RequestParams(max_tokens=64))
    while eng.has_work(): outputs = eng.step()                      # RequestOutput per request touched
    done = eng.generate([ids_a, ids_b], RequestParams(max_tokens=16))  # or all at once: Completions

A step: the scheduler picks decode rows and prefill chunks (:mod:`dispatch.serve.scheduler`), the
runner computes them through the paged cache (:mod:`dispatch.serve.runner`), then every sequence
that caught up with its tokens gets one: greedy rows by one argmax over the step, sampled rows by
:func:`dispatch.engine.sampling.sample` with the request's own generator (seeded by its seed, so
its draws do not depend on which other requests share its steps). A request stops at max_tokens
("length"), at an end-of-sequence or stop token, or when its text contains a stop string ("stop");
its blocks go back in the same step, as they do on :meth:`LLMEngine.abort`.

The promise, tested: a greedy request generates the same tokens whatever else runs beside it — the
tokens it gets alone, and the tokens chapter 6's static engine gives it.
"""
from __future__ import annotations

import collections
import itertools
import time
from dataclasses import dataclass

import torch

from dispatch import compiles
from dispatch.engine.model import LeanModel
from dispatch.engine.sampling import sample
from dispatch.kernels import tiles
from dispatch.moe import shared_rides_along
from dispatch.serve.blocks import BlockAllocator
from dispatch.serve.model import kv_bytes_per_token
from dispatch.serve.request import DEFAULT, Completion, RequestOutput, RequestParams, StepStat
from dispatch.serve.runner import ModelRunner
from dispatch.serve.scheduler import QueueFull, Scheduler, SchedulerConfig, Sequence  # noqa: F401

STEP_LOG = 100_000  # the latest steps kept in LLMEngine.step_log (a server runs for days: older ones go)


@dataclass(frozen=True)
class EngineConfig:
    """``num_blocks`` None: on CUDA as many as ``kv_fraction`` of the free memory holds, on CPU
    enough for ``max_seqs`` sequences of ``max_model_len``. ``max_model_len`` None: the model's
    ``max_position_embeddings``. ``graphs`` None: on CUDA. ``kernels`` None: the Triton attention
    kernels on CUDA, their twins on CPU."""

    block_size: int = 16
    num_blocks: int | None = None
    max_model_len: int | None = None
    max_seqs: int = 64
    max_step_tokens: int = 512
    max_waiting: int = 1024
    chunked_prefill: bool = True
    prefix_caching: bool = True
    graphs: bool | None = None
    kernels: bool | None = None
    kv_fraction: float = 0.85

    def __post_init__(self):
        if not 0.0 < self.kv_fraction < 1.0:
            raise ValueError(f"kv_fraction must lie in (0, 1), got {self.kv_fraction!r}")
        for name in ("block_size", "num_blocks", "max_model_len"):
            v = getattr(self, name)
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
                raise ValueError(f"{name} must be a positive int or None, got {v!r}")


def warmup_lengths(max_tokens: int, routed: tuple[int, ...] = (), crossovers: tuple[int, ...] = ()) -> list[int]:
    """Prompt lengths a GPU warm-up prefills: the first T of each class of token counts that compile
    kernels of their own. A class is T's tile bucket both ways it is looked up — the power of two at or
    above T (the decode graphs' buckets) and the power of two nearest T in log2, ties to the larger (a
    tile table's bucket: 12 takes 16's tiles, 11 takes 8's) — the experts path (T at most each of
    ``crossovers``, the decode kernels, or the grouped GEMM), and the kind of integer Triton compiles a
    kernel for (:func:`dispatch.compiles.int_kind`) of T and of T·m for each m in ``routed`` (the routed
    rows T·K the experts kernels take). Each new class compiles the step's kernels the first time it
    runs: seconds in the middle of a request's first token otherwise."""
    def nearest(T: int) -> int:  # tables.nearest_bucket over powers of two
        lo = 1 << (T.bit_length() - 1)
        return lo if T * T < 2 * lo * lo else 2 * lo  # log2(T) - log2(lo) < 1/2, else the larger

    seen, out = set(), []
    for T in range(1, max_tokens + 1):
        key = (1 << (T - 1).bit_length(), nearest(T), *(T <= c for c in crossovers), compiles.int_kind(T),
               *(compiles.int_kind(T * m) for m in routed))
        if key not in seen:
            seen.add(key)
            out.append(T)
    return out


class _Request:
    def __init__(self, seq: Sequence, params: RequestParams, dev: torch.device, arrival: float):
        self.seq, self.params, self.arrival = seq, params, arrival
        self.generator = None
        if not params.greedy:
            self.generator = torch.Generator(dev)
            self.generator.manual_seed(params.seed)
            self.temperature = torch.tensor(params.temperature, device=dev)
            self.top_p = torch.tensor(params.top_p, device=dev)
        self.times: list[float] = []
        self.margins: list[float] = []


class LLMEngine:
    """Continuous batching over a paged KV cache (see the module docstring)."""

    def __init__(self, model, config: EngineConfig = EngineConfig(), *, tokenizer=None,
                 eos_token_ids: tuple[int, ...] | None = None, record_margins: bool = False):
        self.lean = model if isinstance(model, LeanModel) else LeanModel.from_hf(model)
        self.cfg, self.tokenizer, self.record_margins = config, tokenizer, record_margins
        self.dev = self.lean.device
        hf_cfg = getattr(model, "config", None)
        self.max_model_len = config.max_model_len or getattr(hf_cfg, "max_position_embeddings", None) or 2048
        if eos_token_ids is None:
            gen = getattr(model, "generation_config", None)
            eos = getattr(gen, "eos_token_id", None)
            eos_token_ids = tuple(eos) if isinstance(eos, (list, tuple)) else (() if eos is None else (eos,))
        self.eos = tuple(eos_token_ids)
        num_blocks = config.num_blocks or self._auto_blocks()
        per_seq = -(-self.max_model_len // config.block_size)
        if num_blocks < per_seq:
            raise ValueError(f"num_blocks={num_blocks} cannot hold one sequence of max_model_len={self.max_model_len} "
                             f"({per_seq} blocks of {config.block_size})")
        self.alloc = BlockAllocator(num_blocks, config.block_size, prefix_caching=config.prefix_caching)
        self.scheduler = Scheduler(SchedulerConfig(config.max_seqs, config.max_step_tokens, config.max_waiting,
                                                   config.chunked_prefill), self.alloc)
        cuda = self.dev.type == "cuda"
        self.runner = ModelRunner(self.lean, num_blocks=num_blocks, block_size=config.block_size,
                                  max_seqs=config.max_seqs, max_model_len=self.max_model_len,
                                  graphs=cuda if config.graphs is None else config.graphs,
                                  kernels=cuda if config.kernels is None else config.kernels)
        self.requests: dict[int, _Request] = {}
        self._ids = itertools.count()
        self.steps = 0  # steps run since the warm-up
        self.compiled_mark = compiles.count()  # Triton compiles logged before this are the warm-up's
        self.step_log: collections.deque[StepStat] = collections.deque(maxlen=STEP_LOG)  # the latest steps

    def _auto_blocks(self) -> int:
        per_block = kv_bytes_per_token(self.lean) * self.cfg.block_size
        if self.dev.type == "cuda":
            free, _ = torch.cuda.mem_get_info(self.dev)
            return max(1, int(free * self.cfg.kv_fraction) // per_block)
        return self.cfg.max_seqs * -(-self.max_model_len // self.cfg.block_size)

    def warmup(self) -> None:
        """Compile the kernels (one short request) and, with CUDA graphs, capture every decode bucket
        now rather than in the middle of the first requests that need them. On a GPU also one prompt of
        each length :func:`warmup_lengths` names up to the step budget: a step's token count picks the
        experts path and its tiles (and the prefill kernels their shapes), and each pick, and each kind
        of token count, compiles the first time it runs."""
        if self.has_work():
            raise RuntimeError("warm up before adding requests")
        self.generate([[1] * min(4, self.max_model_len - 2)], RequestParams(max_tokens=2, ignore_eos=True))
        if self.dev.type == "cuda":
            compiles.watch()
            V = self.lean.embed.shape[0]
            routed = tuple(sorted({c.K + n for c in self.lean.moe_cfgs if c for n in (0, shared_rides_along(c))}))
            crossovers = tuple(sorted({tiles.resolve("crossover", (0, c.K, c.E, c.H, c.I), self.lean.dtype,
                                                     self.dev).config for c in self.lean.moe_cfgs if c}))
            lengths = warmup_lengths(min(self.cfg.max_step_tokens, self.max_model_len - 2), routed, crossovers)
            for i, n in enumerate(lengths):
                tok = 2 + i % (V - 2)  # a token of its own per length: no cached prefix shortens the step
                self.generate([[tok] * n], RequestParams(max_tokens=1, ignore_eos=True))
        if self.runner.graphs:
            self.runner.capture_all()
        self.compiled_mark = compiles.count()  # a compile after this is a class of step the warm-up missed
        self.steps = 0
        self.step_log.clear()

    def fresh_compiles(self) -> list[str]:
        """The Triton compiles since the warm-up or the last call (:mod:`dispatch.compiles`): each a class of
        step the warm-up missed, a stall while serving."""
        fresh = compiles.since(self.compiled_mark)
        self.compiled_mark += len(fresh)
        return fresh

    # ---- requests ----
    def check_request(self, prompt: list[int], params: RequestParams) -> None:
        """ValueError unless ``prompt`` with ``params`` can run here (the server's 400s)."""
        if not isinstance(prompt, (list, tuple)) or not prompt:
            raise ValueError("the prompt must hold at least one token")
        V = self.lean.embed.shape[0]
        if not all(isinstance(t, int) and not isinstance(t, bool) and 0 <= t < V for t in prompt):
            raise ValueError(f"prompt tokens must be ints in [0, {V})")
        if len(prompt) >= self.max_model_len:
            raise ValueError(f"the prompt has {len(prompt)} tokens; the context is {self.max_model_len}, and at "
                             "least one new token must fit")
        if len(prompt) + params.max_tokens > self.max_model_len:
            raise ValueError(f"prompt ({len(prompt)} tokens) + max_tokens ({params.max_tokens}) exceeds the context "
                             f"of {self.max_model_len} tokens")

    def add_request(self, prompt: list[int], params: RequestParams = DEFAULT, *,
                    arrival: float | None = None) -> int:
        """Queue a request; returns its id. ValueError for a bad one, QueueFull when the queue is full."""
        self.check_request(prompt, params)
        rid = next(self._ids)
        seq = Sequence(rid, list(prompt))
        self.scheduler.add(seq)  # QueueFull before anything is recorded
        self.requests[rid] = _Request(seq, params, self.dev, time.perf_counter() if arrival is None else arrival)
        return rid

    def abort(self, rid: int) -> RequestOutput | None:
        """Stop a request now (a client went away): its blocks return at once. None if unknown."""
        req = self.requests.pop(rid, None)
        if req is None:
            return None
        self.scheduler.finish(req.seq)
        self.runner.release(req.seq)
        return RequestOutput(rid, [], req.seq.output, True, "abort")

    def has_work(self) -> bool:
        return self.scheduler.has_work()

    # ---- a step ----
    def step(self) -> list[RequestOutput]:
        """Schedule, run the model once, sample, retire what finished. Outputs of the requests that
        got a token this step."""
        t0 = time.perf_counter()
        sched = self.scheduler.schedule()
        for seq in sched.preempted:
            self.runner.release(seq)
        if not sched:
            return []
        kv = sum(len(s.tokens) for s in sched.decode)
        try:  # up to the step's one host sync (a kernel's fault surfaces there on a GPU)
            logits, seqs = self.runner.run(sched)
            ready = self.scheduler.after_step(sched)
            picks = self._sample(logits, seqs)
            lps = self._logprobs(logits, picks, seqs)
            picked = picks.tolist()
        except Exception as e:  # what the failed step held, for the log
            e.add_note(f"step {self.steps + 1} held {len(sched.decode)} decode rows (positions "
                       f"{[s.computed for s in sched.decode][:16]}) and chunks (tokens, first position) "
                       f"{[(n, s.computed) for s, n in sched.chunks][:16]}; "
                       f"{'graphed' if self.runner.graphed(sched) else 'eager'}")
            raise
        assert [s.id for s in ready] == [s.id for s in seqs], "the runner's rows and the scheduler's disagree"
        now = time.perf_counter()
        outs = []
        for seq, tok in zip(seqs, picked, strict=True):
            req = self.requests[seq.id]
            seq.tokens.append(tok)
            req.times.append(now)
            outs.append(self._check_stop(req, tok))
            if seq.id in lps:
                outs[-1].logprobs = [lps[seq.id]]
        self.steps += 1
        self.step_log.append(StepStat(len(sched.decode), sched.num_tokens - len(sched.decode), kv,
                                      time.perf_counter() - t0))
        return outs

    @property
    def step_tokens(self) -> list[int]:
        """Tokens per step (the MoE layer's T)."""
        return [s.tokens for s in self.step_log]

    def _sample(self, logits_RV: torch.Tensor, seqs: list[Sequence]) -> torch.Tensor:
        """Next token per row [R] on the device: argmax, or the request's own seeded draw."""
        picks = logits_RV.argmax(-1)
        if self.record_margins:
            top = logits_RV.topk(2, dim=-1).values
            for seq, m in zip(seqs, (top[:, 0] - top[:, 1]).tolist(), strict=True):
                self.requests[seq.id].margins.append(m)
        for r, seq in enumerate(seqs):
            req = self.requests[seq.id]
            if req.generator is not None:
                picks[r] = sample(logits_RV[r:r + 1], req.temperature, req.top_p, generator=req.generator)[0]
        return picks

    def _logprobs(self, logits_RV, picks_R, seqs) -> dict[int, tuple[float, list[tuple[int, float]]]]:
        """{sequence id: (log p of its token, [(token, log p)] of the k most likely)} for the rows
        whose request asked for ``logprobs`` (one pass over those rows)."""
        rows = [r for r, s in enumerate(seqs) if self.requests[s.id].params.logprobs is not None]
        if not rows:
            return {}
        idx = torch.tensor(rows, device=logits_RV.device)
        lp = torch.log_softmax(logits_RV[idx].float(), dim=-1)
        k = max(self.requests[seqs[r].id].params.logprobs for r in rows)
        top_v, top_i = lp.topk(max(k, 1), dim=-1)
        own = lp.gather(1, picks_R[idx][:, None])[:, 0].tolist()
        top_v, top_i = top_v.tolist(), top_i.tolist()
        out = {}
        for j, r in enumerate(rows):
            n = self.requests[seqs[r].id].params.logprobs
            out[seqs[r].id] = (own[j], list(zip(top_i[j][:n], top_v[j][:n], strict=True)))
        return out

    def _check_stop(self, req: _Request, tok: int) -> RequestOutput:
        seq, p = req.seq, req.params
        out = RequestOutput(seq.id, [tok], seq.output)
        if (tok in self.eos and not p.ignore_eos) or tok in p.stop_token_ids:
            out.finish_reason = "stop"
        elif p.stop and self.tokenizer is not None:
            text = self.tokenizer.decode(seq.output, skip_special_tokens=True)
            hits = [i for i in (text.find(s) for s in p.stop) if i >= 0]
            if hits:
                out.finish_reason, out.stop_at = "stop", min(hits)
        if out.finish_reason is None and len(seq.tokens) - len(seq.prompt) >= p.max_tokens:
            out.finish_reason = "length"
        if out.finish_reason is not None:
            out.finished = True
            self.scheduler.finish(seq)
            self.runner.release(seq)
            del self.requests[seq.id]
        return out

    # ---- all at once ----
    def generate(self, prompts: list[list[int]], params: RequestParams | list[RequestParams] = DEFAULT
                 ) -> list[Completion]:
        """Every prompt to completion, continuously batched; one :class:`Completion` per prompt, in order."""
        many = params if isinstance(params, list) else [params] * len(prompts)
        if len(many) != len(prompts):
            raise ValueError(f"{len(prompts)} prompts but {len(many)} RequestParams")
        for p, q in zip(prompts, many, strict=True):
            self.check_request(p, q)  # every prompt checked before any runs
        t0 = time.perf_counter()
        ids, reqs, done, todo = [], {}, {}, list(zip(prompts, many, strict=True))[::-1]
        while todo or len(done) < len(ids):
            while todo and len(self.scheduler.waiting) < self.cfg.max_waiting:  # the queue is bounded
                ids.append(self.add_request(*todo.pop(), arrival=t0))
                reqs[ids[-1]] = self.requests[ids[-1]]
            for out in self.step():
                if out.finished:
                    done[out.id] = out.finish_reason
        res = []
        for rid in ids:
            r = reqs[rid]
            ts = [r.arrival] + r.times
            res.append(Completion(r.seq.output, done[rid], r.times[0] - r.arrival,
                                  [b - a for a, b in zip(ts[1:], ts[2:], strict=False)], r.margins))
        return res

    @property
    def stats(self) -> dict:
        """Queue and cache state (what /metrics reports)."""
        return {"waiting": len(self.scheduler.waiting), "running": len(self.scheduler.running),
                "blocks_used": self.alloc.num_used, "blocks_total": self.alloc.num_blocks,
                "prefix_hit_tokens": self.alloc.hits, "prefix_query_tokens": self.alloc.queries}
