"""A wrong ch09_ngram: stops at the end of the text instead of copying on from what it copied."""


def ngram_draft(tokens: list[int], k: int, n: int) -> list[int]:
    L = len(tokens)
    if L < n + 1:
        return []
    suffix = tokens[-n:]
    for i in range(L - n - 1, -1, -1):
        if tokens[i:i + n] == suffix:
            return list(tokens[i + n:i + n + k])  # the draft ends where the text ends: the mistake
    return []
