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
        self.refs = [0] * num_blocks
        self.free_list = list(range(num_blocks))

    def num_free(self) -> int:
        return len(self.free_list)

    def allocate(self, n: int) -> list[int]:
        if n > len(self.free_list):  # check first: a failed call takes nothing
            raise ValueError(f"{n} blocks asked for, {len(self.free_list)} free")
        out = [self.free_list.pop() for _ in range(n)]
        for b in out:
            self.refs[b] = 1
        return out

    def share(self, blocks: list[int]) -> None:
        if any(self.refs[b] == 0 for b in blocks):
            raise ValueError("only a held block can be shared")
        for b in blocks:
            self.refs[b] += 1

    def free(self, blocks: list[int]) -> None:
        for b in blocks:
            if self.refs[b] == 0:
                raise ValueError(f"block {b} is not held (a double free)")
            self.refs[b] -= 1
            if self.refs[b] == 0:
                self.free_list.append(b)
