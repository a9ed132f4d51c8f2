"""Chapter 6, exercise 2: batch buckets for CUDA graphs.

A graph fixes its shapes, so the engine records one decode step per bucket and runs a batch of B
rows in the smallest bucket that holds it: B real rows and bucket − B dummy ones, computed and
dropped. More buckets mean more graphs to record and keep; fewer mean more dummy rows. Complete:

* ``bucket(batch, buckets)``: the smallest of ``buckets`` (ascending) holding ``batch`` rows;
  ValueError for a batch below 1 or above the largest bucket;
* ``worst_padding(buckets)``: the largest share of dummy rows, ``(bucket − B) / bucket``, over
  every batch B = 1 … max(buckets).

Example: buckets (1, 2, 4, 8): bucket(5) = 8, and batch 5 is the worst case: 3 dummy rows of 8,
0.375.
"""

BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)


def bucket(batch: int, buckets: tuple[int, ...] = BUCKETS) -> int:
    for b in buckets:
        if 1 <= batch <= b:
            return b
    raise ValueError(f"batch must be 1..{buckets[-1]}, got {batch}")


def worst_padding(buckets: tuple[int, ...] = BUCKETS) -> float:
    # within a bucket the smallest batch pads most: one more than the bucket below
    lows = [1, *(b + 1 for b in buckets[:-1])]
    return max((b - low) / b for low, b in zip(lows, buckets, strict=True))
