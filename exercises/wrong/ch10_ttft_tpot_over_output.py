"""A wrong ch10_ttft: TPOT divides by every output token, the first included (it has no gap before it)."""


def one_request(prompt, output, prefill, decode, budget, handoff_s, disaggregated):
    ttft, left = 0.0, prompt
    while left:
        n = min(left, budget)
        ttft += prefill(n)
        left -= n
    rest = (output - 1) * decode(1) + (handoff_s if disaggregated else 0.0)
    return ttft, rest / output  # the mistake
