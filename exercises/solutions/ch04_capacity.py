"""Chapter 4, exercise 3: the fixed-capacity send buffer of low-latency mode.

With a capacity of C tokens, destination d owns rows d·C … d·C + C − 1 of an [R·C, …] send buffer
whatever the routing, so the sizes never change and nobody waits for the host to learn them.
Token t goes to rank d when ``sends_TR[t, d]`` is True; it sits at row d·C + p, where p counts the
tokens before t (in t order) that also go to d. Complete:

* ``capacity_rows(sends_TR, capacity)``: int64 [T, R], that row, or -1 where t does not go to d.
  Raise ValueError (naming the capacity) when C < 1 or some destination gets more than C tokens.
* ``padded_fraction(sends_TR, capacity)``: the share of the buffer's R·C rows that carry no token
  (they travel all the same: the price of fixed sizes). T may be 0.

Example: sends_TR [[1, 1], [0, 1], [1, 0]], C = 3 → rows [[0, 3], [-1, 4], [1, -1]]; 4 of the 6
rows carry a token, so the padded fraction is 1/3.
"""
import torch


def capacity_rows(sends_TR: torch.Tensor, capacity: int) -> torch.Tensor:
    T, R = sends_TR.shape
    most = int(sends_TR.sum(0).max()) if T else 0
    if capacity < max(most, 1):
        raise ValueError(f"capacity must be >= 1 and >= the {most} tokens sent to one rank, got {capacity}")
    pos_TR = sends_TR.long().cumsum(0) - 1  # tokens before t that go to d
    rows_TR = torch.arange(R) * capacity + pos_TR
    return torch.where(sends_TR, rows_TR, -1)


def padded_fraction(sends_TR: torch.Tensor, capacity: int) -> float:
    return 1 - int(sends_TR.sum()) / (sends_TR.shape[1] * capacity)
