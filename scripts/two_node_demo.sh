#!/usr/bin/env bash
# Two machines on this one: a two-node msrun job of model_zoo_lenet/train.py (data parallel, TrainAccuStepsCell
# through Model_ACCU), each "machine" a network namespace with its own address, joined by a veth pair. Every
# command is printed before it runs; on two real machines, run node 0's msrun line on the machine whose address is
# MASTER_ADDR and node 1's on the other, with MASTER_ADDR changed to that machine's address.
#   sudo bash scripts/two_node_demo.sh [OUT_DIR] [extra train.py arguments, which override the defaults]
#   sudo bash scripts/two_node_demo.sh runs/two_nodes --epoch_size 4
# Needs root and iproute2 (ip). Removes the namespaces and the link it made on exit, also after a failure.
# The addresses (SUBNET.1 and SUBNET.2, default 10.231.0) exist only inside the two namespaces.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-runs/two_node_demo}
[ $# -gt 0 ] && shift
SUBNET=${SUBNET:-10.231.0}
MASTER_ADDR=$SUBNET.1
MASTER_PORT=${MASTER_PORT:-8240}
NS0=msdemo$$n0
NS1=msdemo$$n1

if [ "$(id -u)" -ne 0 ]; then
    echo "two_node_demo: creating network namespaces needs root; run it with sudo" >&2
    exit 2
fi
if ! command -v ip >/dev/null 2>&1; then
    echo "two_node_demo: the 'ip' command is missing; install iproute2 (apt-get install iproute2)" >&2
    exit 2
fi

VENV_BIN=$(cd "$(dirname "$(bash scripts/setup.sh)")" && pwd)

run() {
    echo "+ $*"
    "$@"
}
cleanup() {
    [ -n "${NODE1:-}" ] && kill "$NODE1" 2>/dev/null || true
    ip netns del "$NS0" 2>/dev/null || true
    ip netns del "$NS1" 2>/dev/null || true   # deleting a namespace deletes its end of the veth pair
    ip link del "${NS0}v" 2>/dev/null || true  # a link left in this namespace if set-up stopped half way
}
trap cleanup EXIT

echo "== two hosts: namespaces $NS0 ($MASTER_ADDR) and $NS1 ($SUBNET.2), one veth pair"
run ip netns add "$NS0"
run ip netns add "$NS1"
run ip link add "${NS0}v" type veth peer name "${NS1}v"
run ip link set "${NS0}v" netns "$NS0"
run ip link set "${NS1}v" netns "$NS1"
run ip -n "$NS0" addr add "$MASTER_ADDR/24" dev "${NS0}v"
run ip -n "$NS1" addr add "$SUBNET.2/24" dev "${NS1}v"
for NS in "$NS0" "$NS1"; do
    run ip -n "$NS" link set "${NS}v" up
    run ip -n "$NS" link set lo up
done

TRAIN_ARGS=(--parallel_mode data_parallel --data_path model_zoo_lenet/data/fashion_mnist_sample
            --num_samples 640 --batch_size 16 --accumulation_steps 4 --epoch_size 2 --ckpt_path "$OUT/ckpt" "$@")
node_argv() {  # NODE_ARGV: the msrun line of node $1, what runs on machine $1
    NODE_ARGV=(msrun --worker_num=2 --local_worker_num=1 --node_rank="$1" --master_addr="$MASTER_ADDR"
               --master_port="$MASTER_PORT" --join=True --log_dir="$OUT/logs_node$1" model_zoo_lenet/train.py
               "${TRAIN_ARGS[@]}")
}
mkdir -p "$OUT"
echo "== node 1 (namespace $NS1), in the background:"
node_argv 1
echo "+ ip netns exec $NS1 env PATH=$VENV_BIN:\$PATH ${NODE_ARGV[*]}"
ip netns exec "$NS1" env PATH="$VENV_BIN:$PATH" "${NODE_ARGV[@]}" > "$OUT/node1.out" 2>&1 &
NODE1=$!
echo "== node 0 (namespace $NS0, the master):"
node_argv 0
echo "+ ip netns exec $NS0 env PATH=$VENV_BIN:\$PATH ${NODE_ARGV[*]}"
STATUS0=0
ip netns exec "$NS0" env PATH="$VENV_BIN:$PATH" "${NODE_ARGV[@]}" > "$OUT/node0.out" 2>&1 || STATUS0=$?
STATUS1=0
wait "$NODE1" || STATUS1=$?
echo "== node 0's launcher exited $STATUS0, node 1's exited $STATUS1 (launcher output: $OUT/node0.out," \
     "$OUT/node1.out; worker logs: $OUT/logs_node0, $OUT/logs_node1)"
if [ "$STATUS0" -ne 0 ] || [ "$STATUS1" -ne 0 ]; then
    tail -n 20 "$OUT"/logs_node*/worker_*.log >&2 || true
    exit 1
fi
"$VENV_BIN/python" - "$OUT/ckpt" <<'EOF'
import glob, os, sys
import numpy as np
import mindspore as ms
root = sys.argv[1]
names = [os.path.basename(p) for p in
         sorted(glob.glob(os.path.join(root, "rank_0", "checkpoint_*.ckpt")), key=os.path.getmtime)]
if not names:
    sys.exit(f"two_node_demo: no checkpoint under {root}/rank_0")
for name in names:
    ranks = [ms.load_checkpoint(os.path.join(root, f"rank_{r}", name)) for r in (0, 1)]
    differ = [k for k, v in ranks[0].items() if not np.array_equal(v.asnumpy(), ranks[1][k].asnumpy())]
    if differ:
        sys.exit(f"two_node_demo: {name} differs between the nodes in {differ}")
print(f"== rank 0 (node 0) and rank 1 (node 1) hold identical parameters in {len(names)} checkpoints, "
      f"the last {root}/rank_0/{names[-1]}")
EOF
