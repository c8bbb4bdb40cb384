#!/usr/bin/env bash
# The runs behind docs/benchmarks.md's YCSB table: workloads A-F against a
# 3-node embedded rdkv cluster (GETs one-sided over shm, then by RPC over
# TCP) and a local redis-server, one invocation per workload, same seed.
# Needs release builds: cargo build --release -p rdkv-server -p rdkv-bench
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-bench-results}
mkdir -p "$OUT"
for w in a b c d e f; do
  target/release/rdkv-bench ycsb --embedded 3 --start-redis \
    -P bench/workloads/workload$w -p recordcount=10000 -p operationcount=20000 \
    --threads 1 --concurrency 16 --seed 1 \
    --target rdkv-shm --target rdkv-tcp --target redis \
    --json "$OUT/workload$w.json" | tee "$OUT/workload$w.txt"
done
