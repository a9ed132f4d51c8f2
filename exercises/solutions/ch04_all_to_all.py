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
import torch.distributed as dist


def round_trip(x_TH: torch.Tensor, dest_TK: torch.Tensor, expert) -> torch.Tensor:
    rank, R = dist.get_rank(), dist.get_world_size()
    T, K = dest_TK.shape
    sends_TR = torch.zeros(T, R, dtype=torch.bool)
    sends_TR[torch.arange(T)[:, None].expand(T, K), dest_TK] = True  # once per (token, destination)
    dest_M, t_M = torch.nonzero(sends_TR.T, as_tuple=True)  # by destination, t order within one
    send_R = sends_TR.sum(0)
    recv_R = torch.empty_like(send_R)
    dist.all_to_all_single(recv_R, send_R)  # the counts first: one number per pair of ranks
    send, recv = send_R.tolist(), recv_R.tolist()
    rows = x_TH.new_empty(sum(recv), x_TH.shape[1])
    dist.all_to_all_single(rows, x_TH[t_M].contiguous(), recv, send)
    done = expert(rank, rows)
    back = x_TH.new_empty(len(t_M), x_TH.shape[1])
    dist.all_to_all_single(back, done.contiguous(), send, recv)  # the same way, reversed
    place_TR = torch.full((T, R), -1, dtype=torch.long)
    place_TR[t_M, dest_M] = torch.arange(len(t_M))  # where token t's result from rank d came back
    return back[place_TR[torch.arange(T)[:, None], dest_TK]]
