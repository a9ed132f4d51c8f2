"""A wrong ch10_ttft: the whole prompt in one prefill step, ignoring the budget (no chunks)."""


def one_request(prompt, output, prefill, decode, budget, handoff_s, disaggregated):
    rest = (output - 1) * decode(1) + (handoff_s if disaggregated else 0.0)
    return prefill(prompt), rest / (output - 1)  # the mistake: prefill(prompt) for a prompt over the budget
