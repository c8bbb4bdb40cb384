#!/usr/bin/env bash
# Issue 20: update-only throughput of one shard against six, same client,
# same concurrency, back to back: rdkv-bench ycsb with an embedded 3-node
# cluster of --shards 1, then of --shards 6 (--replicas 3: every node hosts
# every shard, leaders spread one per node round-robin).
#
#   bench/scripts/shards-throughput.sh [BIN_DIR] [SECONDS]
#
# BIN_DIR holds rdkv-server and rdkv-bench (default target/release);
# each run measures SECONDS (default 20) after a 3 s warm-up. Prints each
# run's [OVERALL] lines, the load average before each, and the ratio.
set -euo pipefail

BIN=${1:-target/release}
SECONDS_PER_RUN=${2:-20}
export RDKV_SERVER_BIN="$BIN/rdkv-server"

run() {
    local shards=$1
    echo "== --shards $shards (load average: $(cut -d' ' -f1-3 /proc/loadavg))" >&2
    "$BIN/rdkv-bench" ycsb --target rdkv-tcp --embedded 3 --shards "$shards" --replicas 3 \
        --embedded-region-mib 64 -P bench/workloads/workloada \
        -p recordcount=10000 -p readproportion=0 -p updateproportion=1 \
        --threads 2 --concurrency 128 --warmup-secs 3 --duration-secs "$SECONDS_PER_RUN" \
        --no-progress 2>/dev/null |
        grep -E '^\[(OVERALL|UPDATE)\]' | tee /dev/stderr |
        awk -F', ' '/RUN.*Throughput|\[OVERALL\], Throughput/ {v=$3} END {print v}'
}

one=$(run 1)
six=$(run 6)
echo "update-only ops/s: 1 shard $one, 6 shards $six, ratio $(awk -v a="$one" -v b="$six" 'BEGIN {printf "%.2f", b / a}')"
