#!/usr/bin/env bash
# The races of issue-style targets under uniform and skewed routing, in calls of < 9.5 minutes: run it
# again, call after call, until it prints "complete" (each call resumes where the last one stopped).
#   DISPATCH_GIT_COMMIT=<sha> dispatch_book/gpu/race_run.sh "$OUT"
# Steps, in order (one process each; a step starts only if its expected seconds fit what is left):
#   tune:<preset>          python -m dispatch.tune --routing zipf:3 (the race's 7 sizes) into a copy of this
#                          GPU's shipped table, so that ours races the skewed sizes on tiles tuned for them
#                          (skipped where the shipped table already has the zipf:3 entries; TUNE=0 skips it)
#   kernels:<routing>:<preset>   the kernels race, 7 sizes (1 … 16384 tokens), the peer tuned per size on the
#                          same routing (vLLM's tables, then its tuner's grid: PEER_BUDGET_S a size), torch's
#                          grouped GEMM from 256 tokens; uniform rows → kernels.json, zipf:3 → kernels_skewed.json
#   quant                  the quantized race at 1, 8, 4096, 16384 tokens, the four presets (QUANT=0 skips it)
# State lives in _build/race (ignored, so it stays on a warm machine between calls): results, the tuned
# table, done.txt; Triton's cache in _build/triton_cache. On a fresh machine, carry _build/race back from
# the files of the last call (copy them into _build/race/<gpu-slug>/ and the table into _build/race/).
# Each call copies to $OUT (at most 8 files): kernels.json, kernels_skewed.json, quant.json, <slug>.json (the
# table, tuned rows merged into the shipped one: commit it as dispatch/tables/<slug>.json), race.log, done.txt.
# With a tuned table in the tree the run is of <commit>+dirty: a preview; the recordings the book cites
# come from the commit that holds the table (`python -m dispatch_book.bench all`).
# Knobs (env): ROUTINGS ("uniform zipf:3"), SHAPES (the four), PEER_BUDGET_S (20), SKIP (contestant
# prefixes not timed, default "hf_,ours_no_,ours_layer,ours_persistent"; FULL=1 times every one), TUNE, QUANT.
set -u
TOTAL_DEFAULT=560
. "$(dirname "$0")/prelude.sh" "$@"
COMMIT=$DISPATCH_GIT_COMMIT
RES=_build/race
export TRITON_CACHE_DIR="$PWD/_build/triton_cache"
mkdir -p "$RES" "$TRITON_CACHE_DIR"
touch "$RES/done.txt"
ROUTINGS=${ROUTINGS:-uniform zipf:3}
SHAPES=${SHAPES:-olmoe-1b-7b qwen3-30b-a3b deepseek-moe-16b mixtral-8x7b}
TOKENS=1,8,64,256,1024,4096,16384
PEER_BUDGET_S=${PEER_BUDGET_S:-20}
SKIP=${SKIP:-hf_,ours_no_,ours_layer,ours_persistent}
[ "${FULL:-0}" = 1 ] && SKIP=""
slug=$(python3 -c "import torch; from dispatch import tables; print(tables.device_slug(torch.cuda.get_device_name()))")
LOG="$RES/race.log"
echo "== call at $(date -u +%FT%TZ) on $(nvidia-smi --query-gpu=name --format=csv,noheader)" | tee -a "$LOG"

has_skewed=$(python3 -c "from dispatch import tables; e = tables.load('$slug').get('entries', {}); \
print(int(any(k.endswith(',zipf:3') for k in e)))")
steps=()
if [ "${TUNE:-1}" = 1 ] && [ "$has_skewed" = 0 ]; then
    for s in $SHAPES; do steps+=("tune:$s"); done
fi
for r in $ROUTINGS; do for s in $SHAPES; do steps+=("kernels:$r:$s"); done; done
[ "${QUANT:-1}" = 1 ] && steps+=("quant")

guess() {  # expected seconds of a step (an H100: the peer's compiles are cached after the first call)
    case $1 in tune:*) echo 110;; kernels:*) echo 180;; quant) echo 200;; esac
}
table_in_tree() {  # the tuned table, where this run made one, is what every later step races on
    if [ -s "$RES/$slug.json" ] && ! cmp -s "$RES/$slug.json" "dispatch/tables/$slug.json"; then
        cp "$RES/$slug.json" "dispatch/tables/$slug.json"
        export DISPATCH_GIT_COMMIT="${COMMIT%+dirty}+dirty"
    fi
}
table_in_tree
for step in "${steps[@]}"; do
    grep -qxF "$step" "$RES/done.txt" && continue
    if [ "$(left)" -lt "$(guess "$step")" ]; then
        echo "stopped before $step ($(left) s left, it takes about $(guess "$step") s): call again" | tee -a "$LOG"
        break
    fi
    t0=$(date +%s)
    case $step in
        tune:*)
            [ -s "$RES/$slug.json" ] || cp "dispatch/tables/$slug.json" "$RES/$slug.json" 2>/dev/null || true
            timeout $(( $(left) - 5 )) python3 -m dispatch.tune --preset "${step#tune:}" --routing zipf:3 \
                --tokens "$TOKENS" --out "$RES/$slug.json" 2>&1 | grep -v "^  " >> "$LOG"
            rc=${PIPESTATUS[0]}
            table_in_tree;;
        kernels:*)
            rest=${step#kernels:}; routing=${rest%:*}; shape=${rest##*:}
            timeout $(( $(left) - 5 )) python3 -m dispatch_book.bench kernels --allow-dirty --out "$RES" --merge \
                --shapes "$shape" --tokens "$TOKENS" --routing "$routing" --peer-budget-s "$PEER_BUDGET_S" \
                ${SKIP:+--skip "$SKIP"} >> "$LOG" 2>&1
            rc=$?;;
        quant)
            timeout $(( $(left) - 5 )) python3 -m dispatch_book.bench quant --allow-dirty --quick --out "$RES" \
                --shapes olmoe-1b-7b,qwen3-30b-a3b,deepseek-moe-16b,mixtral-8x7b --tokens 1,8,4096,16384 \
                >> "$LOG" 2>&1
            rc=$?;;
    esac
    echo "$step: exit $rc in $(( $(date +%s) - t0 )) s" | tee -a "$LOG"
    [ "$rc" = 0 ] && echo "$step" >> "$RES/done.txt"
done
left_steps=0
for step in "${steps[@]}"; do grep -qxF "$step" "$RES/done.txt" || left_steps=$((left_steps + 1)); done
[ "$left_steps" = 0 ] && echo "complete" | tee -a "$LOG" || echo "$left_steps steps left: call again"
for f in "$RES/$slug/kernels.json" "$RES/$slug/kernels_skewed.json" "$RES/$slug/quant.json" "$RES/$slug.json" \
         "$LOG" "$RES/done.txt"; do
    [ -f "$f" ] && cp "$f" "$OUT/"
done
recorded=$(ls "$RES/$slug/kernels.json" "$RES/$slug/kernels_skewed.json" 2>/dev/null)
[ -n "$recorded" ] && python3 -m dispatch_book.bench.kernels_targets $recorded | tail -70
echo "total $(( $(date +%s) - start )) s"
