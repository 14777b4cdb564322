#!/usr/bin/env bash
# The two-thread pair loop in a pool, K times: counts the runs that were refused an
# allocation (and the refusals) far below the pool's cap. On the fake driver, no GPU.
#
#   scripts/bench/stress-pool-alloc.sh            # STRESS_RUNS=100 runs of 2 x 200000 pairs
#
# Each run is one process of a fresh pool (GPUCAP_POOL, its own GPUCAP_POOL_DIR) whose
# STRESS_THREADS threads (2) each allocate and free 1 MiB STRESS_PAIRS times
# (tests/c/pool_pairs.c; STRESS_KIND=plain: cuMemAlloc_v2/cuMemFree_v2, or managed,
# mixed), with a 256 MiB context (FAKECUDA_CONTEXT_MEM), the fake's arena
# (FAKECUDA_ARENA=1) and GPUCAP_LIMIT=150Gi: every refusal is made with room under the
# cap. Prints one line per refused run (its first refusal line) and a summary:
#   runs=K refused_runs=R refusals=N pairs_per_run=P
# Exits 1 if any run was refused, 2 if a run failed otherwise.
# STRESS_CLAIM=1 makes each run's pool a claim's (GPUCAP_CLAIM_DIR: its words in the
# sealed memfd a claim's members hand to each other, not the file);
# STRESS_SHIM=<path> runs another build of libgpucap.so (an older one, say);
# STRESS_NO_BUILD=1 skips the release build.
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
RUNS=${STRESS_RUNS:-100}
THREADS=${STRESS_THREADS:-2}
PAIRS=${STRESS_PAIRS:-200000}
KIND=${STRESS_KIND:-plain}

case $RUNS$THREADS$PAIRS in
    *[!0-9]*)
        echo "stress-pool-alloc: STRESS_RUNS, STRESS_THREADS and STRESS_PAIRS must be whole numbers" >&2
        exit 2
        ;;
esac
case $KIND in
    plain | managed | mixed) ;;
    *)
        echo "stress-pool-alloc: STRESS_KIND=$KIND: expected plain, managed or mixed" >&2
        exit 2
        ;;
esac

if [ "${STRESS_NO_BUILD:-0}" != 1 ]; then
    echo "== building (release)" >&2
    cargo build --release --workspace >&2
fi
R=$ROOT/target/release
SHIM=${STRESS_SHIM:-$R/libgpucap.so}
for f in "$SHIM" "$R/libcuda.so"; do
    [ -f "$f" ] || { echo "stress-pool-alloc: $f missing" >&2; exit 2; }
done

FAKE=$R/fakecuda-stress
mkdir -p "$FAKE" "$R/ctests"
ln -sfn "$R/libcuda.so" "$FAKE/libcuda.so.1"
ln -sfn "$R/libcuda.so" "$FAKE/libcuda.so"
# Built under a name of its own, then moved into place: two runs of the script at once
# (a build before and after a change, side by side) never run a half-written program.
PROG=$R/ctests/pool_pairs-stress
cc -O1 -g -Wall -Werror -pthread -I tests/c -o "$PROG.$$" tests/c/pool_pairs.c -L "$FAKE" -lcuda -ldl
mv -f "$PROG.$$" "$PROG"

for v in $(env | sed -n 's/^\(GPUCAP_[A-Za-z0-9_]*\|FAKECUDA_[A-Za-z0-9_]*\)=.*/\1/p'); do unset "$v"; done
unset LD_PRELOAD

WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
refused_runs=0
refusals=0
for run in $(seq 1 "$RUNS"); do
    pool=$WORK/pool$run
    mkdir -p "$pool"
    if [ "${STRESS_CLAIM:-0}" = 1 ]; then
        chmod 0777 "$pool"
        which=(GPUCAP_CLAIM_DIR="$pool")
    else
        which=(GPUCAP_POOL=stress GPUCAP_POOL_DIR="$pool")
    fi
    if ! out=$(env LD_LIBRARY_PATH="$FAKE" LD_PRELOAD="$SHIM" FAKECUDA_ARENA=1 \
        FAKECUDA_CONTEXT_MEM=256Mi GPUCAP_LIMIT=150Gi "${which[@]}" \
        "$PROG" "$THREADS" "$PAIRS" 1Mi "$KIND" 2>"$WORK/err"); then
        echo "stress-pool-alloc: run $run failed:" >&2
        cat "$WORK/err" >&2
        exit 2
    fi
    n=$(printf '%s\n' "$out" | sed -n 's/.*refused=\([0-9]*\).*/\1/p')
    if [ -z "$n" ]; then
        echo "stress-pool-alloc: run $run printed no count: $out" >&2
        exit 2
    fi
    if [ "$n" -gt 0 ]; then
        refused_runs=$((refused_runs + 1))
        refusals=$((refusals + n))
        echo "run $run: $n refused: $(grep -m1 'gpucap: refused' "$WORK/err" || true)"
    fi
    rm -rf "$pool"
done
echo "runs=$RUNS refused_runs=$refused_runs refusals=$refusals pairs_per_run=$((THREADS * PAIRS))"
[ "$refused_runs" -eq 0 ]
