"""One copy per routed row, not per destination: a token two of whose rows go to one rank travels twice."""
import torch
import torch.distributed as dist


def round_trip(x_TH, dest_TK, expert):
    rank, R = dist.get_rank(), dist.get_world_size()
    T, K = dest_TK.shape
    order = torch.argsort(dest_TK.reshape(-1), stable=True)  # routed rows by destination
    send_R = torch.bincount(dest_TK.reshape(-1), minlength=R)
    recv_R = torch.empty_like(send_R)
    dist.all_to_all_single(recv_R, send_R)
    send, recv = send_R.tolist(), recv_R.tolist()
    rows = x_TH.new_empty(sum(recv), x_TH.shape[1])
    dist.all_to_all_single(rows, x_TH[order // K].contiguous(), recv, send)
    back = x_TH.new_empty(T * K, x_TH.shape[1])
    dist.all_to_all_single(back, expert(rank, rows).contiguous(), send, recv)
    out = torch.empty_like(back)
    out[order] = back
    return out.view(T, K, x_TH.shape[1])
