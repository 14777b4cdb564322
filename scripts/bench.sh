#!/usr/bin/env bash
# What the shim costs, measured on the fake driver (no GPU needed).
#
#   scripts/bench.sh            # REPS=7 STARTUP_RUNS=200 TARGET_MS=500 by default
#   REPS=9 scripts/bench.sh
#
# 1. cuMemAlloc_v2 + cuMemFree_v2 pairs of 4 KiB (tests/c/bench_alloc.c), 1 and 2
#    threads, without and with LD_PRELOAD=libgpucap.so (GPUCAP_LIMIT set, so the
#    ledger is live), REPS runs each, interleaved: median ns per pair, the ratio and
#    the nanoseconds the shim adds. N is calibrated so that a run without the shim
#    takes about TARGET_MS.
# 2. Process start: /bin/true without and with the shim preloaded, STARTUP_RUNS runs
#    (hyperfine when installed, else a timed loop repeated REPS times): the ratio.
#
# Prints a table and writes target/bench.json. Targets (reported, not enforced):
# under 50 ns added per pair, under 15% slower process start.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD

REPS=${REPS:-7}
STARTUP_RUNS=${STARTUP_RUNS:-200}
TARGET_MS=${TARGET_MS:-500}
LIMIT=${BENCH_LIMIT:-40Gi}

echo "== building (release)" >&2
cargo build --release --workspace >&2

R=$ROOT/target/release
SHIM=$R/libgpucap.so
FAKE=$R/libcuda.so
[ -f "$SHIM" ] || { echo "bench: $SHIM missing" >&2; exit 1; }
[ -f "$FAKE" ] || { echo "bench: $FAKE (the fake driver) missing" >&2; exit 1; }

# The fake driver under the names programs look for (as tests/common does).
FAKEDIR=$R/fakecuda
mkdir -p "$FAKEDIR" "$R/ctests"
ln -sfn "$FAKE" "$FAKEDIR/libcuda.so.1"
ln -sfn "$FAKE" "$FAKEDIR/libcuda.so"

BENCH=$R/ctests/bench_alloc
cc -O2 -g -Wall -Werror -pthread -I tests/c -o "$BENCH" tests/c/bench_alloc.c -L "$FAKEDIR" -lcuda -ldl

# A clean environment: no inherited gpucap/fake settings, the fake on the library path.
for v in $(env | sed -n 's/^\(GPUCAP_[A-Za-z0-9_]*\|FAKECUDA_[A-Za-z0-9_]*\)=.*/\1/p'); do unset "$v"; done
unset LD_PRELOAD
export LD_LIBRARY_PATH=$FAKEDIR

minimum() { sort -g | awk 'NR == 1'; }
median() { sort -g | awk '{a[NR]=$1} END {if (NR==0) {print "nan"} else if (NR%2) {print a[(NR+1)/2]} else {printf "%.2f\n", (a[NR/2]+a[NR/2+1])/2}}'; }
field() { sed -n "s/.* $1=\([0-9.]*\).*/\1/p"; }
# run_bench <shim:0|1> <threads> <pairs>: prints ns per pair
run_bench() {
    local out
    if [ "$1" = 1 ]; then
        out=$(LD_PRELOAD=$SHIM GPUCAP_LIMIT=$LIMIT "$BENCH" "$2" "$3")
    else
        out=$("$BENCH" "$2" "$3")
    fi
    echo " $out" | field ns_per_pair
}

# ---- calibration -------------------------------------------------------------------
probe=200000
ns=$(run_bench 0 1 $probe)
PAIRS=$(awk -v ns="$ns" -v ms="$TARGET_MS" 'BEGIN { n = int(ms * 1e6 / ns); if (n < 10000) n = 10000; print n }')
echo "== calibration: $ns ns/pair without the shim -> N=$PAIRS pairs per thread (~${TARGET_MS} ms)" >&2

# ---- alloc/free pairs ----------------------------------------------------------------
declare -A BASE SHIMNS
for threads in 1 2; do
    base_runs=() shim_runs=()
    for ((i = 0; i < REPS; i++)); do
        base_runs+=("$(run_bench 0 $threads $PAIRS)")
        shim_runs+=("$(run_bench 1 $threads $PAIRS)")
        echo "   threads=$threads rep=$((i + 1)): base ${base_runs[-1]} ns, shim ${shim_runs[-1]} ns" >&2
    done
    BASE[$threads]="${base_runs[*]}"
    SHIMNS[$threads]="${shim_runs[*]}"
done

# ---- process start -----------------------------------------------------------------
startup_tool=loop
if command -v hyperfine >/dev/null 2>&1; then
    startup_tool=hyperfine
    hf=$R/bench-hyperfine.json
    hyperfine --warmup 20 --runs "$STARTUP_RUNS" --export-json "$hf" \
        -n base '/bin/true' \
        -n shim "LD_PRELOAD=$SHIM GPUCAP_LIMIT=$LIMIT /bin/true" >&2
    # mean seconds of each command, in microseconds
    read -r start_base start_shim < <(tr -d ' \n' <"$hf" | grep -o '"mean":[0-9.e+-]*' | cut -d: -f2 |
        awk '{v[NR]=$1*1e6} END {printf "%.1f %.1f\n", v[1], v[2]}')
    start_base_runs=$start_base start_shim_runs=$start_shim
else
    # loop <shim:0|1>: microseconds per /bin/true start, over STARTUP_RUNS runs
    loop() {
        local t0 t1
        t0=$(date +%s%N)
        if [ "$1" = 1 ]; then
            (export LD_PRELOAD=$SHIM GPUCAP_LIMIT=$LIMIT
             for ((j = 0; j < STARTUP_RUNS; j++)); do /bin/true; done)
        else
            (for ((j = 0; j < STARTUP_RUNS; j++)); do /bin/true; done)
        fi
        t1=$(date +%s%N)
        awk -v a="$t0" -v b="$t1" -v n="$STARTUP_RUNS" 'BEGIN { printf "%.1f\n", (b - a) / n / 1000 }'
    }
    loop 0 >/dev/null; loop 1 >/dev/null # warm the page cache
    sb=() ss=()
    for ((i = 0; i < REPS; i++)); do
        sb+=("$(loop 0)")
        ss+=("$(loop 1)")
        echo "   startup rep=$((i + 1)): /bin/true ${sb[-1]} us, with the shim ${ss[-1]} us" >&2
    done
    start_base=$(printf '%s\n' "${sb[@]}" | median)
    start_shim=$(printf '%s\n' "${ss[@]}" | median)
    start_base_runs="${sb[*]}" start_shim_runs="${ss[*]}"
fi
start_ratio=$(awk -v a="$start_base" -v b="$start_shim" 'BEGIN { printf "%.3f", b / a }')

# ---- report --------------------------------------------------------------------------
json_list() { echo "$1" | tr ' ' '\n' | grep . | paste -sd, -; }
{
    printf '{\n  "device": "fake driver (host memory), no GPU",\n'
    printf '  "host": "%s, %s cores",\n' "$(uname -m)" "$(nproc)"
    printf '  "reps": %d,\n  "limit": "%s",\n' "$REPS" "$LIMIT"
    printf '  "alloc_free": [\n'
} >"$ROOT/target/bench.json"

printf '\n%-28s %12s %12s %8s %10s   %s\n' "cuMemAlloc_v2+cuMemFree_v2" "without" "with shim" "ratio" "added" "best of $REPS"
printf '%-28s %12s %12s %8s %10s   %s\n' "(4 KiB, median of $REPS)" "ns/pair" "ns/pair" "" "ns/pair" "without/with (added)"
sep=""
for threads in 1 2; do
    b=$(echo "${BASE[$threads]}" | tr ' ' '\n' | median)
    s=$(echo "${SHIMNS[$threads]}" | tr ' ' '\n' | median)
    ratio=$(awk -v a="$b" -v b="$s" 'BEGIN { printf "%.3f", b / a }')
    added=$(awk -v a="$b" -v b="$s" 'BEGIN { printf "%.1f", b - a }')
    bmin=$(echo "${BASE[$threads]}" | tr ' ' '\n' | minimum)
    smin=$(echo "${SHIMNS[$threads]}" | tr ' ' '\n' | minimum)
    addmin=$(awk -v a="$bmin" -v b="$smin" 'BEGIN { printf "%.1f", b - a }')
    printf '%-28s %12s %12s %8s %10s   %s/%s (%s)\n' "$threads thread(s), N=$PAIRS" "$b" "$s" "$ratio" "$added" "$bmin" "$smin" "$addmin"
    printf '%s    {"threads": %d, "pairs_per_thread": %d, "size": 4096, "base_ns_per_pair": %s, "shim_ns_per_pair": %s, "ratio": %s, "added_ns_per_pair": %s, "base_min": %s, "shim_min": %s, "added_ns_per_pair_min": %s, "base_runs": [%s], "shim_runs": [%s]}' \
        "$sep" "$threads" "$PAIRS" "$b" "$s" "$ratio" "$added" "$bmin" "$smin" "$addmin" \
        "$(json_list "${BASE[$threads]}")" "$(json_list "${SHIMNS[$threads]}")" >>"$ROOT/target/bench.json"
    sep=$',\n'
done
printf '\n%-28s %12s %12s %8s\n' "process start (/bin/true)" "without" "with shim" "ratio"
printf '%-28s %12s %12s %8s\n' "($startup_tool, $STARTUP_RUNS runs)" "us" "us" ""
printf '%-28s %12s %12s %8s\n' "" "$start_base" "$start_shim" "$start_ratio"

added1=$(awk -v a="$(echo "${BASE[1]}" | tr ' ' '\n' | median)" -v b="$(echo "${SHIMNS[1]}" | tr ' ' '\n' | median)" 'BEGIN { printf "%.1f", b - a }')
{
    printf '\n  ],\n'
    printf '  "startup": {"tool": "%s", "runs": %d, "base_us": %s, "shim_us": %s, "ratio": %s, "base_reps": [%s], "shim_reps": [%s]},\n' \
        "$startup_tool" "$STARTUP_RUNS" "$start_base" "$start_shim" "$start_ratio" \
        "$(json_list "$start_base_runs")" "$(json_list "$start_shim_runs")"
    printf '  "targets": {"added_ns_per_pair_max": 50, "startup_ratio_max": 1.15, "added_ns_per_pair_1_thread": %s, "met_alloc": %s, "met_startup": %s}\n}\n' \
        "$added1" \
        "$(awk -v x="$added1" 'BEGIN { print (x < 50) ? "true" : "false" }')" \
        "$(awk -v x="$start_ratio" 'BEGIN { print (x < 1.15) ? "true" : "false" }')"
} >>"$ROOT/target/bench.json"

printf '\ntargets: < 50 ns added per pair (1 thread: %s ns), < 15%% slower start (ratio %s)\n' "$added1" "$start_ratio"
echo "wrote target/bench.json"
