"""Chapter 3, exercise 1: a matrix-vector product kernel, the core of decode.

``y_O = W_OI · x_I`` for one token. A program owns BLOCK_O output rows: it walks the I dimension
BLOCK_I at a time, loads a [BLOCK_O, BLOCK_I] tile of W (masked at the edges) and the matching
piece of x, accumulates ``tl.sum(w * x[None, :], axis=1)`` in fp32, and stores its BLOCK_O
outputs. Complete ``_gemv_kernel``.
"""
import torch
import triton
import triton.language as tl

import dispatch  # noqa: F401  (turns on the interpreter on a machine without CUDA)


@triton.jit
def _gemv_kernel(w_ptr, x_ptr, y_ptr, O, I, s_wo, s_wi,  # noqa: E741
                 BLOCK_O: tl.constexpr, BLOCK_I: tl.constexpr):
    pass  # your kernel here


def gemv(w_OI: torch.Tensor, x_I: torch.Tensor, *, block_o: int = 16, block_i: int = 32) -> torch.Tensor:
    """y_O (fp32) = w_OI @ x_I."""
    O, I = w_OI.shape  # noqa: E741
    y_O = torch.full((O,), float("nan"), device=w_OI.device)
    _gemv_kernel[(triton.cdiv(O, block_o),)](w_OI, x_I.contiguous(), y_O, O, I, *w_OI.stride(),
                                             BLOCK_O=block_o, BLOCK_I=block_i)
    return y_O
