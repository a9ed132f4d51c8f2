"""Slots numbered in the order the experts first appear in ids_TK, not in id order."""


def deal(ids_TK, num_experts, tiles, programs):
    used = []
    for e in ids_TK.reshape(-1).tolist():
        if 0 <= e < num_experts and e not in used:
            used.append(e)
    items = [(e, j) for e in used for j in range(tiles)]
    return [items[p::programs] for p in range(programs)]
