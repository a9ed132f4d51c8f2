"""A wrong ch10_handoff_plan: sends every block, overwriting the ones the decode side shares from its cache."""


def handoff_plan(n_prompt, block_size, dst_blocks, cached_tokens=0):
    nb = -(-n_prompt // block_size)
    if len(dst_blocks) != nb or cached_tokens % block_size or not 0 <= cached_tokens < n_prompt:
        raise ValueError("bad arguments")
    return [(i, dst_blocks[i]) for i in range(nb)]  # the mistake: cached blocks are written again
