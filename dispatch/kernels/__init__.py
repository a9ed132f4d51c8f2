"""The Triton kernels, each next to its launcher and its plain-PyTorch twin (``*_torch``).

checks.py        the one experts-input validator and the bad-id policy
routing.py       route: logits → (weights_TK, ids_TK) in one launch              (chapter 1)
sort.py          sort_by_expert: ids_TK → SortedRoutes, padded per expert        (chapter 1)
grouped_gemm.py  moe_experts: sort → grouped up+SwiGLU → grouped down → combine  (chapter 2)
persistent.py    the same with persistent kernels (a benchmark contestant)       (chapter 2)
gemv.py          moe_decode: grouped GEMV kernels for 1–64 tokens                (chapter 3)
trace.py         a timeline of the decode kernels' items on the SMs (GPU only)   (chapter 3)
combine.py       combine: the one k-order sum of a token's K routed rows
pdl.py           programmatic dependent launch: the decode step's kernels start early    (chapter 6)

Import the modules themselves (``from dispatch.kernels.routing import route``): this package
imports none of them, so the plain-PyTorch parts of ``dispatch`` load without compiling kernels.
"""
