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
    raise NotImplementedError("complete bucket in exercises/ch06_bucket.py")


def worst_padding(buckets: tuple[int, ...] = BUCKETS) -> float:
    raise NotImplementedError("complete worst_padding in exercises/ch06_bucket.py")
