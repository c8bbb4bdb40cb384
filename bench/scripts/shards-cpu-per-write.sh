#!/usr/bin/env bash
# Issue 20: CPU time per durable write, one shard against six. The same
# run as shards-throughput.sh (rdkv-bench ycsb, an embedded 3-node cluster
# of --shards 1, then --shards 6, --replicas 3, update-only, 2 threads x
# 128 in flight), each under /usr/bin/time: user + system CPU seconds of
# rdkv-bench and the three rdkv-server processes it starts and reaps,
# divided by the updates made (the load phase's records, the warm-up's and
# the measured phase's). On a machine whose cores are all busy, throughput
# is at most cores / (CPU per write), so the ratio of the two CPU costs
# bounds what six shards can gain there.
#
#   bench/scripts/shards-cpu-per-write.sh [BIN_DIR] [SECONDS]
set -euo pipefail

BIN=${1:-target/release}
SECONDS_PER_RUN=${2:-15}
export RDKV_SERVER_BIN="$BIN/rdkv-server"

run() {
    local shards=$1 out
    echo "== --shards $shards (load average: $(cut -d' ' -f1-3 /proc/loadavg))" >&2
    out=$(/usr/bin/time -f "cpu_s=%U+%S" "$BIN/rdkv-bench" ycsb --target rdkv-tcp --embedded 3 \
        --shards "$shards" --replicas 3 --embedded-region-mib 64 -P bench/workloads/workloada \
        -p recordcount=10000 -p readproportion=0 -p updateproportion=1 \
        --threads 2 --concurrency 128 --warmup-secs 3 --duration-secs "$SECONDS_PER_RUN" \
        --no-progress 2>&1)
    # Every [OVERALL] phase's operations: throughput x run time.
    echo "$out" | grep -E '^\[OVERALL\]|cpu_s=' >&2
    echo "$out" | awk -F', ' '
        /^\[OVERALL\], RunTime/ {ms = $3}
        /^\[OVERALL\], Throughput/ {ops += $3 * ms / 1000}
        /cpu_s=/ {split(substr($0, index($0, "=") + 1), t, "+"); cpu = t[1] + t[2]}
        END {printf "%.0f %.2f %.1f\n", ops, cpu, cpu / ops * 1e6}'
}

read -r ops1 cpu1 us1 < <(run 1)
read -r ops6 cpu6 us6 < <(run 6)
echo "1 shard: $ops1 writes, $cpu1 CPU s, $us1 us CPU per write"
echo "6 shards: $ops6 writes, $cpu6 CPU s, $us6 us CPU per write"
echo "CPU per write, 6 / 1: $(awk -v a="$us1" -v b="$us6" 'BEGIN {printf "%.2f", b / a}')"
