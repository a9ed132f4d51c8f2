"""A batch equal to a bucket goes to the next one up: > where >= belongs."""
BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)


def bucket(batch, buckets=BUCKETS):
    if batch < 1 or batch > buckets[-1]:
        raise ValueError(f"batch must be 1..{buckets[-1]}, got {batch}")
    return next((b for b in buckets if b > batch), buckets[-1])


def worst_padding(buckets=BUCKETS):
    lows = [1, *(b + 1 for b in buckets[:-1])]
    return max((b - low) / b for low, b in zip(lows, buckets, strict=True))
