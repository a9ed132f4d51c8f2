#!/usr/bin/env bash
# One GPU run (one H200, < 9 minutes): the decode step's own kernels and the engine — their `-m gpu`
# tests, the step-kernels race (GEMV vs cuBLAS, decode attention vs SDPA), the end-to-end race with
# a per-step profile, and the kernels race (with the persistent schedule).
#   DISPATCH_GIT_COMMIT=<sha> dispatch_book/gpu/engine_run.sh "$OUT"
# Writes $OUT/tests.log, $OUT/bench.log and $OUT/results/h200/{step_kernels,e2e,kernels}.json.
set -u
TOTAL_DEFAULT=560  # seconds left() counts down from, unless TOTAL is set
. "$(dirname "$0")/prelude.sh" "$@"
if [ "${TESTS:-1}" = 1 ]; then  # TESTS=0: the tests ran in a call of their own
    timeout 100 python3 -m pytest -m gpu -q -p no:cacheprovider -rf tests/test_dense_gemv.py \
        tests/test_decode_attention.py tests/test_engine_gpu.py tests/test_pdl.py > "$OUT/tests.log" 2>&1
    tail -6 "$OUT/tests.log"
fi
timeout 90 python3 -m dispatch_book.bench step_kernels --out "$OUT/results" > "$OUT/bench.log" 2>&1
grep -v "ours_config" "$OUT/bench.log" | tail -30
echo "step kernels done at $(( $(date +%s) - start )) s"
timeout 250 python3 -m dispatch_book.bench e2e --out "$OUT/results" --profile --budget-s 215 \
    --contestants ours,ours_no_pdl,ours_cublas_sdpa,ours_int8,ours_fp8,hf_graph,hf_grouped_mm >> "$OUT/bench.log" 2>&1
grep "contestant\|'what'" "$OUT/bench.log" | tail -30
echo "e2e done at $(( $(date +%s) - start )) s"
timeout "$(left)" python3 -m dispatch_book.bench kernels --shapes olmoe-1b-7b,qwen3-30b-a3b,deepseek-moe-16b,mixtral-8x7b \
    --out "$OUT/results" > "$OUT/kernels.log" 2>&1
tail -4 "$OUT/kernels.log"
echo "total $(( $(date +%s) - start )) s"
