#!/usr/bin/env bash
# Ablations of the packed candidates at 99% on the inputs they were trained on: `nope-interp ablate --protocol
# window --window 44` (contexts of 44 characters of newline-joined held-out lines ending in a complete prompt;
# positional means over windows, so "position" is the position in the window, not in the prompt; 44 leaves
# room for reversal's 16-character answer in n_ctx 64). Results copied to docs/measured/ablate/window44/.
# Usage: docs/measured/scripts/ablate_window.sh [OUT_ROOT]
set -euo pipefail
OUT=${1:-results/measured-window}
source "$(dirname "$0")/packed_candidates.sh"  # BIN, PACKED
$BIN ablate --run "${PACKED[@]}" --protocol window --window 44 --out-root "$OUT"
mkdir -p docs/measured/ablate/window44
cp "$OUT"/results/ablate/{ablate_window44.csv,ablate_decomposition_window44.csv,ablate_seeds_window44.csv,ablate_seeds_window44.md} \
   docs/measured/ablate/window44/
echo "wrote docs/measured/ablate/window44/ (figures: $OUT/figures/ablate/)"
