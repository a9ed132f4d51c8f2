"""Chapter 4, exercise 1: who computes each routed row, and how many tokens go to each rank.

A placement's ``slots_RS[r]`` lists the experts rank r holds (in any order; a row may be empty).
Routed row n = t·K + k of a token on rank ``origin_rank`` is computed by a rank holding expert
``ids_TK[t, k]``; when several ranks hold it (its replicas r_0 < r_1 < …, ascending), by r_j with
j = (origin_rank + t) mod (number of replicas).

Complete ``dest_ranks`` (int64 [T, K]: the rank computing each row) and ``send_counts`` (int64
[R]: how many tokens this rank sends to each rank, the split sizes of the all-to-all). A token
travels to a rank once, however many of its K rows that rank computes, and the tokens a rank
keeps for itself count too (the diagonal). T may be 0.

Example: slots_RS ((0, 1), (2, 3)), ids_TK [[0, 2], [1, 0], [3, 2]], origin_rank 0 →
dest_TK [[0, 1], [0, 0], [1, 1]], send counts [2, 2]. With slots_RS ((0, 1, 2), (0, 3)) expert 0
has replicas (0, 1): token 0 of rank 1 sends its expert-0 row to rank 1, token 1 to rank 0.
"""
import torch


def dest_ranks(ids_TK: torch.Tensor, slots_RS: tuple[tuple[int, ...], ...], origin_rank: int) -> torch.Tensor:
    raise NotImplementedError("complete dest_ranks in exercises/ch04_send_plan.py")


def send_counts(dest_TK: torch.Tensor, num_ranks: int) -> torch.Tensor:
    raise NotImplementedError("complete send_counts in exercises/ch04_send_plan.py")
