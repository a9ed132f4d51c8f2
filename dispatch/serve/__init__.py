"""Serving many requests (chapter 8): a paged KV cache, continuous batching, an OpenAI-style server.

    from dispatch.serve import LLMEngine, EngineConfig, RequestParams
    eng = LLMEngine(model, EngineConfig(max_seqs=32), tokenizer=tok)
    outs = eng.generate([ids_a, ids_b], RequestParams(max_tokens=64))

    python -m dispatch.serve --model cpu --port 8000        # /v1/completions, /v1/models, /metrics

Files: ``blocks`` (allocator, block tables, prefix cache), ``scheduler`` (continuous batching,
chunked prefill, preemption), ``model`` (a mixed step through the lean model), ``runner`` (tables,
CUDA graphs), ``engine`` (the API), ``server`` / ``api`` / ``metrics`` (HTTP); ``speculative`` and
its helpers (chapter 9); ``disagg``, ``disagg_worker``, ``handoff``, ``disagg_model`` (prefill/decode
disaggregation, chapter 10).
The paged decode and prefill attention kernels (+ twins): :mod:`dispatch.kernels.paged_attention`.
"""
from dispatch.serve.blocks import BlockAllocator, BlockTable
from dispatch.serve.engine import EngineConfig, LLMEngine
from dispatch.serve.request import Completion, RequestOutput, RequestParams
from dispatch.serve.scheduler import QueueFull, Scheduler, SchedulerConfig, Sequence

__all__ = ["BlockAllocator", "BlockTable", "Completion", "EngineConfig", "LLMEngine", "QueueFull", "RequestOutput",
           "RequestParams", "Scheduler", "SchedulerConfig", "Sequence"]
