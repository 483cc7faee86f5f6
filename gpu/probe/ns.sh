#!/bin/bash
set -u
cd "$(dirname "$0")"
export LD_LIBRARY_PATH=/usr/local/nvidia/lib64:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
W=/tmp/probe; mkdir -p $W
[ -x $W/vmm_probe ] || nvcc -O2 -o $W/vmm_probe vmm_probe.cu -lcuda > /dev/null 2>&1
S=$W/p.sock
$W/vmm_probe server $S > $OUT/server2.log 2>&1 &
SP=$!; sleep 3
for u in "--ipc" "--pid --fork" "--pid --fork --mount --mount-proc" "--pid --ipc --fork --mount --mount-proc" "--user --map-root-user --pid --ipc --fork --mount --mount-proc"; do
  echo "== unshare $u"; timeout 60 unshare $u $W/vmm_probe worker $S read 2>&1 || echo "rc=$?"
done
kill $SP
