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
DEBIAN_DIR=/usr/share/datasets/fashion-mnist
DATA=data/fashion-mnist
SAMPLE=model_zoo_lenet/data/fashion_mnist_sample

PY=$(bash scripts/setup.sh)

if [ ! -f "$DATA/train/train-images-idx3-ubyte" ] || [ ! -f "$DATA/test/t10k-images-idx3-ubyte" ]; then
    if [ ! -d "$DEBIAN_DIR" ]; then
        SUDO=""
        [ "$(id -u)" -ne 0 ] && command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null && SUDO="sudo -n"
        if command -v apt-get >/dev/null 2>&1 && { [ "$(id -u)" -eq 0 ] || [ -n "$SUDO" ]; }; then
            echo "installing Debian's dataset-fashion-mnist"
            $SUDO apt-get update -qq && $SUDO apt-get install -y -qq dataset-fashion-mnist >/dev/null \
                || echo "run_lenet: apt-get could not install dataset-fashion-mnist"
        else
            echo "run_lenet: apt-get is not available or not permitted here (needs root or passwordless sudo)"
        fi
    fi
    if [ -d "$DEBIAN_DIR" ]; then
        $PY model_zoo_lenet/prepare_data.py --source "$DEBIAN_DIR" --dest "$DATA"
    else
        echo "run_lenet: Fashion-MNIST is not installed; training on the bundled sample $SAMPLE (3,000 train /"
        echo "           1,000 test images) instead. Pass your own MNIST-format data with DATA_PATH=DIR."
        DATA=$SAMPLE
    fi
fi
DATA=${DATA_PATH:-$DATA}

RUN=runs/lenet-$(date +%Y%m%d-%H%M%S)
$PY model_zoo_lenet/train.py --device_target "$DEVICE" --data_path "$DATA" --ckpt_path "$RUN" \
    --epoch_size "$EPOCHS" --batch_size 32 --accumulation_steps "$ACCUMULATION_STEPS"
CKPT=$(ls -t "$RUN"/checkpoint_lenet-*.ckpt | head -n 1)
$PY model_zoo_lenet/eval.py --device_target "$DEVICE" --data_path "$DATA" --ckpt_path "$CKPT"
