"""A wrong ch09_ngram: lets the suffix match itself (i + n == len(tokens)), so it copies past the end."""


def ngram_draft(tokens: list[int], k: int, n: int) -> list[int]:
    L = len(tokens)
    if L < n:
        return []
    suffix = tokens[-n:]
    for i in range(L - n, -1, -1):  # the suffix itself counts as a match: the mistake
        if tokens[i:i + n] == suffix:
            text = list(tokens)
            for j in range(k):
                if i + n + j >= len(text):
                    break
                text.append(text[i + n + j])
            return text[L:]
    return []
