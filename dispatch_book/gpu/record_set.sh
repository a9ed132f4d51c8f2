#!/usr/bin/env bash
# One GPU call of `make record-gpu`: `python -m dispatch_book.bench all` on the GPU that comes, from the
# copied tree's results/ (so steps recorded earlier at this commit are skipped, and merging steps add to
# the recordings there), then the whole set folder packed into one file, $OUT/set.tgz — a call returns
# only a few files. Call it again, call after call, until record.log says "complete"; unpack each
# set.tgz over the checkout (`tar xzf set.tgz`: results/<gpu>/...) before the next call (the call copies
# the working tree, committed or not). Commit a file once its steps are all in: kernels.json with some of
# the four kernels:<preset> steps is a recording chapter 2 cannot read (it quotes every preset).
#   DISPATCH_GIT_COMMIT=<sha> [ONLY=kernels:olmoe-1b-7b,decode] [TOTAL=570] dispatch_book/gpu/record_set.sh "$OUT"
# Carry .whl (`make gpu-wheels`) for the serving steps. TESTS=1 runs `pytest -m gpu` beside the book step.
# Writes $OUT/record.log, $OUT/set.tgz and, with TESTS=1, $OUT/tests.log.
set -u
TOTAL_DEFAULT=570
. "$(dirname "$0")/prelude.sh" "$@"
serve_wheels
nvidia-smi --query-gpu=name,memory.used,clocks.sm --format=csv | tee "$OUT/gpu.txt"
slug=$(python3 -c "from dispatch_book.bench import gpu_slug; print(gpu_slug())")
tests=(); [ "${TESTS:-0}" = 1 ] && tests=(--with-tests "$OUT/tests.log")
timeout "$(left)" python3 -m dispatch_book.bench all --out results --budget-s $(( $(left) - 25 )) \
    ${ONLY:+--only "$ONLY"} "${tests[@]}" 2>&1 | tee "$OUT/record.log" | cut -c1-300 | tail -40
tar czf "$OUT/set.tgz" "results/$slug"
echo "packed results/$slug into set.tgz; total $(( $(date +%s) - start )) s"
