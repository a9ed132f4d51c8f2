#!/usr/bin/env bash
# One GPU run (one H200, < 9 minutes): the tile policy's GPU tests, the tuner for every benchmark
# preset, then the kernels race using the table just tuned, then the tile sweep of chapter 2.
#   dispatch_book/gpu/tune_and_bench.sh "$OUT"
# Writes $OUT/tests.log, $OUT/h200.json (the table: commit it as dispatch/tables/h200.json), $OUT/sweep.log,
# $OUT/results/h200/kernels_sweep.json,
# $OUT/tune.log, $OUT/results/h200/kernels.json (commit as results/h200/kernels.json), $OUT/bench.log.
set -u
OUT=${1:?usage: dispatch_book/gpu/tune_and_bench.sh OUT_DIR}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
COMMIT=${DISPATCH_GIT_COMMIT:-$(git rev-parse HEAD 2>/dev/null)}
if [ -z "$COMMIT" ]; then  # results files name the commit they measure: a copied tree has no .git
    echo "set DISPATCH_GIT_COMMIT=<commit of this tree> (no .git here)"; exit 2
fi
start=$(date +%s)
left() { echo $((400 - ($(date +%s) - start))); }

nvidia-smi --query-gpu=name,memory.used,clocks.sm --format=csv | tee "$OUT/gpu.txt"
timeout 120 python3 -m pytest tests -m gpu -q -x -p no:cacheprovider \
    -k "tiles or tune or grouped or gemv or peer" 2>&1 | tail -30 | tee "$OUT/tests.log"

timeout $(( $(left) < 290 ? $(left) : 290 )) python3 -m dispatch.tune --preset all --out "$OUT/h200.json" \
    2>&1 | tee "$OUT/tune.log" | grep -v "^  " | tail -80
if [ -s "$OUT/h200.json" ]; then  # the race reads it: the measured tree is the commit plus this table
    cp "$OUT/h200.json" dispatch/tables/h200.json
    COMMIT="${COMMIT%+dirty}+dirty"
fi
export DISPATCH_GIT_COMMIT=$COMMIT

timeout "$(left)" python3 -m dispatch_book.bench kernels --allow-dirty --shapes olmoe-1b-7b,qwen3-30b-a3b,deepseek-moe-16b,mixtral-8x7b \
    --out "$OUT/results" 2>&1 | tee "$OUT/bench.log" | tail -150
timeout 150 python3 -m dispatch_book.bench kernels_sweep --allow-dirty --out "$OUT/results" > "$OUT/sweep.log" 2>&1
tail -3 "$OUT/sweep.log"
echo "total $(( $(date +%s) - start )) s"
