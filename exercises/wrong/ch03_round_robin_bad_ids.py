"""torch.unique's ids as slots: an id outside [0, E) becomes a slot of its own."""
import torch


def deal(ids_TK, num_experts, tiles, programs):
    items = [(e, j) for e in torch.unique(ids_TK).tolist() for j in range(tiles)]
    return [items[p::programs] for p in range(programs)]
