"""The front door for kernels: every entry point a reader calls, under one import.

    from dispatch.ops import route, sort_by_expert, moe_experts, moe_decode, combine

Names load lazily (module ``__getattr__``): ``import dispatch.ops`` imports no kernel module, and
asking for ``route`` imports :mod:`dispatch.kernels.routing` alone. Each launcher has its
plain-PyTorch twin beside it (``*_torch``); :mod:`dispatch.kernels`' docstring maps the files.

    route            route, route_torch                            logits → (weights_TK, ids_TK)
    sort             sort_by_expert, sort_by_expert_torch, static_sizes   ids_TK → SortedRoutes
    experts          moe_experts (grouped GEMM), moe_experts_persistent, grouped_up_swiglu,
                     grouped_down (+ twins)
    decode           moe_decode, moe_decode_torch, decode_loop_torch, expert_bytes_read
    combine          combine, combine_torch                        the k-order sum of K rows
    quantized        moe_experts_quant, moe_decode_quant (+ twins), fp8_rows
    the decode step  linear_small, decode_attention, add_rms, qk_rope, router_topk, moe_decode_1
                     (+ twins), num_splits
    serving          paged_decode_attention, paged_prefill_attention (+ twins), gated_rows,
                     copy_blocks (+ twin: the KV handoff's copy between two block pools)
    speculative      lookup_drafts, accept_advance (+ twins): a speculative step's drafts and rollback
    tiles            resolve, GemmConfig, DecodeConfig, DenseGemvConfig, INTERPRET_CONFIG,
                     DECODE_MAX_TOKENS, pick_block_m, heuristic_decode, shared_bytes
    modules          the kernel modules by name, to read a kernel's source (``routing``, ``sort``,
                     ``grouped_gemm``, ``gemv_kernels``, ``tiles``, ...; not ``combine`` nor ``gated_rows``:
                     those names are the functions)
    shown kernels    the ``@triton.jit`` functions the chapters print: _combine_kernel,
                     _dense_gemv_kernel, _gemv_step, _decode_attn_kernel
"""
from __future__ import annotations

import importlib

_ENTRY = {
    "routing": ("route", "route_torch"),
    "sort": ("sort_by_expert", "sort_by_expert_torch", "static_sizes"),
    "grouped_gemm": ("moe_experts", "grouped_up_swiglu", "grouped_down", "grouped_up_swiglu_torch",
                     "grouped_down_torch"),
    "persistent": ("moe_experts_persistent",),
    "gemv": ("moe_decode", "moe_decode_torch", "decode_loop_torch", "expert_bytes_read"),
    "combine": ("combine", "combine_torch", "_combine_kernel"),
    "quant_grouped": ("moe_experts_quant", "moe_experts_quant_torch"),
    "quant_gemv": ("moe_decode_quant", "moe_decode_quant_torch"),
    "quant_kernels": ("fp8_rows",),
    "dense_gemv": ("linear_small", "linear_small_torch", "_dense_gemv_kernel", "_gemv_step"),
    "attention": ("decode_attention", "decode_attention_torch", "num_splits", "_decode_attn_kernel"),
    "norm_rope": ("add_rms", "add_rms_torch", "qk_rope", "qk_rope_torch"),
    "fused_moe": ("router_topk", "router_topk_torch", "moe_decode_1"),
    "paged_attention": ("paged_decode_attention", "paged_decode_attention_torch", "paged_prefill_attention",
                        "paged_prefill_attention_torch"),
    "gated_rows": ("gated_rows", "gated_rows_torch"),
    "block_copy": ("copy_blocks", "copy_blocks_reference"),
    "spec_step": ("lookup_drafts", "lookup_drafts_torch", "accept_advance", "accept_advance_torch"),
    "tiles": ("resolve", "GemmConfig", "DecodeConfig", "DenseGemvConfig", "INTERPRET_CONFIG", "DECODE_MAX_TOKENS",
              "pick_block_m", "heuristic_decode", "shared_bytes"),
}
# the kernel modules, by their own names (every file of dispatch/kernels but those named like a function above)
MODULES = ("attention", "block_copy", "decode_fused", "decode_split", "dense_gemv", "fused_moe", "gemv",
           "gemv_kernels", "grouped_gemm", "grouped_kernels", "helpers", "norm_rope", "p2p", "paged_attention", "pdl",
           "persistent", "quant_gemv", "quant_grouped", "quant_kernels", "routing", "sort", "spec_step", "tile_configs",
           "tile_rules", "tiles", "tma", "trace")
_WHERE = {name: module for module, names in _ENTRY.items() for name in names}
__all__ = sorted(set(_WHERE) | set(MODULES))


def __getattr__(name: str):
    if name in _WHERE:
        value = getattr(importlib.import_module(f"dispatch.kernels.{_WHERE[name]}"), name)
    elif name in MODULES:
        value = importlib.import_module(f"dispatch.kernels.{name}")
    else:
        raise AttributeError(f"module 'dispatch.ops' has no attribute {name!r}; it offers {__all__}")
    globals()[name] = value  # asked once
    return value


def __dir__() -> list[str]:
    return __all__
