"""One scale per row: the groups ignored (an outlier coarsens its whole row)."""
import torch


def quantize(w_RC, group):
    R, C = w_RC.shape
    G = -(-C // group)
    amax_R = w_RC.float().abs().amax(-1, keepdim=True)
    scale_R = torch.where(amax_R > 0, amax_R / 127, torch.ones_like(amax_R))
    return (w_RC.float() / scale_R).round().to(torch.int8), scale_R.expand(R, G).contiguous()


def dequantize(codes_RC, scales, group):
    return codes_RC.float() * scales.repeat_interleave(group, dim=1)[:, :codes_RC.shape[1]]


def error_bound(scales, group, C):
    return scales.repeat_interleave(group, dim=1)[:, :C] / 2
