#!/usr/bin/env bash
# Does a leader keep its lease and leadership through a FLUSHALL of a
# region of millions of keys? (docs/reliability.md,
# a_clear_leaves_the_state_lock_free) Three nodes with --region-mib $MIB
# (default 1024) on loopback; $N keys (default 4,000,000) of 8-byte values
# written through the leader's RESP port, then FLUSHALL (timed), while one
# GET at a time is timed (probe.py). Prints the FLUSHALL's time, the
# probe's longest waits and each node's term: a term above 1 means an
# election.
# usage: bench/scripts/compaction/flushall-lease.sh BIN_DIR (a release rdkv-server)
# Needs redis-cli, python3, curl; about 2 GB of memory per node.
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
BIN=$1; MIB=${MIB:-1024}; N=${N:-4000000}
pgrep -f "rdkv-server --id" > /dev/null && { echo "servers still running"; exit 1; }
DIR=$(mktemp -d "${TMPDIR:-/tmp}/flushall-lease.XXXX")
ic="1=127.0.0.11:17380,2=127.0.0.12:17380,3=127.0.0.13:17380"
for i in 1 2 3; do
  RUST_LOG=info $BIN/rdkv-server --id $i --data-dir $DIR/n$i --listen 127.0.0.1$i:17379 --peer-listen 127.0.0.1$i:17380 --http-listen 127.0.0.1$i:17381 --resp-listen 127.0.0.1$i:16380 --resp-read-consistency lease --region-mib $MIB --initial-cluster $ic > $DIR/log$i 2>&1 &
done
L=; for _ in $(seq 100); do for i in 1 2 3; do redis-cli -h 127.0.0.1$i -p 16380 info replication 2>/dev/null | grep -q role:master && L=$i; done; [[ -n $L ]] && break; sleep 0.2; done
echo "leader $L $(date +%T)"
python3 "$HERE/commands.py" set s $N 8 | redis-cli -h 127.0.0.1$L -p 16380 --pipe | tail -1
echo "dbsize $(redis-cli -h 127.0.0.1$L -p 16380 dbsize) $(date +%T)"
sleep 5
python3 "$HERE/probe.py" 127.0.0.1$L 16380 & P=$!
sleep 2
start=$(date +%s.%N)
echo "FLUSHALL: $(redis-cli -h 127.0.0.1$L -p 16380 flushall) in $(echo "$(date +%s.%N) - $start" | bc) s"
sleep 3
kill -TERM $P; wait $P
echo "dbsize $(redis-cli -h 127.0.0.1$L -p 16380 dbsize) $(date +%T)"
for i in 1 2 3; do echo "== node $i"; grep -E "election: new term|leader changed|role changed" $DIR/log$i | cut -c1-160 | tail -6; done
for i in 1 2 3; do curl -s 127.0.0.1$i:17381/metrics | grep -E "^rdkv_raft_is_leader|^rdkv_raft_term"; done
pkill -f "rdkv-server --id"; while pgrep -f "rdkv-server --id" > /dev/null; do sleep 0.5; done
rm -rf $DIR/n1 $DIR/n2 $DIR/n3; echo "node logs in $DIR"
