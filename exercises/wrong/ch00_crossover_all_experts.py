"""Every expert read at every T: the small batch that touches a few experts not seen."""


def flops_and_bytes(T, E, K, H, I, b):  # noqa: E741
    return 2.0 * T * K * 3 * H * I, (E * 3 * H * I + 2 * T * H) * b


def crossover(E, K, H, I, b, ridge):  # noqa: E741
    T = 1
    while T < 10 ** 7:
        flops, nbytes = flops_and_bytes(T, E, K, H, I, b)
        if flops / nbytes >= ridge:
            return T
        T += 1
    return None


def large_batch_crossover(E, K, b, ridge):
    return ridge * E * b / (2 * K)
