#!/usr/bin/env bash
# gpucap beside HAMi-core, in one run: the raw driver, HAMi-core (libvgpu.so), gpucap alone
# and gpucap in a pool (GPUCAP_POOL), on the same allocations.
#
#   scripts/bench/bench-hami.sh [HAMI_SRC | --so LIBVGPU.so] [--out FILE.json] [--build-only]
#
# HAMI_SRC is a HAMi-core source folder you provide (github.com/Project-HAMi/HAMi-core;
# this script fetches nothing). It is built as HAMi-core's own build.sh builds it (its
# CMake Debug flags "-shared -fPIC -g -D_GNU_SOURCE -Wall" and its four options
# DLSYM_HOOK_ENABLE, MULTIPROCESS_LIMIT_ENABLE, HOOK_MEMINFO_ENABLE, HOOK_NVML_ENABLE;
# HAMI_CFLAGS adds flags, say -O2) into target/hami/libvgpu.so, with the commit in
# target/hami/libvgpu.so.commit. CUDA's cuda.h and NVML's nvml.h come from pip wheels
# (nvidia-cuda-runtime, nvidia-nvml-dev) installed into target/venv-cuda-headers, or from
# HAMI_CUDA_INCLUDE. --build-only stops there (to carry the .so to a GPU machine);
# --so takes such a build (default target/hami/libvgpu.so when no HAMI_SRC is given).
#
# On the fake GPU (no libcuda.so.1 in ldconfig's cache, or BENCH_HAMI_DRIVER=fake; needs
# valgrind and a release build), in the same run:
#   per pair        callgrind instructions of one cuMemAlloc_v2 + cuMemFree_v2 of 1 MiB
#                   (N vs 2N pairs, N=BENCH_HAMI_N, default 2000), and with 10,000 live
#                   1 MiB blocks
#   churn           4 processes at once, each PAIRS (default 20000) 1 MiB pairs, the mean of
#                   their ns per pair, as a ratio to the raw driver in the same round;
#                   median of REPS (default 5) rounds. The fake maps each block (mmap),
#                   standing for the driver's own work; BENCH_HAMI_ARENA=1 uses its arena
#                   mode instead (no mmap per block: the layers' own cost, larger ratios)
#   first use       whole-process instructions of cuInit + first context + a pair
#                   (tests/c/bench_first.c), as a ratio to raw
#   start           LD_PRELOAD=... /bin/true, STARTUP_RUNS (default 200) starts, median of
#                   REPS rounds, as a ratio to no preload; also with an empty C library
#                   preloaded (built here: one int, no code), the floor any preloaded
#                   library pays (the loader's open, mappings and page faults)
# On a real GPU (BENCH_HAMI_DRIVER=real, the default when ldconfig knows libcuda.so.1):
# ns per pair of 4 KiB, 1 MiB and 256 MiB (PAIRS pairs, default 2000 there; 256 MiB a tenth),
# with 10,000 live 1 MiB blocks, the 4-process
# churn, first use (ns, tests/c/bench_first.c) and start; every way interleaved in each
# of REPS rounds, medians. Prints a table, writes the JSON to --out (default
# target/bench-hami.json). Every way is checked to cap (a 128 MiB allocation under a 64 MiB
# limit must fail) before it is measured.
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
R=$ROOT/target/release
SRC='' SO='' OUTFILE=$ROOT/target/bench-hami.json BUILD_ONLY=0
while [ $# -gt 0 ]; do
    case $1 in
        --so) SO=${2:?--so needs a path}; shift 2 ;;
        --out) OUTFILE=${2:?--out needs a path}; shift 2 ;;
        --build-only) BUILD_ONLY=1; shift ;;
        -h | --help) sed -n '2,36p' "$0"; exit 0 ;;
        -*) echo "bench-hami: unknown option $1 (accepted: --so FILE, --out FILE, --build-only)" >&2; exit 2 ;;
        *) [ -z "$SRC" ] || { echo "bench-hami: one HAMI_SRC only" >&2; exit 2; }; SRC=$1; shift ;;
    esac
done
say() { echo "bench-hami: $*" >&2; }
. scripts/bench/bench-lib.sh

# ---- HAMi-core, built from HAMI_SRC ---------------------------------------------------
headers() { # the folder with cuda.h and nvml.h
    if [ -n "${HAMI_CUDA_INCLUDE:-}" ]; then echo "$HAMI_CUDA_INCLUDE"; return; fi
    local venv=$ROOT/target/venv-cuda-headers
    if [ ! -x "$venv/bin/python" ]; then
        say "installing CUDA and NVML headers (pip: nvidia-cuda-runtime, nvidia-nvml-dev) into $venv"
        python3 -m venv "$venv" >&2
        "$venv/bin/pip" install -q nvidia-cuda-runtime==13.5.37 nvidia-nvml-dev==13.5.37 >&2
    fi
    local h
    h=$(find "$venv" -name cuda.h -path '*nvidia*' | head -1)
    [ -n "$h" ] && [ -f "$(dirname "$h")/nvml.h" ] || { say "cuda.h and nvml.h not found under $venv"; exit 1; }
    dirname "$h"
}
if [ -n "$SRC" ]; then
    [ -f "$SRC/src/libvgpu.c" ] || { say "$SRC is not a HAMi-core source folder (no src/libvgpu.c)"; exit 2; }
    commit=$(git -C "$SRC" rev-parse HEAD 2>/dev/null || echo "${HAMI_COMMIT:-unknown}")
    inc=$(headers)
    B=$ROOT/target/hami
    mkdir -p "$B/config" "$B/lib"
    cuda_link_dir "$B/lib" >/dev/null 2>&1 || ln -sfn "$R/libcuda.so" "$B/lib/libcuda.so"
    # static_config.h as HAMi-core's CMake writes it with build.sh's options.
    sed -e 's/^#cmakedefine \(MULTIPROCESS_LIMIT_ENABLE\|DLSYM_HOOK_ENABLE\|HOOK_MEMINFO_ENABLE\|HOOK_NVML_ENABLE\)$/#define \1/' \
        -e 's/^#cmakedefine \(.*\)$/\/* #undef \1 *\//' -e "s/@GIT_HASH@/${commit:0:7}/" -e 's/@GIT_BRANCH@/unknown/' \
        "$SRC/src/static_config.h.in" >"$B/config/static_config.h"
    S=$SRC/src
    # shellcheck disable=SC2086
    cc -shared -fPIC -g -D_GNU_SOURCE -Wall ${HAMI_CFLAGS:-} -w -I "$inc" -I "$S" -I "$B/config" -o "$B/libvgpu.so" \
        "$S/libvgpu.c" "$S/utils.c" "$S/log_utils.c" "$S/nvml/nvml_entry.c" "$S/nvml/hook.c" \
        "$S"/cuda/{context,device,hook,event,memory,stream,graph}.c "$S/allocator/allocator.c" \
        "$S"/multiprocess/{multiprocess_memory_limit,multiprocess_utilization_watcher}.c \
        -L "$B/lib" -lcuda -lpthread -ldl
    printf '%s\ncc -shared -fPIC -g -D_GNU_SOURCE -Wall %s (as HAMi-core build.sh: CMake Debug)\n' \
        "$commit" "${HAMI_CFLAGS:-}" >"$B/libvgpu.so.commit"
    SO=$B/libvgpu.so
    say "built $SO from HAMi-core $commit ($(du -k "$SO" | cut -f1) KiB)"
fi
[ "$BUILD_ONLY" = 1 ] && exit 0
SO=${SO:-$ROOT/target/hami/libvgpu.so}
[ -f "$SO" ] || { say "no HAMi-core build at $SO: give HAMI_SRC (a HAMi-core source folder) or --so FILE"; exit 2; }
SO=$(cd "$(dirname "$SO")" && pwd)/$(basename "$SO")
HAMI_COMMIT=$(sed -n 1p "$SO.commit" 2>/dev/null || true)
HAMI_BUILD=$(sed -n 2p "$SO.commit" 2>/dev/null || true)
SHIM=${BENCH_HAMI_SHIM:-$R/libgpucap.so}
[ -f "$SHIM" ] || { say "$SHIM missing: cargo build --release"; exit 2; }

# ---- which driver ---------------------------------------------------------------------
DRIVER=${BENCH_HAMI_DRIVER:-}
[ -n "$DRIVER" ] || { ldconfig -p 2>/dev/null | grep -q 'libcuda\.so\.1 ' && DRIVER=real || DRIVER=fake; }
# A real driver's pair takes ~80 us (H200, driver 580): 2,000 pairs a figure there.
[ "$DRIVER" = real ] && DEFAULT_PAIRS=2000 || DEFAULT_PAIRS=20000
REPS=${REPS:-5} PAIRS=${PAIRS:-$DEFAULT_PAIRS} STARTUP_RUNS=${STARTUP_RUNS:-200} N=${BENCH_HAMI_N:-2000}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
bench_clean_env 'CUDA_DEVICE_[A-Za-z0-9_]*'
if [ "$DRIVER" = fake ]; then
    FAKEDIR=$R/fakecuda-hami
    bench_fake_setup nvml
    export LD_LIBRARY_PATH=$FAKEDIR FAKECUDA_TOTAL_MEM=80Gi
    LINKDIR=$FAKEDIR
    DEVICE="fake driver (host memory), no GPU"
else
    LINKDIR=$tmp/lib
    cuda_link_dir "$LINKDIR" >/dev/null
    mkdir -p "$R/ctests"
    BIN=$tmp/bench_alloc
    cc -O2 -pthread -o "$BIN" tests/c/bench_alloc.c -Itests/c -L"$LINKDIR" -lcuda
    DEVICE=$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -1 || echo "real GPU")
fi
FIRST=$tmp/bench_first
# The floor of any preloaded library: one with nothing in it.
printf 'int bench_hami_empty;\n' >"$tmp/empty.c"
cc -shared -fPIC -O2 -o "$tmp/libempty.so" "$tmp/empty.c"
cc -O2 -Wall -I tests/c -o "$FIRST" tests/c/bench_first.c -L "$LINKDIR" -lcuda

WAYS=(raw hami gpucap pool)
# way_env WAY [LIMIT]: the environment of one way, one VAR=VALUE per line (limit 40 GiB).
way_env() {
    local gib=${2:-40}
    case $1 in
        raw) ;;
        empty) printf '%s\n' "LD_PRELOAD=$tmp/libempty.so" ;;
        hami) printf '%s\n' "LD_PRELOAD=$SO" "CUDA_DEVICE_MEMORY_LIMIT=${gib}g" "LIBCUDA_LOG_LEVEL=0" \
            "CUDA_DEVICE_MEMORY_SHARED_CACHE=$tmp/hami-$gib.cache" ;;
        gpucap) printf '%s\n' "LD_PRELOAD=$SHIM" "GPUCAP_LIMIT=${gib}Gi" ;;
        pool) printf '%s\n' "LD_PRELOAD=$SHIM" "GPUCAP_LIMIT=${gib}Gi" "GPUCAP_POOL=bench$gib" "GPUCAP_POOL_DIR=$tmp" ;;
    esac
}
# in_way WAY CMD...: CMD in that way's environment.
in_way() {
    local way=$1 e
    shift
    mapfile -t e < <(way_env "$way")
    env ${e[@]+"${e[@]}"} "$@"
}
# Each way caps: 128 MiB under a 64 MiB limit is refused (raw: allowed).
for way in hami gpucap pool; do
    mapfile -t e < <(way_env "$way" 0 | sed -e 's/LIMIT=0g$/LIMIT=64m/' -e 's/LIMIT=0Gi$/LIMIT=64Mi/')
    if env "${e[@]}" "$BIN" 1 1 128Mi >/dev/null 2>&1; then
        say "$way did not refuse 128 MiB under a 64 MiB limit: it is not capping, nothing to compare"
        exit 1
    fi
done
say "driver: $DRIVER ($DEVICE); HAMi-core $HAMI_COMMIT ($SO); every way caps"
if [ "$DRIVER" = fake ] && ! command -v valgrind >/dev/null; then
    say "valgrind not found (apt-get install valgrind): it counts the instructions on the fake"
    exit 2
fi

# ns_pair WAY SIZE [LIVE] [ARENA]: ns per pair (bench_alloc's wall figure) of one process.
ns_pair() {
    local arena=()
    [ "${4:-0}" = 1 ] && arena=(FAKECUDA_ARENA=1)
    in_way "$1" env ${arena[@]+"${arena[@]}"} "$BIN" 1 "$PAIRS" "$2" pair "live=${3:-0}" 2>>"$tmp/stderr" |
        sed -n 's/.* ns_per_pair=\([0-9.]*\) .*/\1/p'
}
# churn WAY: 4 processes at once, the mean of their ns per pair (1 MiB).
churn() {
    local i f=() arena=${BENCH_HAMI_ARENA:-0}
    for i in 1 2 3 4; do
        f+=("$tmp/churn.$i")
        ns_pair "$1" 1Mi 0 "$arena" >"$tmp/churn.$i" &
    done
    wait
    cat "${f[@]}" | awk '{ s += $1 } END { if (NR != 4) exit 1; printf "%.1f\n", s / NR }'
}
# start WAY: microseconds per LD_PRELOAD=... /bin/true start, over STARTUP_RUNS starts.
start() {
    local e j t0 t1
    mapfile -t e < <(way_env "$1")
    t0=$(date +%s%N)
    for ((j = 0; j < STARTUP_RUNS; j++)); do env ${e[@]+"${e[@]}"} /bin/true; done
    t1=$(date +%s%N)
    awk -v a="$t0" -v b="$t1" -v n="$STARTUP_RUNS" 'BEGIN { printf "%.1f\n", (b - a) / n / 1e3 }'
}
first_ns() { in_way "$1" "$FIRST" create | sed -n 's/.*total_ns=\([0-9]*\).*/\1/p'; }

declare -A S # S[case,way]="value value ..." over rounds
if [ "$DRIVER" = fake ]; then
    CASES=(churn start)
else
    CASES=(4Ki 1Mi 256Mi live10k churn first start)
fi
for ((r = 1; r <= REPS; r++)); do
    for c in "${CASES[@]}"; do
        ways=("${WAYS[@]}")
        [ "$c" = start ] && ways+=(empty)
        for way in "${ways[@]}"; do
            case $c in
                4Ki | 1Mi) v=$(ns_pair "$way" "$c") ;;
                256Mi) v=$(PAIRS=$((PAIRS / 10)) ns_pair "$way" "$c") ;;
                live10k) v=$(ns_pair "$way" 1Mi 10000) ;;
                churn) v=$(churn "$way") ;;
                first) v=$(first_ns "$way") ;;
                start) v=$(start "$way") ;;
            esac
            [ -n "$v" ] || { say "$c, $way: no figure"; exit 1; }
            S[$c,$way]+=" $v"
        done
    done
    say "round $r of $REPS done"
done
declare -A M # medians
for c in "${CASES[@]}"; do for way in "${WAYS[@]}"; do
    # shellcheck disable=SC2086
    M[$c,$way]=$(med ${S[$c,$way]})
done; done
# shellcheck disable=SC2086
M[start,empty]=$(med ${S[start,empty]})
declare -A I # instructions (fake only)
if [ "$DRIVER" = fake ]; then
    bench_netns bench-hami
    for way in "${WAYS[@]}"; do
        mapfile -t e < <(way_env "$way")
        pre=$(printf '%s\n' ${e[@]+"${e[@]}"} | sed -n 's/^LD_PRELOAD=//p')
        # Each counted run in a pool (and HAMi-core's shared cache) of its own (see
        # `instructions`): before, the N and 2N runs shared one file, and with 10,000
        # blocks live the pool's figure moved with N (+132 at 200 pairs, +399 at 2,000;
        # +431 at both in pools of their own).
        vars=$(printf '%s\n' ${e[@]+"${e[@]}"} | grep -v '^LD_PRELOAD=' |
            sed -e 's/^\(GPUCAP_POOL\|CUDA_DEVICE_MEMORY_SHARED_CACHE\)=\(.*\)$/\1=\2-@RUN@/' || true)
        # shellcheck disable=SC2086
        I[pair,$way]=$(BSIZE=1Mi per_pair "$pre" 0 $vars)
        # shellcheck disable=SC2086
        I[live10k,$way]=$(BSIZE=1Mi per_pair "$pre" 10000 $vars)
        I[first,$way]=$(whole_instructions ${e[@]+"${e[@]}"} -- "$FIRST" create)
        say "instructions, $way: pair ${I[pair,$way]}, with 10,000 live ${I[live10k,$way]}, first use ${I[first,$way]}"
    done
fi

# ---- the table and the JSON -----------------------------------------------------------
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", a / b }'; }
plus() { awk -v a="$1" -v b="$2" 'BEGIN { d = a - b; printf "%s%d", (d >= 0 ? "+" : ""), d }'; }
row() { # row LABEL KIND(plus|ratio) KEY ARRAY: raw's figure, then each way against it
    local label=$1 kind=$2 key=$3 arr=$4 raw line w
    eval "raw=\${$arr[\$key,raw]}"
    line="| $label | $raw"
    for w in hami gpucap pool; do
        eval "v=\${$arr[\$key,\$w]}"
        if [ "$kind" = plus ]; then line+=" | $(plus "$v" "$raw")"; else line+=" | ×$(ratio "$v" "$raw")"; fi
    done
    echo "$line |"
}
{
    echo
    echo "gpucap beside HAMi-core ($HAMI_COMMIT), $DEVICE, $(date -u +%Y-%m-%d)"
    echo
    echo "| | raw driver | HAMi-core | gpucap alone | gpucap in a pool |"
    echo "| --- | --- | --- | --- | --- |"
    if [ "$DRIVER" = fake ]; then
        row "1 MiB pair, instructions (callgrind, N=$N)" plus pair I
        row "1 MiB pair with 10,000 live 1 MiB blocks, instructions" plus live10k I
        row "4 processes churning 1 MiB, ns per pair$([ "${BENCH_HAMI_ARENA:-0}" = 1 ] && echo ' (arena)')" ratio churn M
        row "first use (cuInit + first context + pair), whole-process instructions" ratio first I
    else
        row "4 KiB pair, ns" ratio 4Ki M
        row "1 MiB pair, ns" ratio 1Mi M
        row "256 MiB pair, ns" ratio 256Mi M
        row "1 MiB pair with 10,000 live 1 MiB blocks, ns" ratio live10k M
        row "4 processes churning 1 MiB, ns per pair" ratio churn M
        row "first use (cuInit + first context + pair), ns" ratio first M
    fi
    row "LD_PRELOAD /bin/true start, µs" ratio start M
    echo
    echo "start with an empty C library preloaded (the floor of any preloaded library): ×$(ratio "${M[start,empty]}" "${M[start,raw]}")"
    echo "medians of $REPS interleaved rounds; raw's column is its own figure, the others are added instructions (+) or a ratio to raw (×)"
} | tee "$tmp/table" >&2
json_way() { # json_way ARRAY KEY: {"raw": v, ...}
    local arr=$1 key=$2 w s='' v
    for w in "${WAYS[@]}"; do
        eval "v=\${$arr[\$key,\$w]}"
        s+="${s:+, }\"$w\": $v"
    done
    [ "$key" = start ] && [ "$arr" = M ] && s+=", \"empty\": ${M[start,empty]}"
    echo "{$s}"
}
{
    printf '{\n  "driver": "%s",\n  "device": "%s",\n  "hami_core_commit": "%s",\n  "hami_core_build": "%s",\n' \
        "$DRIVER" "$DEVICE" "${HAMI_COMMIT:-unknown}" "$HAMI_BUILD"
    printf '  "reps": %d,\n  "pairs": %d,\n  "startup_runs": %d,\n  "date": "%s",\n  "medians": {' \
        "$REPS" "$PAIRS" "$STARTUP_RUNS" "$(date -u +%Y-%m-%dT%H:%M:%SZ)"
    sep=''
    for c in "${CASES[@]}"; do printf '%s\n    "%s": %s' "$sep" "$c" "$(json_way M "$c")"; sep=','; done
    printf '\n  }'
    if [ "$DRIVER" = fake ]; then
        printf ',\n  "instructions_n": %d,\n  "instructions": {' "$N"
        sep=''
        for c in pair live10k first; do printf '%s\n    "%s": %s' "$sep" "$c" "$(json_way I "$c")"; sep=','; done
        printf '\n  }'
    fi
    printf ',\n  "table": %s\n}\n' "$(python3 -c 'import json, sys; print(json.dumps(sys.stdin.read()))' <"$tmp/table")"
} >"$OUTFILE"
say "wrote $OUTFILE"
