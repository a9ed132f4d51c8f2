"""An expert counted as two H×I matrices: the gate and up projections are two, plus down."""


def experts_touched(num_experts, top_k, tokens):
    return num_experts * (1 - (1 - top_k / num_experts) ** tokens)


def expert_bytes_read(num_experts, top_k, tokens, hidden, intermediate, bytes_per_param=2):
    return experts_touched(num_experts, top_k, tokens) * 2 * hidden * intermediate * bytes_per_param
