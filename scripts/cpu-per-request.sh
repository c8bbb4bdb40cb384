#!/usr/bin/env bash
# Server CPU per request of a 3-node rdkv cluster (issue 15): the
# utime+stime ticks (/proc/PID/stat, all threads) each node process spends
# while a fixed number of requests runs, divided by that number. Measures
# work, not time, so it holds on a shared machine (the absolute rates do
# not).
#
# usage: scripts/cpu-per-request.sh [BIN_DIR] [WHAT...]
#   BIN_DIR: where rdkv-server and rdkv-bench are (default target/release)
#   WHAT: any of set get update redis (default: set get update)
#     set:    redis-benchmark -t set -c 256 -n $SET_N at the leader's RESP port
#     get:    redis-benchmark -t get -c 50 -P $GET_PIPELINE (default 16)
#             -n $GET_N (lease reads,
#             or $READS)
#     update: rdkv-bench ycsb update-only, 2 threads x 128 in flight, $UPDATE_N ops
#     redis:  the same SET (appendfsync always) and GET (no persistence) at redis-server
#     down:   a follower killed and one SET written, then each node's CPU
#             over 5 s with no requests (the "per request" figure is the
#             whole 5 s); last, as the follower stays down
# Each measurement runs $ROUNDS times (default 2). PERF_DIR=DIR also
# records a perf profile of the leader per measurement into DIR, at
# PERF_HZ samples a second (default 299); PERF_ROLE=follower profiles the
# first follower instead. SERVER_ARGS="..." adds flags to every rdkv-server.
# SERVERS_ON=CPUS and CLIENT_ON=CPUS (taskset lists, e.g. 0 and 1) pin the
# servers (rdkv's nodes and redis-server alike) and the load generators,
# so that each side gets the same cores whichever store is measured.
# READS=linearizable starts the nodes with that RESP read consistency
# instead of lease. Each process's figure is split into user and system
# time too. Each line ends with the machine's idle ticks (all CPUs,
# /proc/stat's idle + iowait) over the measurement: a load that leaves a
# core idle is bound by waiting, not by work.
set -euo pipefail

BIN=${1:-target/release}
shift || true
WHAT=("${@:-set get update}")
[[ ${#WHAT[@]} -eq 1 ]] && read -r -a WHAT <<<"${WHAT[0]}"
SET_N=${SET_N:-100000}
GET_N=${GET_N:-2000000}
GET_PIPELINE=${GET_PIPELINE:-16}
UPDATE_N=${UPDATE_N:-100000}
ROUNDS=${ROUNDS:-2}
HZ=$(getconf CLK_TCK)
SERVER_PIN=()
CLIENT_PIN=()
[[ -n ${SERVERS_ON:-} ]] && SERVER_PIN=(taskset -c "$SERVERS_ON")
[[ -n ${CLIENT_ON:-} ]] && CLIENT_PIN=(taskset -c "$CLIENT_ON")
DIR=$(mktemp -d /tmp/cpuper.XXXXXX)
PIDS=()

cleanup() {
    for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
    wait 2>/dev/null || true
    rm -rf "$DIR"
}
trap cleanup EXIT

# user and system ticks of a process (all its threads), as "USER SYS".
ticks() { awk '{print $14, $15}' "/proc/$1/stat"; }
idle_ticks() { awk '$1 == "cpu" {print $5 + $6}' /proc/stat; }

# us of CPU per request for each pid, while "$@" runs with N requests.
measure() {
    local label=$1 n=$2
    shift 2
    local before=() after=() i
    local perf=""
    if [[ -n ${PERF_DIR:-} && -n ${PERF_PID:-} ]]; then
        # PERF_DIR: also profile one node (perf record, DWARF call graphs).
        perf record -e cpu-clock -F "${PERF_HZ:-299}" --call-graph dwarf,16384 -p "$PERF_PID" \
            -o "$PERF_DIR/${label// /_}.data" >/dev/null 2>&1 &
        perf=$!
        sleep 0.5
    fi
    for pid in "${MEASURED[@]}"; do before+=("$(ticks "$pid")"); done
    local idle_before idle_after
    idle_before=$(idle_ticks)
    "$@" >"$DIR/last.out" 2>&1
    idle_after=$(idle_ticks)
    for pid in "${MEASURED[@]}"; do after+=("$(ticks "$pid")"); done
    if [[ -n $perf ]]; then kill -INT "$perf"; wait "$perf" || true; fi
    local line="$label:"
    for i in "${!MEASURED[@]}"; do
        line+=" ${NAMES[i]} $(echo "${before[i]} ${after[i]}" | awk -v n="$n" -v hz="$HZ" \
            '{u = $3 - $1; s = $4 - $2; printf "%.2f us (%d ticks; user %.2f, sys %.2f)", (u + s) * 1e6 / hz / n, u + s, u * 1e6 / hz / n, s * 1e6 / hz / n}')"
    done
    echo "$line | $(grep -Eo '[0-9.]+ requests per second|\[OVERALL\], Throughput\(ops/sec\), [0-9.]+|throughput[^|]*' "$DIR/last.out" | head -1) | idle $((idle_after - idle_before)) ticks"
}

start_rdkv() {
    local ic="1=127.0.0.11:17380,2=127.0.0.12:17380,3=127.0.0.13:17380" i
    local first=${#PIDS[@]}
    for i in 1 2 3; do
        "${SERVER_PIN[@]}" "$BIN/rdkv-server" --id "$i" --data-dir "$DIR/n$i" --listen "127.0.0.1$i:17379" \
            --peer-listen "127.0.0.1$i:17380" --http-listen off --resp-listen "127.0.0.1$i:16380" \
            --resp-read-consistency "${READS:-lease}" --initial-cluster "$ic" ${SERVER_ARGS:-} >"$DIR/n$i.log" 2>&1 &
        PIDS+=($!)
    done
    LEADER=""
    for _ in $(seq 100); do
        for i in 1 2 3; do
            if redis-cli -h "127.0.0.1$i" -p 16380 info replication 2>/dev/null | grep -q role:master; then
                LEADER=$i
            fi
        done
        [[ -n $LEADER ]] && break
        sleep 0.2
    done
    [[ -n $LEADER ]] || { echo "no leader"; exit 1; }
    MEASURED=()
    NAMES=()
    PERF_PID=""
    for i in 1 2 3; do
        MEASURED+=("${PIDS[first + i - 1]}")
        if [[ $i == "$LEADER" ]]; then
            NAMES+=("leader")
            [[ ${PERF_ROLE:-leader} == leader ]] && PERF_PID=${PIDS[first + i - 1]}
        else
            NAMES+=("follower$i")
            [[ ${PERF_ROLE:-leader} == follower && -z ${PERF_PID:-} ]] && PERF_PID=${PIDS[first + i - 1]}
        fi
    done
    echo "leader: node $LEADER; $(uptime)"
}

run_rdkv() {
    local host="127.0.0.1$LEADER" r
    for what in "${WHAT[@]}"; do
        case $what in
        set)
            redis-benchmark -h "$host" -p 16380 -t set -c 256 -n 20000 -q >/dev/null
            for r in $(seq "$ROUNDS"); do
                measure "SET -c 256" "$SET_N" "${CLIENT_PIN[@]}" redis-benchmark -h "$host" -p 16380 -t set -c 256 -n "$SET_N" -q
            done
            ;;
        get)
            redis-benchmark -h "$host" -p 16380 -t get -c 50 -P 16 -n 200000 -q >/dev/null
            for r in $(seq "$ROUNDS"); do
                measure "GET -c 50 -P $GET_PIPELINE" "$GET_N" "${CLIENT_PIN[@]}" redis-benchmark -h "$host" -p 16380 -t get -c 50 -P "$GET_PIPELINE" -n "$GET_N" -q
            done
            ;;
        update)
            local eps="127.0.0.11:17379,127.0.0.12:17379,127.0.0.13:17379"
            local ycsb=("${CLIENT_PIN[@]}" "$BIN/rdkv-bench" ycsb --target rdkv-tcp --endpoints "$eps" -P bench/workloads/workloada
                -p recordcount=10000 -p readproportion=0 -p updateproportion=1 --threads 2 --concurrency 128 --no-progress)
            "${ycsb[@]}" --phase load >/dev/null
            for r in $(seq "$ROUNDS"); do
                measure "update-only 2x128" "$UPDATE_N" "${ycsb[@]}" --phase run -p operationcount="$UPDATE_N"
            done
            ;;
        down)
            local i
            # The follower killed is never the one profiled (PERF_ROLE=follower).
            for i in "${!NAMES[@]}"; do
                if [[ ${NAMES[i]} != leader && ${MEASURED[i]} != "${PERF_PID:-}" ]]; then
                    kill -9 "${MEASURED[i]}"
                    unset 'MEASURED[i]' 'NAMES[i]'
                    MEASURED=("${MEASURED[@]}") NAMES=("${NAMES[@]}")
                    break
                fi
            done
            # A write after the kill leaves the leader an entry to send it.
            redis-cli -h "127.0.0.1$LEADER" -p 16380 set after-the-kill 1 >/dev/null
            sleep 1
            for r in $(seq "$ROUNDS"); do
                measure "a follower down, 5 s idle" 1 sleep 5
            done
            ;;
        esac
    done
}

run_redis() {
    "${SERVER_PIN[@]}" redis-server --port 16391 --save "" --appendonly yes --appendfsync always --dir "$DIR" >/dev/null 2>&1 &
    PIDS+=($!)
    local aof=$!
    "${SERVER_PIN[@]}" redis-server --port 16390 --save "" --appendonly no >/dev/null 2>&1 &
    PIDS+=($!)
    local plain=$!
    sleep 0.5
    MEASURED=("$aof") NAMES=("redis-aof")
    redis-benchmark -p 16391 -t set -c 256 -n 20000 -q >/dev/null
    for r in $(seq "$ROUNDS"); do
        measure "redis SET -c 256 (appendfsync always)" "$SET_N" "${CLIENT_PIN[@]}" redis-benchmark -p 16391 -t set -c 256 -n "$SET_N" -q
    done
    MEASURED=("$plain") NAMES=("redis")
    redis-benchmark -p 16390 -t set -n 1000 -q >/dev/null
    for r in $(seq "$ROUNDS"); do
        measure "redis GET -c 50 -P $GET_PIPELINE" "$GET_N" "${CLIENT_PIN[@]}" redis-benchmark -p 16390 -t get -c 50 -P "$GET_PIPELINE" -n "$GET_N" -q
    done
}

if [[ " ${WHAT[*]} " == *" redis "* ]]; then
    run_redis
fi
if [[ " ${WHAT[*]} " =~ \ (set|get|update|down)\  ]]; then
    start_rdkv
    run_rdkv
fi
