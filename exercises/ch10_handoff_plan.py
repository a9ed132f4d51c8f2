"""Chapter 10, exercise 1: the block handoff plan.

A request's prompt of ``n_prompt`` tokens sits on the prefill side in blocks of ``block_size`` token
slots; the payload holds those blocks in token order (payload block i = the prompt's tokens
i·BS … i·BS + BS − 1). The decode side allocated ``dst_blocks`` for the same tokens, and its prefix
cache already held the first ``cached_tokens`` of them (a whole number of blocks). Complete
``handoff_plan(n_prompt, block_size, dst_blocks, cached_tokens)``: the list of
(payload block, decode block) pairs to write, in token order — every block the prompt occupies
(a partly filled last block too) except the cached ones.

Raise ValueError when ``dst_blocks`` does not hold exactly the prompt's blocks, or when
``cached_tokens`` is not a whole number of blocks in [0, n_prompt).

Example: 10 tokens, blocks of 4, decode blocks [3, 9, 4], 4 tokens cached → [(1, 9), (2, 4)].
"""


def handoff_plan(n_prompt: int, block_size: int, dst_blocks: list[int], cached_tokens: int = 0
                 ) -> list[tuple[int, int]]:
    raise NotImplementedError("complete handoff_plan in exercises/ch10_handoff_plan.py")
