"""The one validator of the routed-experts contract, and the one bad-id policy.

Every launcher (``moe_experts``, ``moe_decode``, ``moe_experts_persistent``) and every twin calls
:func:`check_experts_inputs` before anything runs, so a bad call fails the same way, with the same
message, on every path.

Bad-id policy (the same on every path and device, with no host sync):
    an expert id outside [0, E) never addresses memory and contributes nothing to the output
    (the kernels mask it, the sort places its row in no expert's block, the twins skip it);
    ``check_ids=True`` turns that into a ValueError naming the ids (one device→host sync).
Non-finite tokens: a token whose router logits are NaN/Inf still gets K valid, distinct ids; its
weights are NaN, so its output row is non-finite (as in :func:`dispatch.reference.moe_reference`),
and no other row is disturbed (rows never mix inside a GEMM, and the combine sums a token's own rows).
"""
from __future__ import annotations

import torch

from dispatch import runtime


def check_tensor(name: str, t, *, dims: int | None = None) -> None:
    """Raise ValueError unless ``t`` is a tensor (of ``dims`` dimensions)."""
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if dims is not None and t.dim() != dims:
        raise ValueError(f"{name} must have {dims} dimensions, got shape {tuple(t.shape)}")


def check_launch(what: str, t: torch.Tensor, *, widens_bf16: bool = False) -> None:
    """Raise ValueError unless a Triton kernel can compute on ``t`` here: a CUDA tensor, or a CPU
    tensor under Triton's interpreter in float32/float16 (the interpreter mis-loads bf16, unless the
    launcher widens it to fp32 first: ``widens_bf16``)."""
    if not runtime.triton_ok(t):
        raise ValueError(f"{what} needs a CUDA tensor, or a CPU tensor under Triton's interpreter "
                         f"(TRITON_INTERPRET=1); got {t.device} with interpreter={runtime.INTERPRET}")
    if t.is_floating_point() and t.dtype not in (torch.float32, torch.float16, torch.bfloat16):
        raise ValueError(f"{what} computes in float32, float16 or bfloat16 (the Triton kernels); got {t.dtype}: "
                         "cast the input and weights, or use the plain-PyTorch path (path='torch')")
    if t.device.type == "cpu" and t.dtype == torch.bfloat16 and not widens_bf16:
        raise ValueError(f"{what} cannot compute bfloat16 under Triton's CPU interpreter (it mis-loads bf16): "
                         "use float32 or float16 on CPU, or the plain-PyTorch path")


def check_ids_in_range(ids_TK: torch.Tensor, num_experts: int) -> None:
    """Raise ValueError if an id lies outside [0, E) (the opt-in ``check_ids=True``; one host sync)."""
    if ids_TK.numel() == 0:
        return
    bad = (ids_TK < 0) | (ids_TK >= num_experts)
    n_bad = int(bad.sum())
    if n_bad:
        where = tuple(int(i) for i in torch.nonzero(bad)[0])
        raise ValueError(f"ids_TK must hold expert ids in [0, E={num_experts}): {n_bad} do not, the first "
                         f"ids_TK[{where[0]}, {where[1]}] = {int(ids_TK[where])} (check_ids=True; without it such "
                         "rows contribute nothing)")


def check_routing_inputs(x_TH, weights_TK, ids_TK, num_experts: int, *,
                         check_ids: bool = False) -> tuple[int, int]:
    """The routing half of the contract (also what expert parallelism checks before sending tokens):
    x_TH [T, H] floating, ids_TK [T, K] int32/int64 with 1 <= K <= E, weights_TK floating like ids_TK,
    all three on one device. ``check_ids``: also refuse ids outside [0, E). Returns (T, K)."""
    for name, t in (("x_TH", x_TH), ("weights_TK", weights_TK), ("ids_TK", ids_TK)):
        check_tensor(name, t)
    if x_TH.dim() != 2 or not x_TH.is_floating_point():
        raise ValueError(f"x_TH must be a floating [T, H] tensor, got {x_TH.dtype} {tuple(x_TH.shape)}")
    T = x_TH.shape[0]
    if ids_TK.dim() != 2 or ids_TK.shape[0] != T or ids_TK.shape[1] < 1:
        raise ValueError(f"ids_TK must be [T={T}, K >= 1], got {tuple(ids_TK.shape)}")
    if ids_TK.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"ids_TK must be int32 or int64, got {ids_TK.dtype}")
    if tuple(weights_TK.shape) != tuple(ids_TK.shape) or not weights_TK.is_floating_point():
        raise ValueError(f"weights_TK must be a floating tensor shaped like ids_TK {tuple(ids_TK.shape)}, "
                         f"got {weights_TK.dtype} {tuple(weights_TK.shape)}")
    K = ids_TK.shape[1]
    if K > num_experts:
        raise ValueError(f"K={K} experts per token is more than the E={num_experts} experts there are")
    devices = {t.device for t in (x_TH, weights_TK, ids_TK)}
    if len(devices) > 1:
        raise ValueError(f"all inputs must be on one device, got {sorted(map(str, devices))}")
    if check_ids:
        check_ids_in_range(ids_TK, num_experts)
    return T, K


def check_experts_inputs(x_TH, weights_TK, ids_TK, gate_up_E2IH, down_EHI, *,
                         check_ids: bool = False) -> tuple[int, int, int, int, int]:
    """Raise ValueError naming what was expected, before any kernel runs; return (T, K, E, H, I).

    x_TH [T, H] floating; weights_TK [T, K] floating; ids_TK [T, K] int32/int64 with 1 <= K <= E;
    gate_up_E2IH [E, 2I, H] and down_EHI [E, H, I] in x's dtype; all on one device.
    ``check_ids``: also refuse ids outside [0, E) (one host sync; by default they add nothing).
    """
    for name, t in (("x_TH", x_TH), ("gate_up_E2IH", gate_up_E2IH), ("down_EHI", down_EHI)):
        check_tensor(name, t)
    if x_TH.dim() != 2 or not x_TH.is_floating_point():
        raise ValueError(f"x_TH must be a floating [T, H] tensor, got {x_TH.dtype} {tuple(x_TH.shape)}")
    H = x_TH.shape[1]
    if gate_up_E2IH.dim() != 3 or gate_up_E2IH.shape[2] != H or gate_up_E2IH.shape[1] % 2 or not gate_up_E2IH.shape[1]:
        raise ValueError(f"gate_up_E2IH must be [E, 2I, H={H}] with I >= 1, got {tuple(gate_up_E2IH.shape)}")
    E, I = gate_up_E2IH.shape[0], gate_up_E2IH.shape[1] // 2  # noqa: E741
    if tuple(down_EHI.shape) != (E, H, I):
        raise ValueError(f"down_EHI must be [E={E}, H={H}, I={I}], got {tuple(down_EHI.shape)}")
    T, K = check_routing_inputs(x_TH, weights_TK, ids_TK, E)
    if not (x_TH.dtype == gate_up_E2IH.dtype == down_EHI.dtype):
        raise ValueError(f"x_TH, gate_up_E2IH and down_EHI must share one dtype, got "
                         f"{x_TH.dtype}, {gate_up_E2IH.dtype}, {down_EHI.dtype}")
    devices = {t.device for t in (x_TH, gate_up_E2IH, down_EHI)}
    if len(devices) > 1:
        raise ValueError(f"all inputs must be on one device, got {sorted(map(str, devices))}")
    if check_ids:
        check_ids_in_range(ids_TK, E)
    return T, K, E, H, I


def via_op(*tensors) -> bool:
    """Call a kernel through its registered ``torch.library`` op (rather than its implementation,
    the very same function)? Yes under ``torch.compile`` (the graph then holds the op) and when
    autograd records (a backward then raises); otherwise the ~10 µs of op dispatch are skipped."""
    if torch.compiler.is_compiling():
        return True
    return torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)


def no_backward(op, name: str) -> None:
    """Register an autograd formula on a ``torch.library`` op that fails loudly at backward."""

    def backward(ctx, *grads):
        raise RuntimeError(f"{name} (a Triton kernel) has no backward: gradients would be lost. "
                           "Train through the plain-PyTorch path (path='torch' / MoELayer(path='torch')).")

    op.register_autograd(backward, setup_context=lambda ctx, inputs, output: None)
