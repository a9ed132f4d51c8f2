"""Program p takes a contiguous chunk of ceil(items / G) items: the last programs get fewer, or none."""


def deal(ids_TK, num_experts, tiles, programs):
    used = sorted({e for e in ids_TK.reshape(-1).tolist() if 0 <= e < num_experts})
    items = [(e, j) for e in used for j in range(tiles)]
    size = -(-len(items) // programs)
    return [items[p * size:(p + 1) * size] for p in range(programs)]
