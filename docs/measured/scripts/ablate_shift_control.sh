#!/usr/bin/env bash
# The size-matched control of the mean ablation: `mean_positional` (h_p - mu[p] + mean mu) beside
# `mean_positional_random` (h_p moved by the same distance in a random direction), on the packed candidates
# at 99% (packed_candidates.sh: 9 since 2026-12-04, with addition seed 4; window contexts of 44 characters,
# then full prompts) and on the 12 shipped models and seeds (full prompts). Results copied to
# docs/measured/ablate/shift_control/.
# Usage: docs/measured/scripts/ablate_shift_control.sh [OUT_ROOT]
set -euo pipefail
OUT=${1:-results/measured-shift-control}
source "$(dirname "$0")/packed_candidates.sh"  # BIN, PACKED
K=(--kinds mean_positional mean_positional_random --ranks 0 --n-random 1)
$BIN ablate --run "${PACKED[@]}" "${K[@]}" --protocol window --window 44 --out-root "$OUT/packed-window44"
$BIN ablate --run "${PACKED[@]}" "${K[@]}" --out-root "$OUT/packed-full"
$BIN ablate --with-seeds "${K[@]}" --out-root "$OUT/shipped-full"
D=docs/measured/ablate/shift_control
mkdir -p "$D"
cp "$OUT/packed-window44/results/ablate/ablate_window44.csv" "$D/packed_window44.csv"
cp "$OUT/packed-full/results/ablate/ablate.csv" "$D/packed_full.csv"
cp "$OUT/shipped-full/results/ablate/ablate.csv" "$D/shipped_full.csv"
echo "wrote $D/"
