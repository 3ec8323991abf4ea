#!/usr/bin/env bash
# Ablations of the packed candidates at 99% on the inputs they were trained on: `nope-interp ablate --protocol
# window --window 44` (contexts of 44 characters of newline-joined held-out lines ending in a complete prompt;
# positional means over windows, so "position" is the position in the window, not in the prompt; 44 leaves
# room for reversal's 16-character answer in n_ctx 64). Results copied to docs/measured/ablate/window44/.
# The packed indexing model (6x128, reached 99% after the other eight were measured) goes into
# docs/measured/ablate/window44/indexing-packed/ from a second call.
# Usage: docs/measured/scripts/ablate_window.sh [OUT_ROOT]   (about 40 min beside two trainings, + 5 min for indexing)
set -euo pipefail
OUT=${1:-results/measured-window}
source "$(dirname "$0")/packed_candidates.sh"  # BIN, PACKED
$BIN ablate --run "${PACKED[@]}" --protocol window --window 44 --out-root "$OUT"
mkdir -p docs/measured/ablate/window44
cp "$OUT"/results/ablate/{ablate_window44.csv,ablate_decomposition_window44.csv,ablate_seeds_window44.csv,ablate_seeds_window44.md} \
   docs/measured/ablate/window44/
$BIN ablate --run nope_interp/pretrained/candidates/indexing-packed-6l-nodrop-s0 --protocol window --window 44 \
  --out-root "$OUT/indexing-packed"
mkdir -p docs/measured/ablate/window44/indexing-packed
cp "$OUT"/indexing-packed/results/ablate/{ablate_window44.csv,ablate_decomposition_window44.csv,ablate_seeds_window44.csv,ablate_seeds_window44.md} \
   docs/measured/ablate/window44/indexing-packed/
echo "wrote docs/measured/ablate/window44/ and window44/indexing-packed/ (figures: $OUT/figures/ablate/, $OUT/indexing-packed/figures/ablate/)"
