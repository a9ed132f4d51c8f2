"""A wrong ch08_block_allocator: alloc_leak."""


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
            if self.refs[b] == 1:  # a shared block is dropped without counting down: it never comes back
                self.free_list.append(b)
            self.refs[b] = 0
