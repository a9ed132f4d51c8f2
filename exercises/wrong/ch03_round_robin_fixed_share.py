"""A fixed share of the programs per used expert: G // slots programs each deal that expert's tiles."""


def deal(ids_TK, num_experts, tiles, programs):
    used = sorted({e for e in ids_TK.reshape(-1).tolist() if 0 <= e < num_experts})
    out = [[] for _ in range(programs)]
    if not used:
        return out
    share = max(programs // len(used), 1)
    for s, e in enumerate(used):
        for j in range(tiles):
            out[(s * share + j % share) % programs].append((e, j))
    return out
