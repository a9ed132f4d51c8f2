"""Chapter 3, exercise 2: how many experts does a decode batch read?

T tokens each choose K distinct experts of E, uniformly at random and independently of each
other. Decode streams every expert that at least one token chose, once per step.

* ``experts_touched(E, K, T)``: how many distinct experts does the batch choose, on average? A
  float, exact (the check enumerates every routing of small cases). Hint: compute, for one expert,
  the probability that no token chooses it.
* ``expert_bytes_read(E, K, T, H, I, b)``: the expected bytes of routed-expert weights a step
  reads: each touched expert is three H×I matrices of b bytes per weight.
"""


def experts_touched(num_experts: int, top_k: int, tokens: int) -> float:
    raise NotImplementedError("complete experts_touched in exercises/ch03_experts_touched.py")


def expert_bytes_read(num_experts: int, top_k: int, tokens: int, hidden: int, intermediate: int,
                      bytes_per_param: int = 2) -> float:
    raise NotImplementedError("complete expert_bytes_read in exercises/ch03_experts_touched.py")
