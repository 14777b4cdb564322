#!/usr/bin/env bash
# First use of CUDA, measured on the fake driver (no GPU needed): cuInit, the first
# context, the first allocation (tests/c/bench_first.c times each in the process), and
# how many contexts the driver made (the fake's FAKECUDA_STATS "contexts_created").
#
#   scripts/bench/bench-first.sh             # FIRST_REPS=21 by default; scripts/bench/bench.sh runs it
#
# Three ways, interleaved, FIRST_REPS runs each, for cuCtxCreate_v2 and for
# cuDevicePrimaryCtxRetain (the runtime API's way):
#   raw      no shim
#   nvml     through the shim, the fake NVML on the library path: the first context
#            is measured by NVML's free memory before and after (no other context)
#   no-nvml  through the shim without libnvidia-ml.so.1: the first context is measured
#            with a temporary context beside it (gpucap before issue 14)
# Each context takes FAKECUDA_CONTEXT_MEM=300Mi on the fake (which costs it no time: on
# a real GPU a context costs tens to hundreds of ms, which the temporary one doubled).
# With valgrind installed, also the instructions of the whole process (callgrind's
# total: start, cuInit, the first context, the first allocation, exit), one run of each
# way: deterministic, unlike the microseconds.
# Prints a table (medians, microseconds) and writes target/bench-first.json.
# BENCH_FIRST_SHIM=<path> measures another build of libgpucap.so (say, an older one).
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
REPS=${FIRST_REPS:-21}
LIMIT=${BENCH_LIMIT:-40Gi}

if [ "${BENCH_FIRST_NO_BUILD:-0}" != 1 ]; then
    echo "== building (release)" >&2
    cargo build --release --workspace >&2
fi
R=$ROOT/target/release
SHIM=${BENCH_FIRST_SHIM:-$R/libgpucap.so}
for f in "$SHIM" "$R/libcuda.so" "$R/libnvidia_ml.so"; do
    [ -f "$f" ] || { echo "bench-first: $f missing" >&2; exit 1; }
done

# The fake driver with and without the fake NVML beside it.
WITH=$R/fakecuda-first
WITHOUT=$R/fakecuda-first-no-nvml
mkdir -p "$WITH" "$WITHOUT" "$R/ctests"
for d in "$WITH" "$WITHOUT"; do
    ln -sfn "$R/libcuda.so" "$d/libcuda.so.1"
    ln -sfn "$R/libcuda.so" "$d/libcuda.so"
done
ln -sfn "$R/libnvidia_ml.so" "$WITH/libnvidia-ml.so.1"

BENCH=$R/ctests/bench_first
cc -O2 -g -Wall -Werror -I tests/c -o "$BENCH" tests/c/bench_first.c -L "$WITH" -lcuda

for v in $(env | sed -n 's/^\(GPUCAP_[A-Za-z0-9_]*\|FAKECUDA_[A-Za-z0-9_]*\)=.*/\1/p'); do unset "$v"; done
unset LD_PRELOAD
export FAKECUDA_CONTEXT_MEM=300Mi

STATS=$(mktemp)
trap 'rm -f "$STATS"' EXIT
# first <raw|nvml|no-nvml> <create|retain> [stats]: "init ctx alloc total" in us
way_env() { # way_env <raw|nvml|no-nvml>: the environment of that way, one per line
    case $1 in
        raw) printf '%s\n' "LD_LIBRARY_PATH=$WITH" ;;
        nvml) printf '%s\n' "LD_LIBRARY_PATH=$WITH" "LD_PRELOAD=$SHIM" "GPUCAP_LIMIT=$LIMIT" ;;
        no-nvml) printf '%s\n' "LD_LIBRARY_PATH=$WITHOUT" "LD_PRELOAD=$SHIM" "GPUCAP_LIMIT=$LIMIT" ;;
    esac
}
first() {
    local env
    mapfile -t env < <(way_env "$1")
    [ -n "${3:-}" ] && env+=(FAKECUDA_STATS="$3")
    env "${env[@]}" "$BENCH" "$2" |
        sed -n 's/^init_ns=\([0-9]*\) ctx_ns=\([0-9]*\) alloc_ns=\([0-9]*\) total_ns=\([0-9]*\)$/\1 \2 \3 \4/p' |
        awk '{ printf "%.1f %.1f %.1f %.1f\n", $1 / 1e3, $2 / 1e3, $3 / 1e3, $4 / 1e3 }'
}
med() { printf '%s\n' "$@" | sort -g | awk '{ a[NR] = $1 } END { print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2 }'; }

JSON=$ROOT/target/bench-first.json
TABLE=$(mktemp)
trap 'rm -f "$STATS" "$TABLE"' EXIT
printf '\n%-26s %9s %9s %9s %9s %9s\n' "first use (median of $REPS)" "cuInit" "context" "1st alloc" "total" "contexts" >"$TABLE"
printf '%-26s %9s %9s %9s %9s %9s\n' "" "us" "us" "us" "us" "made" >>"$TABLE"
echo '{"device": "fake driver, FAKECUDA_CONTEXT_MEM=300Mi, no GPU", "reps": '"$REPS"', "cases": [' >"$JSON"
sep=''
for call in create retain; do
    declare -A I C A T
    for way in raw nvml no-nvml; do I[$way]='' C[$way]='' A[$way]='' T[$way]=''; done
    for ((i = 1; i <= REPS; i++)); do
        for way in raw nvml no-nvml; do
            read -r a b c d < <(first "$way" "$call")
            I[$way]+=" $a" C[$way]+=" $b" A[$way]+=" $c" T[$way]+=" $d"
        done
        echo "   first use $call rep=$i done" >&2
    done
    for way in raw nvml no-nvml; do
        first "$way" "$call" "$STATS" >/dev/null
        made=$(sed -n 's/.*"contexts_created":\([0-9]*\).*/\1/p' "$STATS" | head -1)
        # shellcheck disable=SC2086
        i=$(med ${I[$way]}) c=$(med ${C[$way]}) a=$(med ${A[$way]}) t=$(med ${T[$way]})
        printf '%-26s %9.1f %9.1f %9.1f %9.1f %9s\n' "$call, $way" "$i" "$c" "$a" "$t" "$made" >>"$TABLE"
        printf '%s  {"call": "%s", "way": "%s", "init_us": %s, "context_us": %s, "first_alloc_us": %s, "total_us": %s, "contexts_made": %s}' \
            "$sep" "$call" "$way" "$i" "$c" "$a" "$t" "$made" >>"$JSON"
        sep=$',\n'
    done
done
if command -v valgrind >/dev/null; then
    printf '\n%-26s %12s\n' "whole process (callgrind)" "instructions" >>"$TABLE"
    printf '],\n"instructions": [\n' >>"$JSON"
    sep=''
    for call in create retain; do
        for way in raw nvml no-nvml; do
            mapfile -t env < <(way_env "$way")
            env "${env[@]}" valgrind --tool=callgrind --callgrind-out-file="$STATS.cg" "$BENCH" "$call" \
                >/dev/null 2>"$STATS.log"
            ir=$(sed -n 's/.*Collected : \([0-9]*\).*/\1/p' "$STATS.log")
            rm -f "$STATS.cg" "$STATS.log"
            printf '%-26s %12s\n' "$call, $way" "$ir" >>"$TABLE"
            printf '%s  {"call": "%s", "way": "%s", "instructions": %s}' "$sep" "$call" "$way" "$ir" >>"$JSON"
            sep=$',\n'
        done
    done
fi
printf '\n]}\n' >>"$JSON"
cat "$TABLE"
echo "wrote target/bench-first.json"
