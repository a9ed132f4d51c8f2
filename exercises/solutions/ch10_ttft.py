"""Chapter 10, exercise 2, a solution: the prompt's chunks, then the decode steps (after the handoff)."""


def one_request(prompt: int, output: int, prefill, decode, budget: int, handoff_s: float,
                disaggregated: bool) -> tuple[float, float]:
    ttft, left = 0.0, prompt
    while left:  # full chunks, then the rest
        n = min(left, budget)
        ttft += prefill(n)
        left -= n
    rest = (output - 1) * decode(1) + (handoff_s if disaggregated else 0.0)
    return ttft, rest / (output - 1)
