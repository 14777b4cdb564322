#!/usr/bin/env bash
# gpucap on a real NVIDIA GPU: does the cap hold for nvcc-built programs, PyTorch, JAX,
# CuPy, nvidia-smi and NVML, and what does the shim cost? Unattended, no network.
#
#   scripts/gpu-check.sh [options]
#
#   --lib PATH        libgpucap.so to test      (default target/release/libgpucap.so)
#   --cli PATH        the gpucap executable      (default target/release/gpucap)
#                     Built with `cargo build --release` only when both are left at
#                     their defaults, either is missing and cargo is installed.
#   --gpu N|UUID      the GPU (nvidia-smi index or UUID; default 0). Every check runs
#                     with CUDA_VISIBLE_DEVICES set to its UUID.
#   --cap-mib N       the cap, in MiB (default: 2048, or a quarter of the card if less)
#   --python PATH     the Python with torch / jax / cupy / pynvml (default python3)
#   --timeout S       per-check (and per benchmark run) time limit (default 300, min 60)
#   --only REGEX      run only the checks whose name matches (bash =~)
#   --except REGEX    leave out the checks whose name matches (after --only)
#   --pool-members N  processes of the pool-64 check (default 64, at least 2)
#   --step-rounds N   rounds of the bench-step benchmark (default 8, at least 3)
#   --no-fill         torch-growth/torch-release: do not fill the GPU's free memory
#                     for a moment (use on a GPU that other jobs share)
#   --logs DIR        keep the per-check logs there (default: a new temp directory)
#   --bench           also run the benchmarks and write them to a JSON file
#   --out PATH        the benchmark JSON (default gpu-bench.json)
#   --reps N          benchmark repetitions, raw and capped interleaved (default 5)
#   --target-ms MS    length of one alloc/free benchmark run (default 300)
#   --train-reps N    training benchmark runs per mode (default 3)
#   --train-steps N   timed steps of one training run (default 50)
#   --deadline EPOCH  a time budget (seconds since the epoch): no check starts later
#                     than 30 s before it (SKIP: the time budget is spent) and none
#                     runs past it. Each check's seconds go to LOGDIR/times.txt.
#
# Output: one line per check, `PASS <name>`, `FAIL <name>: <why>` (followed by the end of
# its log) or `SKIP <name>: <reason>`, then `N passed, M failed, K skipped`. Exit status 1
# if any check failed, else 0; 2 for a bad command line. Without an NVIDIA GPU every check
# is skipped. See docs/src/real-gpu.md, "Proof on a real GPU", for what each check proves.

# The checks are called by name ("check_${name//-/_}"), which shellcheck cannot follow:
# shellcheck disable=SC2317
set -uo pipefail

ORIG_PWD=$PWD
cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 2
ROOT=$PWD
PROBE=$ROOT/scripts/gpu/probe.py
SRC_DIR=$ROOT/scripts/gpu

LIB='' CLI='' GPU=0 CAP_MIB='' PY=python3 TIMEOUT=300 ONLY='' EXCEPT='' NO_FILL=0 LOGDIR=
POOL_MEMBERS=64 STEP_ROUNDS=8
BENCH=0 OUT=gpu-bench.json REPS=5 TARGET_MS=300 DEADLINE=
TRAIN_STEPS=50 TRAIN_WARMUP=10 TRAIN_BATCH=64 TRAIN_IMAGE=128 TRAIN_REPS=3 TRAIN_CAP=

usage() {
    sed -n '2,/^$/p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'
}

die_usage() {
    printf 'gpu-check.sh: %s (see --help)\n' "$1" >&2
    exit 2
}

abspath() {
    case $1 in
        /*) printf '%s' "$1" ;;
        *) printf '%s/%s' "$ORIG_PWD" "$1" ;;
    esac
}

is_uint() { [[ $1 =~ ^[0-9]+$ ]]; }

# uint_at_least OPTION VALUE MIN: VALUE, or exit 2
uint_at_least() {
    if ! is_uint "$2" || [ "$2" -lt "$3" ]; then
        die_usage "$1 wants a whole number, at least $3"
    fi
    printf '%s' "$2"
}

while [ $# -gt 0 ]; do
    opt=$1
    case $opt in
        -h | --help) usage; exit 0 ;;
        --bench) BENCH=1; shift; continue ;;
        --no-fill) NO_FILL=1; shift; continue ;;
        --*=*) val=${opt#*=}; opt=${opt%%=*}; shift ;;
        --lib | --cli | --gpu | --cap-mib | --python | --timeout | --only | --logs | --out | --reps | --target-ms | \
            --train-reps | --train-steps | --deadline | --except | --pool-members | --step-rounds)
            [ $# -ge 2 ] || die_usage "$opt needs a value"
            val=$2; shift 2 ;;
        -*) die_usage "unknown option '$opt'" ;;
        *) die_usage "unexpected argument '$opt'" ;;
    esac
    case $opt in
        --lib) LIB=$(abspath "$val") ;;
        --cli) CLI=$(abspath "$val") ;;
        --gpu) GPU=$val ;;
        --cap-mib) CAP_MIB=$(uint_at_least "$opt" "$val" 64) || exit 2 ;;
        --python) case $val in */*) PY=$(abspath "$val") ;; *) PY=$val ;; esac ;;
        --timeout) TIMEOUT=$(uint_at_least "$opt" "$val" 60) || exit 2 ;;
        --only) ONLY=$val ;;
        --except) EXCEPT=$val ;;
        --pool-members) POOL_MEMBERS=$(uint_at_least "$opt" "$val" 2) || exit 2 ;;
        --step-rounds) STEP_ROUNDS=$(uint_at_least "$opt" "$val" 3) || exit 2 ;;
        --logs) LOGDIR=$(abspath "$val") ;;
        --out) OUT=$(abspath "$val") ;;
        --reps) REPS=$(uint_at_least "$opt" "$val" 1) || exit 2 ;;
        --target-ms) TARGET_MS=$(uint_at_least "$opt" "$val" 10) || exit 2 ;;
        --train-reps) TRAIN_REPS=$(uint_at_least "$opt" "$val" 1) || exit 2 ;;
        --train-steps) TRAIN_STEPS=$(uint_at_least "$opt" "$val" 1) || exit 2 ;;
        --deadline) DEADLINE=$(uint_at_least "$opt" "$val" 1) || exit 2 ;;
        *) die_usage "unknown option '$opt'" ;;
    esac
done
OUT=$(abspath "$OUT")

CHECKS=(
    cuda-static cuda-shared
    torch-default torch-expandable-segments torch-cudaMallocAsync
    torch-release torch-growth torch-eager
    jax-preallocate jax-no-preallocate jax-platform-allocator
    cupy-default-pool cupy-async-pool
    numba
    nvidia-smi nvml
    context-overhead
)
BENCHES=(bench-alloc bench-churn bench-torch-train)
# The checks and benchmarks, one file per job (scripts/gpu/checks/): the files of
# later checks add their names to CHECKS.
for f in "$SRC_DIR"/checks/*.sh; do
    # shellcheck source=/dev/null
    . "$f"
done

# ---- results ---------------------------------------------------------------------------
NPASS=0 NFAIL=0 NSKIP=0
LOG=/dev/null
RESULTS_FILE=

record() { # STATUS NAME DETAIL
    if [ -n "$RESULTS_FILE" ]; then
        printf '%s %s %s\n' "$1" "$2" "$3" >>"$RESULTS_FILE"
    fi
}

pass() { # NAME [DETAIL]
    NPASS=$((NPASS + 1))
    printf 'PASS %s\n' "$1"
    if [ -n "${2:-}" ]; then
        printf '      %s\n' "$2"
    fi
    record PASS "$1" "${2:-}"
}

fail() { # NAME WHY  (prints the end of the check's log)
    NFAIL=$((NFAIL + 1))
    printf 'FAIL %s: %s\n' "$1" "$2"
    if [ -s "$LOG" ]; then
        printf '    --- last lines of %s\n' "$LOG"
        tail -n 25 "$LOG" | sed 's/^/    | /'
    fi
    record FAIL "$1" "$2"
}

skip() { # NAME REASON
    NSKIP=$((NSKIP + 1))
    printf 'SKIP %s: %s\n' "$1" "$2"
    record SKIP "$1" "$2"
}

selected() { { [ -z "$ONLY" ] || [[ $1 =~ $ONLY ]]; } && { [ -z "$EXCEPT" ] || ! [[ $1 =~ $EXCEPT ]]; }; }

all_names() {
    printf '%s\n' "${CHECKS[@]}"
    if [ "$BENCH" = 1 ]; then
        printf '%s\n' "${BENCHES[@]}"
    fi
}

finish() {
    printf '%d passed, %d failed, %d skipped\n' "$NPASS" "$NFAIL" "$NSKIP"
    if [ "$NFAIL" -gt 0 ]; then
        exit 1
    fi
    exit 0
}

skip_all() { # REASON
    local name
    while read -r name; do
        if selected "$name"; then
            skip "$name" "$1"
        fi
    done < <(all_names)
    finish
}

# With --logs, even a run that skips everything keeps its verdicts there.
if [ -n "$LOGDIR" ] && mkdir -p "$LOGDIR" 2>/dev/null; then
    RESULTS_FILE=$LOGDIR/results.txt
    : >"$RESULTS_FILE"
fi

# ---- is there a GPU? ---------------------------------------------------------------------
if ! command -v nvidia-smi >/dev/null 2>&1; then
    skip_all "no NVIDIA GPU (nvidia-smi not found)"
fi
if ! smi_list=$(nvidia-smi -L 2>&1) || ! grep -q '^GPU ' <<<"$smi_list"; then
    skip_all "no NVIDIA GPU (nvidia-smi -L: $(head -n 1 <<<"$smi_list"))"
fi

gpu_query() { # FIELD
    nvidia-smi -i "$GPU" --query-gpu="$1" --format=csv,noheader,nounits 2>/dev/null |
        head -n 1 | sed 's/^[[:space:]]*//; s/[[:space:]]*$//'
}

GPU_UUID=$(gpu_query uuid)
if [[ $GPU_UUID != GPU-* ]]; then
    die_usage "no GPU '$GPU' (nvidia-smi -i $GPU --query-gpu=uuid: '$GPU_UUID'); nvidia-smi -L lists: $(tr '\n' ';' <<<"$smi_list")"
fi
GPU=$GPU_UUID
GPU_NAME=$(gpu_query name)
DRIVER=$(gpu_query driver_version)
TOTAL_MIB=$(gpu_query memory.total)
FREE_MIB=$(gpu_query memory.free)
MIG=$(gpu_query mig.mode.current)
if [ "$MIG" = Enabled ]; then
    skip_all "MIG is enabled on $GPU_UUID: run on a GPU without MIG (or pass --gpu)"
fi

# ---- set-up: logs, the shim, the environment -----------------------------------------------
if [ -z "$LOGDIR" ]; then
    LOGDIR=$(mktemp -d "${TMPDIR:-/tmp}/gpu-check.XXXXXX") || { echo "gpu-check.sh: mktemp failed" >&2; exit 2; }
fi
mkdir -p "$LOGDIR/build" || { echo "gpu-check.sh: cannot create $LOGDIR" >&2; exit 2; }
BUILD=$LOGDIR/build
RESULTS_FILE=$LOGDIR/results.txt
FIGURES=$LOGDIR/figures.txt
BENCH_TSV=$LOGDIR/bench.tsv
: >"$RESULTS_FILE"
: >"$FIGURES"
: >"$BENCH_TSV"

echo "gpu-check: $GPU_NAME ($GPU_UUID), driver $DRIVER, ${TOTAL_MIB} MiB (${FREE_MIB} MiB free)"
echo "gpu-check: logs in $LOGDIR"

# A run in progress is stopped with the script (timeout puts it in its own process group).
CHILD=
on_signal() {
    if [ -n "$CHILD" ]; then
        kill -TERM "$CHILD" 2>/dev/null
    fi
    echo "gpu-check: interrupted" >&2
    exit 130
}
trap on_signal INT TERM

# run_logged OUTFILE CMD...: CMD under `timeout`, stdin from /dev/null, stdout and stderr
# to OUTFILE (and the check's log); returns CMD's status (124/137: timed out).
run_logged() {
    local out=$1
    shift
    {
        printf '\n$'
        printf ' %q' "$@"
        printf '\n'
    } >>"$LOG"
    timeout -k 10 "$TIMEOUT" "$@" </dev/null >"$out" 2>&1 &
    CHILD=$!
    wait "$CHILD"
    local rc=$?
    CHILD=
    cat "$out" >>"$LOG"
    printf '[exit status %d]\n' "$rc" >>"$LOG"
    return "$rc"
}

# probe CMD...: runs a probe (a program whose last verdict line is OK:, FAIL: or SKIP:).
# Sets PROBE_RC and PROBE_MSG (the text of that line); keeps its FIGURE lines.
PROBE_RC=0 PROBE_MSG=
probe() {
    local out=$LOGDIR/.out
    run_logged "$out" "$@"
    PROBE_RC=$?
    PROBE_MSG=$(grep -E '^(OK|FAIL|SKIP): ' "$out" | tail -n 1 | sed -E 's/^(OK|FAIL|SKIP): //')
    grep -E '^FIGURE [A-Za-z0-9_]+ ' "$out" | cut -d' ' -f2- >>"$FIGURES"
    case $PROBE_RC in
        0) [ -n "$PROBE_MSG" ] || PROBE_MSG="done" ;;
        77) [ -n "$PROBE_MSG" ] || PROBE_MSG="skipped by the probe" ;;
        124 | 137) PROBE_MSG="timed out after ${TIMEOUT}s" ;;
        *) [ -n "$PROBE_MSG" ] || PROBE_MSG="exit status $PROBE_RC" ;;
    esac
    return "$PROBE_RC"
}

# verdict NAME: PASS/SKIP/FAIL from the last probe.
verdict() {
    case $PROBE_RC in
        0) pass "$1" "$PROBE_MSG" ;;
        77) skip "$1" "$PROBE_MSG" ;;
        *) fail "$1" "$PROBE_MSG" ;;
    esac
}

setup_fail() { # WHY: the shim cannot be tested at all
    LOG=$LOGDIR/setup.log
    fail setup "$1"
    local name
    while read -r name; do
        if selected "$name"; then
            skip "$name" "set-up failed"
        fi
    done < <(all_names)
    finish
}

# Nothing inherited may change what the checks see.
if [ -n "${LD_PRELOAD:-}" ]; then
    echo "gpu-check: ignoring the inherited LD_PRELOAD=$LD_PRELOAD"
fi
unset LD_PRELOAD
while read -r v; do
    case $v in
        # PYTORCH_ALLOC_CONF is PyTorch's newer name of PYTORCH_CUDA_ALLOC_CONF (either one
        # picks the allocator), XLA_CLIENT_MEM_FRACTION JAX's newer name of
        # XLA_PYTHON_CLIENT_MEM_FRACTION; CUDA_MODULE_LOADING=EAGER would load every kernel of
        # a framework into its first context, charged to the cap before any allocation.
        GPUCAP_* | XLA_PYTHON_CLIENT_* | XLA_CLIENT_MEM_FRACTION | PYTORCH_CUDA_ALLOC_CONF | \
            PYTORCH_ALLOC_CONF | PYTORCH_NO_CUDA_MEMORY_CACHING | CUPY_GPU_MEMORY_LIMIT | \
            TF_FORCE_GPU_ALLOW_GROWTH | CUDA_MODULE_LOADING | CUDA_VISIBLE_DEVICES | CUDA_DEVICE_ORDER)
            unset "$v" ;;
    esac
done < <(compgen -e)
export CUDA_DEVICE_ORDER=PCI_BUS_ID CUDA_VISIBLE_DEVICES=$GPU_UUID
export PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1

if ! is_uint "${TOTAL_MIB:-}"; then
    setup_fail "nvidia-smi gives no memory.total for $GPU_UUID ('$TOTAL_MIB')"
fi
if [ -z "$CAP_MIB" ]; then
    CAP_MIB=2048
    if [ $((TOTAL_MIB / 4)) -lt "$CAP_MIB" ]; then
        CAP_MIB=$((TOTAL_MIB / 4 / 2 * 2))
    fi
fi
if [ "$CAP_MIB" -gt $((TOTAL_MIB / 2)) ]; then
    setup_fail "--cap-mib $CAP_MIB is not well below the card's ${TOTAL_MIB} MiB"
fi
CAP=$((CAP_MIB * 1048576))
if is_uint "${FREE_MIB:-}" && [ "$FREE_MIB" -lt $((2 * CAP_MIB + 1024)) ]; then
    echo "gpu-check: warning: only ${FREE_MIB} MiB free on the GPU; checks may fail for want of memory"
fi
echo "gpu-check: cap ${CAP_MIB} MiB ($CAP bytes)"

DEFAULT_LIB=$ROOT/target/release/libgpucap.so
DEFAULT_CLI=$ROOT/target/release/gpucap
if [ -z "$LIB" ] && [ -z "$CLI" ] && { [ ! -f "$DEFAULT_LIB" ] || [ ! -x "$DEFAULT_CLI" ]; }; then
    LOG=$LOGDIR/setup.log
    if command -v cargo >/dev/null 2>&1; then
        echo "gpu-check: building gpucap (cargo build --release, log in $LOG)"
        if ! (cargo build --release >>"$LOG" 2>&1); then
            setup_fail "cargo build --release failed"
        fi
    else
        setup_fail "$DEFAULT_LIB or $DEFAULT_CLI missing and no cargo to build them: pass --lib PATH --cli PATH"
    fi
fi
LIB=${LIB:-$DEFAULT_LIB}
CLI=${CLI:-$DEFAULT_CLI}
[ -f "$LIB" ] || setup_fail "no libgpucap.so at $LIB"
[ -x "$CLI" ] || setup_fail "no gpucap executable at $CLI"
export GPUCAP_LIB=$LIB
echo "gpu-check: shim $LIB, CLI $CLI ($("$CLI" --version 2>/dev/null | head -n 1))"

LOG=$LOGDIR/setup.log
if ! run_logged "$LOGDIR/.out" "$CLI" check --limit "$CAP"; then
    setup_fail "gpucap check --limit $CAP failed"
fi
if ! run_logged "$LOGDIR/.out" "$CLI" run --limit "$CAP" -- true; then
    setup_fail "gpucap run --limit $CAP -- true failed"
fi

PY_OK=0
if command -v "$PY" >/dev/null 2>&1 && "$PY" -c 'import sys; sys.exit(sys.version_info < (3, 7))' 2>/dev/null; then
    PY_OK=1
fi

# ---- helpers of the checks -------------------------------------------------------------------
# capped REPORT: the command prefix of a capped run that writes gpucap's report to REPORT.
# A report left there by an earlier run (--logs DIR reused) is removed first: the shim adds
# its process to an existing file, and report_ok would judge the old entries too.
capped() {
    rm -f "$1"
    CAPPED=("$CLI" run --limit "$CAP" --report "$1" --)
}

# report_ok NAME REPORT [probe report options]: gpucap's own figures agree (cap, peak <=
# cap, refusals...). Returns 1 after printing FAIL.
report_ok() {
    local name=$1 rep=$2
    shift 2
    if [ "$PY_OK" != 1 ]; then
        return 0
    fi
    if ! probe "$PY" "$PROBE" report "$rep" --cap "$CAP" "$@"; then
        fail "$name" "$PROBE_MSG"
        return 1
    fi
    return 0
}

# needs_fw FW NAME: 0 if framework FW (torch, jax, cupy, pynvml) works uncapped, else
# prints SKIP NAME and returns 1. Detected once, uncapped.
declare -A FW_STATE=() FW_MSG=()
needs_fw() {
    if fw_available "$1"; then
        return 0
    fi
    skip "$2" "${FW_MSG[$1]}"
    return 1
}

# fw_available FW: 0 if framework FW works uncapped (detected once, quietly).
fw_available() {
    local fw=$1 out rc
    if [ -z "${FW_STATE[$fw]:-}" ]; then
        if [ "$PY_OK" != 1 ]; then
            FW_STATE[$fw]=no
            FW_MSG[$fw]="no Python 3 ('$PY' not found)"
        else
            out=$(timeout -k 10 "$TIMEOUT" "$PY" "$PROBE" detect "$fw" </dev/null 2>>"$LOGDIR/detect.log")
            rc=$?
            printf '%s\n' "$out" >>"$LOGDIR/detect.log"
            out=$(grep -E '^(OK|SKIP|FAIL): ' <<<"$out" | tail -n 1 | sed -E 's/^(OK|SKIP|FAIL): //')
            if [ "$rc" = 0 ]; then
                FW_STATE[$fw]=yes
                FW_MSG[$fw]=$out
                echo "gpu-check: found $out"
            else
                FW_STATE[$fw]=no
                FW_MSG[$fw]=${out:-"detection failed (exit status $rc), see $LOGDIR/detect.log"}
            fi
        fi
    fi
    [ "${FW_STATE[$fw]}" = yes ]
}

NVCC=
for c in nvcc "${CUDA_HOME:-/nonexistent}/bin/nvcc" /usr/local/cuda/bin/nvcc; do
    if command -v "$c" >/dev/null 2>&1; then
        NVCC=$(command -v "$c")
        break
    fi
done
CUDA_ROOT=
NVCC_FLAGS=(-O2 -Wno-deprecated-gpu-targets)
if [ -n "$NVCC" ]; then
    CUDA_ROOT=$(cd "$(dirname "$(readlink -f "$NVCC")")/.." && pwd)
    # The helpers have no device code: a host gcc newer than this nvcc supports is fine,
    # where nvcc would otherwise stop with "unsupported GNU version".
    nvcc_help=$("$NVCC" --help 2>/dev/null)
    if [[ $nvcc_help == *allow-unsupported-compiler* ]]; then
        NVCC_FLAGS+=(-allow-unsupported-compiler)
    fi
fi

# The directories where libcudart.so and the libcuda.so link stub are.
cuda_lib_dirs() {
    local d
    for d in "$CUDA_ROOT/lib64" "$CUDA_ROOT/targets/$(uname -m)-linux/lib" "$CUDA_ROOT/targets/sbsa-linux/lib" "$CUDA_ROOT/lib"; do
        if [ -d "$d" ]; then
            printf '%s\n' "$d"
        fi
    done
}

# cuda_link_flags: -L flags for the CUDA lib folders and their link stubs (libcuda.so), one a line.
cuda_link_flags() {
    local d
    while read -r d; do
        printf -- '-L%s\n-L%s/stubs\n' "$d" "$d"
    done < <(cuda_lib_dirs)
}

# build NAME OUT SRC [nvcc flags...]: compiles once; 1 after printing FAIL/SKIP NAME.
declare -A BUILT=()
build() {
    local name=$1 out=$2 src=$3
    shift 3
    if [ -z "$NVCC" ]; then
        skip "$name" "nvcc not found (PATH, \$CUDA_HOME/bin, /usr/local/cuda/bin)"
        return 1
    fi
    if [ "${BUILT[$out]:-}" = ok ]; then
        return 0
    fi
    if [ "${BUILT[$out]:-}" = failed ]; then
        fail "$name" "building $(basename "$out") with nvcc failed (see the log of the first check that built it)"
        return 1
    fi
    local flags=()
    mapfile -t flags < <(cuda_link_flags)
    if run_logged "$LOGDIR/.out" "$NVCC" "${NVCC_FLAGS[@]}" -o "$out" "$src" "$@" ${flags[@]+"${flags[@]}"}; then
        BUILT[$out]=ok
        return 0
    fi
    BUILT[$out]=failed
    fail "$name" "nvcc failed to build $(basename "$src")"
    return 1
}

DRVBENCH=$BUILD/drvbench
build_drvbench() { build "$1" "$DRVBENCH" "$SRC_DIR/drvbench.cu" -lcuda; }

# ---- the checks -------------------------------------------------------------------------------
# The cuda-*, torch-*, jax-*, cupy-* checks and the benchmarks are in scripts/gpu/checks/
# (cuda.sh, frameworks.sh, bench.sh), sourced above.

check_nvidia_smi() {
    local out=$LOGDIR/.out total
    if ! run_logged "$out" "$CLI" run --limit "$CAP" -- nvidia-smi -i "$GPU_UUID" \
        --query-gpu=memory.total,memory.used,memory.free --format=csv,noheader,nounits; then
        fail "$1" "nvidia-smi under gpucap run failed"
        return
    fi
    total=$(grep -E '^[[:space:]]*[0-9]+,' "$out" | tail -n 1 | cut -d, -f1 | tr -d '[:space:]')
    if ! is_uint "$total"; then
        fail "$1" "no memory.total in nvidia-smi's output"
        return
    fi
    if [ "$total" -lt $((CAP_MIB - 1)) ] || [ "$total" -gt $((CAP_MIB + 1)) ]; then
        fail "$1" "nvidia-smi under gpucap shows memory.total ${total} MiB, not the ${CAP_MIB} MiB cap (card: ${TOTAL_MIB} MiB)"
        return
    fi
    pass "$1" "nvidia-smi --query-gpu=memory.total inside gpucap run shows ${total} MiB (card: ${TOTAL_MIB} MiB)"
}

check_nvml() {
    needs_fw pynvml "$1" || return
    probe "$CLI" run --limit "$CAP" -- "$PY" "$PROBE" nvml --cap "$CAP" --uuid "$GPU_UUID"
    verdict "$1"
}

check_context_overhead() {
    if [ "$PY_OK" != 1 ]; then
        skip "$1" "no Python 3 ('$PY' not found) for the observer"
        return
    fi
    local child=()
    if [ -n "$NVCC" ]; then
        build_drvbench "$1" || return
        child=(--bin "$DRVBENCH")
    fi # else a Python child (ctypes) creates the context
    probe "$PY" "$PROBE" ctx-overhead --cap "$CAP" --cli "$CLI" --runs 3 ${child[@]+"${child[@]}"}
    verdict "$1"
}

# ---- run -------------------------------------------------------------------------------------
others=$(nvidia-smi -i "$GPU_UUID" --query-compute-apps=pid,used_memory --format=csv,noheader 2>/dev/null | grep -c '^[0-9]')
if [ "${others:-0}" -gt 0 ]; then
    echo "gpu-check: note: $others other process(es) on this GPU; figures may be noisy"
fi

# run_check NAME: the check, within the time budget; its seconds to times.txt.
FULL_TIMEOUT=$TIMEOUT
: >"$LOGDIR/times.txt"
run_check() {
    local name=$1 t0=$SECONDS left
    LOG=$LOGDIR/$name.log
    : >"$LOG"
    TIMEOUT=$FULL_TIMEOUT
    if [ -n "$DEADLINE" ]; then
        left=$((DEADLINE - $(date +%s)))
        if [ "$left" -lt 30 ]; then
            skip "$name" "the time budget is spent (--deadline: ${left}s left)"
            return
        fi
        if [ "$left" -lt "$TIMEOUT" ]; then
            TIMEOUT=$left
        fi
    fi
    "check_${name//-/_}" "$name"
    printf '%s %d\n' "$name" $((SECONDS - t0)) >>"$LOGDIR/times.txt"
}

for name in "${CHECKS[@]}"; do
    selected "$name" || continue
    run_check "$name"
done

if [ "$BENCH" = 1 ]; then
    for name in "${BENCHES[@]}"; do
        selected "$name" || continue
        run_check "$name"
    done
    if [ -s "$BENCH_TSV" ]; then
        bench_summary
    fi
fi

echo "gpu-check: logs in $LOGDIR"
finish
