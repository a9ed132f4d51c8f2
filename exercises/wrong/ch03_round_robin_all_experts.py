"""Every expert is a slot, used or not: programs stream the weights of experts nobody chose."""


def deal(ids_TK, num_experts, tiles, programs):
    items = [(e, j) for e in range(num_experts) for j in range(tiles)]
    return [items[p::programs] for p in range(programs)]
