#!/usr/bin/env bash
# The variance-rich control of the positional projection: `project_out` (top-r directions of the positional
# means) beside `project_out_content` (top-r principal directions of the content part h - mu) and
# `project_out_random`, at rank 1 and 4, on the 12 shipped models and seeds and the packed candidates at 99%
# (full prompts; packed_candidates.sh: 9 since 2026-12-04, with addition seed 4). Results copied to docs/measured/ablate/content_control/.
# Usage: docs/measured/scripts/ablate_content_control.sh [OUT_ROOT]
set -euo pipefail
OUT=${1:-results/measured-content-control}
source "$(dirname "$0")/packed_candidates.sh"  # BIN, PACKED
D=docs/measured/ablate/content_control
mkdir -p "$D"
for r in 1 4; do
  K=(--kinds project_out project_out_content project_out_random --rank "$r" --ranks 0 --n-random 1 --layers 1)
  $BIN ablate --with-seeds "${K[@]}" --out-root "$OUT/shipped-r$r"
  $BIN ablate --run "${PACKED[@]}" "${K[@]}" --out-root "$OUT/packed-r$r"
  cp "$OUT/shipped-r$r/results/ablate/ablate.csv" "$D/shipped_rank$r.csv"
  cp "$OUT/packed-r$r/results/ablate/ablate.csv" "$D/packed_rank$r.csv"
done
echo "wrote $D/"
