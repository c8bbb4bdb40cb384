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
. "$HERE/cluster.sh"
start_cluster flushall-lease
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
report_and_stop "" ""
