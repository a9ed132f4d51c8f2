"""The worst padding measured at the bucket below (B = previous bucket), not one above it."""
BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)


def bucket(batch, buckets=BUCKETS):
    for b in buckets:
        if 1 <= batch <= b:
            return b
    raise ValueError(f"batch must be 1..{buckets[-1]}, got {batch}")


def worst_padding(buckets=BUCKETS):
    lows = [1, *buckets[:-1]]
    return max((b - low) / b for low, b in zip(lows, buckets, strict=True))
