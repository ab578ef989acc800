#!/usr/bin/env bash
# The main job from a fresh clone: set up, get Fashion-MNIST, train LeNet5 with gradient accumulation, evaluate.
#   bash scripts/run_lenet.sh                 # 10 epochs, micro-batch 32 x 4 = effective batch 128, on CPU
#   EPOCHS=2 DEVICE=GPU bash scripts/run_lenet.sh
# Data: Debian's dataset-fashion-mnist (installed with apt-get when possible) laid out under data/fashion-mnist;
# where apt is not available or not permitted it says so and uses the bundled 3,000-image sample instead.
set -euo pipefail
cd "$(dirname "$0")/.."
EPOCHS=${EPOCHS:-10}
DEVICE=${DEVICE:-CPU}
ACCUMULATION_STEPS=${ACCUMULATION_STEPS:-4}
PY=$(bash scripts/setup.sh)
DATA=$(bash scripts/fashion_mnist.sh "$PY")
DATA=${DATA_PATH:-$DATA}

RUN=runs/lenet-$(date +%Y%m%d-%H%M%S)
$PY model_zoo_lenet/train.py --device_target "$DEVICE" --data_path "$DATA" --ckpt_path "$RUN" \
    --epoch_size "$EPOCHS" --batch_size 32 --accumulation_steps "$ACCUMULATION_STEPS"
CKPT=$(ls -t "$RUN"/checkpoint_lenet-*.ckpt | head -n 1)
$PY model_zoo_lenet/eval.py --device_target "$DEVICE" --data_path "$DATA" --ckpt_path "$CKPT"
