#!/usr/bin/env bash
# The RDMA transport's device check (docs/rdma.md, "Device test plan").
#
#   scripts/rdma-check.sh [--rxe IFACE] [--device NAME] [--keep-rxe]
#
# On a Linux host with Soft-RoCE or an RDMA NIC: optionally sets up rxe0 on
# IFACE, runs the device tests (RDKV_RDMA_DEVICE), a short `rdkv-bench
# fabric` run and, when perftest is installed, ib_read_lat next to it;
# counts queue pairs and memory regions (`rdma resource show qp/mr`) before
# and after; prints one table. On a host without RDMA it prints one line
# saying why and exits 1.
set -euo pipefail
cd "$(dirname "$0")/.."

rxe_iface=""
device="${RDKV_RDMA_DEVICE:-}"
keep_rxe=0
while [ $# -gt 0 ]; do
    case "$1" in
        --rxe) rxe_iface="${2:?--rxe needs an interface}"; shift 2 ;;
        --device) device="${2:?--device needs a name}"; shift 2 ;;
        --keep-rxe) keep_rxe=1; shift ;;
        -h|--help) sed -n '2,11p' "$0"; exit 0 ;;
        *) echo "rdma-check: unknown argument $1" >&2; exit 2 ;;
    esac
done

no_rdma() {
    echo "rdma-check: no RDMA on this host: $1"
    exit 1
}

# Why there is no RDMA here, in one line, or nothing.
[ "$(uname -s)" = Linux ] || no_rdma "not Linux ($(uname -s))"
command -v rdma >/dev/null 2>&1 || no_rdma "the rdma tool (iproute2) is not installed"

created_rxe=0
if [ -n "$rxe_iface" ]; then
    ip link show "$rxe_iface" >/dev/null 2>&1 || no_rdma "no interface $rxe_iface"
    modprobe rdma_rxe 2>/dev/null || true
    [ -d /sys/module/rdma_rxe ] || no_rdma "the kernel has no rdma_rxe module (Soft-RoCE)"
    if [ ! -e /sys/class/infiniband/rxe0 ]; then
        rdma link add rxe0 type rxe netdev "$rxe_iface" || no_rdma "rdma link add rxe0 on $rxe_iface failed"
        created_rxe=1
    fi
    device="${device:-rxe0}"
fi
cleanup() {
    if [ "$created_rxe" = 1 ] && [ "$keep_rxe" = 0 ]; then
        rdma link delete rxe0 >/dev/null 2>&1 || true
    fi
}
trap cleanup EXIT

[ -d /sys/class/infiniband ] || no_rdma "no kernel RDMA support (/sys/class/infiniband is missing; load rdma_rxe or a NIC driver)"
devices=$(ls /sys/class/infiniband)
[ -n "$devices" ] || no_rdma "no RDMA device (try --rxe IFACE for Soft-RoCE)"
if [ -z "$device" ]; then
    device=$(printf '%s\n' "$devices" | head -n 1)
fi
[ -e "/sys/class/infiniband/$device" ] || no_rdma "no device $device (have: $(echo "$devices" | tr '\n' ' '))"
grep -qs ACTIVE /sys/class/infiniband/"$device"/ports/*/state || no_rdma "$device has no ACTIVE port"

export RDKV_RDMA_DEVICE="$device"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$PWD/target}"
log_dir=$(mktemp -d)

count() { rdma resource show "$1" 2>/dev/null | grep -c . || true; }
qp_before=$(count qp)
mr_before=$(count mr)

rows=()
row() { rows+=("$(printf '%-38s %-6s %s' "$1" "$2" "$3")"); }
step() {
    local name=$1; shift
    if "$@" >"$log_dir/$name.log" 2>&1; then
        row "$name" ok "$log_dir/$name.log"
    else
        row "$name" FAIL "$log_dir/$name.log"
    fi
}

step "memlock limit (ulimit -l)" test "$(ulimit -l)" = unlimited
step "unit tests (--features rdma)" cargo test -p rdkv-fabric --features rdma --lib rdma::
step "device tests (tests/tests/rdma.rs)" cargo test -p rdkv-tests --features rdma --test rdma -- --nocapture
step "rdkv-bench fabric (shm-get,tcp; auto=rdma)" cargo run -q --release -p rdkv-bench --features rdkv-client/rdma -- \
    fabric --transports shm-get,tcp --sizes 64,1024,4096,65536 --iterations 200 --warmup-iterations 20
if command -v ib_read_lat >/dev/null 2>&1; then
    step "ib_read_lat (perftest, loopback)" sh -c \
        "ib_read_lat -d '$device' -n 1000 >'$log_dir/srv' 2>&1 & sleep 1; ib_read_lat -d '$device' -n 1000 127.0.0.1"
else
    row "ib_read_lat (perftest)" skip "perftest not installed"
fi

qp_after=$(count qp)
mr_after=$(count mr)
leaks=ok
if [ "$qp_after" != "$qp_before" ] || [ "$mr_after" != "$mr_before" ]; then
    leaks=FAIL
fi
row "rdma resource qp/mr before -> after" "$leaks" "qp $qp_before -> $qp_after, mr $mr_before -> $mr_after"

echo "rdma-check on $device ($(uname -r))"
printf '%-38s %-6s %s\n' check result detail
printf '%s\n' "${rows[@]}"
for r in "${rows[@]}"; do
    case "$r" in *" FAIL "*) exit 1 ;; esac
done
