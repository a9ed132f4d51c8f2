"""Chapter 3, exercise 2: how many experts does a decode batch read?

With T tokens each choosing K distinct experts of E uniformly at random, an expert escapes a
token with probability 1 − K/E, so the expected number of distinct experts read is
E · (1 − (1 − K/E)^T). Decode streams each touched expert's weights once per step.

Complete ``experts_touched`` (that expectation, a float) and ``expert_bytes_read`` (the expected
bytes of routed-expert weights a step reads: touched experts × 3·H·I parameters × bytes each).
"""


def experts_touched(num_experts: int, top_k: int, tokens: int) -> float:
    raise NotImplementedError("complete experts_touched in exercises/ch03_experts_touched.py")


def expert_bytes_read(num_experts: int, top_k: int, tokens: int, hidden: int, intermediate: int,
                      bytes_per_param: int = 2) -> float:
    raise NotImplementedError("complete expert_bytes_read in exercises/ch03_experts_touched.py")
