"""min(T·K, E): as if no two tokens ever chose the same expert until all are used."""


def experts_touched(num_experts, top_k, tokens):
    return float(min(tokens * top_k, num_experts))


def expert_bytes_read(num_experts, top_k, tokens, hidden, intermediate, bytes_per_param=2):
    return experts_touched(num_experts, top_k, tokens) * 3 * hidden * intermediate * bytes_per_param
