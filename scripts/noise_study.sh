#!/usr/bin/env bash
# The study of docs/noise_scale.md: LeNet5 on Fashion-MNIST, micro-batch 32, momentum 0.9 at a constant learning
# rate 0.05, EPOCHS epochs, with N fixed at 2, 8 and 32 and adaptive in 2..32 (a decision every 20 windows), the
# noise scale measured in every run. Each run's telemetry, checkpoints, test accuracy and plot go to OUT/<run>;
# the table and the figure comparing them to OUT/summary.md and OUT/noise_study.png.
#   bash scripts/noise_study.sh                  # EPOCHS=5, about 8 minutes on 2 CPU cores
#   EPOCHS=1 OUT=runs/quick bash scripts/noise_study.sh
set -euo pipefail
cd "$(dirname "$0")/.."
EPOCHS=${EPOCHS:-5}
OUT=${OUT:-runs/noise_study}
PY=$(bash scripts/setup.sh)
DATA=${DATA_PATH:-$(bash scripts/fashion_mnist.sh "$PY")}
COMMON=(--data_path "$DATA" --epoch_size "$EPOCHS" --batch_size 32 --lr_schedule constant --lr 0.05
        --log_every 0 --save_state_every 0)
for RUN in fixed_2 fixed_8 fixed_32 adaptive_2_32; do
    case $RUN in
        fixed_*) FLAGS=(--accumulation_steps "${RUN#fixed_}" --noise_scale) ;;
        adaptive_2_32) FLAGS=(--adaptive_steps 2:32 --adaptive_interval 20) ;;
    esac
    echo "== $RUN"
    $PY model_zoo_lenet/train.py "${COMMON[@]}" "${FLAGS[@]}" --ckpt_path "$OUT/$RUN" \
        --telemetry_csv "$OUT/$RUN/telemetry.csv"
    CKPT=$(ls -t "$OUT/$RUN"/checkpoint_lenet*-*.ckpt | head -n 1)  # this run's newest, whatever its prefix
    $PY model_zoo_lenet/eval.py --data_path "$DATA" --ckpt_path "$CKPT" | tee "$OUT/$RUN/eval.txt"
    $PY model_zoo_lenet/plot_telemetry.py --csv "$OUT/$RUN/telemetry.csv" --out "$OUT/$RUN/telemetry.png"
done
$PY model_zoo_lenet/summarize_study.py --runs "$OUT" --out "$OUT/noise_study.png" | tee "$OUT/summary.md"
