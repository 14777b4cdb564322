#!/usr/bin/env bash
# Instructions gpucap adds to one step of a real program: the hooked driver calls of a
# PyTorch training step and of a CUDA-graph inference step, recorded on the fake GPU
# (tests/fixtures/steps/*.json, scripts/bench/step-profile.py), replayed by tests/c/step_replay.c
# under valgrind's callgrind, N and 2N steps: the difference / N is one step, set-up and
# exit cancelled out. Deterministic, unlike wall-clock time. N replays at least CALLS
# hooked calls (default 10000: 19 training steps, 5,000 graph steps), so that what a pool
# member does now and then (its periodic look at the pool) averages out.
#
#   scripts/bench/bench-step.sh [CALLS]
#   BENCH_SHIM=<path>: measure another build of libgpucap.so
#   BENCH_JSON=<path>: where the figures go (default target/bench-step.json)
#
# For each fixture: raw driver, LD_PRELOAD=libgpucap.so with GPUCAP_LIMIT (the ledger
# live), and the same in a pool (GPUCAP_POOL). Prints per step: raw, gpucap, added, pool,
# added, and the hooked calls per step; writes the JSON. Needs valgrind and a release
# build (cargo build --release).
set -euo pipefail
cd "$(dirname "$0")/../.."
CALLS=${1:-10000}
R=$PWD/target/release
SHIM=${BENCH_SHIM:-$R/libgpucap.so}
JSON=${BENCH_JSON:-$PWD/target/bench-step.json}
. scripts/bench/bench-lib.sh
bench_prepare bench-step "$SHIM" valgrind python3
# Everything the replay's process loads and names at fixed paths of its own
# (bench_fixed_layout): with the shim at the checkout's path, a 200-character checkout
# counted the pooled train step 2,235 instructions short (tests/bench/step_profile.rs holds
# the figures to where the checkout lies).
bench_fixed_layout bench-step "$SHIM"
SHIM=$lay/libgpucap.so FAKEDIR=$lay REPLAY=$lay/step_replay
cc -O2 -o "$REPLAY" tests/c/step_replay.c -Itests/c -L"$FAKEDIR" -lcuda

# replayed PRELOAD SEQUENCE STEPS [VAR=VALUE...]: total instructions of one replay.
replayed() {
    local preload=$1 seq=$2 steps=$3 out=$tmp/cg.$RANDOM
    shift 3
    (cd "$lay" && env LD_LIBRARY_PATH="$FAKEDIR" FAKECUDA_TOTAL_MEM=80Gi GPUCAP_LIMIT=40Gi "$@" \
        ${preload:+LD_PRELOAD=$preload} \
        valgrind --tool=callgrind --collect-atstart=no --callgrind-out-file="$out" "$REPLAY" "$seq" "$steps") >/dev/null 2>&1 ||
        { echo "bench-step: step_replay $seq $steps $* failed" >&2; exit 1; }
    awk '/^summary:/ {print $2}' "$out"
}

rows=()
for fixture in tests/fixtures/steps/*.json; do
    name=$(basename "$fixture" .json)
    seq=$lay/$name.seq
    python3 scripts/bench/step-profile.py sequence "$fixture" "$seq"
    calls=$(grep -c . "$seq")
    N=$(((CALLS + calls - 1) / calls))
    raw1=$(replayed "" "$seq" "$N"); raw2=$(replayed "" "$seq" $((2 * N)))
    shim1=$(replayed "$SHIM" "$seq" "$N"); shim2=$(replayed "$SHIM" "$seq" $((2 * N)))
    # Each pooled replay in a pool of its own: the second must not find what the first
    # learned in the pool file (what its kernels took), or N and 2N steps differ by more
    # than N steps.
    mkdir "$lay/pool-$name-1" "$lay/pool-$name-2"
    pool1=$(replayed "$SHIM" "$seq" "$N" GPUCAP_POOL=bench GPUCAP_POOL_DIR="$lay/pool-$name-1")
    pool2=$(replayed "$SHIM" "$seq" $((2 * N)) GPUCAP_POOL=bench GPUCAP_POOL_DIR="$lay/pool-$name-2")
    raw=$(((raw2 - raw1) / N)); shim=$(((shim2 - shim1) / N)); inpool=$(((pool2 - pool1) / N))
    printf '%s step (%d hooked calls; %d and %d steps): raw %d instructions, gpucap %d, added %d; in a pool %d, added %d\n' \
        "$name" "$calls" "$N" $((2 * N)) "$raw" "$shim" $((shim - raw)) "$inpool" $((inpool - raw))
    rows+=("$(printf '"%s":{"hooked_calls":%d,"steps":%d,"raw":%d,"gpucap":%d,"added":%d,"pool":%d,"pool_added":%d}' \
        "$name" "$calls" "$N" "$raw" "$shim" $((shim - raw)) "$inpool" $((inpool - raw)))")
done
(IFS=,; printf '{"calls":%d,%s}\n' "$CALLS" "${rows[*]}") >"$JSON"
