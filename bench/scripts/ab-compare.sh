#!/usr/bin/env bash
# A/B of two builds on the same machine in one invocation, alternating, so that
# the machine's noise falls on both: YCSB workload C over shm (3 nodes) and
# redis-benchmark SET/GET against one node's RESP port.
# Usage: ab-compare.sh BASE_BIN_DIR AFTER_BIN_DIR bench/workloads
# Each BIN_DIR holds release rdkv-server and rdkv-bench of one commit.
set -euo pipefail
BASE=$1; AFTER=$2; W=$3
N=50000
ycsb() { # $1 bin dir, $2 label
  "$1/rdkv-bench" ycsb --embedded 3 -P "$W/workloadc" -p recordcount=100000 -p operationcount=2000000 \
     --target rdkv-shm --threads 2 --concurrency 16 --phase both --no-progress 2>&1 \
     | grep -E "run phase|\[OVERALL\], Throughput|\[READ\], (50th|99th)PercentileLatency" | sed "s/^/$2 ycsb-c: /"
}
resp() { # $1 bin dir, $2 label, $3 port
  local d; d=$(mktemp -d /tmp/ab-resp.XXXX)
  "$1/rdkv-server" --data-dir "$d" --listen 127.0.0.1:$(( $3 + 1 )) --peer-listen 127.0.0.1:$(( $3 + 2 )) \
     --http-listen off --resp-listen 127.0.0.1:$3 > "$d/log" 2>&1 &
  local pid=$!
  for _ in $(seq 100); do redis-cli -p $3 ping >/dev/null 2>&1 && break; sleep 0.1; done
  sleep 1
  redis-benchmark -p $3 -t set,get -n $N -q | tr '\r' '\n' | grep -E "^(SET|GET)" | sed "s/^/$2 resp: /"
  kill $pid; wait $pid || true; rm -rf "$d"
}
for round in 1 2; do
  ycsb "$BASE" "base r$round"
  ycsb "$AFTER" "after r$round"
  resp "$BASE" "base r$round" 16380
  resp "$AFTER" "after r$round" 16390
done
