"""Chapter 3, exercise 3: the decode kernels' work, dealt round-robin.

A decode kernel runs a fixed grid of G programs, whatever the batch. Its work is a flat list of
*items*, one per (slot, tile): the slots are the experts the batch uses (chosen by at least one
routed row), numbered in id order; each slot has ``tiles`` tiles; item i is slot i // tiles,
tile i % tiles (slot-major). Program p streams items p, p + G, p + 2G, … An id outside [0, E)
is no expert: it makes no slot.

Complete ``deal(ids_TK, num_experts, tiles, programs)``: for every program p, the list of
(expert id, tile) pairs it streams, in the order it streams them.

Example: ids_TK [[3, 0], [3, 1]], E 5, tiles 2, G 3 → slots are experts (0, 1, 3); the items
(0, 0) (0, 1) (1, 0) (1, 1) (3, 0) (3, 1); program 0 streams [(0, 0), (1, 1)], program 1
[(0, 1), (3, 0)], program 2 [(1, 0), (3, 1)]. (Why not give each used expert its own share of
the programs instead? The chapter counts what that costs.)
"""
import torch


def deal(ids_TK: torch.Tensor, num_experts: int, tiles: int, programs: int) -> list[list[tuple[int, int]]]:
    ids = ids_TK.reshape(-1)
    used_E = torch.zeros(num_experts, dtype=torch.bool)
    used_E[ids[(ids >= 0) & (ids < num_experts)]] = True
    slots = torch.nonzero(used_E).flatten().tolist()  # the used experts, in id order
    items = [(e, j) for e in slots for j in range(tiles)]  # item i = (slot i // tiles, tile i % tiles)
    return [items[p::programs] for p in range(programs)]
