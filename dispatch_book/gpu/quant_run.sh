#!/usr/bin/env bash
# One GPU run (one H200, < 9 minutes) for chapter 7: the quantized kernels' GPU tests, the tuner's
# w8a8 grouped tiles for every benchmark preset (fp8 schemes, T >= 128; the decode tiles stay), then
# the quantized race on the table just tuned.
#   dispatch_book/gpu/quant_run.sh "$OUT"
# Writes $OUT/tests.log, $OUT/tune.log, $OUT/h200.json (the table: commit it as
# dispatch/tables/h200.json), $OUT/bench.log and $OUT/results/h200/quant.json (a run of the commit
# plus that table: +dirty; re-record from the commit that holds the table before the book cites it).
set -u
TOTAL_DEFAULT=520
. "$(dirname "$0")/prelude.sh" "$@"
COMMIT=$DISPATCH_GIT_COMMIT

nvidia-smi --query-gpu=name,memory.used,clocks.sm --format=csv | tee "$OUT/gpu.txt"
timeout 120 python3 -m pytest tests/test_quant_kernels.py tests/test_tune.py -m gpu -q -x -p no:cacheprovider \
    2>&1 | tail -30 | tee "$OUT/tests.log"

cp dispatch/tables/h200.json "$OUT/h200.json"  # the tuner merges into a copy of the shipped table
timeout 240 python3 -m dispatch.tune --preset all --quant fp8-channel,fp8-block128 --tokens 256,1024,4096,16384 \
    --out "$OUT/h200.json" 2>&1 | tee "$OUT/tune.log" | grep -v "^  " | tail -40
cp "$OUT/h200.json" dispatch/tables/h200.json
export DISPATCH_GIT_COMMIT="${COMMIT%+dirty}+dirty"

timeout "$(left)" python3 -m dispatch_book.bench quant --allow-dirty --quick \
    --shapes olmoe-1b-7b,qwen3-30b-a3b,deepseek-moe-16b,mixtral-8x7b --out "$OUT/results" 2>&1 \
    | tee "$OUT/bench.log" | grep -v "^ *hf_fp8" | tail -25
echo "total $(( $(date +%s) - start )) s"
