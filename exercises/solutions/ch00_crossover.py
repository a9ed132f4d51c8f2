"""Chapter 0, exercise 2: at how many tokens does an MoE layer stop being memory-bound?

The routed experts of one layer at T tokens, under uniform routing (each token picks K distinct
experts of E), with b bytes per weight and per activation value:

* FLOPs: every routed row runs its expert's three H×I matrices, 2 FLOPs per multiply-add;
* bytes: every expert the batch touches is read once (3·H·I weights), x_TH is read and y_TH
  written once. On average the batch touches E·(1 − (1 − K/E)^T) experts.

Complete:

* ``flops_and_bytes(T, E, K, H, I, b)``: (FLOPs, bytes) of the layer at T tokens, as floats;
* ``crossover(E, K, H, I, b, ridge)``: the smallest T whose FLOPs per byte reach ``ridge`` (the
  GPU's FLOP/s over its bytes/s), or None if no T does (the intensity grows with T towards a
  limit: which one?);
* ``large_batch_crossover(E, K, b, ridge)``: the T at which the intensity reaches ``ridge`` once
  every expert is read and the activations are neglected: a formula in E, K, b and the ridge
  alone. (For bf16 it is worth remembering.)
"""


def flops_and_bytes(T: int, E: int, K: int, H: int, I: int, b: int) -> tuple[float, float]:  # noqa: E741
    touched = E * (1 - (1 - K / E) ** T)
    return 2.0 * T * K * 3 * H * I, (touched * 3 * H * I + 2 * T * H) * b


def crossover(E: int, K: int, H: int, I: int, b: int, ridge: float) -> int | None:  # noqa: E741
    # FLOPs / bytes < 2·T·K·3HI / (2·T·H·b) = 3·K·I / b: a ridge at or above that is never reached
    if ridge >= 3 * K * I / b:
        return None

    def reaches(T):
        flops, nbytes = flops_and_bytes(T, E, K, H, I, b)
        return flops / nbytes >= ridge

    hi = 1
    while not reaches(hi):  # the intensity grows with T: double, then bisect
        hi *= 2
    lo = hi // 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if reaches(mid) else (mid, hi)
    return hi


def large_batch_crossover(E: int, K: int, b: int, ridge: float) -> float:
    # every expert read: FLOPs / bytes = 2·T·K·3HI / (E·3HI·b) = 2·T·K / (E·b)
    return ridge * E * b / (2 * K)
