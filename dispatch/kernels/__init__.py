"""The Triton kernels, each next to its launcher and its plain-PyTorch twin (``*_torch``).

routing.py  route: logits → (weights_TK, ids_TK) in one launch          (chapter 1)
sort.py     sort_by_expert: ids_TK → SortedRoutes, padded per expert    (chapter 1)
"""
from dispatch.kernels.routing import route, route_torch  # noqa: F401
from dispatch.kernels.sort import SortedRoutes, sort_by_expert, sort_by_expert_torch  # noqa: F401
