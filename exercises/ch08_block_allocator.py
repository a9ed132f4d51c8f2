"""Chapter 8, exercise 1: a block allocator with reference counts.

The paged KV cache hands out fixed-size blocks from one pool. Two sequences whose prompts start with
the same blocks share them: each shared block counts its holders, and returns to the pool only when
the last one lets go. A server runs for weeks; a block lost on one path (an abort, a double free)
is lost for good. Complete the class:

* ``Allocator(num_blocks)``: blocks 0 … num_blocks − 1, all free;
* ``num_free()``: how many blocks are free;
* ``allocate(n)``: n distinct free blocks (a list), each now held once; if fewer than n are free,
  ValueError — and nothing taken;
* ``share(blocks)``: one more holder for each of ``blocks`` (each must be held already, else ValueError);
* ``free(blocks)``: one holder less for each; a block with no holder left is free again. Freeing a
  block that is not held (a double free) is a ValueError.

Example: ``a = Allocator(4); x = a.allocate(3); a.share(x[:2]); a.free(x)`` leaves 2 free blocks
(x[0] and x[1] are still held once); ``a.free(x[:2])`` makes all 4 free.
"""


class Allocator:
    def __init__(self, num_blocks: int):
        raise NotImplementedError("complete Allocator in exercises/ch08_block_allocator.py")

    def num_free(self) -> int:
        raise NotImplementedError

    def allocate(self, n: int) -> list[int]:
        raise NotImplementedError

    def share(self, blocks: list[int]) -> None:
        raise NotImplementedError

    def free(self, blocks: list[int]) -> None:
        raise NotImplementedError
