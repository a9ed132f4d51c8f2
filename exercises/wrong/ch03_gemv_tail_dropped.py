"""The loop stops at the last full BLOCK_I: the tail of I (not a multiple) is never read."""
import torch
import triton
import triton.language as tl

import dispatch  # noqa: F401  (turns on the interpreter on a machine without CUDA)


@triton.jit
def _gemv_kernel(w_ptr, x_ptr, y_ptr, O, I, s_wo, s_wi,  # noqa: E741
                 BLOCK_O: tl.constexpr, BLOCK_I: tl.constexpr):
    offs_o = tl.program_id(0) * BLOCK_O + tl.arange(0, BLOCK_O)
    mask_o = offs_o < O
    acc = tl.zeros((BLOCK_O,), dtype=tl.float32)
    for i0 in range(0, I // BLOCK_I):
        offs_i = i0 * BLOCK_I + tl.arange(0, BLOCK_I)
        mask_i = offs_i < I
        w = tl.load(w_ptr + offs_o[:, None] * s_wo + offs_i[None, :] * s_wi,
                    mask=mask_o[:, None] & mask_i[None, :], other=0.0).to(tl.float32)
        x = tl.load(x_ptr + offs_i, mask=mask_i, other=0.0).to(tl.float32)
        acc += tl.sum(w * x[None, :], axis=1)
    tl.store(y_ptr + offs_o, acc, mask=mask_o)


def gemv(w_OI: torch.Tensor, x_I: torch.Tensor, *, block_o: int = 16, block_i: int = 32) -> torch.Tensor:
    """y_O (fp32) = w_OI @ x_I."""
    O, I = w_OI.shape  # noqa: E741
    y_O = torch.full((O,), float("nan"), device=w_OI.device)
    _gemv_kernel[(triton.cdiv(O, block_o),)](w_OI, x_I.contiguous(), y_O, O, I, *w_OI.stride(),
                                             BLOCK_O=block_o, BLOCK_I=block_i)
    return y_O
