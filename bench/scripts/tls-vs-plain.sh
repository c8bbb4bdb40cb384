#!/bin/bash
# RESP and native GET/SET throughput of one rdkv node without TLS and one
# with TLS (client certificates required), in one run: both nodes run side
# by side and the measurements alternate, round after round, so that both
# see the same machine. Figures in docs/benchmarks.md ("TLS").
#
# Needs release builds (cargo build --release -p rdkv-server -p rdkv-bench),
# openssl and redis-tools (redis-benchmark with --tls).
set -euo pipefail
REPO=$(cd "$(dirname "$0")/../.." && pwd)
R=${R:-$REPO/target/release}
W=${W:-/tmp/rdkv-tls-bench}
N=${N:-50000}
rm -rf "$W"; mkdir -p "$W"; cd "$W"

# The CA and certificates, made as docs/security.md makes them.
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes \
  -keyout ca.key -out ca.pem -days 30 -subj "/CN=bench CA" \
  -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" 2>/dev/null
for who in node client; do
  printf 'subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth,clientAuth\nkeyUsage=critical,digitalSignature\nauthorityKeyIdentifier=keyid\n' > $who.ext
  openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout $who.key -out $who.csr -subj "/CN=$who" 2>/dev/null
  openssl x509 -req -in $who.csr -CA ca.pem -CAkey ca.key -CAcreateserial -out $who.pem -days 30 -extfile $who.ext 2>/dev/null
done

# Two single-node clusters: plain, and TLS on every port. No shm or Unix
# socket, so that every request crosses TCP (and TLS).
COMMON="--http-listen off --shm-socket off --rpc-socket off"
"$R/rdkv-server" --data-dir plain --listen 127.0.0.1:27379 --peer-listen 127.0.0.1:27380 \
  --resp-listen 127.0.0.1:26380 $COMMON 2>plain.log &
P1=$!
"$R/rdkv-server" --data-dir tls --listen 127.0.0.1:28379 --peer-listen 127.0.0.1:28380 \
  --resp-listen 127.0.0.1:26381 $COMMON \
  --tls-cert node.pem --tls-key node.key --tls-ca ca.pem 2>tls.log &
P2=$!
trap 'kill $P1 $P2' EXIT
sleep 3

CLIENT_TLS="--tls-ca ca.pem --tls-cert client.pem --tls-key client.key"
# redis-benchmark -t set,get: 50 connections, 3-byte values.
resp() { # $1 port, rest: TLS flags
  local port=$1; shift
  redis-benchmark -h 127.0.0.1 -p "$port" "$@" -t set,get -n "$N" -q \
    | tr '\r' '\n' | grep -oE '(SET|GET): [0-9.]+ requests per second' | tr '\n' ' '
}
# rdkv-bench over the native protocol (RPC over TCP), 2 threads x 16 in
# flight, 10 000 records of YCSB's 10 x 100 bytes; GET runs load them first.
native() { # $1 endpoint, $2 get|set, rest: TLS flags
  local endpoint=$1 op=$2; shift 2
  local mix="-p readproportion=1 -p updateproportion=0" phase=both
  if [ "$op" = set ]; then mix="-p readproportion=0 -p updateproportion=1"; phase=run; fi
  "$R/rdkv-bench" ycsb --endpoints "$endpoint" --target rdkv-tcp \
    -P "$REPO/bench/workloads/workloadc" -p recordcount=10000 -p operationcount="$N" $mix \
    --threads 2 --concurrency 16 --no-progress --phase $phase "$@" 2>/dev/null \
    | grep -E '^\[OVERALL\], Throughput' | tail -1 | awk -F', ' '{printf "%.0f", $3}'
}
for round in $(seq "${ROUNDS:-3}"); do
  echo "== round $round (load average: $(cut -d' ' -f1-3 /proc/loadavg))"
  echo "resp plain: $(resp 26380)"
  echo "resp tls:   $(resp 26381 --tls --cacert ca.pem --cert client.pem --key client.key)"
  echo "native plain GET ops/s: $(native 127.0.0.1:27379 get)"
  echo "native tls   GET ops/s: $(native 127.0.0.1:28379 get $CLIENT_TLS)"
  echo "native plain SET ops/s: $(native 127.0.0.1:27379 set)"
  echo "native tls   SET ops/s: $(native 127.0.0.1:28379 set $CLIENT_TLS)"
done
