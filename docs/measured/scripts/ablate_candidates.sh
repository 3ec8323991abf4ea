#!/usr/bin/env bash
# The README's "models trained the other recipes at 99%" ablation table: `nope-interp ablate` with its defaults
# on the 19 candidates at 99% (packed: addition seeds 1, 2 and 4, reversal and ordering seeds 0-2, 6x128 indexing without
# dropout; answer-only at the paper's learning rate: addition 40,000-step, reversal, ordering 80,000-step, seeds
# 0-2), their CSV and Markdown results copied to docs/measured/ablate/candidates/.
# Usage: docs/measured/scripts/ablate_candidates.sh [OUT_ROOT]   (about 20 min on 2 free cores, 45 beside a training)
set -euo pipefail
OUT=${1:-results/measured-candidates}
BIN=${BIN:-.venv/bin/nope-interp}
C=nope_interp/pretrained/candidates
runs=()
for name in addition-packed-s{1,2,4} reversal-packed-s{0,1,2} ordering-packed-s{0,1,2} indexing-packed-6l-nodrop-s0 \
            addition-paperlr40k-s{0,1,2} reversal-paperlr-s{0,1,2} ordering-paperlr80k-s{0,1,2}; do
  runs+=("$C/$name")
done
$BIN ablate --run "${runs[@]}" --out-root "$OUT"
mkdir -p docs/measured/ablate/candidates
cp "$OUT"/results/ablate/{ablate.csv,ablate_decomposition.csv,ablate_seeds.csv,ablate_seeds.md} docs/measured/ablate/candidates/
echo "wrote docs/measured/ablate/candidates/ (figures: $OUT/figures/ablate/)"
