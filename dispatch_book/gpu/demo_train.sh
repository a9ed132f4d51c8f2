#!/usr/bin/env bash
# One GPU run (one H100, < 9 minutes): train the demo model (`--preset demo`, ~12M parameters, training capped
# at MAX_SECONDS=200), then measure the demo on it and on the shipped cpu model (dispatch_book/demo.py): greedy
# decoding without a loop and sampled completions that parse, on 50 held-out prompts at seeds 0, 1 and 2, with
# both models' validation perplexity in the same 128-token windows. The demo runs on the CPU in fp32
# (DEMO_DEVICE), as the shipped model's numbers were measured.
# The corpus is the standard library of the Python the shipped model was trained on, which the GPU machine's
# Python is not: copy it here first, into an ignored folder that the run carries (.cache/demo_corpus):
#   mkdir -p .cache/demo_corpus && cp "$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["stdlib"])')"/*.py .cache/demo_corpus/
#   DISPATCH_GIT_COMMIT=<sha> dispatch_book/gpu/demo_train.sh "$OUT"
# Writes $OUT/train.log, $OUT/train_log.json, $OUT/demo_eval.log, $OUT/demo_eval.json and the checkpoint as
# $OUT/demo.tar.part-aa, -ab (a file that comes back holds at most 16 MiB). Back here:
#   cat "$OUT"/demo.tar.part-* | tar -x -C dispatch/assets     # dispatch/assets/demo, with its hashes.json
# A dry run on a CPU: STEPS=2 PROMPTS=4 DISPATCH_GIT_COMMIT=x dispatch_book/gpu/demo_train.sh /tmp/demo_out
set -u
TOTAL_DEFAULT=540  # seconds left() counts down from, unless TOTAL is set
. "$(dirname "$0")/prelude.sh" "$@"
export DISPATCH_STDLIB=${DISPATCH_STDLIB:-$PWD/.cache/demo_corpus}
DISPATCH_CACHE=$(mktemp -d) && export DISPATCH_CACHE  # the tokenizer: the shipped model's (same_corpus)
python3 -c "from dispatch_book.demo import same_corpus; print('corpus', same_corpus())" || exit 2
work=$(mktemp -d)
timeout $(( $(left) - 200 )) python3 -m dispatch.train --preset demo --out "$work/demo" \
    --max-seconds "${MAX_SECONDS:-200}" ${STEPS:+--steps "$STEPS"} > "$OUT/train.log" 2>&1
tail -2 "$OUT/train.log"
[ -f "$work/demo/hashes.json" ] || { echo "no checkpoint written"; exit 1; }
cp "$work/demo/train_log.json" "$OUT/"
tar -c -C "$work" demo | split -b 15m - "$OUT/demo.tar.part-"
echo "trained and packed at $(( $(date +%s) - start )) s"
timeout "$(left)" python3 -m dispatch_book.demo --model cpu --model "$work/demo" --prompts "${PROMPTS:-50}" \
    --seeds 0,1,2 --device "${DEMO_DEVICE:-cpu}" --json "$OUT/demo_eval.json" > "$OUT/demo_eval.log" 2>&1
grep "held-out prompts" "$OUT/demo_eval.log" || tail -5 "$OUT/demo_eval.log"
echo "total $(( $(date +%s) - start )) s"
