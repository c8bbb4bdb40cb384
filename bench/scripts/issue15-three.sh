#!/usr/bin/env bash
# Issue 15's three measurements (docs/benchmarks.md, "The same three
# measurements on a quiet machine"), for a BASE and a NEW build:
#  1. one write at a time against 3 nodes started by hand, with the
#     leader's stage breakdown from /metrics (NEW only);
#  2. RESP GET (-P 16) and SET (256 clients) through the leader's RESP port
#     against redis-server (and redis-server with appendfsync always);
#  3. update-only 2 x 128 in flight, rdkv 3 nodes vs etcd 3 members.
# Usage (from the repository root): bench/scripts/issue15-three.sh BASE_DIR NEW_DIR
# Each dir holds release rdkv-server and rdkv-bench (the latter built with
# --features etcd). Needs redis-server, redis-benchmark, etcd, curl.
# SERVER_ARGS="..." adds flags to every rdkv-server of both builds (e.g.
# "--worker-threads=1": the three nodes and the clients share this host's
# cores).
set -uo pipefail
BASE=$1; NEW=$2; W=bench/workloads
cleanup() {
  pkill -f "rdkv-server --id"
  redis-cli -p 16390 shutdown nosave > /dev/null 2>&1
  redis-cli -p 16391 shutdown nosave > /dev/null 2>&1
}
trap cleanup EXIT
EMBEDDED_ARGS=()
for arg in ${SERVER_ARGS:-}; do EMBEDDED_ARGS+=("--server-arg=$arg"); done
IC="1=127.0.0.11:17380,2=127.0.0.12:17380,3=127.0.0.13:17380"
start3() { # $1: server binary, $2: data root, $3: RESP (on|off)
  pkill -f "rdkv-server --id" ; sleep 0.5; rm -rf "$2"; mkdir -p "$2"
  for i in 1 2 3; do
    local resp=off; [ "$3" = on ] && resp=127.0.0.1$i:16380
    "$1" --id $i --data-dir "$2/n$i" --listen 127.0.0.1$i:17379 --peer-listen 127.0.0.1$i:17380 \
      --http-listen 127.0.0.1$i:17381 --resp-listen $resp --initial-cluster $IC ${SERVER_ARGS:-} > "$2/log$i" 2>&1 &
  done
  sleep 3
}
# The node that leads, waiting up to 10 s for an election.
leader() {
  for _ in $(seq 50); do
    for i in 1 2 3; do
      # grep reads to the end (no -q): under pipefail, curl cut off by an
      # early exit would fail the test on the leader itself.
      curl -s -m 1 127.0.0.1$i:17381/metrics | grep -E '^rdkv_raft_is_leader(\{[^}]*\})? 1' > /dev/null \
        && { echo $i; return; }
    done
    sleep 0.2
  done
  echo "no leader after 10 s" >&2; exit 1
}
rate() { tr '\r' '\n' | grep 'requests per second' | tail -1; }

echo "== one write at a time (NEW) $(uptime)"
start3 "$NEW/rdkv-server" /tmp/issue15-w1 off
"$NEW/rdkv-bench" ycsb --target rdkv-tcp --endpoints 127.0.0.11:17379,127.0.0.12:17379,127.0.0.13:17379 \
  --transport tcp -P $W/workloada -p recordcount=1000 -p readproportion=0 -p updateproportion=1 \
  --threads 1 --concurrency 1 --duration-secs 10 --no-progress 2>&1 | grep -E "^\[UPDATE\]"
for i in 1 2 3; do echo "node $i"; curl -s 127.0.0.1$i:17381/metrics \
  | grep -E "^rdkv_raft_is_leader(\{[^}]*\})? 1|stage_latency.*0.5\"|fsync_duration_seconds_(sum|count)"; done

redis-server --port 16390 --save "" --appendonly no --daemonize yes > /dev/null
rm -rf /tmp/issue15-aof && mkdir -p /tmp/issue15-aof
redis-server --port 16391 --save "" --appendonly yes --appendfsync always --dir /tmp/issue15-aof --daemonize yes > /dev/null
for round in 1 2 3; do for v in BASE NEW; do
  dir=$BASE; [ $v = NEW ] && dir=$NEW
  start3 "$dir/rdkv-server" /tmp/issue15-resp on; L=$(leader) || exit 1
  redis-benchmark -h 127.0.0.1$L -p 16380 -t set -n 20000 -c 50 -q > /dev/null 2>&1
  echo "== RESP $v round $round leader=$L $(uptime)"
  echo "redis GET: $(redis-benchmark -p 16390 -t get -n 300000 -c 50 -P 16 -q 2>&1 | rate)"
  echo "rdkv  GET: $(redis-benchmark -h 127.0.0.1$L -p 16380 -t get -n 300000 -c 50 -P 16 -q 2>&1 | rate)"
  echo "redis-aof SET: $(redis-benchmark -p 16391 -t set -n 50000 -c 256 -q 2>&1 | rate)"
  echo "rdkv  SET: $(redis-benchmark -h 127.0.0.1$L -p 16380 -t set -n 50000 -c 256 -q 2>&1 | rate)"
done; done
cleanup

for round in 1 2; do for v in BASE NEW; do
  dir=$BASE; [ $v = NEW ] && dir=$NEW
  echo "== update-only $v round $round $(uptime)"
  out=$(RDKV_SERVER_BIN=$dir/rdkv-server "$NEW/rdkv-bench" ycsb --target rdkv-tcp --embedded 3 --target etcd \
    --start-etcd 3 "${EMBEDDED_ARGS[@]}" -P $W/workloada -p recordcount=10000 -p readproportion=0 -p updateproportion=1 \
    --threads 2 --concurrency 128 --duration-secs 15 --phase both --no-progress 2>&1)
  # A run that failed has no comparison: show why instead of nothing.
  grep -A5 "comparison, run phase" <<<"$out" | grep -E "throughput|p50|p99" \
    || { echo "no comparison; the run's last lines:"; tail -5 <<<"$out"; }
done; done
