"""The T·K picks taken as independent draws of one expert each: a token's K experts are distinct."""


def experts_touched(num_experts, top_k, tokens):
    return num_experts * (1 - (1 - 1 / num_experts) ** (tokens * top_k))


def expert_bytes_read(num_experts, top_k, tokens, hidden, intermediate, bytes_per_param=2):
    return experts_touched(num_experts, top_k, tokens) * 3 * hidden * intermediate * bytes_per_param
