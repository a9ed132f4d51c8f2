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
    # one token misses a given expert with probability 1 - K/E, all T tokens with (1 - K/E)^T;
    # by linearity of expectation the mean count is E times the chance that some token hits it
    return num_experts * (1 - (1 - top_k / num_experts) ** tokens)


def expert_bytes_read(num_experts: int, top_k: int, tokens: int, hidden: int, intermediate: int,
                      bytes_per_param: int = 2) -> float:
    return experts_touched(num_experts, top_k, tokens) * 3 * hidden * intermediate * bytes_per_param
