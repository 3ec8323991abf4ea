# Sourced by the ablation scripts: the nope-interp binary and the 9 packed candidates at 99% (addition seeds
# 1, 2 and 4, reversal and ordering seeds 0-2) as the array PACKED.
BIN=${BIN:-.venv/bin/nope-interp}
PACKED=()
for name in addition-packed-s{1,2,4} reversal-packed-s{0,1,2} ordering-packed-s{0,1,2}; do
  PACKED+=("nope_interp/pretrained/candidates/$name")
done
