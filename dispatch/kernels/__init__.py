"""The Triton kernels, each next to its launcher and its plain-PyTorch twin (``*_torch``).

Every ``@triton.jit`` function of the package lives here (tests/test_kernels_map.py checks it, and
this map against the folder). The entry points a reader calls are re-exported by :mod:`dispatch.ops`.

routing.py          route: logits → (weights_TK, ids_TK) in one launch                  (chapter 1)
sort.py             sort_by_expert: ids_TK → SortedRoutes, padded per expert            (chapter 1)
grouped_gemm.py     moe_experts: sort → grouped up+SwiGLU → grouped down → combine      (chapter 2)
grouped_kernels.py  the grouped GEMM's up and down kernels                              (chapter 2)
persistent.py       the same with persistent kernels (a benchmark contestant)           (chapter 2)
tma.py              Hopper's tensor memory accelerator: descriptors for the weight tiles (chapter 2)
combine.py          combine: the k-order sum of a token's K routed rows                 (chapter 2)
gemv.py             moe_decode: grouped GEMV kernels for 1–64 tokens                    (chapter 3)
gemv_kernels.py     the decode path's up and down kernels and their item bodies         (chapter 3)
decode_fused.py     the decode path in one launch (up, down and combine by ticket)      (chapter 3)
decode_split.py     the decode path in one launch of split-I items, then a reduction    (chapter 3)
trace.py            a timeline of the decode kernels' items on the SMs (GPU only)       (chapter 3)
p2p.py              expert parallelism's peer-to-peer copies and flags                  (chapter 4)
dense_gemv.py       linear_small: the decode step's dense GEMV for 1–16 rows            (chapter 6)
norm_rope.py        the decode step's glue: residual + RMSNorm; q/k norm + RoPE + cache (chapter 6)
attention.py        decode attention over a static KV cache (flash-decoding)           (chapter 6)
fused_moe.py        batch 1: router + top-K in one kernel, down + combine in one        (chapter 6)
paged_attention.py  attention through a block table: paged decode and chunked prefill   (chapter 8)
block_copy.py       copy_blocks: paged-cache blocks from one pool into another, one pass (chapter 10)
spec_step.py        the speculative step: lookup drafts; greedy accept + rollback     (chapter 9)
gated_rows.py       act(a)·b row by row: batch-invariant mode's gated products           (chapter 9)
pdl.py              programmatic dependent launch: the decode step's kernels start early (chapter 6)
quant_kernels.py    8-bit weight operands (QUANT), fp8 activation rows (w8a8)           (chapter 7)
quant_gemv.py       moe_decode_quant: the decode path on int8 / fp8 codes               (chapter 7)
quant_grouped.py    moe_experts_quant: the grouped GEMM on int8 / fp8 codes, w8a16 or w8a8 (chapter 7)
helpers.py          the jit pieces kernels share: SwiGLU, top-K, the k-order sum
tiles.py            the one tile resolver: every launch config and its source (pinned, table, heuristic)
tile_configs.py     the launch configs, the named ones, and what fits a device
tile_rules.py       the heuristics the resolver falls back to without a table

Import the modules themselves (``from dispatch.kernels.routing import route``, or :mod:`dispatch.ops`):
this package imports none of them, so the plain-PyTorch parts of ``dispatch`` load without kernels.
"""
