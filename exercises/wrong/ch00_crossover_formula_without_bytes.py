"""The large-batch formula without the bytes per weight: right for 2-byte weights only by luck."""


def flops_and_bytes(T, E, K, H, I, b):  # noqa: E741
    touched = E * (1 - (1 - K / E) ** T)
    return 2.0 * T * K * 3 * H * I, (touched * 3 * H * I + 2 * T * H) * b


def crossover(E, K, H, I, b, ridge):  # noqa: E741
    if ridge >= 3 * K * I / b:
        return None
    T = 1
    while True:
        flops, nbytes = flops_and_bytes(T, E, K, H, I, b)
        if flops / nbytes >= ridge:
            return T
        T += 1


def large_batch_crossover(E, K, b, ridge):
    return ridge * E / K
