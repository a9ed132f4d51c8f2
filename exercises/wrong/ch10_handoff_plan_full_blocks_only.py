"""A wrong ch10_handoff_plan: floor division drops a partly filled last block (its tokens never arrive)."""


def handoff_plan(n_prompt, block_size, dst_blocks, cached_tokens=0):
    nb = n_prompt // block_size  # the mistake: the last, partly filled block is left behind
    if len(dst_blocks) < nb:
        raise ValueError("too few blocks")
    return [(i, dst_blocks[i]) for i in range(cached_tokens // block_size, nb)]
