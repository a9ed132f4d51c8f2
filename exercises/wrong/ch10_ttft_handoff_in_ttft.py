"""A wrong ch10_ttft: the handoff delays the first token (it leaves from the prefill GPU, before the handoff)."""


def one_request(prompt, output, prefill, decode, budget, handoff_s, disaggregated):
    ttft, left = 0.0, prompt
    while left:
        n = min(left, budget)
        ttft += prefill(n)
        left -= n
    if disaggregated:
        ttft += handoff_s  # the mistake
    return ttft, decode(1)
