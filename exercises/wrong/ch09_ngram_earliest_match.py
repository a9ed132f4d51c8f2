"""A wrong ch09_ngram: takes the earliest match instead of the latest (the nearest text is the likeliest)."""


def ngram_draft(tokens: list[int], k: int, n: int) -> list[int]:
    L = len(tokens)
    if L < n + 1:
        return []
    suffix = tokens[-n:]
    for i in range(0, L - n):  # earliest first: the mistake
        if tokens[i:i + n] == suffix:
            text = list(tokens)
            for j in range(k):
                text.append(text[i + n + j])
            return text[L:]
    return []
