"""The tail lanes past E read as 0, not -inf: a row of negative logits picks a lane that is no expert."""
import torch
import triton
import triton.language as tl

import dispatch  # noqa: F401  (turns on the interpreter on a machine without CUDA)


@triton.jit
def _top1_kernel(logits_ptr, weight_ptr, id_ptr, E, stride_t, BLOCK_E: tl.constexpr):
    t = tl.program_id(0)
    offs = tl.arange(0, BLOCK_E)
    mask = offs < E
    x = tl.load(logits_ptr + t * stride_t + offs, mask=mask, other=0.0).to(tl.float32)
    m = tl.max(x, axis=0)
    denom = tl.sum(tl.where(mask, tl.exp(x - m), 0.0), axis=0)
    tl.store(weight_ptr + t, tl.exp(tl.max(tl.where(mask, x, float("-inf")), axis=0) - m) / denom)
    tl.store(id_ptr + t, tl.argmax(x, axis=0))


def top1(logits_TE: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    T, E = logits_TE.shape
    weight_T = torch.full((T,), float("nan"), device=logits_TE.device)
    id_T = torch.full((T,), -1, dtype=torch.int32, device=logits_TE.device)
    if T:
        _top1_kernel[(T,)](logits_TE, weight_T, id_T, E, logits_TE.stride(0),
                           BLOCK_E=triton.next_power_of_2(E))
    return weight_T, id_T
