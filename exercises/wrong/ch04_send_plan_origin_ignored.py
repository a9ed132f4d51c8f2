"""Replica j = t mod (replicas), the same on every rank: the origin rank left out of the rule."""
import torch


def dest_ranks(ids_TK, slots_RS, origin_rank):
    E = 1 + max(e for row in slots_RS for e in row)
    replicas_E = [[r for r, row in enumerate(slots_RS) if e in row] for e in range(E)]
    T, K = ids_TK.shape
    return torch.tensor([[replicas_E[e][t % len(replicas_E[e])] for e in ids_TK[t].tolist()] for t in range(T)],
                        dtype=torch.int64).view(T, K)


def send_counts(dest_TK, num_ranks):
    sends_TR = torch.zeros(dest_TK.shape[0], num_ranks, dtype=torch.bool)
    sends_TR.scatter_(1, dest_TK.long(), True)
    return sends_TR.sum(0)
