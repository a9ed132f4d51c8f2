"""A tree sum, (r0 + r1) + (r2 + r3) + r4: the reduction order of a parallel sum, not k order."""
import torch


def combine(out_NH: torch.Tensor, top_k: int) -> torch.Tensor:
    rows = list(out_NH.view(-1, top_k, out_NH.shape[-1]).float().unbind(1))
    while len(rows) > 1:
        rows = [rows[i] + rows[i + 1] if i + 1 < len(rows) else rows[i] for i in range(0, len(rows), 2)]
    return rows[0].to(out_NH.dtype)
