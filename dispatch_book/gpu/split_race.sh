#!/usr/bin/env bash
# One GPU run (< 9.5 minutes): split items against the chain, the one launch and a plain read of the same
# bytes at 1, 4 and 16 tokens (python -m dispatch_book.bench split), then, on a GPU with no shipped table,
# the tuner for every preset (its table: commit it as dispatch/tables/<gpu>.json).
#   DISPATCH_GIT_COMMIT=<sha> dispatch_book/gpu/split_race.sh "$OUT"
# On a GPU without a table the race's chain takes the H200's tiles (DISPATCH_TILE_TABLE=h200).
# Writes $OUT/split.log, $OUT/results/<gpu>/decode_split.json, $OUT/tune.log, $OUT/<gpu>.json.
set -u
TOTAL_DEFAULT=560
. "$(dirname "$0")/prelude.sh" "$@"
nvidia-smi --query-gpu=name,clocks.max.sm,memory.total --format=csv | tee "$OUT/gpu.txt"
slug=$(python3 -c "import torch; from dispatch import tables; print(tables.device_slug(torch.cuda.get_device_name()))")
have=$(python3 -c "from dispatch import tables; print(int(bool(tables.load('$slug'))))")
[ "$have" = 1 ] || export DISPATCH_TILE_TABLE=h200
timeout 300 python3 -m dispatch_book.bench split --out "$OUT/results" > "$OUT/split.log" 2>&1
grep -v "^    \|^  " "$OUT/split.log" | tail -16
unset DISPATCH_TILE_TABLE
if [ "$have" = 0 ] && [ "$(left)" -gt 60 ]; then
    timeout "$(left)" python3 -m dispatch.tune --preset all --out "$OUT/$slug.json" > "$OUT/tune.log" 2>&1
    grep -v "^  " "$OUT/tune.log" | tail -30
fi
echo "total $(( $(date +%s) - start )) s"
