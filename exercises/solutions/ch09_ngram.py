"""Chapter 9, exercise 1: an n-gram drafter (prompt lookup).

Code repeats itself: a name, an argument list, a line of a pattern. A drafter can guess what
comes next by finding where the text's last n tokens occurred before and copying what followed
them. Complete ``ngram_draft(tokens, k, n)``:

* the suffix is ``tokens[-n:]``; a match is a position i with ``tokens[i:i+n] == suffix`` that
  ends before the last token (i + n < len(tokens): the suffix does not match itself);
* take the latest match (the largest i: the nearest text is the likeliest to go on alike) and
  return the k tokens that followed it, ``tokens[i+n], tokens[i+n+1], …``; where the copy reaches
  the end of the text, keep copying from what you have copied (the text after the match repeats);
* no match, or fewer than n + 1 tokens: return ``[]``.

Example: tokens [7, 1, 2, 3, 1, 2], k 4, n 2 → the suffix [1, 2] matched at i 1, so [3, 1, 2, 3]
(3, 1, 2 follow the match, then the copy goes on with 3).
"""


def ngram_draft(tokens: list[int], k: int, n: int) -> list[int]:
    L = len(tokens)
    if L < n + 1:
        return []
    suffix = tokens[-n:]
    for i in range(L - n - 1, -1, -1):  # latest first; i + n < L
        if tokens[i:i + n] == suffix:
            text = list(tokens)
            for j in range(k):
                text.append(text[i + n + j])  # may read a token copied a moment ago
            return text[L:]
    return []
