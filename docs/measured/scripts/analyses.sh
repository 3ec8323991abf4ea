#!/usr/bin/env bash
# The analyses behind the README's first table and "What the other analyses found", rerun on the shipped
# models with each command's defaults, their result files (JSON, Markdown, CSV; not the HTML figures)
# under 400 kB copied to docs/measured/<command>/ so every number quoted there has a stored source.
# Usage: docs/measured/scripts/analyses.sh [OUT_ROOT]   (about 20-40 min on 2 cores)
set -euo pipefail
OUT=${1:-results/measured}
BIN=${BIN:-.venv/bin/nope-interp}
mkdir -p "$OUT"
for job in "demo" "averaging" "averaging --protocol authors" "probe" "ablate --with-seeds" "init-grid"; do
  name=${job%% *}
  start=$(date +%s)
  log="$OUT/${job// /_}.log"
  # shellcheck disable=SC2086
  $BIN $job --out-root "$OUT" > "$log" 2>&1 || { echo "$job failed: see $log"; exit 1; }
  folder=$name
  [ "$name" = "init-grid" ] && folder=init_grid
  mkdir -p "docs/measured/$folder"
  find "$OUT/results/$folder" -maxdepth 1 -type f \( -name '*.json' -o -name '*.md' -o -name '*.csv' \) \
    -size -400k -exec cp {} "docs/measured/$folder/" \;
  echo "$job: $(( $(date +%s) - start )) s -> docs/measured/$folder/"
done
