# Sourced by the ablation scripts: the nope-interp binary and the 8 packed candidates at 99% (addition seeds
# 1-2, reversal and ordering seeds 0-2) as the array PACKED.
BIN=${BIN:-.venv/bin/nope-interp}
PACKED=()
for name in addition-packed-s1 addition-packed-s2 reversal-packed-s{0,1,2} ordering-packed-s{0,1,2}; do
  PACKED+=("nope_interp/pretrained/candidates/$name")
done
