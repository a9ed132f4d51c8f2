"""Chapter 4, exercise 4: one all-to-all round trip, on real ranks.

Every rank of the default process group (gloo, one process per rank) holds its own tokens x_TH and,
for each of their K routed rows, the rank that computes it: dest_TK (exercise 1's rule). Move the
rows as an expert-parallel layer does, with ``torch.distributed.all_to_all_single``:

1. token t travels once to every distinct rank of its row dest_TK[t], however many of its K rows
   that rank computes; a rank's rows leave grouped by destination (rank 0's first), in t order
   within one;
2. all_to_all_single needs, on every rank, the number of rows it receives from each rank before
   the rows move: exchange the counts first (an all-to-all of one count per pair of ranks, in a
   1-D tensor);
3. the receiving rank calls ``expert(its rank, rows)`` once, on all the rows it received;
4. the results go home the same way, reversed, and land on their rows: the output out_TKH
   [T, K, H] holds at [t, k] the result computed for token t by rank dest_TK[t, k].

Complete ``round_trip(x_TH, dest_TK, expert)``; T may be 0 on a rank. Rows (tensors of two or more
dimensions) move only through all_to_all_single; the check counts them.
"""
import torch
import torch.distributed as dist  # noqa: F401  (what round_trip needs)


def round_trip(x_TH: torch.Tensor, dest_TK: torch.Tensor, expert) -> torch.Tensor:
    raise NotImplementedError("complete round_trip in exercises/ch04_all_to_all.py")
