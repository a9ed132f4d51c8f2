#!/usr/bin/env bash
# One GPU run (one H200, < 10 minutes) of what a session records: every `-m gpu` test and every
# chapter in both budgets at once (phase 1), then the end-to-end benchmark alone on the GPU
# (phase 2) and, with the time left, the quantized-experts benchmark (phase 3); the ceilings
# are measured first, on the idle GPU.
#   DISPATCH_GIT_COMMIT=<sha> dispatch_book/gpu/final_run.sh "$OUT"
set -u
TOTAL_DEFAULT=560  # seconds left() counts down from, unless TOTAL is set
. "$(dirname "$0")/prelude.sh" "$@"
# the ceilings first, on an idle GPU: every "% of peak" of the book divides by them
timeout 90 python3 -m dispatch_book.bench ceilings --out "$OUT/results" > "$OUT/bench.log" 2>&1
tail -8 "$OUT/bench.log"
# the benchmarks below divide by these fresh ceilings (the checkout's recording is read)
cp "$OUT/results/"*/ceilings.json results/h200/ceilings.json 2>/dev/null
LIMIT=${LIMIT:-340} bash dispatch_book/gpu/book_and_tests.sh "$OUT"
# at most 8 files come back from the device: keep the merged file and one log per phase
cat "$OUT/gpu.txt" "$OUT/tests.log" > "$OUT/tests_gpu.log" && rm "$OUT/gpu.txt" "$OUT/tests.log"
cat "$OUT/book_h200.log" "$OUT/book_t4.log" > "$OUT/book.log" && rm "$OUT/book_h200.log" "$OUT/book_t4.log"
rm -rf "$OUT/h200" "$OUT/t4"
echo "phase 1 done at $(( $(date +%s) - start )) s"
timeout $(( $(left) - 10 )) python3 -m dispatch_book.bench e2e --out "$OUT/results" \
    --contestants ours,ours_int8,ours_fp8,hf_graph,hf_grouped_mm --budget-s 130 \
    >> "$OUT/bench.log" 2>&1
tail -25 "$OUT/bench.log"
echo "phase 2 done at $(( $(date +%s) - start )) s"
if [ "$(left)" -gt 60 ]; then
    timeout $(( $(left) - 5 )) python3 -m dispatch_book.bench quant --quick --shapes olmoe-1b-7b,mixtral-8x7b \
        --out "$OUT/results" > "$OUT/quant.log" 2>&1
    tail -25 "$OUT/quant.log"
fi
echo "total $(( $(date +%s) - start )) s"
