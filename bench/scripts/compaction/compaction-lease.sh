#!/usr/bin/env bash
# Does a leader keep its lease and leadership through a compaction of a
# large region? (docs/reliability.md, a_compaction_leaves_the_state_lock_free)
# Three nodes with --region-mib $MIB (default 1024) on loopback; the region
# is filled with 2,000-byte values through the leader's RESP port, every
# other key deleted (its free space then holes), and 4,000-byte values
# written until the region cannot place one and compacts. Meanwhile one
# GET at a time is timed (probe.py). Prints the probe's longest waits and
# each node's term and compaction count: a term above 1 means an election.
# usage: bench/scripts/compaction/compaction-lease.sh BIN_DIR (a release rdkv-server)
# Needs redis-cli, python3, curl; about 3 GB of memory per node and of disk.
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
BIN=$1; MIB=${MIB:-1024}; N=$((1700 * MIB / 4)); BIG=${BIG:-40000}
. "$HERE/cluster.sh"
start_cluster compaction-lease
python3 "$HERE/commands.py" set s $N 2000 | redis-cli -h 127.0.0.1$L -p 16380 --pipe | tail -1
python3 "$HERE/commands.py" del s $N 2 | redis-cli -h 127.0.0.1$L -p 16380 --pipe | tail -1
sleep 5
echo "filled and fragmented $(date +%T)"
python3 "$HERE/probe.py" 127.0.0.1$L 16380 & P=$!
sleep 1
python3 "$HERE/commands.py" set l $BIG 4000 | redis-cli -h 127.0.0.1$L -p 16380 --pipe | tail -1
sleep 2
kill -TERM $P; wait $P
echo "done $(date +%T)"
report_and_stop "compacted" "^rdkv_region_compactions_total"
