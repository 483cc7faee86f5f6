#!/bin/bash
# Runs the VMM probe (gpu/probe/vmm_probe.cu) on the GPU machine; logs under $OUT.
set -u
cd "$(dirname "$0")"
export LD_LIBRARY_PATH=/usr/local/nvidia/lib64:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
W=/tmp/probe; mkdir -p $W
nvcc -O2 -o $W/vmm_probe vmm_probe.cu -lcuda 2>&1 | tail -5
S=$W/p.sock
$W/vmm_probe server $S > $OUT/server.log 2>&1 &
SP=$!; sleep 3
for m in read memcpy-write kernel-write rw-remap wait-flag reexport attach-bench; do
  echo "== $m"; timeout 60 $W/vmm_probe worker $S $m 2>&1
done
echo "== unshare (root?)"; id
echo "== unshare pid+ipc"; timeout 60 unshare --pid --ipc --fork $W/vmm_probe worker $S read 2>&1 || echo "unshare rc=$?"
echo "== unshare user+pid+ipc"; timeout 60 unshare --user --map-root-user --pid --ipc --fork $W/vmm_probe worker $S read 2>&1 || echo "unshare-user rc=$?"
echo "== hold, kill -9 server at 5s"
( timeout 40 $W/vmm_probe worker $S hold > $OUT/hold.log 2>&1 ) &
HP=$!; sleep 5; kill -9 $SP; echo killed server; sleep 3; nvidia-smi --query-gpu=memory.used --format=csv
wait $HP; tail -5 $OUT/hold.log; grep -c '"sum_ok":1' $OUT/hold.log
echo "== server log"; cat $OUT/server.log
