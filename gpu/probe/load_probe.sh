#!/bin/bash
# Runs the loader probe (gpu/probe/load_probe.cu) on the GPU machine; JSON lines under $OUT.
# Usage: gpu/probe/load_probe.sh [DIR]   (DIR: where the 8 GiB file goes; default /tmp/lp)
set -u
cd "$(dirname "$0")"
export LD_LIBRARY_PATH=/usr/local/nvidia/lib64:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
D=${1:-/tmp/lp}; mkdir -p $D; F=$D/probe.bin; P=$D/load_probe
O=${OUT:-/tmp/lp-out}; mkdir -p $O
exec > >(tee $O/probe.log) 2>&1
nvcc -O2 -std=c++17 -o $P load_probe.cu 2>&1 | tail -5
echo "== machine"; nproc; lscpu | grep -E 'Model name|NUMA|Socket'; ls /sys/devices/system/node | grep node
nvidia-smi --query-gpu=name,pci.bus_id --format=csv,noheader
BUS=$(nvidia-smi --query-gpu=pci.bus_id --format=csv,noheader | head -1 | tr 'A-Z' 'a-z' | sed 's/^0000\(....\)/\1/')
cat /sys/bus/pci/devices/*${BUS#*:}/numa_node 2>/dev/null | head -1
df -hT $D; findmnt -T $D; lsblk -o NAME,SIZE,ROTA,TYPE,MOUNTPOINT 2>/dev/null | head -20; free -g
[ -f $F ] || $P make $F 8
$P h2d
echo "== warm"; cat $F > /dev/null
for t in 1 4 8 16; do $P read $F $t 16 noh2d; $P read $F $t 16; done
for t in 8 16; do $P read $F $t 64; $P mmapcopy $F $t 16; done
for c in 16 64 256; do for t in 1 4 8 16; do $P register $F $t $c; done; done
$P register $F 4 64 noh2d
echo "== cold"
for t in 1 4 8 16; do for c in 16 64; do $P drop $F; $P direct $F $t $c noh2d; done; done
for t in 4 8 16; do $P drop $F; $P direct $F $t 16; done
$P drop $F; $P read $F 16 16
$P drop $F; $P register $F 8 64
$P drop $F; dd if=$F of=/dev/null bs=16M iflag=direct 2>&1 | tail -1
