#!/usr/bin/env bash
# Lay out Fashion-MNIST under data/fashion-mnist (train/ and test/, MNIST IDX) and print the data directory.
#   DATA=$(bash scripts/fashion_mnist.sh "$PY")     # PY: the environment's python (scripts/setup.sh prints it)
# Data: Debian's dataset-fashion-mnist (installed with apt-get when possible); where apt is not available or not
# permitted it says so (on stderr) and prints the bundled 3,000-image sample's directory instead.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${1:?usage: fashion_mnist.sh PYTHON}
DEBIAN_DIR=/usr/share/datasets/fashion-mnist
DATA=data/fashion-mnist
SAMPLE=model_zoo_lenet/data/fashion_mnist_sample
{

if [ ! -f "$DATA/train/train-images-idx3-ubyte" ] || [ ! -f "$DATA/test/t10k-images-idx3-ubyte" ]; then
    if [ ! -d "$DEBIAN_DIR" ]; then
        SUDO=""
        [ "$(id -u)" -ne 0 ] && command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null && SUDO="sudo -n"
        if command -v apt-get >/dev/null 2>&1 && { [ "$(id -u)" -eq 0 ] || [ -n "$SUDO" ]; }; then
            echo "installing Debian's dataset-fashion-mnist"
            $SUDO apt-get update -qq && $SUDO apt-get install -y -qq dataset-fashion-mnist >/dev/null \
                || echo "fashion_mnist: apt-get could not install dataset-fashion-mnist"
        else
            echo "fashion_mnist: apt-get is not available or not permitted here (needs root or passwordless sudo)"
        fi
    fi
    if [ -d "$DEBIAN_DIR" ]; then
        $PY model_zoo_lenet/prepare_data.py --source "$DEBIAN_DIR" --dest "$DATA"
    else
        echo "fashion_mnist: Fashion-MNIST is not installed; training on the bundled sample $SAMPLE (3,000 train /"
        echo "           1,000 test images) instead. Pass your own MNIST-format data with DATA_PATH=DIR."
        DATA=$SAMPLE
    fi
fi
} >&2
echo "$DATA"
