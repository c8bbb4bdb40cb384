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
pgrep -f "rdkv-server --id" > /dev/null && { echo "servers still running"; exit 1; }
DIR=$(mktemp -d "${TMPDIR:-/tmp}/compaction-lease.XXXX")
ic="1=127.0.0.11:17380,2=127.0.0.12:17380,3=127.0.0.13:17380"
for i in 1 2 3; do
  RUST_LOG=info $BIN/rdkv-server --id $i --data-dir $DIR/n$i --listen 127.0.0.1$i:17379 --peer-listen 127.0.0.1$i:17380 --http-listen 127.0.0.1$i:17381 --resp-listen 127.0.0.1$i:16380 --resp-read-consistency lease --region-mib $MIB --initial-cluster $ic > $DIR/log$i 2>&1 &
done
L=; for _ in $(seq 100); do for i in 1 2 3; do redis-cli -h 127.0.0.1$i -p 16380 info replication 2>/dev/null | grep -q role:master && L=$i; done; [[ -n $L ]] && break; sleep 0.2; done
echo "leader $L $(date +%T)"
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
for i in 1 2 3; do echo "== node $i"; grep -E "compacted|election: new term|leader changed|role changed" $DIR/log$i | cut -c1-160 | tail -6; done
for i in 1 2 3; do curl -s 127.0.0.1$i:17381/metrics | grep -E "^rdkv_raft_is_leader|^rdkv_raft_term|^rdkv_region_compactions_total"; done
pkill -f "rdkv-server --id"; while pgrep -f "rdkv-server --id" > /dev/null; do sleep 0.5; done
rm -rf $DIR/n1 $DIR/n2 $DIR/n3; echo "node logs in $DIR"
