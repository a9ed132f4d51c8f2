"""The offline contestants of ``python -m dispatch_book.bench serve``: one workload, four engines.

    ours(lean, reqs)                the continuous-batching engine (:class:`dispatch.serve.LLMEngine`)
    static(lean, reqs, batch)       chapter 6's engine, one static batch at a time in arrival order:
                                    a batch runs until its longest request is done (its other rows idle)
    hf_cb(model, reqs)              transformers' continuous batching (``ContinuousBatchingManager``,
                                    paged attention), with the model's experts implementation as it is
                                    (default, or ``"dispatch"`` after :func:`dispatch.engine.use_dispatch_experts`)

Each returns {"output_tokens", "wall_s", "output_tok_s", ...}: output tokens are the tokens the
requests asked for (``max_tokens`` each, end of sequence ignored), whatever an engine computed
beyond them. Also :func:`word_tokenizer`: a tokenizer with one word per id (``"t17 t4"`` ↔ [17, 4]),
so a random-weight model can be served over a text API with prompts of exact token lengths.
"""
from __future__ import annotations

import time

import torch


def _sync(dev) -> None:
    if torch.device(dev).type == "cuda":
        torch.cuda.synchronize()


def ours(lean, reqs, *, max_seqs: int = 256, max_step_tokens: int = 2048, graphs: bool | None = None,
         num_blocks: int | None = None) -> dict:
    from dispatch.serve import EngineConfig, LLMEngine, RequestParams
    from dispatch.serve.model import kv_bytes_per_token

    longest = max(len(r.prompt) + r.max_tokens for r in reqs)
    eng = LLMEngine(lean, EngineConfig(max_seqs=max_seqs, max_step_tokens=max_step_tokens, graphs=graphs,
                                       max_model_len=-(-longest // 16) * 16, num_blocks=num_blocks), eos_token_ids=())
    eng.warmup()  # kernels compiled, every decode bucket's graph captured
    params = [RequestParams(max_tokens=r.max_tokens, ignore_eos=True) for r in reqs]
    _sync(lean.device)
    t0 = time.perf_counter()
    outs = eng.generate([r.prompt for r in reqs], params)
    _sync(lean.device)
    wall = time.perf_counter() - t0
    n = sum(len(o.tokens) for o in outs)
    ttft = sorted(o.ttft_s for o in outs)
    res = {"output_tokens": n, "wall_s": wall, "output_tok_s": n / wall, "steps": eng.steps,
           "mean_step_tokens": sum(eng.step_tokens) / max(len(eng.step_tokens), 1),
           "kv_blocks": eng.alloc.num_blocks, "ttft_p50_s": ttft[len(ttft) // 2],
           "where": step_split(eng.step_log), "kv_bytes_per_token": kv_bytes_per_token(lean)}
    del eng
    return res


def step_split(log) -> dict:
    """Where a run's time went: {"decode"|"mixed": {"steps", "s", "rows", "kv_tokens", "prefill_tokens"}}
    over :class:`dispatch.serve.request.StepStat` records — decode-only steps (graph replays on a GPU)
    and steps with a prompt chunk."""
    out = {k: {"steps": 0, "s": 0.0, "rows": 0, "kv_tokens": 0, "prefill_tokens": 0} for k in ("decode", "mixed")}
    for st in log:
        d = out["mixed" if st.prefill_tokens else "decode"]
        d["steps"] += 1
        d["s"] += st.seconds
        d["rows"] += st.decode_rows
        d["kv_tokens"] += st.kv_tokens
        d["prefill_tokens"] += st.prefill_tokens
    return out


def static(lean, reqs, *, batch: int) -> dict:
    from dispatch.engine import Engine

    longest = max(len(r.prompt) for r in reqs) + max(r.max_tokens for r in reqs)
    eng = Engine(lean, max_batch=batch, max_seq=-(-longest // 16) * 16)
    eng.generate([reqs[0].prompt] * min(batch, len(reqs)), 4)  # warm-up: this bucket's graph
    _sync(lean.device)
    t0, computed = time.perf_counter(), 0
    for i in range(0, len(reqs), batch):
        group = reqs[i:i + batch]
        new = max(r.max_tokens for r in group)
        eng.generate([r.prompt for r in group], new)  # no stop tokens: every row runs `new` steps
        computed += len(group) * new
    _sync(lean.device)
    wall = time.perf_counter() - t0
    n = sum(r.max_tokens for r in reqs)
    res = {"output_tokens": n, "wall_s": wall, "output_tok_s": n / wall, "batch": batch,
           "computed_tokens": computed, "idle_share": 1 - n / computed}
    del eng
    return res


def cb_blocks(cache_tokens: int) -> int:
    """transformers' continuous-batching blocks that hold ``cache_tokens`` tokens (of its default page size):
    ``hf_cb``'s and ``transformers serve --cb-num-blocks``' cache size."""
    from transformers import ContinuousBatchingConfig

    return -(-cache_tokens // ContinuousBatchingConfig().page_size)


class Unfinished(TimeoutError):
    """The run was cut off after ``wall_s``: ``done`` of ``requests`` finished with ``tokens`` of the ``total``
    output tokens. It needed longer than ``wall_s`` for ``total``, so its throughput was at most
    ``total / wall_s`` (:meth:`bound`) — an upper bound, never a measurement."""

    def __init__(self, done: int, requests: int, tokens: int, total: int, wall_s: float):
        super().__init__(f"{done} of {requests} requests done after {wall_s:.0f} s")
        self.done, self.requests, self.tokens, self.total, self.wall_s = done, requests, tokens, total, wall_s

    def bound(self) -> dict:
        return {"did_not_finish": str(self), "requests_done": self.done, "wall_s": self.wall_s,
                "output_tok_s_at_most": self.total / self.wall_s}


def hf_cb(model, reqs, *, max_batch_tokens: int | None = None, cache_tokens: int | None = None,
          timeout_s: float = 600, warmup: bool = True) -> dict:
    """transformers' continuous batching, one request per prompt with its own max_new_tokens: TimeoutError
    when the warm-up request and the run together take over ``timeout_s`` (:class:`Unfinished`, with the
    throughput bound, when the run had started). ``max_batch_tokens`` and
    ``cache_tokens`` (the KV cache's size) left None, transformers sizes them from free memory: on a GPU
    what a user gets, on a CPU most of the host's RAM (14 GB for the shipped model on a 24 GiB machine)."""
    from transformers import GenerationConfig

    gen = GenerationConfig(do_sample=False, max_new_tokens=max(r.max_tokens for r in reqs), eos_token_id=-1,
                           pad_token_id=0)
    kw = {}
    if max_batch_tokens is not None or cache_tokens is not None:
        from transformers import ContinuousBatchingConfig

        cfg = ContinuousBatchingConfig(max_batch_tokens=max_batch_tokens,
                                       num_blocks=None if cache_tokens is None else cb_blocks(cache_tokens))
        kw["continuous_batching_config"] = cfg
    with torch.no_grad(), model.continuous_batching_context_manager(generation_config=gen, block=True, timeout=30,
                                                                    warmup=warmup, **kw) as manager:
        deadline = time.perf_counter() + timeout_s  # one budget for the warm-up and the run
        ids = [manager.add_request(reqs[0].prompt, max_new_tokens=4, eos_token_id=-1)]  # warm-up
        while manager.get_result(timeout=1) is None and manager.is_running():
            if time.perf_counter() > deadline:
                raise TimeoutError(f"the warm-up request was not done after {timeout_s:.0f} s")
        _sync(model.device)
        t0 = time.perf_counter()
        ids = [manager.add_request(r.prompt, max_new_tokens=r.max_tokens, eos_token_id=-1) for r in reqs]
        done, n = set(), 0
        while len(done) < len(ids):
            if time.perf_counter() > deadline:
                raise Unfinished(len(done), len(ids), n, sum(r.max_tokens for r in reqs), time.perf_counter() - t0)
            res = manager.get_result(timeout=1)
            if res is not None and res.is_finished() and res.request_id not in done:
                if res.error:
                    raise RuntimeError(f"request {res.request_id}: {res.error}")
                done.add(res.request_id)
                n += len(res.generated_tokens)
            elif res is None and not manager.is_running():
                raise RuntimeError("transformers' generation thread stopped")
        _sync(model.device)
        wall = time.perf_counter() - t0
    return {"output_tokens": n, "wall_s": wall, "output_tok_s": n / wall,
            "attn_implementation": str(model.config._attn_implementation),
            "experts_implementation": str(getattr(model.config, "_experts_implementation", None))}


def word_tokenizer(vocab: int):
    """A fast tokenizer with one whitespace-separated word per id: ``t0`` … ``t{vocab-1}``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    # special tokens match inside words ("t1" would split "t17"): the unknown word gets a name of its own
    tok = Tokenizer(models.WordLevel({**{f"t{i}": i for i in range(vocab)}, "<unk>": vocab}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##")  # joins words with spaces
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>")


def as_text(ids: list[int]) -> str:
    return " ".join(f"t{i}" for i in ids)
