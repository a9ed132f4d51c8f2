"""Chapter 4, exercise 2: the rows leave grouped by destination and come home in n order.

To send its N = T·K routed rows, a rank lays them out grouped by destination: every row for rank 0
first, then every row for rank 1, and so on, in n order within a destination (a stable sort by
``dest_N``). The computed rows come back in that same layout. Complete, with tensor operations
(no Python loop over rows):

* ``send_order(dest_N)``: int64 [N], the routed row n at each place of that layout;
* ``home_rows(dest_N)``: int64 [N], the place of each routed row n in the layout: the inverse
  permutation, so that ``back_NH[home_rows(dest_N)]`` puts the returned rows back in n order.

Example: dest_N [1, 0, 1, 0] → send_order [1, 3, 0, 2] and home_rows [2, 0, 3, 1]: row 0's result
comes back third.
"""
import torch


def send_order(dest_N: torch.Tensor) -> torch.Tensor:
    return torch.argsort(dest_N, stable=True)


def home_rows(dest_N: torch.Tensor) -> torch.Tensor:
    order_N = send_order(dest_N)
    home_N = torch.empty_like(order_N)
    home_N[order_N] = torch.arange(order_N.numel())
    return home_N
