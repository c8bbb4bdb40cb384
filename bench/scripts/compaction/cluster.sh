# Sourced by the scripts of this directory: three release nodes on
# loopback, and their report and stop. Needs BIN (the rdkv-server's
# directory) and MIB (the region's size) set.

# Starts the three nodes (data and logs in a new $DIR named after $1) and
# sets L to the leader's number (127.0.0.1$L).
start_cluster() {
  pgrep -f "rdkv-server --id" > /dev/null && { echo "servers still running"; exit 1; }
  DIR=$(mktemp -d "${TMPDIR:-/tmp}/$1.XXXX")
  local ic="1=127.0.0.11:17380,2=127.0.0.12:17380,3=127.0.0.13:17380" i
  for i in 1 2 3; do
    RUST_LOG=info $BIN/rdkv-server --id $i --data-dir $DIR/n$i --listen 127.0.0.1$i:17379 --peer-listen 127.0.0.1$i:17380 --http-listen 127.0.0.1$i:17381 --resp-listen 127.0.0.1$i:16380 --resp-read-consistency lease --region-mib $MIB --initial-cluster $ic > $DIR/log$i 2>&1 &
  done
  L=; for _ in $(seq 100); do for i in 1 2 3; do redis-cli -h 127.0.0.1$i -p 16380 info replication 2>/dev/null | grep -q role:master && L=$i; done; [[ -n $L ]] && break; sleep 0.2; done
  echo "leader $L $(date +%T)"
}

# Prints each node's log lines matching $1 (elections always) and metrics
# matching $2 (leadership and term always), then stops the nodes and
# removes their data (the logs stay).
report_and_stop() {
  local i
  for i in 1 2 3; do echo "== node $i"; grep -E "election: new term|leader changed|role changed${1:+|$1}" $DIR/log$i | cut -c1-160 | tail -6; done
  for i in 1 2 3; do curl -s 127.0.0.1$i:17381/metrics | grep -E "^rdkv_raft_is_leader|^rdkv_raft_term${2:+|$2}"; done
  pkill -f "rdkv-server --id"; while pgrep -f "rdkv-server --id" > /dev/null; do sleep 0.5; done
  rm -rf $DIR/n1 $DIR/n2 $DIR/n3; echo "node logs in $DIR"
}
