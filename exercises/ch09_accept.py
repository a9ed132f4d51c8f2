"""Chapter 9, exercise 2: greedy acceptance and the rollback, on the device.

A verify step fed each row b the tokens [t, d_1, …, d_k] at positions pos_b … pos_b + k and got
logits [B, k+1, V]: position j's logits say what comes after its token. Complete, with no Python
loop over rows and no ``.item()``, ``.tolist()`` or ``if`` on a tensor (a CUDA graph cannot wait
for the host):

* ``greedy_accept(drafts_BK, logits_BK1V)`` → ``(out_BK1, n_B)``: out = the argmax of every
  position (int64 [B, k+1]); n = how many drafts, from the first, equal the argmax before them
  (d_{j+1} == out[:, j]) — counting stops at the first that does not (int64 [B]);
* ``advance(hist_BS, pos_B, out_BK1, n_B)``: the row keeps its n drafts and the target's own next
  token: write ``out[b, :n_b + 1]`` into ``hist_BS[b]`` at positions pos_b + 1 … pos_b + n_b + 1,
  leave every other position as it is (the rejected tail must not be written; ``hist_BS`` has room:
  pos_b + k + 1 < S), and move
  ``pos_B`` (in place) by n + 1. That is the whole rollback: the KV cache entries of the rejected
  drafts sit past the new position, where no attention reads and the next step writes.

Example: drafts [[5, 7, 2]], argmaxes [[5, 7, 9, 4]] → n [2]; with pos [3] the tokens 5, 7, 9 go to
positions 4, 5, 6 and pos becomes 6.
"""
import torch


def greedy_accept(drafts_BK: torch.Tensor, logits_BK1V: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    raise NotImplementedError("complete greedy_accept in exercises/ch09_accept.py")


def advance(hist_BS: torch.Tensor, pos_B: torch.Tensor, out_BK1: torch.Tensor, n_B: torch.Tensor) -> None:
    raise NotImplementedError("complete advance in exercises/ch09_accept.py")
