#!/usr/bin/env bash
# What the shim costs, measured on the fake driver (no GPU needed).
#
#   scripts/bench/bench.sh                 # REPS=7 STARTUP_RUNS=200 TARGET_MS=500 by default
#   REPS=11 scripts/bench/bench.sh
#
# 1. cuMemAlloc_v2 + cuMemFree_v2 pairs of 4 KiB (tests/c/bench_alloc.c) with 1 and 2
#    threads, without and with LD_PRELOAD=libgpucap.so (GPUCAP_LIMIT set, so the
#    ledger is live), REPS runs of each, interleaved. Reported: the median wall-clock
#    ns per pair (clock_gettime), the ratio and the ns the shim adds, plus the same
#    from each thread's CPU time (steadier when other processes share the machine).
#    N is calibrated so that one run without the shim takes about TARGET_MS.
# 2. Growth mode: alloc/free churn of 1 MiB and 64 MiB raw, through the shim, and with
#    GPUCAP_GROWTH=1 (target/bench-growth.json).
# 3. Process start: /bin/true without and with the shim preloaded, STARTUP_RUNS runs
#    (hyperfine when installed, else a timed loop, REPS times): the ratio.
# 4. The fake's arena mode (FAKECUDA_ARENA=1: no mmap/munmap per block): raw and through
#    the shim, 1 and 2 threads, and 1 thread with 10,000 and 1,000,000 allocations live:
#    the shim's own ns per pair (target/bench-arena.json; ARENA_CASES="threads:live ...").
# 5. The pool (GPUCAP_POOL): the same pairs without and with a pool, 1 and 2 threads
#    and 2 processes of one pool (target/bench-pool.json).
# 6. First use (scripts/bench/bench-first.sh): cuInit, the first context and the first
#    allocation timed raw and through the shim, with NVML and without it, and the
#    contexts the driver made (target/bench-first.json).
#
# Prints a table and writes target/bench.json. Targets (reported, not enforced):
# under 50 ns added per pair, under 15% slower process start.
set -euo pipefail
cd "$(dirname "$0")/../.."
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

RESULTS=$(mktemp)
# med VALUES...: the median
med() { printf '%s\n' "$@" | sort -g | awk '{ a[NR] = $1 } END { print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2 }'; }
trap 'rm -f "$RESULTS"' EXIT

# run_bench <shim:0|1> <threads> <pairs> [pair|info]: prints "wall_ns cpu_ns" per pair (call)
run_bench() {
    local out
    if [ "$1" = 1 ]; then
        out=$(LD_PRELOAD=$SHIM GPUCAP_LIMIT=$LIMIT "$BENCH" "$2" "$3" 4Ki "${4:-pair}")
    else
        out=$("$BENCH" "$2" "$3" 4Ki "${4:-pair}")
    fi
    echo " $out" | sed -n 's/.* ns_per_pair=\([0-9.]*\) cpu_ns_per_pair=\([0-9.]*\).*/\1 \2/p'
}

# ---- calibration -------------------------------------------------------------------
read -r ns _ < <(run_bench 0 1 200000)
PAIRS=$(awk -v ns="$ns" -v ms="$TARGET_MS" 'BEGIN { n = int(ms * 1e6 / ns); if (n < 10000) n = 10000; print n }')
echo "== calibration: $ns ns/pair without the shim -> N=$PAIRS pairs per thread (~${TARGET_MS} ms)" >&2

# ---- alloc/free pairs ----------------------------------------------------------------
for threads in 1 2; do
    for ((i = 1; i <= REPS; i++)); do
        read -r bw bc < <(run_bench 0 "$threads" "$PAIRS")
        read -r sw sc < <(run_bench 1 "$threads" "$PAIRS")
        echo "alloc $threads base $bw $bc" >>"$RESULTS"
        echo "alloc $threads shim $sw $sc" >>"$RESULTS"
        echo "   threads=$threads rep=$i: without ${bw} ns (cpu ${bc}), with the shim ${sw} ns (cpu ${sc})" >&2
    done
done

# cuMemGetInfo_v2 alone: a hook whose driver side costs next to nothing.
read -r ns _ < <(run_bench 0 1 1000000 info)
CALLS=$(awk -v ns="$ns" -v ms="$TARGET_MS" 'BEGIN { n = int(ms * 1e6 / ns / 4); if (n < 100000) n = 100000; print n }')
for ((i = 1; i <= REPS; i++)); do
    read -r bw bc < <(run_bench 0 1 "$CALLS" info)
    read -r sw sc < <(run_bench 1 1 "$CALLS" info)
    echo "info 1 base $bw $bc" >>"$RESULTS"
    echo "info 1 shim $sw $sc" >>"$RESULTS"
    echo "   cuMemGetInfo_v2 rep=$i: without ${bw} ns, with the shim ${sw} ns" >&2
done

# ---- process start -----------------------------------------------------------------
startup_tool=loop
if command -v hyperfine >/dev/null 2>&1; then
    startup_tool=hyperfine
    hf=$R/bench-hyperfine.json
    hyperfine --warmup 20 --runs "$STARTUP_RUNS" --export-json "$hf" \
        -n base '/bin/true' \
        -n shim "LD_PRELOAD=$SHIM GPUCAP_LIMIT=$LIMIT /bin/true" >&2
    # the mean seconds of each command, in microseconds
    tr -d ' \n' <"$hf" | grep -o '"mean":[0-9.e+-]*' | cut -d: -f2 |
        awk 'NR == 1 { printf "start 0 base %.1f 0\n", $1 * 1e6 } NR == 2 { printf "start 0 shim %.1f 0\n", $1 * 1e6 }' >>"$RESULTS"
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
    loop 0 >/dev/null
    loop 1 >/dev/null # warm the page cache
    for ((i = 1; i <= REPS; i++)); do
        b=$(loop 0)
        s=$(loop 1)
        echo "start 0 base $b 0" >>"$RESULTS"
        echo "start 0 shim $s 0" >>"$RESULTS"
        echo "   startup rep=$i: /bin/true ${b} us, with the shim ${s} us" >&2
    done
fi

# ---- growth mode: alloc/free churn ----------------------------------------------------
# The same pairs of one size, raw, through the shim (pass-through) and in growth mode
# (GPUCAP_GROWTH=1: the first allocation maps pages, every later one reuses them).
# churn <mode: base|shim|growth> <size>: "wall_ns cpu_ns" per pair
churn() {
    local env=()
    case $1 in
        shim) env=(LD_PRELOAD="$SHIM" GPUCAP_LIMIT="$LIMIT") ;;
        growth) env=(LD_PRELOAD="$SHIM" GPUCAP_LIMIT="$LIMIT" GPUCAP_GROWTH=1) ;;
    esac
    env "${env[@]}" "$BENCH" 1 "$CHURN_PAIRS" "$2" pair |
        sed -n 's/.* ns_per_pair=\([0-9.]*\) cpu_ns_per_pair=\([0-9.]*\).*/\1 \2/p'
}
CHURN_PAIRS=${CHURN_PAIRS:-20000}
GROWTH_JSON=$ROOT/target/bench-growth.json
{
    printf '\n%-30s %11s %11s %11s %9s %9s\n' "alloc/free churn, 1 thread" "raw" "shim" "growth" "shim/raw" "growth/raw"
    printf '%-30s %11s %11s %11s\n' "median of $REPS, N=$CHURN_PAIRS" "ns/pair" "ns/pair" "ns/pair"
} >"$RESULTS.growth"
echo '{"device": "fake driver (host memory), no GPU", "pairs": '"$CHURN_PAIRS"', "sizes": [' >"$GROWTH_JSON"
first=1
for size in 1Mi 64Mi; do
    raw=() shim=() growth=()
    for ((i = 1; i <= REPS; i++)); do
        read -r w _ < <(churn base $size); raw+=("$w")
        read -r w _ < <(churn shim $size); shim+=("$w")
        read -r w _ < <(churn growth $size); growth+=("$w")
        echo "   churn $size rep=$i: raw ${raw[-1]} ns, shim ${shim[-1]} ns, growth ${growth[-1]} ns" >&2
    done
    r=$(med "${raw[@]}"); s=$(med "${shim[@]}"); g=$(med "${growth[@]}")
    awk -v sz="$size" -v r="$r" -v s="$s" -v g="$g" 'BEGIN { printf "%-30s %11.1f %11.1f %11.1f %9.3f %9.3f\n", sz, r, s, g, s / r, g / r }' >>"$RESULTS.growth"
    [ $first = 1 ] || echo ',' >>"$GROWTH_JSON"
    first=0
    awk -v sz="$size" -v r="$r" -v s="$s" -v g="$g" 'BEGIN { printf "  {\"size\": \"%s\", \"raw_ns_per_pair\": %.1f, \"shim_ns_per_pair\": %.1f, \"growth_ns_per_pair\": %.1f, \"shim_ratio\": %.4f, \"growth_ratio\": %.4f}", sz, r, s, g, s / r, g / r }' >>"$GROWTH_JSON"
done
echo '' >>"$GROWTH_JSON"; echo ']}' >>"$GROWTH_JSON"

# ---- the fake's arena mode: the shim's own nanoseconds ------------------------------------
# FAKECUDA_ARENA=1: the fake keeps freed blocks mapped and hands them out again, so the
# pair's time is no longer an mmap and a munmap whose noise drowns what the shim adds.
# Raw and through the shim, 1 and 2 threads, interleaved, REPS runs (target/bench-arena.json).
arena_run() { # arena_run <shim:0|1> <threads> [live]: "wall_ns cpu_ns" per pair
    local env=(FAKECUDA_ARENA=1)
    [ "$1" = 1 ] && env+=(LD_PRELOAD="$SHIM" GPUCAP_LIMIT="$LIMIT")
    env "${env[@]}" "$BENCH" "$2" "$ARENA_PAIRS" 4Ki pair "live=${3:-0}" |
        sed -n 's/.* ns_per_pair=\([0-9.]*\) cpu_ns_per_pair=\([0-9.]*\).*/\1 \2/p'
}
ARENA_PAIRS=${ARENA_PAIRS:-2000000}
ARENA_JSON=$ROOT/target/bench-arena.json
{
    printf '\n%-30s %11s %11s %9s   %s\n' "arena mode (FAKECUDA_ARENA=1)" "raw" "shim" "added" "per-thread CPU time"
    printf '%-30s %11s %11s %9s   %s\n' "median of $REPS, N=$ARENA_PAIRS" "ns/pair" "ns/pair" "ns/pair" "raw / shim (added)"
} >"$RESULTS.arena"
echo '{"device": "fake driver, arena mode (no mmap per block)", "pairs": '"$ARENA_PAIRS"', "cases": [' >"$ARENA_JSON"
first=1
# threads:live — 1 and 2 threads, then 1 thread with 10,000 and 1,000,000 other
# allocations live (bench_alloc live=K: made before the timed pairs, kept).
for tl in ${ARENA_CASES:-1:0 2:0 1:10000 1:1000000}; do
    threads=${tl%%:*} live=${tl#*:}
    rw=() rc=() sw=() sc=()
    for ((i = 1; i <= REPS; i++)); do
        read -r w c < <(arena_run 0 "$threads" "$live"); rw+=("$w") rc+=("$c")
        read -r w c < <(arena_run 1 "$threads" "$live"); sw+=("$w") sc+=("$c")
        echo "   arena threads=$threads live=$live rep=$i: raw ${rw[-1]} ns, shim ${sw[-1]} ns" >&2
    done
    a=$(med "${rw[@]}") b=$(med "${sw[@]}") ac=$(med "${rc[@]}") bc=$(med "${sc[@]}")
    label="$threads thread(s)"
    [ "$live" = 0 ] || label="$label, $live live"
    awk -v t="$label" -v a="$a" -v b="$b" -v ac="$ac" -v bc="$bc" 'BEGIN { printf "%-30s %11.1f %11.1f %9.1f   %.1f / %.1f (%+.1f)\n", t, a, b, b - a, ac, bc, bc - ac }' >>"$RESULTS.arena"
    [ $first = 1 ] || echo ',' >>"$ARENA_JSON"
    first=0
    awk -v t="$threads" -v l="$live" -v a="$a" -v b="$b" -v ac="$ac" -v bc="$bc" 'BEGIN { printf "  {\"threads\": %d, \"live\": %d, \"raw_ns_per_pair\": %.2f, \"shim_ns_per_pair\": %.2f, \"added_ns_per_pair\": %.2f, \"raw_cpu_ns\": %.2f, \"shim_cpu_ns\": %.2f, \"added_cpu_ns\": %.2f}", t, l, a, b, b - a, ac, bc, bc - ac }' >>"$ARENA_JSON"
done
echo '' >>"$ARENA_JSON"; echo ']}' >>"$ARENA_JSON"

# ---- the pool (GPUCAP_POOL): what sharing one budget between processes adds --------------
# The same 4 KiB pairs through the shim without a pool and as a member of a pool, with 1
# and 2 threads in one process, and with 2 one-thread processes of the same pool at once
# (their per-pair figures averaged), interleaved, REPS runs each. Reported: the medians
# and the ns a pool adds per pair (target/bench-pool.json).
POOL_DIR=$(mktemp -d)
pool_run() { # pool_run <pool:0|1> <threads>: "wall_ns cpu_ns" per pair
    local env=(LD_PRELOAD="$SHIM" GPUCAP_LIMIT="$LIMIT")
    [ "$1" = 1 ] && env+=(GPUCAP_POOL=bench GPUCAP_POOL_DIR="$POOL_DIR")
    env "${env[@]}" "$BENCH" "$2" "$PAIRS" 4Ki pair |
        sed -n 's/.* ns_per_pair=\([0-9.]*\) cpu_ns_per_pair=\([0-9.]*\).*/\1 \2/p'
}
pool_two() { # pool_two <pool:0|1>: two processes at once, the mean of their "wall cpu"
    local a b
    a=$(mktemp) b=$(mktemp)
    pool_run "$1" 1 >"$a" & pool_run "$1" 1 >"$b" & wait
    cat "$a" "$b" | awk '{ w += $1; c += $2 } END { printf "%.2f %.2f\n", w / NR, c / NR }'
    rm -f "$a" "$b"
}
POOL_JSON=$ROOT/target/bench-pool.json
{
    printf '\n%-30s %11s %11s %9s   %s\n' "pool: alloc+free 4 KiB" "no pool" "pool" "added" "per-thread CPU time"
    printf '%-30s %11s %11s %9s   %s\n' "median of $REPS, N=$PAIRS" "ns/pair" "ns/pair" "ns/pair" "no pool / pool (added)"
} >"$RESULTS.pool"
echo '{"device": "fake driver (host memory), no GPU", "pairs": '"$PAIRS"', "limit": "'"$LIMIT"'", "cases": [' >"$POOL_JSON"
first=1
for case in "1 thread" "2 threads" "2 processes"; do
    nw=() nc=() pw=() pc=()
    for ((i = 1; i <= REPS; i++)); do
        case $case in
            "1 thread") read -r w c < <(pool_run 0 1); read -r W C < <(pool_run 1 1) ;;
            "2 threads") read -r w c < <(pool_run 0 2); read -r W C < <(pool_run 1 2) ;;
            *) read -r w c < <(pool_two 0); read -r W C < <(pool_two 1) ;;
        esac
        nw+=("$w") nc+=("$c") pw+=("$W") pc+=("$C")
        echo "   pool $case rep=$i: no pool ${w} ns (cpu ${c}), pool ${W} ns (cpu ${C})" >&2
    done
    a=$(med "${nw[@]}") b=$(med "${pw[@]}") ac=$(med "${nc[@]}") bc=$(med "${pc[@]}")
    awk -v k="$case" -v a="$a" -v b="$b" -v ac="$ac" -v bc="$bc" 'BEGIN { printf "%-30s %11.1f %11.1f %9.1f   %.1f / %.1f (%+.1f)\n", k, a, b, b - a, ac, bc, bc - ac }' >>"$RESULTS.pool"
    [ $first = 1 ] || echo ',' >>"$POOL_JSON"
    first=0
    awk -v k="$case" -v a="$a" -v b="$b" -v ac="$ac" -v bc="$bc" 'BEGIN { printf "  {\"case\": \"%s\", \"no_pool_ns_per_pair\": %.2f, \"pool_ns_per_pair\": %.2f, \"added_ns_per_pair\": %.2f, \"no_pool_cpu_ns\": %.2f, \"pool_cpu_ns\": %.2f, \"added_cpu_ns\": %.2f}", k, a, b, b - a, ac, bc, bc - ac }' >>"$POOL_JSON"
done
echo '' >>"$POOL_JSON"; echo ']}' >>"$POOL_JSON"
rm -rf "$POOL_DIR"

# ---- report: a table on stdout, JSON in target/bench.json -----------------------------
awk -v reps="$REPS" -v pairs="$PAIRS" -v calls="$CALLS" -v tool="$startup_tool" -v runs="$STARTUP_RUNS" \
    -v limit="$LIMIT" -v host="$(uname -m), $(nproc) cores" -v json="$ROOT/target/bench.json" '
function sortn(a, n,   i, j, t) { for (i = 2; i <= n; i++) { t = a[i]; for (j = i - 1; j >= 1 && a[j] > t; j--) a[j + 1] = a[j]; a[j + 1] = t } }
function median(key, col,   n, a, i) {
    n = split(vals[key, col], a, " "); sortn(a, n)
    return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
}
function minimum(key, col,   n, a) { n = split(vals[key, col], a, " "); sortn(a, n); return a[1] }
# median over reps of (shim - base) of the same rep: cancels drift between reps
function paired(t, col,   n, a, b, d, i) {
    n = split(vals["alloc " t " base", col], a, " "); split(vals["alloc " t " shim", col], b, " ")
    for (i = 1; i <= n; i++) d[i] = b[i] - a[i]
    sortn(d, n)
    return n % 2 ? d[(n + 1) / 2] : (d[n / 2] + d[n / 2 + 1]) / 2
}
function list(key, col,   n, a, i, s) { n = split(vals[key, col], a, " "); s = ""; for (i = 1; i <= n; i++) s = s (i > 1 ? ", " : "") a[i]; return "[" s "]" }
{ key = $1 " " $2 " " $3; vals[key, 1] = vals[key, 1] " " $4; vals[key, 2] = vals[key, 2] " " $5 }
END {
    printf "\n%-30s %11s %11s %7s %9s   %s\n", "cuMemAlloc_v2 + cuMemFree_v2", "without", "with shim", "ratio", "added", "per-thread CPU time"
    printf "%-30s %11s %11s %7s %9s   %s\n", "4 KiB, median of " reps, "ns/pair", "ns/pair", "", "ns/pair", "without / with (added)"
    printf "{\n  \"device\": \"fake driver (host memory), no GPU\",\n  \"host\": \"%s\",\n  \"reps\": %d,\n  \"limit\": \"%s\",\n  \"alloc_free\": [\n", host, reps, limit > json
    for (t = 1; t <= 2; t++) {
        b = median("alloc " t " base", 1); s = median("alloc " t " shim", 1)
        bc = median("alloc " t " base", 2); sc = median("alloc " t " shim", 2)
        printf "%-30s %11.1f %11.1f %7.3f %9.1f   %.1f / %.1f (%+.1f)\n", t " thread" (t > 1 ? "s" : "") ", N=" pairs, b, s, s / b, s - b, bc, sc, sc - bc
        if (t == 1) { added1 = s - b; added1cpu = sc - bc }
        pw[t] = paired(t, 1); pc[t] = paired(t, 2)
        printf "    {\"threads\": %d, \"pairs_per_thread\": %d, \"size\": 4096,\n", t, pairs > json
        printf "     \"base_ns_per_pair\": %.2f, \"shim_ns_per_pair\": %.2f, \"ratio\": %.4f, \"added_ns_per_pair\": %.2f,\n", b, s, s / b, s - b > json
        printf "     \"base_cpu_ns_per_pair\": %.2f, \"shim_cpu_ns_per_pair\": %.2f, \"added_cpu_ns_per_pair\": %.2f,\n", bc, sc, sc - bc > json
        printf "     \"added_paired_median_ns\": %.2f, \"added_cpu_paired_median_ns\": %.2f,\n", pw[t], pc[t] > json
        printf "     \"base_min\": %.2f, \"shim_min\": %.2f,\n", minimum("alloc " t " base", 1), minimum("alloc " t " shim", 1) > json
        printf "     \"base_runs\": %s, \"shim_runs\": %s,\n", list("alloc " t " base", 1), list("alloc " t " shim", 1) > json
        printf "     \"base_cpu_runs\": %s, \"shim_cpu_runs\": %s}%s\n", list("alloc " t " base", 2), list("alloc " t " shim", 2), t < 2 ? "," : "" > json
    }
    printf "%-30s %s\n", "  median of per-rep differences", sprintf("1 thread: %+.1f ns (CPU %+.1f), 2 threads: %+.1f ns (CPU %+.1f)", pw[1], pc[1], pw[2], pc[2])
    b = median("info 1 base", 1); s = median("info 1 shim", 1)
    bc = median("info 1 base", 2); sc = median("info 1 shim", 2)
    printf "%-30s %11.1f %11.1f %7.3f %9.1f   %.1f / %.1f (%+.1f)\n", "cuMemGetInfo_v2 (ns/call), 1 th", b, s, s / b, s - b, bc, sc, sc - bc
    printf "  ],\n  \"get_info\": {\"threads\": 1, \"calls\": %d, \"base_ns_per_call\": %.2f, \"shim_ns_per_call\": %.2f, \"added_ns_per_call\": %.2f, \"base_runs\": %s, \"shim_runs\": %s},\n", calls, b, s, s - b, list("info 1 base", 1), list("info 1 shim", 1) > json
    sb = median("start 0 base", 1); ss = median("start 0 shim", 1)
    printf "\n%-30s %11s %11s %7s %9s\n", "process start (/bin/true)", "without", "with shim", "ratio", "added"
    printf "%-30s %11s %11s %7s %9s\n", tool ", " runs " runs" (tool == "loop" ? " x " reps : ""), "us", "us", "", "us"
    printf "%-30s %11.1f %11.1f %7.3f %9.1f\n", "", sb, ss, ss / sb, ss - sb
    printf "  \"startup\": {\"tool\": \"%s\", \"runs\": %d, \"base_us\": %.1f, \"shim_us\": %.1f, \"ratio\": %.4f, \"base_reps\": %s, \"shim_reps\": %s},\n", tool, runs, sb, ss, ss / sb, list("start 0 base", 1), list("start 0 shim", 1) > json
    printf "  \"targets\": {\"added_ns_per_pair_max\": 50, \"startup_ratio_max\": 1.15, \"added_ns_per_pair_1_thread\": %.2f, \"added_cpu_ns_per_pair_1_thread\": %.2f, \"startup_ratio\": %.4f, \"met_alloc\": %s, \"met_startup\": %s}\n}\n", added1, added1cpu, ss / sb, added1 < 50 ? "true" : "false", ss / sb < 1.15 ? "true" : "false" > json
    printf "\ntargets (not enforced): < 50 ns added per pair -> %.1f ns (CPU time: %+.1f ns); < 15%% slower start -> %+.1f%%\n", added1, added1cpu, (ss / sb - 1) * 100
}' "$RESULTS"
cat "$RESULTS.growth" "$RESULTS.arena" "$RESULTS.pool"
rm -f "$RESULTS.growth" "$RESULTS.arena" "$RESULTS.pool"
echo "wrote target/bench.json, target/bench-growth.json, target/bench-arena.json and target/bench-pool.json"

# ---- first use: cuInit, the first context, the first allocation ---------------------------
BENCH_FIRST_NO_BUILD=1 BENCH_LIMIT=$LIMIT scripts/bench/bench-first.sh
