"""A wrong ch08_scheduler_step: no_chunking."""


def schedule_step(running: list[tuple[int, int]], waiting: list[tuple[int, int]], budget: int,
                  max_seqs: int) -> list[tuple[int, int]]:
    step = []
    for sid, left in running:  # decode rows first: their time per token stays steady
        if left == 0 and budget > 0:
            step.append((sid, 1))
            budget -= 1
    for sid, left in running:  # prompts in progress: the next chunk
        if left > 0 and budget > 0:
            n = min(left, budget)
            step.append((sid, n))
            budget -= n
    count = len(running)
    for sid, prompt_len in waiting:  # admissions, in arrival order
        if budget == 0 or count >= max_seqs:
            break
        if prompt_len > budget:  # a prompt runs whole or not at all: the next one overtakes it
            continue
        n = prompt_len
        step.append((sid, n))
        budget -= n
        count += 1
    return step
