#!/usr/bin/env bash
# The measurements on the Shakespeare language models (README, "A NoPE language model on Shakespeare"):
# adjacency score and lag profile by layer at lengths up to and past the 128-character training window,
# the positional ablation with its random-subspace control, and the position probes.
# Usage: docs/measured/scripts/text_models.sh [MODELS_DIR] [OUT_ROOT]
#   MODELS_DIR holds text-nope/, text-learned/, text-rotary/, text-hybrid/ (default: the shipped ones;
#   any that is missing is skipped)
set -euo pipefail
DIR=${1:-nope_interp/pretrained/text}
OUT=${2:-results/text}
BIN=${BIN:-.venv/bin/nope-interp}
RUNS=()
for name in text-nope text-learned text-rotary text-hybrid; do
  if [ -d "$DIR/$name" ]; then RUNS+=("$DIR/$name"); fi
done
LONG=()
for run in "${RUNS[@]}"; do
  case "$run" in *learned*) ;; *) LONG+=("$run") ;; esac
done
# all three within the learned model's n_ctx (256); then NoPE and rotary far past the window
"$BIN" long-context --run "${RUNS[@]}" --lengths 32 64 128 256 --inputs text random --n-sequences 16 \
  --out-root "$OUT/within"
"$BIN" long-context --run "${LONG[@]}" --lengths 512 1024 2048 --inputs text random --n-sequences 8 \
  --out-root "$OUT/past"
"$BIN" ablate --run "${RUNS[@]}" --out-root "$OUT"
"$BIN" probe --run "${RUNS[@]}" --out-root "$OUT"
