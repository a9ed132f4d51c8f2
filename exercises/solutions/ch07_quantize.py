"""Chapter 7, exercise 1: int8 codes with a scale per group, and how far off they can be.

Quantize a weight matrix w [R, C] (fp32) as the ``int8-group128`` scheme does, for any group size:
each row is cut into groups of ``group`` consecutive columns (the last group may be shorter); a
group's scale is its amax / 127, so that its largest magnitude lands exactly on the code ±127; a
weight's code is w / scale rounded to the nearest integer (``torch.round``: a tie to the even
integer). A group of zeros gets scale 1 (and codes 0). Complete:

* ``quantize(w_RC, group)``: (codes int8 [R, C], scales fp32 [R, ceil(C / group)]);
* ``dequantize(codes_RC, scales, group)``: fp32 [R, C], every code times its group's scale;
* ``error_bound(scales, group, C)``: fp32 [R, C], for each weight the most that
  |w − dequantize(quantize(w))| can be, knowing only its group's scale. It must hold for every
  weight and be the tightest such bound: the check measures how close real errors come to it.
"""
import torch


def quantize(w_RC: torch.Tensor, group: int) -> tuple[torch.Tensor, torch.Tensor]:
    R, C = w_RC.shape
    G = -(-C // group)
    padded = w_RC.float().new_zeros(R, G * group)
    padded[:, :C] = w_RC.float()
    amax_RG = padded.abs().view(R, G, group).amax(-1)
    scale_RG = torch.where(amax_RG > 0, amax_RG / 127, torch.ones_like(amax_RG))  # amax lands on ±127
    x_RC = w_RC.float() / scale_RG.repeat_interleave(group, dim=1)[:, :C]
    return x_RC.round().to(torch.int8), scale_RG  # the nearest integer: at most half a step off


def dequantize(codes_RC: torch.Tensor, scales: torch.Tensor, group: int) -> torch.Tensor:
    return codes_RC.float() * scales.repeat_interleave(group, dim=1)[:, :codes_RC.shape[1]]


def error_bound(scales: torch.Tensor, group: int, C: int) -> torch.Tensor:
    return scales.repeat_interleave(group, dim=1)[:, :C] / 2  # rounding to the nearest: half a step
