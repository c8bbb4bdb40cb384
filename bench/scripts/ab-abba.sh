#!/usr/bin/env bash
# A/B of two builds in ABBA order (A B, B A, B A, A B), so that neither
# always runs first: YCSB C over shm (3 nodes, 100,000 records, 2M reads)
# and redis-benchmark SET/GET on one node's RESP port. One line per run.
# Usage: bench/scripts/ab-abba.sh A_BIN_DIR B_BIN_DIR A_LABEL B_LABEL
# (from the repository root; each dir holds release rdkv-server, rdkv-bench).
set -euo pipefail
W=${W:-bench/workloads}; N=50000
ycsb() { "$1/rdkv-bench" ycsb --embedded 3 -P "$W/workloadc" -p recordcount=100000 -p operationcount=2000000 \
     --target rdkv-shm --threads 2 --concurrency 16 --phase both --no-progress 2>&1 \
     | grep -E "\[OVERALL\], Throughput" | tail -1 | awk -F', ' -v l="$2" '{printf "%s ycsb %d\n", l, $3}'; }
resp() { local d; d=$(mktemp -d /tmp/ab-resp.XXXX)
  "$1/rdkv-server" --data-dir "$d" --listen 127.0.0.1:$(( $3 + 1 )) --peer-listen 127.0.0.1:$(( $3 + 2 )) \
     --http-listen off --resp-listen 127.0.0.1:$3 > "$d/log" 2>&1 &
  local pid=$!
  for _ in $(seq 100); do redis-cli -p $3 ping >/dev/null 2>&1 && break; sleep 0.1; done
  sleep 1
  redis-benchmark -p $3 -t set,get -n $N -q | tr '\r' '\n' | grep -E "^(SET|GET): [0-9]" | awk -v l="$2" '{printf "%s %s %d\n", l, $1, $2}'
  kill $pid; wait $pid || true; rm -rf "$d"; }
A=$1; B=$2; LA=$3; LB=$4
for pair in "$A $LA $B $LB" "$B $LB $A $LA" "$B $LB $A $LA" "$A $LA $B $LB"; do
  set -- $pair
  ycsb $1 $2; ycsb $3 $4
  resp $1 $2 16380; resp $3 $4 16390
done
