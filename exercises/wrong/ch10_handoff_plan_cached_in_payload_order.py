"""A wrong ch10_handoff_plan: skips the cached blocks in the payload but numbers the decode blocks from 0."""


def handoff_plan(n_prompt, block_size, dst_blocks, cached_tokens=0):
    nb = -(-n_prompt // block_size)
    if len(dst_blocks) != nb or cached_tokens % block_size or not 0 <= cached_tokens < n_prompt:
        raise ValueError("bad arguments")
    skip = cached_tokens // block_size
    return [(i, dst_blocks[i - skip]) for i in range(skip, nb)]  # the mistake: payload and table indices mixed
