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
    raise NotImplementedError("complete quantize in exercises/ch07_quantize.py")


def dequantize(codes_RC: torch.Tensor, scales: torch.Tensor, group: int) -> torch.Tensor:
    raise NotImplementedError("complete dequantize in exercises/ch07_quantize.py")


def error_bound(scales: torch.Tensor, group: int, C: int) -> torch.Tensor:
    raise NotImplementedError("complete error_bound in exercises/ch07_quantize.py")
