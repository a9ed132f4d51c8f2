"""Chapter 10, exercise 1, a solution: the blocks of the prompt past the cached ones, in order."""


def handoff_plan(n_prompt: int, block_size: int, dst_blocks: list[int], cached_tokens: int = 0
                 ) -> list[tuple[int, int]]:
    nb = -(-n_prompt // block_size)  # a partly filled last block travels too
    if len(dst_blocks) != nb:
        raise ValueError(f"{n_prompt} tokens need {nb} blocks of {block_size}, got {len(dst_blocks)}")
    if cached_tokens % block_size or not 0 <= cached_tokens < n_prompt:
        raise ValueError(f"cached_tokens must be whole blocks short of the prompt, got {cached_tokens}")
    return [(i, dst_blocks[i]) for i in range(cached_tokens // block_size, nb)]
