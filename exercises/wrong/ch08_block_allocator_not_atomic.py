"""A wrong ch08_block_allocator: alloc_not_atomic."""


class Allocator:
    def __init__(self, num_blocks: int):
        self.refs = [0] * num_blocks
        self.free_list = list(range(num_blocks))

    def num_free(self) -> int:
        return len(self.free_list)

    def allocate(self, n: int) -> list[int]:
        out = []
        for _ in range(n):  # takes blocks, then fails half way: those are gone
            if not self.free_list:
                raise ValueError("out of blocks")
            out.append(self.free_list.pop())
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
