"""A wrong ch09_accept: counts every draft that matches, not only the leading run of matches."""
import torch


def greedy_accept(drafts_BK: torch.Tensor, logits_BK1V: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    out_BK1 = logits_BK1V.argmax(dim=-1)
    match_BK = drafts_BK.long() == out_BK1[:, :-1]
    return out_BK1, match_BK.long().sum(dim=1)  # a match after a miss counts too: the mistake


def advance(hist_BS: torch.Tensor, pos_B: torch.Tensor, out_BK1: torch.Tensor, n_B: torch.Tensor) -> None:
    j = torch.arange(out_BK1.shape[1], device=pos_B.device)[None, :]
    idx = (pos_B[:, None] + 1 + j).clamp(max=hist_BS.shape[1] - 1)
    keep = hist_BS.gather(1, idx)
    hist_BS.scatter_(1, idx, torch.where(j <= n_B[:, None], out_BK1, keep))
    pos_B.add_(n_B + 1)
