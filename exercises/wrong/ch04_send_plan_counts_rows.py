"""Send counts of routed rows, not of tokens: a token two of whose rows go to one rank counted twice."""
import torch


def dest_ranks(ids_TK, slots_RS, origin_rank):
    E = 1 + max(e for row in slots_RS for e in row)
    replicas_E = [[r for r, row in enumerate(slots_RS) if e in row] for e in range(E)]
    T, K = ids_TK.shape
    return torch.tensor([[replicas_E[e][(origin_rank + t) % len(replicas_E[e])] for e in ids_TK[t].tolist()]
                         for t in range(T)], dtype=torch.int64).view(T, K)


def send_counts(dest_TK, num_ranks):
    return torch.bincount(dest_TK.reshape(-1).long(), minlength=num_ranks)
