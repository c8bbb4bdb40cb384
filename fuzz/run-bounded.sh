#!/usr/bin/env bash
# Bounded fuzzing run (CI and by hand): builds every cargo-fuzz target and
# runs each for SECONDS against its committed corpus (fuzz/corpus/<target>).
# Fails on the first crash, panic, hang or over-large allocation, leaving the
# reproducer in fuzz/artifacts/<target>/; prints executions per target.
#
#   bash fuzz/run-bounded.sh 20
#
# New inputs libFuzzer finds go to a scratch directory, not to the committed
# corpus, so a run leaves the work tree clean. Stable toolchain: cargo-fuzz
# needs nightly flags (-Zsanitizer), which RUSTC_BOOTSTRAP=1 unlocks.
set -euo pipefail

seconds=${1:?usage: fuzz/run-bounded.sh SECONDS}
cd "$(dirname "$0")/.."

export RUSTC_BOOTSTRAP=1
export CARGO_INCREMENTAL=0
# A panic's message names the failed assertion; symbolising a backtrace
# would itself allocate past -malloc_limit_mb and turn the crash into an "oom".
export RUST_BACKTRACE=0

# Pinned: the version this script and the targets were checked with.
CARGO_FUZZ_VERSION=0.13.2
if ! cargo fuzz --version >/dev/null 2>&1; then
    echo "== installing cargo-fuzz $CARGO_FUZZ_VERSION"
    cargo install cargo-fuzz --version "$CARGO_FUZZ_VERSION" --locked
fi

echo "== fuzz: building all targets"
cargo fuzz build

scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT

# -malloc_limit_mb: no single allocation of 4 MiB or more (the largest bound
#   any target sets is the snapshot record bound, about 1 MiB);
# -timeout: one input taking 10 s is a hang;
# -print_final_stats: prints stat::number_of_executed_units.
flags=(-max_total_time="$seconds" -malloc_limit_mb=4 -rss_limit_mb=1024 -timeout=10
    -print_final_stats=1)

summary=()
for target in $(cargo fuzz list); do
    echo "== fuzz: $target for ${seconds}s"
    mkdir -p "$scratch/$target"
    log="$scratch/$target.log"
    # The scratch dir comes first: libFuzzer writes new inputs to the first dir.
    if ! cargo fuzz run "$target" "$scratch/$target" "fuzz/corpus/$target" -- "${flags[@]}" \
        >"$log" 2>&1; then
        tail -n 60 "$log"
        echo "fuzz: $target FAILED; reproduce with:"
        echo "  RUSTC_BOOTSTRAP=1 cargo fuzz run $target fuzz/artifacts/$target/<artifact>"
        exit 1
    fi
    execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -n 1)
    grep -E '^(Done|#[0-9]+ +DONE)' "$log" | tail -n 1 || true
    summary+=("$target: ${execs:-?} executions in ${seconds}s, no crash")
done

echo "== fuzz summary"
printf '%s\n' "${summary[@]}"
