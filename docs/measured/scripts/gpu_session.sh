#!/bin/bash
# The GPU session of bench/paper_recipe_gpu.py, as it was run on a lent GPU machine (an H200) through this
# workplace's device tool: run from the repository root there; $OUT is the folder whose files come back.
# The machine has PyTorch but not TransformerLens: the wheels in .whl/ (ignored by git; carried) are installed
# into /tmp/site first. Made here with (plus .whl/stub/datasets, a stand-in used only if datasets fails there):
#   echo /.whl/ >> .git/info/exclude
#   .venv/bin/python -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#     --platform manylinux2014_x86_64 --platform any -d .whl transformer-lens==3.9.0 better-abc==0.0.3 \
#     fancy-einsum==0.0.3 beartype==0.23.1 typeguard==4.6.1 plotly==7.1.0 dill==0.4.1 multiprocess==0.70.19 \
#     datasets==5.2.0
# The working tree that travels must stay under 64 MiB: the candidates' weights (about 90 MB) were taken out of
# the index for the calls (git rm --cached, listed in .git/info/exclude) and put back after (git reset).
#   bash docs/measured/scripts/gpu_session.sh smoke            # ~1 min: the code path on CUDA, step times
#   bash docs/measured/scripts/gpu_session.sh main BUDGET_S [TASK ...]   # train (BUDGET_S s per task), score
# A 15-minute lease fits one task's 5,000 steps (about 6 min on an H200): main 420 addition
# (PRECISION=bf16 trains under bfloat16 autocast: untimed on a GPU so far, perhaps two tasks per lease)
# On 2026-12-04 (15 minutes of device time in all): `smoke`, then `main 230` with the four tasks trained at
# once (then an option of the script, measured 1.9x slower than one after the other and removed), then
# reversal alone resumed for 150 s more (bench/paper_recipe_gpu.py --out /tmp/gpu --tasks reversal
# --device cuda --budget-s 150, then gpu_pack.py). Results: docs/measured/gpu/.
set -u
mode=${1:?smoke or main}
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
exec > >(tee -a "$OUT/$mode.log") 2>&1
T0=$(date +%s)
stamp() { echo "[$(( $(date +%s) - T0 )) s] $*"; }
# DEVICE=cpu TINY=--tiny SITE=<installed wheels> test this script on a CPU machine
DEVICE=${DEVICE:-cuda} TINY=${TINY:-} SITE=${SITE:-/tmp/site}
[ "$SITE" = /tmp/site ] && { python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl || exit 1; }
export PYTHONPATH=$PWD:$SITE PYTHONUNBUFFERED=1
if ! python3 -c "import transformer_lens" 2>/tmp/tl_err; then
    tail -3 /tmp/tl_err; echo "transformer_lens does not import with the carried datasets: using .whl/stub"
    export PYTHONPATH=$PWD:$PWD/.whl/stub:$SITE
fi
stamp "installed"
if [ "$mode" = smoke ]; then
    nvidia-smi -L; nproc
    python3 -c "import sys, torch, transformers, transformer_lens, numpy; print(sys.version.split()[0], torch.__version__, torch.cuda.get_device_name(), 'transformers', transformers.__version__, 'numpy', numpy.__version__)"
    python3 bench/paper_recipe_gpu.py --out /tmp/smoke --tiny --tasks reversal --device $DEVICE || echo "SMOKE FAILED"
    stamp "tiny run done"
    python3 docs/measured/scripts/gpu_step_time.py || echo "STEP TIME FAILED"
    stamp "step time done"
    timeout 60 python3 bench/train_step.py --device cuda --presets paper --packed-len 256 --steps 10 || echo "BENCH FAILED"
    stamp "smoke done"
    exit 0
fi
BUDGET=${2:?budget in seconds}
shift 2
TASKS=("${@:-addition reversal indexing ordering}")
TASKS=(${TASKS[@]})
timeout -k 10 $(( ${#TASKS[@]} * (BUDGET + 60) )) python3 bench/paper_recipe_gpu.py --out /tmp/gpu --tasks "${TASKS[@]}" \
    --budget-s "$BUDGET" --device $DEVICE --precision "${PRECISION:-tf32}" $TINY
stamp "training done"
for t in "${TASKS[@]}"; do
    grep -h '"test_acc"' /tmp/gpu/$t/summary.json 2>/dev/null | head -1 | sed "s/^/$t /"
done
mkdir -p /tmp/ana
pids=()
for t in "${TASKS[@]}"; do
    [ -f /tmp/gpu/$t/summary.json ] || continue
    OMP_NUM_THREADS=3 timeout 170 python3 -m nope_interp.cli trajectory --run /tmp/gpu/$t --out-root /tmp/ana/traj-$t \
        > /tmp/ana/traj-$t.log 2>&1 &
    pids+=($!)
done
OMP_NUM_THREADS=4 timeout 170 python3 -m nope_interp.cli compare --run $(ls -d /tmp/gpu/*/ | sed 's,/$,,') \
    --out-root /tmp/ana/compare > /tmp/ana/compare.log 2>&1 &
pids+=($!)
wait "${pids[@]}"  # not a bare wait: it would wait for the tee above too stamp "analysis done"
tail -n 3 /tmp/ana/*.log
python3 docs/measured/scripts/gpu_pack.py /tmp/gpu /tmp/ana "$OUT"
stamp "packed"; ls -la "$OUT"
